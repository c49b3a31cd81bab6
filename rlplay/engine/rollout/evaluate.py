"""Evaluation in a worker process, on request, without blocking training.

Protocol
--------
The learner sizes the envs from a probe source that it makes and closes
at once (as the rollout generators do: a count of ``n_envs`` that the
factory's sources cannot make, or a ``record=`` that they cannot render,
is refused there), makes a shared copy of the actor's parameters
(:class:`SharedParams`) and starts the worker, which makes its own envs
(seeded from the run's ``entropy`` at collector index
:data:`~rlplay.engine.seeds.EVAL_COLLECTOR`, apart from every rollout
worker) and waits; it runs the worker loop of the rollout workers, under
the same supervision (restarts included). At most
one request is outstanding: submitted and not yet picked up::

    learner                                       worker
    -------                                       ------
    Evaluator(): probe env, v0, start worker ───► seed, make envs, wait
    ...train...
    submit(actor): publish v_n,
                   send Evaluate(n) ────────────► load v_n, eval mode,
                   return v_n at once             play n_episodes
    ...train...  poll() → None                      ...
    ...train...  poll() → Evaluation(..., v_n) ◄── Result(n, ...)
    submit(actor): publish v_m ...

``submit`` publishes the parameters (and the ``call_envs`` calls made
since the last one, which the worker applies before it plays:
``Evaluation.control``) and returns at once; ``poll`` never waits;
``result`` waits, bounded. Since nothing is published while a
request is outstanding, the worker evaluates exactly the version that
``submit`` returned, and the result says so.

Each evaluation runs the actor in eval mode (whatever the learner's mode)
with :func:`rlplay.engine.core.evaluate`: every env plays
``ceil(n_episodes / n_envs)`` whole episodes from fresh resets, the ``i``-th
evaluation seeding the resets from the ``i``-th children of the envs' seed
sequences (reproducible, different each time); an agent of a PettingZoo
env plays its lives in that many episodes of its env, so an agent that
does not appear in all of them gives fewer results. A torch-native source
is played where it lives (:mod:`rlplay.engine.core.torch_episodes`); the
worker's copy of the actor runs on the CPU, or on ``actor_device``
(:mod:`rlplay.engine.devices`; the rows of a source elsewhere are moved
to the actor, :mod:`rlplay.engine.policy.device`).

Errors and shutdown are those of :mod:`rlplay.engine.rollout.single`: a
worker exception is raised as :class:`~rlplay.engine.errors.WorkerError`
(by the next ``submit``, ``poll`` or ``result``), a silent death as
:class:`~rlplay.engine.errors.WorkerDied`; either (or Ctrl-C during a
call) breaks the evaluator, and every later call raises the same error
again (see :mod:`._states`). A :class:`~rlplay.engine.errors.RolloutTimeout`
from ``result`` leaves the evaluator as it was (ask again, or close it),
as with :meth:`concurrent.futures.Future.result`; one from ``submit`` (a
live worker that kept the parameters' lock too long) breaks it. Bad
arguments (an actor of another architecture, a bad ``timeout``) raise
``ValueError``/``TypeError`` and leave it as it was. ``close()`` stops the
worker in the supervisor's order, interrupting an evaluation in progress
after ``shutdown_timeout``.

Restarts (``restarts=N``): a worker that dies, or whose factory or envs
raise, is replaced; an evaluation in progress is discarded and the
replacement plays it again from fresh resets (seeded from its own
generation), with the same parameters.
"""
import functools
import inspect
import os
import tempfile
from typing import Any, NamedTuple

from ..errors import RolloutTimeout
from ..seeds import EVAL_COLLECTOR
from ..utils.mp import (Cloudpickled, check_timeouts, get_context,
                        worker_cpu_affinity)
from ..video import check_writer
from ..devices import worker_devices
from ..envs import render_refusal
from ..workers import (Evaluate, EvaluationSpec, Result, SessionSpec,
                       WorkerConfig, cpu_copy)
from ._base import (EVALUATION_TIMEOUT, RESTART_DELAY, SHUTDOWN_TIMEOUT,
                    START_TIMEOUT, Deadline, Lifecycle, SetUp, Status, probed)
from ._calls import call_envs
from ._supervised import (Supervision, supervised_params, supervised_pid,
                          supervised_pids, supervised_process)

__all__ = ["Evaluator", "Evaluation"]


