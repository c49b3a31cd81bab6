"""The messages between a learner and its workers, and what a worker
starts from (see :mod:`._session` for the protocol)."""
from typing import Any, NamedTuple, Optional

__all__ = ["Give", "Evaluate", "STOP", "Ready", "Result", "Failed", "Bye",
           "SessionSpec", "WorkerConfig", "EvaluationSpec", "Buffers",
           "Request", "Attach", "Drop", "ServeLink", "STEP",
           "LOOKAHEAD"]


# learner -> worker
class Give(NamedTuple):
    """The learner hands fragment buffers back to a worker."""
    indices: Any


class Evaluate(NamedTuple):
    """The learner asks for one evaluation."""
    request: int


STOP = "stop"


# worker -> learner
class Ready(NamedTuple):
    """A fragment is ready in buffer ``index``."""
    index: int
    seq: int
    version: int
    waited: float
    elapsed: float
    control: int = 0


class Result(NamedTuple):
    """An evaluation's result."""
    request: int
    returns: Any
    lengths: Any
    version: int
    elapsed: float
    video: Optional[str] = None
    control: int = 0


class Failed(NamedTuple):
    """A worker failed (``record``: an
    :class:`~rlplay.engine.utils.mp.ErrorRecord`)."""
    record: Any
    restartable: bool


class Bye(NamedTuple):
    """A worker's goodbye, after its last fragment ``seq``."""
    seq: int


class SessionSpec(NamedTuple):
    """What every worker of a generator shares (made by keyword).

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
        Where each worker runs its actor (:mod:`rlplay.engine.devices`):
        ``None``, where its parameters live (a worker's copy: the CPU).
    sparse_final : bool
        As in :func:`rlplay.engine.core.collect`: the learner's collation
        makes the copies of ``obs`` in ``final`` (``multi``, ``cluster``).
    """
    factory: Any
    actor: Any
    entropy: Any
    n_envs: int
    sticky: bool
    check_spaces: str
    cpu_affinity: Any = None
    actor_device: Any = None
    sparse_final: bool = False


class EvaluationSpec(NamedTuple):
    """What an evaluating worker plays (made by keyword).

    n_episodes : int
        Episodes per evaluation.
    max_steps : int or None
        The longest episode.
    pending : int or None
        A request to play at once (a replacement's), or ``None``.
    record : str or None
        The directory where the video of each evaluation's first episode
        goes, or ``None``.
    """
    n_episodes: int
    max_steps: Optional[int]
    pending: Optional[int]
    record: Optional[str]


class WorkerConfig(NamedTuple):
    """One worker's start bundle (made by keyword).

    spec : SessionSpec
    index : int
        The worker's index (``meta.worker``; envs ``index * n_envs ..``).
    collector : int
        Its collector index in the seeding tree
        (:mod:`rlplay.engine.seeds`).
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
    evaluation : EvaluationSpec or None
        For an evaluating worker.
    threads : int
        Torch threads.
    calls : tuple of bytes
        The ``call_envs`` calls to apply before its first reset (set by
        the supervisor: every call published so far, see
        :mod:`._control`).
    serve : ServeLink or None
        A worker of a served rollout: its end of the pipe to the
        inference server (:mod:`._server`), set by the supervisor.
    """
    spec: SessionSpec
    index: int
    collector: int
    generation: int
    seq: int
    params: Any
    buffers: Any
    free: Any
    evaluation: Optional[EvaluationSpec]
    threads: int
    calls: tuple = ()
    serve: Any = None


class Buffers(NamedTuple):
    """A worker's fragment buffers: laid out by ``spec``
    (:func:`rlplay.engine.pool.layout`) every ``stride`` bytes of the
    shared ``segment`` (:class:`~rlplay.engine.pool.Segment`), or, with
    ``segment`` ``None``, one buffer of its own."""
    segment: Any
    spec: Any
    stride: int


# worker <-> inference server (see ._server and ._doors): indices only
STEP, LOOKAHEAD = 0, 1


class Request(NamedTuple):
    """A worker asks the server for the actor's step on row ``row`` of
    buffer ``buffer``, the columns of env group ``group``, with the
    ``hx`` of that group's slot; ``seq`` is the fragment's ``meta.seq``;
    ``kind`` is :data:`STEP` or :data:`LOOKAHEAD` (the virtual call of
    row ``T``). The answer is the parameter version that acted (an int).
    Both travel through the group's doorbell slot (:mod:`._doors`); the
    server reads a request into this tuple."""
    buffer: int
    row: int
    group: int
    seq: int
    kind: int = STEP


# learner -> inference server
class Attach(NamedTuple):
    """Worker ``worker`` (generation ``generation``) started: the server's
    end of its pipe follows on the server's pipe (a file descriptor)."""
    worker: int
    generation: int


class Drop(NamedTuple):
    """Worker ``worker`` was retired: drop its pipe and its requests."""
    worker: int


class ServeLink(NamedTuple):
    """What a worker of a served rollout gets (made by keyword).

    conn : Connection or None
        Its end of the pipe to the server.
    groups : int
        Env groups: its ``n_envs`` columns in ``groups`` equal groups,
        each stepped while the server computes the other's actions.
    hx : Buffers or None
        The ``hx`` slots (``None``: the actor keeps no ``hx``): slot
        ``2 * (worker * groups + group)`` is the group's ``hx`` in, the
        next one its ``hx`` out, each laid out for one group's columns.
    doors : Doors
        The doorbells of every group's requests and answers
        (:mod:`._doors`).
    """
    conn: Any
    groups: int
    hx: Any = None
    doors: Any = None
