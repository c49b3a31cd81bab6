"""Evaluation in a worker process, on request, without blocking training.

Protocol
--------
The learner makes a shared copy of the actor's parameters
(:class:`SharedParams`) and starts the worker, which makes its own envs
(seeded from the run's ``entropy`` at collector index
:data:`EVAL_COLLECTOR`, apart from every rollout worker) and waits. At most
one request is outstanding: submitted and not yet picked up::

    learner                                       worker
    -------                                       ------
    Evaluator(): v0, start the worker ──────────► seed, make envs, wait
    ...train...
    submit(actor): publish v_n,
                   send "evaluate" ─────────────► load v_n, eval mode,
                   return v_n at once             play n_episodes
    ...train...  poll() → None                      ...
    ...train...  poll() → Evaluation(..., v_n) ◄── "result"
    submit(actor): publish v_m ...

``submit`` publishes the parameters and returns at once; ``poll`` never
waits; ``result`` waits, bounded. Since nothing is published while a
request is outstanding, the worker evaluates exactly the version that
``submit`` returned, and the result says so.

Each evaluation runs the actor in eval mode (whatever the learner's mode)
with :func:`rlplay.engine.core.evaluate`: every env plays
``ceil(n_episodes / n_envs)`` whole episodes from fresh resets, the ``i``-th
evaluation seeding the resets from the ``i``-th children of the envs' seed
sequences (reproducible, different each time).

Errors and shutdown are those of :mod:`rlplay.engine.rollout.single`: a
worker exception is raised as :class:`WorkerError` (by the next
``submit``, ``poll`` or ``result``), a silent death as
:class:`WorkerDied`; either closes the evaluator and is raised again by
every later call. A :class:`RolloutTimeout` from ``result`` leaves the
evaluator as it was (ask again, or close it), as with
:meth:`concurrent.futures.Future.result`; one from ``submit`` (a live
worker that kept the parameters' lock too long) closes it. ``close()`` stops the worker in
the order of :mod:`rlplay.engine.utils.worker`, interrupting an evaluation
in progress after ``shutdown_timeout``.
"""
import functools
import time
import weakref
from collections import namedtuple

from ..core import _check_counts, check_count, evaluate
from ..envs import close_envs, make_envs
from ..seeds import (collector_seed_sequence, env_seed_sequences, seed_sequence)
from ..utils import (Cloudpickled, ErrorRecord, LearnerLink, SharedParams,
                     WorkerProcess, check_timeouts, cpu_copy,
                     first_timeout, get_context, start_worker)
from ._base import Closing

__all__ = ["Evaluator", "Evaluation", "EVAL_COLLECTOR", "TIMEOUT",
           "START_TIMEOUT", "SHUTDOWN_TIMEOUT"]

# the longest result() waits for one evaluation by default (seconds)
TIMEOUT = 300.0
# extra time allowed for the worker's start-up before the first result
START_TIMEOUT = 60.0
# how long close() waits for the worker to stop on its own (seconds)
SHUTDOWN_TIMEOUT = 5.0

# the evaluator's collector index: far from the rollout workers' 0, 1, ...
EVAL_COLLECTOR = 2**31 - 2

_EVALUATE, _RESULT = "evaluate", "result"

Evaluation = namedtuple("Evaluation", "returns lengths version")
Evaluation.__doc__ = """The result of one evaluation.

returns : ndarray of float64, shape = (n_episodes,)
lengths : ndarray of int64, shape = (n_episodes,)
version : int
    The parameter version evaluated (what ``submit`` returned).
"""

_Config = namedtuple(
    "_Config", "factory actor params entropy n_envs n_episodes max_steps")


def _worker(conn, config):
    """The worker's side of the protocol in the module docstring."""
    link = LearnerLink(conn)
    envs, stage = [], "start-up"
    try:
        factory, actor = start_worker(
            collector_seed_sequence(config.entropy, EVAL_COLLECTOR),
            config.factory, config.actor)
        seeds = env_seed_sequences(config.entropy, config.n_envs,
                                   EVAL_COLLECTOR)
        stage = "the factory"
        envs = make_envs(factory, seeds)
        version = None
        while True:
            stage = "waiting"
            order = link.recv()
            if order is None:
                return
            _, request = order
            stage = f"evaluation {request}"
            version = config.params.load(actor, version, check=link.check)
            actor.eval()
            tic = time.perf_counter()
            returns, lengths = evaluate(
                envs, actor, config.n_episodes,
                seed_sequences=[ss.spawn(1)[0] for ss in seeds],
                max_steps=config.max_steps)
            elapsed = time.perf_counter() - tic
            if not link.send((_RESULT, request, returns, lengths, version,
                              elapsed)):
                return
    except BaseException as exc:  # noqa: B902 - everything goes to the learner
        link.send(ErrorRecord(exc, stage))
    finally:
        close_envs(envs, quiet=True)
        link.close()


