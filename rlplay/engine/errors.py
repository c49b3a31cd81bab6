"""Every exception a user of rlplay catches, in one place.

All are re-exported by :mod:`rlplay.engine`::

    RolloutError                 (RuntimeError) a generator failed
    ├── WorkerError              a worker raised; type, message, traceback
    ├── WorkerDied               a worker ended without a word
    ├── RolloutTimeout           (also TimeoutError) a bounded wait ran out
    ├── CapacityError            buffers do not fit in /dev/shm or the fd limit
    └── EnvCallError             a method that ``call_envs`` names is missing
                                 or raised in an env (in a worker: the
                                 ``WorkerError``'s ``exc_type``)

A worker's traceback travels as text and is attached to :class:`WorkerError`
as its ``__cause__`` (a :class:`RemoteTraceback`), as
:mod:`concurrent.futures` does, so that the learner's report shows both.
Structure mismatches of nested data raise
:class:`rlplay.engine.nested.StructureError` (a ``ValueError``); bad
arguments raise ``TypeError``/``ValueError`` up front.
"""
import signal

__all__ = [
    "RolloutError",
    "WorkerError",
    "WorkerDied",
    "RolloutTimeout",
    "CapacityError",
    "EnvCallError",
    "RemoteTraceback",
    "describe_exitcode",
]


class RolloutError(RuntimeError):
    """Base class of the errors a generator raises."""


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a worker."""

    def __init__(self, tb):
        super().__init__(tb)
        self.tb = tb

    def __str__(self):
        return self.tb


class WorkerError(RolloutError):
    """An exception raised in a worker, re-raised in the learner.

    Attributes
    ----------
    exc_type : type or None
        The worker's exception class, when it could be shipped.
    type_name : str
        Its qualified name, e.g. ``'builtins.ValueError'``.
    remote_message : str
        ``str()`` of the worker's exception.
    remote_traceback : str
        The worker's formatted traceback (also the ``__cause__``).
    worker : int or None
        The index of the worker.
    """

    def __init__(self, message, *, exc_type=None, type_name="",
                 remote_message="", remote_traceback="", worker=None):
        super().__init__(message)
        self.exc_type, self.type_name = exc_type, type_name
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.worker = worker


class WorkerDied(RolloutError):
    """A worker ended without a word (killed, ``os._exit``, segfault, a
    lost node).

    Attributes
    ----------
    exitcode : int or None
        ``Process.exitcode``: negative for a signal (``None`` when unknown,
        as for a Ray actor).
    worker : int or None
    node : str or None
        The Ray node the worker ran on (``cluster`` only).
    """

    def __init__(self, message, *, exitcode=None, worker=None, node=None):
        super().__init__(message)
        self.exitcode, self.worker, self.node = exitcode, worker, node

    @classmethod
    def of(cls, process, worker, what):
        """The error for worker number ``worker`` (a ``Process`` that has
        exited, or is on its way out) found dead while the learner waited
        for ``what``."""
        return cls(f"worker {worker} (pid {process.pid}) died with "
                   f"{describe_exitcode(process.exitcode)} while the learner "
                   f"waited for {what}", exitcode=process.exitcode,
                   worker=worker)


class RolloutTimeout(RolloutError, TimeoutError):
    """A bounded wait ran out while the other side was still alive."""


class CapacityError(RolloutError):
    """Buffers do not fit in shared memory or in the file-descriptor limit.

    Raised before anything is allocated; the message says what was needed,
    what is available and what to change.
    """


class EnvCallError(RolloutError):
    """A method that ``call_envs`` called on the envs is missing, or
    raised (its exception is the ``__cause__``). The message names the
    call, its number and the env column (of the worker). Never restarted:
    a replacement applies every call again, and would fail alike.

    Attributes
    ----------
    method : str
    column : int or None
        The env column (of its worker's envs); ``None`` for a batched
        source called once for all its columns.
    """

    def __init__(self, message, *, method="", column=None):
        super().__init__(message)
        self.method, self.column = method, column


def describe_exitcode(exitcode):
    """``'exit code 3'`` or ``'signal SIGKILL'`` for a ``Process.exitcode``."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
