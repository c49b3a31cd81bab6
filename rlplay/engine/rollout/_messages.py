"""The messages between a learner and its workers, and what a worker
starts from (see :mod:`._collector` for the protocol)."""
from collections import namedtuple

__all__ = ["Give", "Evaluate", "STOP", "Ready", "Result", "Failed", "Bye",
           "SessionSpec", "WorkerConfig", "Buffers"]

# learner -> worker
Give = namedtuple("Give", "indices")
Evaluate = namedtuple("Evaluate", "request")
STOP = "stop"
# worker -> learner
Ready = namedtuple("Ready", "index seq version waited elapsed control",
                   defaults=(0,))
Result = namedtuple("Result", "request returns lengths version elapsed video "
                              "control", defaults=(None, 0))
Failed = namedtuple("Failed", "record restartable")
Bye = namedtuple("Bye", "seq")

SessionSpec = namedtuple(
    "SessionSpec", "factory actor entropy n_envs sticky check_spaces "
                   "cpu_affinity actor_device sparse_final",
    defaults=(None, None, False))
SessionSpec.__doc__ = """What every worker of a generator shares (made by
keyword).

factory, actor : Cloudpickled
entropy : SeedSequence
    The run's root.
n_envs : int
    Envs (columns) per worker.
sticky : bool
check_spaces : str
    As in :func:`rlplay.engine.core.collect`.
cpu_affinity : None, AutoAffinity or tuple of tuples
    Where each worker runs (:func:`rlplay.engine.utils.mp.
    set_cpu_affinity`), applied before it makes its envs.
actor_device : None or tuple of torch.device
    Where each worker runs its actor (:mod:`._devices`): ``None``, where
    its parameters live (a worker's copy: the CPU).
sparse_final : bool
    As in :func:`rlplay.engine.core.collect`: the learner's collation
    makes the copies of ``obs`` in ``final`` (``multi``, ``cluster``).
"""

WorkerConfig = namedtuple(
    "WorkerConfig", "spec index collector generation seq params buffers "
                    "free evaluation threads calls", defaults=((),))
WorkerConfig.__doc__ = """One worker's start bundle (made by keyword).

spec : SessionSpec
index : int
    The worker's index (``meta.worker``; envs ``index * n_envs ..``).
collector : int
    Its collector index in the seeding tree (:mod:`rlplay.engine.seeds`).
generation : int
    0 for the first worker at ``index``, ``g`` for its ``g``-th
    replacement (``meta.generation``).
seq : int
    The ``meta.seq`` of its first fragment.
params : SharedParams or None
    The shared parameters (a Ray worker gets them with each request).
buffers : Buffers or None
    Where a collecting worker's fragment buffers live.
free : list of int
    The buffers it holds at start.
evaluation : tuple (n_episodes, max_steps, pending, record) or None
    For an evaluating worker; ``pending`` is a request to play at once
    (a replacement's), or ``None``; ``record``: the directory where the
    video of each evaluation's first episode goes, or ``None``.
threads : int
    Torch threads.
calls : tuple of bytes
    The ``call_envs`` calls to apply before its first reset (set by the
    supervisor: every call published so far, see :mod:`._control`).
"""

Buffers = namedtuple("Buffers", "segment spec stride")
Buffers.__doc__ = """A worker's fragment buffers: laid out by ``spec``
(:func:`rlplay.engine.pool.layout`) every ``stride`` bytes of the shared
``segment`` (:class:`~rlplay.engine.pool.Segment`), or, with ``segment``
``None``, one buffer of its own."""
