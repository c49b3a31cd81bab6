"""What every generator shares: iteration and ``with``, the states and the
error latch, statistics, argument checks, and sizing buffers from a probe
env.

States (:class:`Status`)::

    OPEN ──close()──────────────────────────► CLOSED  next(): StopIteration
      └──an error, or Ctrl-C, inside next()─► BROKEN  next(): the same error

The one Ctrl-C rule: a ``KeyboardInterrupt`` (or any exception) raised
while ``next()``, ``submit()``, ``poll()`` or ``result()`` works breaks the
generator. It may have arrived in the middle of a message on a pipe or of
a copy, so nothing can be trusted to resume: the workers are torn down at
once (no waiting for their cooperation), the interrupt propagates, and
every later call raises :class:`~rlplay.engine.errors.RolloutError` saying
that it was interrupted (for an error, the same error again). The one
exception to "an error breaks it" is the evaluator's ``result(timeout=)``
running out, which leaves the request outstanding, as
:meth:`concurrent.futures.Future.result` does.
"""
import enum
import inspect
import math
import numbers
import time
from typing import Optional, TypedDict, Union

import numpy as np
import torch

try:  # Python >= 3.11
    from typing import Unpack
except ImportError:  # typing_extensions comes with torch and gymnasium
    from typing_extensions import Unpack

from ..actor import check_actor
from ..core import (check_count, check_spaces_mode, check_sticky,
                    episode_stats, prepare)
from ..envs import check_columns, make_batch
from ..errors import RolloutError
from ..seeds import PROBE_COLLECTOR, env_seed_sequences, seed_sequence
from ..utils.mp import Cloudpickled, check_cpu_affinity, check_timeouts
from ._collector import SessionSpec
from ._params import cpu_copy
from ._resume import buffer_layout

__all__ = ["Keywords", "WorkerKeywords", "PoolKeywords", "Unpack",
           "spell_out", "Closing", "Breakable", "Generator", "Status",
           "Stats", "STATS_KEYS",
           "probe_layout", "worker_spec", "check_arguments", "Deadline",
           "TIMEOUT",
           "START_TIMEOUT", "SHUTDOWN_TIMEOUT", "EVALUATION_TIMEOUT",
           "RESTART_DELAY"]

# The timeouts of every generator (seconds), defined once. Each is a
# keyword of the generators (the table of shared keywords is in
# rlplay/engine/rollout/__init__.py).
# the longest the learner waits without news from any worker, covering
# every wait inside one next() (the parameter lock included)
TIMEOUT = 60.0
# extra time allowed while a worker starts (a spawned interpreter imports
# torch, then the envs are made and reset)
START_TIMEOUT = 60.0
# how long close() waits for the workers to stop on their own
SHUTDOWN_TIMEOUT = 5.0
# the Evaluator's timeout: its worker sends no news while it plays a whole
# evaluation (n_episodes episodes), so result() waits for all of it, not
# for one fragment
EVALUATION_TIMEOUT = 300.0
# seconds before a failed worker's replacement starts, by default
RESTART_DELAY = 1.0

# the keys of every generator's stats
STATS_KEYS = frozenset({
    "steps", "batches", "time_collect", "time_wall", "time_learner_wait",
    "time_worker_wait", "time_collate", "steps_per_s", "steps_per_s_collect",
    "returns", "lengths", "dropped", "version", "lag", "restarts",
    "workers"})


class Keywords(TypedDict, total=False):
    """The keywords every generator shares, documented once in
    :mod:`rlplay.engine.rollout`; ``**kwargs: Unpack[Keywords]`` lets an
    IDE complete them."""

    entropy: Union[int, np.random.SeedSequence, None]
    sticky: bool
    env_info: Optional[dict]
    final: bool
    device: Union[str, torch.device, None]
    pinned: bool
    copy: bool
    check_spaces: str
    resume: Optional[dict]


class WorkerKeywords(Keywords, total=False):
    """:class:`Keywords` and those of the generators with workers."""

    timeout: Optional[float]
    start_timeout: Optional[float]
    shutdown_timeout: Optional[float]
    restarts: int
    restart_delay: float
    cpu_affinity: Union[str, list, None]


class PoolKeywords(WorkerKeywords, total=False):
    """:class:`WorkerKeywords` and ``max_lag``, of ``multi`` and
    ``cluster``."""

    max_lag: Optional[int]


for _keywords in (Keywords, WorkerKeywords, PoolKeywords):
    _keywords.__module__ = "rlplay.engine.rollout"