class Evaluator(Closing):
    """Evaluate the learner's actor in a worker process, on request.

    Parameters
    ----------
    factory : callable
        Builds one Gymnasium env; called ``n_envs`` times in the worker
        only (shipped with cloudpickle), so a failure there is a
        :class:`WorkerError`.
    actor : BaseActorModule
        The learner's actor (on any device); the worker runs a CPU copy in
        eval mode.
    n_envs : int
        Envs played side by side.
    n_episodes : int
        Episodes per evaluation.
    entropy : int or SeedSequence, optional
        The run's seed (the evaluator's envs and generators use collector
        index :data:`EVAL_COLLECTOR`).
    max_steps : int, optional
        Cut episodes at this many steps.
    start_method : {'forkserver', 'spawn', 'fork'}, optional
    timeout : float or None
        The default bound of :meth:`result` (``None``: no deadline, as
        long as the worker lives).
    start_timeout : float or None
        Added to the default bound of :meth:`result` until the first
        result, for the start-up (``None`` adds nothing).
    shutdown_timeout : float
        How long :meth:`close` waits before terminating the worker.

    Attributes
    ----------
    process : multiprocessing.Process
        The worker.
    pid : int
        The worker's process id.
    stats : dict
        ``evaluations`` (results picked up), ``time_evaluate`` (seconds the
        worker spent evaluating, in all) and ``last`` (the last
        :class:`Evaluation`).

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
                 timeout=TIMEOUT, start_timeout=START_TIMEOUT,
                 shutdown_timeout=SHUTDOWN_TIMEOUT):
        _check_counts(1, n_envs)
        check_count("n_episodes", n_episodes)  # as core.evaluate does
        n_envs, n_episodes = int(n_envs), int(n_episodes)
        check_timeouts(timeout=timeout, start_timeout=start_timeout,
                       shutdown_timeout=shutdown_timeout)
        mp_ctx = get_context(start_method)
        entropy = seed_sequence(entropy)
        self.timeout, self.start_timeout = timeout, start_timeout
        self._closed, self._error = False, None
        self._pending = None  # the version of the outstanding request
        self._requests = 0
        self.params = SharedParams(actor, mp_ctx)
        config = _Config(Cloudpickled(factory), Cloudpickled(cpu_copy(actor)),
                         self.params, entropy, n_envs, n_episodes, max_steps)
        self._worker = WorkerProcess(mp_ctx, _worker, (config,),
                                     name="rlplay-evaluate")
        self.process, self.pid = self._worker.process, self._worker.pid
        self._finalizer = weakref.finalize(self, self._worker.close,
                                           shutdown_timeout)
        self.stats = {"evaluations": 0, "time_evaluate": 0.0, "last": None}

    @property
    def pending(self):
        """Whether a request is outstanding (submitted, not picked up)."""
        return self._pending is not None

    def _check_open(self):
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError("the evaluator is closed")

    def _guard(self, call, *args, keep_open=(TimeoutError,)):
        # a worker error or death closes the evaluator; a timeout of
        # result() does not (the request stays outstanding)
        try:
            return call(*args)
        except (*keep_open, KeyboardInterrupt):
            raise
        except BaseException as exc:
            if isinstance(exc, Exception):
                self._error = exc
            self.close()
            raise

    def _receive(self, timeout):
        what = f"evaluation {self._requests}"
        if timeout is False:
            message = self._worker.poll(what=what)
            if message is None:
                return None
        else:
            message = self._worker.recv(timeout, what=what)
        if isinstance(message, ErrorRecord):
            raise message.to_exception(worker=0)
        _, request, returns, lengths, version, elapsed = message
        assert request == self._requests and version == self._pending, (
            message, self._pending)
        self._pending = None
        result = Evaluation(returns, lengths, version)
        self.stats["evaluations"] += 1
        self.stats["time_evaluate"] += elapsed
        self.stats["last"] = result
        return result

    def submit(self, actor):
        """Publish ``actor``'s parameters and ask for their evaluation.

        Returns at once with the version submitted (what the result will
        report).

        Raises
        ------
        RuntimeError
            A request is still outstanding (pick it up with :meth:`poll` or
            :meth:`result` first), or the evaluator is closed.
        WorkerError, WorkerDied
            The worker failed (say, in the factory) since the last call,
            or died holding the parameters' lock.
        RolloutTimeout
            The live worker held the parameters' lock too long.
        ValueError
            The actor's parameters and buffers changed in number.

        Any of these but ``ValueError`` closes the evaluator.
        """
        self._check_open()
        if self._pending is not None:
            raise RuntimeError(f"evaluation of version {self._pending} is "
                               f"still outstanding: pick it up with poll() "
                               f"or result() before submitting again")
        self._guard(self._check_worker)
        # a worker stuck on the lock cannot evaluate any more: close
        version = self._guard(self._publish, actor, keep_open=(ValueError,))
        self._requests += 1
        self._pending = version
        self._worker.send((_EVALUATE, self._requests))
        return version

    def _publish(self, actor):
        return self.params.publish(actor, check=functools.partial(
            self._worker.check_alive, "the parameter lock"))

    def _check_worker(self):
        # only an error record can arrive while nothing is outstanding
        message = self._worker.poll(what="a request")
        if message is not None:
            assert isinstance(message, ErrorRecord), message
            raise message.to_exception(worker=0)

    def poll(self):
        """The outstanding request's :class:`Evaluation` if it is ready,
        else ``None``; never waits. Raises the worker's failure, if any."""
        self._check_open()
        if self._pending is None:
            self._guard(self._check_worker)
            return None
        return self._guard(self._receive, False)

    def result(self, timeout=None):
        """Wait for the outstanding request's :class:`Evaluation`.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait; the evaluator's ``timeout`` by default (plus
            ``start_timeout`` until the first result).

        Raises
        ------
        RuntimeError
            Nothing was submitted.
        RolloutTimeout
            No result in time; the request stays outstanding.
        WorkerError, WorkerDied
            The worker failed.
        """
        self._check_open()
        if self._pending is None:
            raise RuntimeError("no evaluation was submitted")
        if timeout is None:
            timeout = (first_timeout(self.timeout, self.start_timeout)
                       if self.stats["evaluations"] == 0 else self.timeout)
        return self._guard(self._receive, timeout)

    def close(self):
        """Stop the worker (see the module docstring); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        self.params = None
