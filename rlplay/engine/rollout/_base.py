"""What every generator shares: its keywords, its states and the error
latch (:mod:`._states`, whose :class:`Lifecycle` is the one base class of
every generator), its delivery (:mod:`._delivery`), and one set-up.

The set-up (:class:`SetUp`), one part of ``same``, ``single``, ``multi``,
``cluster`` and the :class:`~.evaluate.Evaluator` (each holds it as
``_setup``), in this order: check every argument before anything is made;
the settings that shape the batch and the run they begin or continue
(:mod:`._resume`), with its ``call_envs`` calls; the restart policy; the
layout of a fragment buffer (from a probe env in the learner, for the
generators with workers), checked against a resumed run's; the
statistics, going on from the run's counters. The generator makes its
delivery after the set-up's checks. The workers then start under a
supervisor, processes or Ray actors (:mod:`rlplay.engine.workers`), whose
learner's side is another part, :class:`~._supervised.Supervision`
(:mod:`._supervised`, which neither this module nor ``same`` imports).
"""
import contextlib
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
from ..core import (check_count, check_flag, check_spaces_mode,
                    check_sticky, prepare)
from ..envs import check_columns, make_batch
from ..seeds import PROBE_COLLECTOR, env_seed_sequences
from ..utils.mp import (Cloudpickled, check_cpu_affinity, check_timeouts,
                        worker_cpu_affinity)
from ..workers import RESTART_DELAY, CallLog, SessionSpec, cpu_copy
from ._delivery import Delivery
from ._resume import buffer_layout, continuation, restore_counters
from ._states import Lifecycle, Status
from ._stats import STATS_KEYS, Stats

__all__ = ["Keywords", "WorkerKeywords", "PoolKeywords", "Unpack",
           "spell_out", "Lifecycle", "Status", "Delivery",
           "Stats", "STATS_KEYS", "SetUp",
           "probe_layout", "probed", "check_arguments", "Deadline", "TIMEOUT",
           "START_TIMEOUT", "SHUTDOWN_TIMEOUT", "EVALUATION_TIMEOUT",
           "RESTART_DELAY"]

# The timeouts of every generator (seconds), defined once. Each is a
# keyword of the generators (the table of shared keywords is in
# rlplay/engine/rollout/__init__.py); RESTART_DELAY is the restart
# policy's (rlplay/engine/workers/_restarts.py).
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
    actor_device: Union[str, torch.device, list, None]