def spell_out(function, defined_by):
    """Show ``function``'s ``**kwargs`` as the keyword-only parameters of
    ``defined_by`` (where they are defined, with their defaults), to
    :func:`inspect.signature` and ``help()``; returns ``function``.

    The keywords stay defined once; ``function`` annotates its ``**kwargs``
    with ``Unpack`` of a :class:`Keywords` for static tools (PEP 692), and
    its ``__signature__`` lists them for the rest.
    """
    signature = inspect.signature(function)
    own = [p for p in signature.parameters.values()
           if p.kind is not p.VAR_KEYWORD]
    names = {p.name for p in own}
    shared = [p.replace(annotation=p.empty)
              for p in inspect.signature(defined_by).parameters.values()
              if p.kind is p.KEYWORD_ONLY and p.name not in names]
    function.__signature__ = signature.replace(
        parameters=own + shared, return_annotation=signature.empty)
    return function


class Status(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"
    BROKEN = "broken"


class Closing:
    """A context manager that calls ``self.close()`` on leaving ``with``."""

    def close(self):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Breakable(Closing):
    """Something with workers, in the states of the module docstring.

    Subclasses implement ``_close(graceful)`` (release everything;
    ``graceful=False`` after a failure) and run their calls under
    :meth:`_guarded`.
    """

    status = Status.OPEN
    _error = None

    def _guarded(self, call, *args, stop=None, keep=()):
        """``call(*args)`` under the rule of the module docstring;
        ``stop`` is raised when closed, errors in ``keep`` pass through."""
        if self.status is Status.BROKEN:
            raise self._error
        if self.status is Status.CLOSED:
            raise stop
        try:
            return call(*args)
        except keep:
            raise
        except BaseException as exc:
            self._break(exc)
            raise

    def _break(self, exc):
        self._error = exc if isinstance(exc, Exception) else RolloutError(
            f"{type(self).__name__} was broken by {type(exc).__name__} "
            f"while it waited; make a new one")
        self.status = Status.BROKEN
        self._close(graceful=False)

    def close(self):
        """Stop the workers and release the buffers; idempotent. Later
        calls end the iteration (or raise the error that broke it)."""
        if self.status is Status.OPEN:
            self.status = Status.CLOSED
            self._close(graceful=True)

    def _close(self, graceful):
        raise NotImplementedError


class Generator(Breakable):
    """An iterator of batches; subclasses implement ``_next()``."""

    def __iter__(self):
        return self

    def __next__(self):
        return self._guarded(self._next, stop=StopIteration)


class Stats(dict):
    """The statistics of a generator (a dict of :data:`STATS_KEYS`, whose
    table in :mod:`rlplay.engine.rollout` is the user's reference).

    ``steps`` (env steps delivered), ``batches``, ``time_wall`` (seconds
    since the first ``next()`` began), ``time_learner_wait`` (seconds
    ``next()`` waited for data), ``time_worker_wait`` (seconds, summed over
    workers, that they waited for the learner), ``time_collect`` (seconds,
    summed over workers, spent collecting what was delivered),
    ``time_collate`` (seconds spent copying fragments into batches),
    ``steps_per_s`` (``steps / time_wall``: what the learner gets,
    training included), ``steps_per_s_collect`` (``steps /
    time_collect``: per worker-second), ``returns`` and ``lengths`` of
    the episodes that ended in the last batch, ``version`` (the parameter
    version of the last ``next()``: the number of ``next()`` calls before
    it, changed parameters or not), ``lag`` (the largest ``version -
    meta.version`` in the last batch), ``dropped`` (stale fragments
    dropped), ``restarts`` (workers replaced) and ``workers`` (one dict
    per worker). Times and counts are cumulative.
    """

    def __init__(self, workers=()):
        super().__init__(
            steps=0, batches=0, time_collect=0.0, time_wall=0.0,
            time_learner_wait=0.0, time_worker_wait=0.0, time_collate=0.0,
            steps_per_s=0.0, steps_per_s_collect=0.0, returns=None,
            lengths=None, dropped=0, version=0, lag=0, restarts=0,
            workers=list(workers))
        self._started, self._wall = None, 0.0

    def resumed(self, time_wall):
        """Go on from a stopped run's counters: ``time_wall`` (its
        seconds) is added to this part's."""
        self._wall = float(time_wall)

    def begin(self):
        """Mark the start of a ``next()``; returns ``perf_counter()``."""
        tic = time.perf_counter()
        if self._started is None:
            self._started = tic
        return tic

    def batch(self, npy, *, waited, collected, worker_waited=0.0,
              collated=0.0, version=0, lag=0):
        """Account for one batch ``npy`` (numpy views), delivered now."""
        T1, B = npy.state.rew.shape
        self["steps"] += (T1 - 1) * B
        self["batches"] += 1
        self["time_learner_wait"] += waited
        self["time_collect"] += collected
        self["time_worker_wait"] += worker_waited
        self["time_collate"] += collated
        self["time_wall"] = self._wall + time.perf_counter() - self._started
        self["steps_per_s"] = self["steps"] / max(self["time_wall"], 1e-9)
        self["steps_per_s_collect"] = self["steps"] / max(
            self["time_collect"], 1e-9)
        self["returns"], self["lengths"] = episode_stats(npy)
        self["version"], self["lag"] = version, lag


class Deadline:
    """A bound on a wait without news, renewed by news (``None``: none)."""

    def __init__(self, bound):
        self.renew(bound)

    def renew(self, bound):
        self.bound = bound
        self.at = None if bound is None else time.monotonic() + bound

    def remaining(self):
        """Seconds left (``None``: unbounded); at least 0."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def lock_timeout(self):
        return float("inf") if self.at is None else self.remaining()


def check_arguments(actor, *, counts=(), timeouts=None, sticky=False,
                    check_spaces="first", restarts=0, restart_delay=0.0,
                    cpu_affinity=None, n_workers=1):
    """Check a generator's arguments up front (nothing is started yet).

    Raises
    ------
    TypeError, ValueError
        Naming the argument, what was expected and what was given.
    """
    check_actor(actor)
    for name, value, minimum in counts:
        check_count(name, value, minimum)
    if timeouts is not None:
        check_timeouts(**timeouts)
    if not isinstance(sticky, (bool, np.bool_)):
        raise TypeError(f"sticky must be a bool, got {sticky!r}")
    check_spaces_mode(check_spaces)
    check_count("restarts", restarts, 0)
    check_cpu_affinity(cpu_affinity, n_workers)
    # a replacement due at infinity would leave next() waiting for good
    if isinstance(restart_delay, bool) or not isinstance(
            restart_delay, numbers.Real) or not 0 <= restart_delay < math.inf:
        raise ValueError(f"restart_delay must be a finite number of seconds "
                         f"of at least 0, got {restart_delay!r}")


def probe_layout(factory, actor, n_steps, n_envs, entropy, *, env_info=None,
                 final=True, sticky=False, name="n_envs"):
    """Size a generator's buffers in the learner, from a probe env.

    Makes one source with ``factory`` (one env, or a vector source of
    ``k``; seeded as collector
    :data:`~rlplay.engine.seeds.PROBE_COLLECTOR` of ``entropy``), checks
    that ``n_envs`` (the argument ``name``) is a whole number of such
    sources and that ``sticky`` suits them, runs
    :func:`~rlplay.engine.core.prepare` with the worker's ``actor`` and
    closes the source; a failure is raised here, as by ``same.rollout``.
    The actor's virtual call draws from a forked torch generator, so that
    making a rollout leaves the learner's random numbers alone.

    Returns
    -------
    template : Fragment of zero-filled CPU tensors, shape = (1 + n_steps,
            n_envs, ...)
        A template of one buffer (not shared).
    layout : dict
        What shapes it (:func:`~._resume.buffer_layout`), for resumes.
    """
    probe = make_batch(factory, env_seed_sequences(entropy, n_envs,
                                                   PROBE_COLLECTOR),
                       max_sources=1)
    try:
        check_columns(probe, n_envs, name)
        if sticky:
            check_sticky(probe)
        with torch.random.fork_rng(devices=[]):
            template = prepare(probe, actor, n_steps, n_envs,
                               env_info=env_info, final=final).pyt
        return template, buffer_layout(template, probe.observation_space,
                                       probe.action_space)
    finally:
        probe.close()


def worker_spec(factory, actor, n_steps, n_envs, entropy, *, sticky,
                env_info, final, check_spaces, cpu_affinity=None,
                name="n_envs"):
    """What a generator with worker processes (or Ray actors) makes before
    they start: the run's root ``SeedSequence``, the workers' CPU copy of
    the actor, the layout of a fragment buffer (from a probe env,
    :func:`probe_layout`) and the :class:`~._collector.SessionSpec` that
    every worker shares.

    Returns
    -------
    spec : SessionSpec
        Its factory and actor cloudpickled.
    template : Fragment of tensors, shape = (1 + n_steps, n_envs, ...)
    layout : dict
        What shapes the batch (see :func:`probe_layout`).
    """
    entropy = seed_sequence(entropy)  # one root for every worker
    worker_actor = cpu_copy(actor)
    template, shape = probe_layout(
        factory, worker_actor, n_steps, n_envs, entropy, env_info=env_info,
        final=final, sticky=sticky, name=name)
    spec = SessionSpec(factory=Cloudpickled(factory),
                       actor=Cloudpickled(worker_actor), entropy=entropy,
                       n_envs=n_envs, sticky=sticky, check_spaces=check_spaces,
                       cpu_affinity=cpu_affinity)
    return spec, template, shape