class Evaluation(NamedTuple):
    """The result of one evaluation.

    returns : ndarray of float64, shape = (n,)
    lengths : ndarray of int64, shape = (n,)
        ``n = n_episodes``, or fewer where agents of a PettingZoo env did
        not appear in every episode of their env that the evaluation played
        (see :func:`rlplay.engine.core.evaluate`).
    version : int
        The parameter version evaluated (what ``submit`` returned).
    video : str or None
        With ``record=``: the path of the video of its first episode.
    control : int
        The number of ``call_envs`` calls that its envs had applied (all
        those made before the ``submit``).
    """
    returns: Any
    lengths: Any
    version: Any
    video: Any = None
    control: Any = 0


class _EvaluationRequests:
    """The protocol that the evaluator's supervisor serves: the outstanding
    request and the result that arrived (no reference to the evaluator, so
    that the supervisor's exit handler may hold it)."""

    def __init__(self, spec, params, evaluation, count=0):
        # evaluation: an EvaluationSpec (its pending set per worker)
        self.spec, self.params, self.evaluation = spec, params, evaluation
        self.count, self.version, self.result = count, None, None
        self.accounts = [{}]  # the worker's, filled by the supervisor

    def config(self, w, generation):
        # a replacement plays the outstanding request again at once
        pending = self.count if self.version is not None \
            and self.result is None else None
        return WorkerConfig(
            spec=self.spec, index=0, collector=EVAL_COLLECTOR,
            generation=generation, seq=0, params=self.params, buffers=None,
            free=[], evaluation=self.evaluation._replace(pending=pending),
            threads=1)

    def on_started(self, w):
        """The worker was started (it plays a pending request at once)."""

    def on_message(self, w, message):
        if isinstance(message, Result):
            assert message.request == self.count and \
                message.version == self.version, (message, self.version)
            self.result = message

    def on_lost(self, w):
        return int(self.version is not None and self.result is None)

    def close(self):
        """Nothing to release (the evaluator's source holds no memory)."""


def _stats(accounts):
    # the evaluator's (documented by Evaluator)
    return {"evaluations": 0, "time_evaluate": 0.0, "last": None,
            "restarts": 0, "workers": accounts}


def _recording(factory, record):
    """``(factory, directory)`` of an evaluator that records videos into
    ``record``: the factory asked for ``render_mode="rgb_array"`` where it
    takes that keyword (``gymnasium.make`` does), the directory made.

    Raises
    ------
    TypeError
        ``record`` is not a path.
    ValueError
        ``record`` cannot be made, or written to.
    ImportError
        The video writer is not installed.
    """
    if not isinstance(record, (str, os.PathLike)):
        raise TypeError(f"record must be a directory (a str or a path) or "
                        f"None, got {type(record).__name__}")
    check_writer()
    record = os.path.abspath(os.fspath(record))
    try:  # made, and written to, here: not first in the worker
        os.makedirs(record, exist_ok=True)
        with tempfile.TemporaryFile(dir=record):
            pass
    except OSError as exc:
        raise ValueError(f"record must be a directory that can be written, "
                         f"got {record!r}: {exc.strerror or exc}") from None
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        parameters = ()
    if any(p.name == "render_mode" or p.kind is p.VAR_KEYWORD
           for p in parameters):
        factory = functools.partial(factory, render_mode="rgb_array")
    return factory, record