class WorkerKeywords(Keywords, total=False):
    """:class:`Keywords` and those of the generators of fragments with
    workers (``single``, ``multi``, ``cluster``)."""

    timeout: Optional[float]
    start_timeout: Optional[float]
    shutdown_timeout: Optional[float]
    restarts: int
    restart_delay: float
    cpu_affinity: Union[str, list, None]
    prefetch: int
    publish: str


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
    check_flag("sticky", sticky)
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
    call_refusal : str or None
        Why the source cannot take ``call_envs`` (EnvPool), or ``None``.
    """
    with probed(factory, n_envs, entropy, name) as probe:
        if sticky:
            check_sticky(probe)
        with torch.random.fork_rng(devices=[]):
            template = prepare(probe, actor, n_steps, n_envs,
                               env_info=env_info, final=final).pyt
        return template, buffer_layout(template, probe.observation_space,
                                       probe.action_space), probe.call_refusal


@contextlib.contextmanager
def probed(factory, n_envs, entropy, name="n_envs"):
    """One source made with ``factory`` in the learner (seeded as collector
    :data:`~rlplay.engine.seeds.PROBE_COLLECTOR` of ``entropy``), checked
    to size ``n_envs`` columns (the argument ``name``): a whole number of
    such sources, none of no columns; closed on leaving.

    Raises
    ------
    TypeError, ValueError
        As :func:`~rlplay.engine.envs.make_batch` and
        :func:`~rlplay.engine.envs.check_columns`.
    Exception
        Whatever ``factory`` raises, as it is.
    """
    probe = make_batch(factory, env_seed_sequences(entropy, n_envs,
                                                   PROBE_COLLECTOR),
                       max_sources=1, name=name)
    try:
        check_columns(probe, n_envs, name)
        yield probe
    finally:
        probe.close()


def _setting(value):
    # a plain int, bool or None in a state (a numpy bool or int given)
    if value is None or isinstance(value, (bool, np.bool_)):
        return None if value is None else bool(value)
    return int(value)


class SetUp:
    """The set-up of a generator (see the module docstring), a part that it
    holds as ``_setup``: made first (the checks of every argument and the
    run begun or continued), then :meth:`probe` (the generators with
    workers) or :meth:`lay_out`, then :meth:`count`; :meth:`state` makes
    the ``state_dict()``.

    Parameters
    ----------
    kind : str
        The generator's kind in a ``state_dict()`` (``"multi"``...).
    actor : BaseActorModule
        The learner's actor.
    settings : dict
        The arguments that shape the batch: a resume must give the same.
    counts : list of (name, value, minimum)
        The counts to check.
    n_workers, entropy, resume, timeouts, restarts, restart_delay
        As the generators' (``timeouts``: a dict of ``timeout``,
        ``start_timeout`` and ``shutdown_timeout``, or ``None``).
    **checked
        The other keywords of :func:`check_arguments`.

    Attributes
    ----------
    run
        The run this part begins or continues
        (:func:`~._resume.continuation` of ``resume`` and ``entropy``, the
        seeds' root).
    calls : CallLog
        The ``call_envs`` calls (:mod:`rlplay.engine.workers._control`; a
        resumed run's first).
    policy : dict
        The restart policy and the shutdown timeout of a supervisor (with
        ``timeouts``).
    stats : dict
        The statistics (:meth:`count`).

    Raises
    ------
    TypeError, ValueError
        A bad argument, or a ``resume`` that does not fit.
    """

    def __init__(self, kind, actor, settings, counts, *, n_workers=1,
                 entropy=None, resume=None, timeouts=None, restarts=0,
                 restart_delay=RESTART_DELAY, **checked):
        check_arguments(actor, counts=counts, timeouts=timeouts,
                        restarts=restarts, restart_delay=restart_delay,
                        n_workers=n_workers, **checked)
        self.kind = kind
        self.settings = {name: _setting(value)
                         for name, value in settings.items()}
        self.run = continuation(resume, entropy, kind, self.settings,
                                n_workers)
        self.calls = CallLog(self.run.calls)
        self.layout = None  # the evaluator's: it fills no fragment buffer
        self.stats = None
        self.policy = None if timeouts is None else dict(
            restarts=restarts, restart_delay=restart_delay,
            shutdown_timeout=timeouts["shutdown_timeout"])

    def lay_out(self, layout):
        """Keep the ``layout`` of one fragment buffer (a
        :func:`~._resume.buffer_layout`), refused where it differs from
        the resumed run's (``ValueError``)."""
        self.run.check_layout(layout)
        self.layout = layout

    def probe(self, factory, actor, n_steps, n_envs, *, sticky, env_info,
              final, check_spaces, cpu_affinity=None, name="n_envs",
              actor_device=None, sparse_final=False):
        """What a generator with workers (processes or Ray actors) makes
        before they start: their CPU copy of ``actor``, the layout of a
        fragment buffer (from a probe env, :func:`probe_layout`: kept by
        :meth:`lay_out`) and the :class:`~rlplay.engine.workers.SessionSpec`
        that every worker shares.

        ``actor_device`` is where each worker runs its copy of the actor
        (:func:`~rlplay.engine.devices.worker_devices`, checked already);
        ``sparse_final``, whether the workers leave the copies of ``obs``
        in ``final`` to the learner (:func:`~rlplay.engine.core.collect`).

        Returns
        -------
        spec : SessionSpec
            Its factory and actor cloudpickled.
        template : Fragment of tensors, shape = (1 + n_steps, n_envs, ...)
        """
        entropy = self.run.entropy  # one root for every worker
        worker_actor = cpu_copy(actor)
        template, layout, self.calls.refusal = probe_layout(
            factory, worker_actor, n_steps, n_envs, entropy,
            env_info=env_info, final=final, sticky=sticky, name=name)
        self.lay_out(layout)
        spec = SessionSpec(factory=Cloudpickled(factory),
                           actor=Cloudpickled(worker_actor), entropy=entropy,
                           n_envs=n_envs, sticky=sticky,
                           check_spaces=check_spaces,
                           cpu_affinity=worker_cpu_affinity(cpu_affinity),
                           actor_device=actor_device,
                           sparse_final=sparse_final)
        return spec, template

    def count(self, stats):
        """Keep ``stats``, going on from the resumed run's counters;
        returns them."""
        self.stats = stats
        restore_counters(stats, self.run.counters)
        return stats

    def state(self, version, workers, extra=None):
        """A ``state_dict()`` (see :mod:`._resume`) at parameter
        ``version``, ``workers`` a list of ``(seq, generation,
        restarts)``."""
        return self.run.state(self.kind, self.settings, self.layout,
                              self.stats, version, workers, extra,
                              self.calls.state())
