"""Multiprocessing kit shared by the process-based generators.

- :func:`get_context`: the start-method context (``fork``, ``spawn``,
  ``forkserver``), ``forkserver`` by default where available: it is safe
  with the threads that torch starts and much cheaper than ``spawn``.
- :class:`CloudpickleWrapper`: ships factories and actors defined in
  ``__main__`` or in a notebook (closures, lambdas) to spawned workers.
- :class:`ErrorRecord`: what a worker sends back when it fails, turned into
  :class:`WorkerError` in the learner with the remote traceback attached as
  the cause (as :mod:`concurrent.futures` does).
- :func:`recv`: a bounded wait on a pipe that also watches the worker's
  sentinel, so a silent death (SIGKILL, ``os._exit``, segfault) is reported
  as :class:`WorkerDied` with its exit code or signal name within one poll.
- :func:`check_timeouts` and :func:`first_timeout`:
  the generators' counts and timeouts, checked up front, and the bound of
  their first wait.
"""
import multiprocessing
import multiprocessing.connection
import numbers
import pickle
import signal
import time
import traceback

import cloudpickle

from ..errors import (RemoteTraceback, RolloutError, RolloutTimeout,
                      WorkerDied, WorkerError, describe_exitcode)

__all__ = [
    "DEFAULT_START_METHOD",
    "POLL_INTERVAL",
    "RolloutError",
    "WorkerError",
    "WorkerDied",
    "RolloutTimeout",
    "RemoteTraceback",
    "ErrorRecord",
    "CloudpickleWrapper",
    "get_context",
    "describe_exitcode",
    "recv",
    "join_or_kill",
    "check_timeouts",
    "first_timeout",
]

DEFAULT_START_METHOD = ("forkserver" if "forkserver" in
                        multiprocessing.get_all_start_methods() else "spawn")

# how often a waiting side re-checks that the other side is alive (seconds)
POLL_INTERVAL = 0.1


class ErrorRecord:
    """A picklable record of an exception, made in the worker."""

    def __init__(self, exc, where=""):
        cls = type(exc)
        self.type_name = f"{cls.__module__}.{cls.__qualname__}"
        self.message = str(exc)
        self.traceback = "".join(traceback.format_exception(exc))
        self.where = where
        try:  # the class itself, when it can travel (by reference)
            self.exc_type = pickle.loads(pickle.dumps(cls))
        except Exception:
            self.exc_type = None

    def to_exception(self, worker=None):
        """The :class:`WorkerError` to raise in the learner."""
        who = "" if worker is None else f" {worker}"
        where = f" in {self.where}" if self.where else ""
        err = WorkerError(
            f"worker{who} raised {self.type_name}{where}: {self.message}",
            exc_type=self.exc_type, type_name=self.type_name,
            remote_message=self.message, remote_traceback=self.traceback,
            worker=worker)
        err.__cause__ = RemoteTraceback(self.traceback)
        return err


class CloudpickleWrapper:
    """Pickle ``obj`` with cloudpickle (closures, lambdas, ``__main__``)."""

    def __init__(self, obj):
        self.obj = obj

    def __getstate__(self):
        return cloudpickle.dumps(self.obj)

    def __setstate__(self, state):
        self.obj = pickle.loads(state)


def get_context(start_method=None):
    """The multiprocessing context for ``start_method`` (default above).

    Raises ``ValueError`` for a start method this platform lacks.
    """
    method = start_method or DEFAULT_START_METHOD
    if method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"start_method must be one of "
                         f"{multiprocessing.get_all_start_methods()}, got "
                         f"{method!r}")
    return multiprocessing.get_context(method)


def recv(conn, processes, timeout, *, what="a message", worker=None):
    """Receive from ``conn`` within ``timeout`` seconds, watching workers.

    Parameters
    ----------
    conn : multiprocessing.connection.Connection
    processes : list of multiprocessing.Process
        Workers whose death ends the wait.
    timeout : float or None
        ``None`` waits as long as the workers live (still checking them).

    Raises
    ------
    WorkerDied
        A worker exited and ``conn`` holds nothing more.
    RolloutTimeout
        Nothing arrived in time although every worker lives.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    sentinels = [p.sentinel for p in processes]
    closed = False  # the other end hung up: only the sentinels matter now
    while True:
        ready = multiprocessing.connection.wait(
            sentinels if closed else [conn, *sentinels],
            timeout=POLL_INTERVAL)
        if not closed and (conn in ready or conn.poll()):
            try:
                return conn.recv()
            except (EOFError, OSError):
                closed = True  # find out who died below
        for index, proc in enumerate(processes):
            if proc.sentinel in ready or not proc.is_alive():
                proc.join(POLL_INTERVAL)
                if not closed and conn.poll():  # its last words arrived
                    try:
                        return conn.recv()
                    except (EOFError, OSError):
                        pass
                raise WorkerDied.of(
                    proc, worker if worker is not None else index, what)
        if deadline is not None and time.monotonic() > deadline:
            raise RolloutTimeout(f"no {what} within {timeout} s although "
                                 f"the workers are alive")


def check_timeouts(**timeouts):
    """Validate timeout arguments given by name, up front.

    ``shutdown_timeout`` must be a number of seconds of at least 0; any
    other (``timeout``, ``start_timeout``) may also be ``None``.

    Raises
    ------
    ValueError
        What was expected and what was given.
    """
    for name, value in timeouts.items():
        if value is None and name != "shutdown_timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not value >= 0:
            kind = "a number of seconds" if name == "shutdown_timeout" \
                else "None or a number of seconds"
            raise ValueError(f"{name} must be {kind} of at least 0, got "
                             f"{value!r}")


def first_timeout(timeout, start_timeout):
    """The bound of the first wait: ``timeout`` plus the start-up allowance
    ``start_timeout`` (``None`` adds nothing, so a finite ``timeout`` keeps
    the first wait finite); ``None`` when ``timeout`` is ``None`` (no
    deadline, the workers' liveness still checked)."""
    if timeout is None:
        return None
    return timeout + (start_timeout or 0.0)


def join_or_kill(processes, timeout):
    """Join ``processes`` within ``timeout`` s in all, then terminate, then
    kill what is left. Idempotent."""
    deadline = time.monotonic() + timeout
    for proc in processes:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