class Evaluator(Lifecycle):
    """Evaluate the learner's actor in a worker process, on request.

    Parameters
    ----------
    factory : callable
        Builds one Gymnasium env, or a batched source (a vector env, a
        torch-native source, a PettingZoo env: see
        :mod:`rlplay.engine.envs`); called once here for a probe source
        (closed at once: a failure there is raised as it is, and a count
        of ``n_envs`` that its sources cannot make is refused up front),
        then until ``n_envs`` columns add up in the worker (shipped with
        cloudpickle), where a failure is a
        :class:`~rlplay.engine.errors.WorkerError`.
    actor : BaseActorModule
        The learner's actor (on any device); the worker runs a copy in
        eval mode, on the CPU or on ``actor_device``.
    n_envs : int
        Envs played side by side (a torch source's ``num_envs``).
    n_episodes : int
        Episodes per evaluation (agent-episodes of a PettingZoo env's
        columns: see :func:`rlplay.engine.core.evaluate` for an agent that
        does not appear in every episode).
    max_steps : int, optional
        Cut episodes at this many steps (at least 1).
    record : str or path, optional
        A directory (made if missing) where each evaluation writes the
        video of its first episode (env 0's), named by the parameter
        version (``version-000012.gif``; the :class:`Evaluation` says
        which). The envs are asked for ``render_mode="rgb_array"`` where
        the factory takes that keyword (``gymnasium.make`` does); otherwise
        it must make them so. Needs the ``video`` extra (``pip install
        -e 'path/to/rlplay[video]'``).
        ``None``: nothing is rendered. A directory that cannot be made
        or written to is refused up front (``ValueError``), and so are
        sources that cannot render one env (a vector env, a torch
        source: ``TypeError``).

    Attributes
    ----------
    process : multiprocessing.Process
        The worker (of its current generation).
    pid : int
        The worker's process id.
    params : SharedParams
        The shared copy of the parameters (``None`` once closed).
    hx_dim : int
        The actor's, as the generators' ``hx_dim``.
    stats : dict
        ``evaluations`` (results picked up), ``time_evaluate`` (seconds the
        worker spent evaluating, in all), ``last`` (the last
        :class:`Evaluation`), ``restarts`` and ``workers`` (the worker's
        ``restarts``, ``lost`` evaluations and ``last_cause``).

    Notes
    -----
    The keywords every generator shares (``entropy``, ``start_method``,
    the timeouts, ``restarts``, ``restart_delay``, ``cpu_affinity``,
    ``resume``, ``actor_device``) are documented once, in
    :mod:`rlplay.engine.rollout`; here ``timeout`` is the default bound of
    :meth:`result` (300 s: the worker is silent for a whole evaluation),
    ``start_timeout`` is added to it while the worker starts, the envs and generators are seeded at
    collector index :data:`~rlplay.engine.seeds.EVAL_COLLECTOR` of
    ``entropy``, and a ``restarts`` replacement plays the outstanding
    evaluation again.

    Examples
    --------
    >>> import functools, gymnasium, torch.nn as nn
    >>> from rlplay.engine import PolicyActor
    >>> actor = PolicyActor(nn.Linear(4, 2))
    >>> factory = functools.partial(gymnasium.make, "CartPole-v1")
    >>> with Evaluator(factory, actor, n_envs=2, n_episodes=4,
    ...                entropy=0) as evaluator:
    ...     version = evaluator.submit(actor)  # returns at once
    ...     # ... train here, poll() now and then ...
    ...     result = evaluator.result(timeout=60)
    >>> result.version, result.returns.shape
    (1, (4,))
    """

    def __init__(self, factory, actor, *, n_envs=1, n_episodes=10,
                 entropy=None, max_steps=None, start_method=None,
                 timeout=EVALUATION_TIMEOUT, start_timeout=START_TIMEOUT,
                 shutdown_timeout=SHUTDOWN_TIMEOUT, restarts=0,
                 restart_delay=RESTART_DELAY, cpu_affinity=None,
                 resume=None, record=None, actor_device=None):
        self._setup = setup = SetUp(
            "evaluator", actor, dict(n_envs=n_envs, n_episodes=n_episodes,
                                     max_steps=max_steps),
            [("n_envs", n_envs, 1), ("n_episodes", n_episodes, 1)]
            + ([] if max_steps is None else [("max_steps", max_steps, 1)]),
            entropy=entropy, resume=resume,
            timeouts=dict(timeout=timeout, start_timeout=start_timeout,
                          shutdown_timeout=shutdown_timeout),
            restarts=restarts, restart_delay=restart_delay,
            cpu_affinity=cpu_affinity)
        run = setup.run
        self.actor, self.hx_dim = actor, getattr(actor, "hx_dim", 1)
        self.timeout, self.start_timeout = timeout, start_timeout
        # the evaluator's parts: the set-up, the supervision of its worker
        # (whose source holds the outstanding request and its result)
        self._supervision = Supervision(setup, None, timeout, start_timeout)
        if not callable(factory):
            raise TypeError(f"factory must be callable and return a "
                            f"Gymnasium env, got {type(factory).__name__}")
        if record is not None:
            factory, record = _recording(factory, record)
        mp_ctx = get_context(start_method)
        devices = worker_devices(actor_device, 1,
                                 start_method=mp_ctx.get_start_method())
        # sized here, as the generators size their buffers: a count the
        # factory's sources cannot make, or a recording that they cannot
        # render, is refused before any worker starts
        with probed(factory, n_envs, run.entropy) as probe:
            if record is not None and not probe.renders_columns:
                raise TypeError(f"record={record!r} renders env 0's "
                                f"frames, but {render_refusal(probe)}")
            setup.calls.refusal = probe.call_refusal
        self._version = run.version  # the last submitted
        spec = SessionSpec(
            factory=Cloudpickled(factory), actor=Cloudpickled(cpu_copy(actor)),
            entropy=run.entropy, n_envs=int(n_envs), sticky=False,
            check_spaces="first",
            cpu_affinity=worker_cpu_affinity(cpu_affinity),
            actor_device=devices)
        self._supervision.workers(mp_ctx, 1, actor, lambda params:
                      _EvaluationRequests(
                          spec, params, EvaluationSpec(
                              n_episodes=int(n_episodes), max_steps=max_steps,
                              pending=None, record=record),
                          count=int(run.extra.get("requests", 0))),
                      name="rlplay-evaluate", stats=_stats)
        self.stats = setup.stats

    call_envs = call_envs

    def state_dict(self):
        """What rlplay owns of this evaluator, for ``resume=`` (see
        ``resume`` in :mod:`rlplay.engine.rollout`, and "Long runs" in the
        docs): the seeding tree's place, the generation, the
        counts and the parameter version (a continuation's versions go on
        from it; an outstanding request is not part of it: submit it
        again). Valid in any state (after ``close()`` too)."""
        supervision = self._supervision
        member = supervision.supervisor.workers[0]
        return self._setup.state(
            self._version, [(0, member.generation,
                             member.account["restarts"])],
            extra={"requests": supervision.source.count})

    @property
    def pending(self):
        """Whether a request is outstanding (submitted, not picked up)."""
        return self._supervision.source.version is not None

    params, pids, pid = supervised_params, supervised_pids, supervised_pid
    process = supervised_process

    def _closed_error(self):
        return RuntimeError("the evaluator is closed")

    def submit(self, actor):
        """Publish ``actor``'s parameters and ask for their evaluation.

        Returns at once with the version submitted (what the result will
        report).

        Raises
        ------
        RuntimeError
            A request is still outstanding (pick it up with :meth:`poll` or
            :meth:`result` first), or the evaluator is closed.
        ValueError
            ``actor`` is of another architecture (the evaluator stays
            usable).
        WorkerError, WorkerDied
            The worker failed (say, in the factory) since the last call,
            or died holding the parameters' lock.
        RolloutTimeout
            The live worker held the parameters' lock too long.
        """
        pending = self._supervision.source.version
        if pending is not None and self.status is Status.OPEN:
            raise RuntimeError(f"evaluation of version {pending} is still "
                               f"outstanding: pick it up with poll() or "
                               f"result() before submitting again")
        return self._guarded(self._submit, actor, stop=self._closed_error(),
                             keep=(ValueError,))

    def _submit(self, actor):
        supervision = self._supervision
        requests, supervisor = supervision.source, supervision.supervisor
        supervisor.check("a request")
        what = "the parameter lock"
        version = supervision.publish(actor, lambda: supervisor.check(what),
                                Deadline(self.timeout).lock_timeout())
        requests.count += 1
        requests.version, requests.result = version, None
        self._version = version
        if supervisor.workers[0].process is not None:
            supervisor.send(0, Evaluate(requests.count))
        # else: a replacement on its way plays it at start
        self.stats["restarts"] = supervisor.restarts
        return version

    def poll(self):
        """The outstanding request's :class:`Evaluation` if it is ready,
        else ``None``; never waits. Raises the worker's failure, if any."""
        return self._guarded(self._wait, 0.0, stop=self._closed_error())

    def result(self, timeout=None):
        """Wait for the outstanding request's :class:`Evaluation`.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait without news from the worker; the evaluator's
            ``timeout`` by default (plus ``start_timeout`` while the worker
            starts).

        Raises
        ------
        RuntimeError
            Nothing was submitted.
        ValueError
            A bad ``timeout`` (the evaluator stays usable).
        RolloutTimeout
            No result in time; the request stays outstanding.
        WorkerError, WorkerDied
            The worker failed.
        """
        check_timeouts(timeout=timeout)
        if self._supervision.source.version is None \
                and self._error is None and self.params is not None:
            raise RuntimeError("no evaluation was submitted")
        return self._guarded(self._wait, timeout, True,
                             stop=self._closed_error(),
                             keep=(RolloutTimeout,))

    def _wait(self, timeout, block=False):
        supervision = self._supervision
        requests, supervisor = supervision.source, supervision.supervisor
        what = f"evaluation {requests.count}"
        if requests.version is None:
            supervisor.check("a request")
            return None
        bound = supervision.bound() if timeout is None else timeout
        deadline = Deadline(bound if block else 0.0)
        supervisor.pump(0, what)
        if not supervision.wait(lambda: requests.result is not None, what,
                           deadline, renew=timeout is None):
            if not block:
                return None
            raise RolloutTimeout(
                f"no result of {what} within {deadline.bound} s "
                f"although the worker is alive")
        message, requests.result, requests.version = requests.result, \
            None, None
        result = Evaluation(message.returns, message.lengths,
                            message.version, message.video, message.control)
        self.stats["evaluations"] += 1
        self.stats["time_evaluate"] += message.elapsed
        self.stats["last"] = result
        self.stats["restarts"] = supervisor.restarts
        return result

    def close(self):
        """Stop the worker (see the module docstring); idempotent."""
        super().close()

    def _close(self, graceful):
        self._supervision.close(graceful, self.stats)
