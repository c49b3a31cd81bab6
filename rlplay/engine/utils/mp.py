"""Multiprocessing kit: what every process-based generator needs from
:mod:`multiprocessing`, whatever its protocol.

- :func:`get_context`: the start-method context (``fork``, ``spawn``,
  ``forkserver``), ``forkserver`` by default where available: it is safe
  with the threads that torch starts and much cheaper than ``spawn``;
  :func:`preload_forkserver` has the server import torch once.
- :class:`Cloudpickled`: ships factories and actors defined in
  ``__main__`` or in a notebook (closures, lambdas) to any worker.
- :class:`ErrorRecord`: what a worker sends back when it fails, turned into
  :class:`~rlplay.engine.errors.WorkerError` in the learner with the remote
  traceback attached as the cause (as :mod:`concurrent.futures` does).
- :func:`bounded_acquire`: a lock wait that watches the other side.
- :func:`guard_parent`: a worker dies with its learner, whatever it is
  doing (Linux: the parent-death signal; everywhere: a watchdog thread).
- :func:`guard_group`: the processes that a worker's envs start (in the
  worker's own process group) end with the worker, however it ends;
  :func:`end_group` ends what is left of a worker's group.
- :func:`check_timeouts`, :func:`first_timeout`, :func:`join_or_kill`:
  timeouts checked up front, the bound of a first wait, a bounded join.
  A process's end is seen by ``waitpid`` (:attr:`~multiprocessing.Process.
  exitcode`) as well as by its sentinel: under ``fork`` and ``spawn`` the
  sentinel is a pipe whose writing end every process that the worker
  forks inherits (an ``AsyncVectorEnv``'s), so it stays silent while they
  live.
- :func:`check_cpu_affinity`, :func:`set_cpu_affinity`: where a worker
  runs (``cpu_affinity=``), checked up front, applied in the worker;
  ``"auto"`` gives each rank of a machine its own share of the cores
  (:func:`local_rank`, :func:`rank_cores`).
"""
import contextlib
import ctypes
import math
import multiprocessing
import multiprocessing.connection
import numbers
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import namedtuple

import cloudpickle

from ..errors import RolloutTimeout, WorkerError, RemoteTraceback

__all__ = [
    "DEFAULT_START_METHOD",
    "POLL_INTERVAL",
    "LOCK_TIMEOUT",
    "FORKSERVER_PRELOAD",
    "ErrorRecord",
    "Cloudpickled",
    "get_context",
    "preload_forkserver",
    "bounded_acquire",
    "guard_parent",
    "guard_group",
    "end_group",
    "ignore_interrupts",
    "check_timeouts",
    "first_timeout",
    "join_or_kill",
    "ended",
    "wait_ended",
    "check_cpu_affinity",
    "set_cpu_affinity",
    "local_rank",
    "rank_cores",
    "AutoAffinity",
    "worker_cpu_affinity",
]

# the start method of the process-based generators when none is given
DEFAULT_START_METHOD = ("forkserver" if "forkserver" in
                        multiprocessing.get_all_start_methods() else "spawn")

# how often a waiting side re-checks that the other side is alive (seconds)
POLL_INTERVAL = 0.1

# the longest a lock is waited for when no other bound is given (seconds)
LOCK_TIMEOUT = 60.0

# modules the forkserver imports once, before forking any worker
FORKSERVER_PRELOAD = ("torch", "numpy", "gymnasium", "rlplay.engine")

# how often an orphan watchdog looks for its parent (seconds)
WATCHDOG_INTERVAL = 0.2


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


class Cloudpickled:
    """An object pickled with cloudpickle now, unpickled by :meth:`load`.

    The object is not rebuilt while the worker process starts (as a
    wrapper that unpickles itself would be), but when the worker calls
    :meth:`load` inside its own error handling: a factory that cannot be
    rebuilt in the worker (say, a module missing there) is reported with
    its exception and traceback instead of a bare exit code. Pickling
    errors are raised at once, in the learner.
    """

    def __init__(self, obj):
        self.data = cloudpickle.dumps(obj)

    def load(self):
        """A fresh copy of the object."""
        return pickle.loads(self.data)


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


def preload_forkserver(ctx, modules=FORKSERVER_PRELOAD):
    """Have the forkserver import ``modules`` before forking workers.

    Adds to (never replaces) the modules already asked for; a no-op for
    other start methods, and without effect once the server runs.
    """
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver
    current = list(getattr(forkserver._forkserver, "_preload_modules",
                           ["__main__"]))
    missing = [name for name in modules if name not in current]
    if missing:
        ctx.set_forkserver_preload(current + missing)


@contextlib.contextmanager
def bounded_acquire(lock, check=None, timeout=LOCK_TIMEOUT, on_acquire=None):
    """Hold ``lock``, calling ``check()`` every poll while waiting for it.

    A process killed while holding a ``multiprocessing`` lock never releases
    it: ``check`` (which raises when the other side is dead) turns what
    would be a hang into an error. A holder that lives but keeps the lock
    longer than ``timeout`` seconds (stopped, stalled) raises
    :class:`~rlplay.engine.errors.RolloutTimeout`. ``on_acquire(True)`` is
    called once the lock is held, ``on_acquire(False)`` before it is
    released (to record the holder).
    """
    deadline = time.monotonic() + timeout
    while not lock.acquire(timeout=POLL_INTERVAL):
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise RolloutTimeout(f"a shared lock was held for more than "
                                 f"{timeout} s by a live process")
    try:
        if on_acquire is not None:
            on_acquire(True)
        yield
    finally:
        if on_acquire is not None:
            on_acquire(False)
        lock.release()


def guard_parent(pdeathsig=True, interval=WATCHDOG_INTERVAL):
    """Make this worker process end within about a second of its parent.

    On Linux, the parent-death signal (``prctl(PR_SET_PDEATHSIG,
    SIGKILL)``) kills it at once, even inside a blocking call or C code
    that holds the GIL. Linux sends it when the *thread* that forked the
    worker ends, so the learner asks for it (``pdeathsig``) only when that
    is its main thread or the fork server's. A watchdog thread, on every
    platform, ends the process when it is re-parented (its parent died)
    or when the parent's sentinel fires. A worker started by the
    forkserver is the server's child: the server exits when its learner
    dies, and the worker follows.
    """
    ppid = os.getppid()
    if pdeathsig and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            # the interpreter's own symbols, libc's among them: no search
            # for the library (find_library runs ldconfig)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        if os.getppid() != ppid:  # died before the signal was armed
            os._exit(1)
    parent = multiprocessing.parent_process()
    sentinel = None if parent is None else parent.sentinel

    def watch():
        import multiprocessing.connection as connection
        while True:
            if sentinel is not None:
                with contextlib.suppress(OSError, ValueError):
                    if connection.wait([sentinel], interval):
                        os._exit(1)
            else:
                time.sleep(interval)
            if os.getppid() != ppid:
                os._exit(1)

    threading.Thread(target=watch, name="rlplay-orphan-watchdog",
                     daemon=True).start()


def guard_group(interval=WATCHDOG_INTERVAL):
    """Make this worker the leader of a process group of its own, and have
    that group end with it.

    Whatever the worker's envs start (the subprocesses of an
    ``AsyncVectorEnv``, a simulator's server) is in the worker's group,
    unless it leaves it (``setsid``): the learner ends what is left of the
    group once the worker is gone (:func:`end_group`), and a *group
    guard*, a small process forked here (before any thread starts), ends
    it when the worker ends without the learner (the learner's death: the
    worker is killed by its parent-death signal, which runs no code).
    The guard closes every file the worker had open (the worker's
    liveness channels must not outlive it) and waits for the worker's end
    on the parent-death signal (Linux) or by polling every ``interval``
    seconds; then it kills the group, itself last. Returns the guard's
    pid, or ``None`` where the platform has no process groups or the
    group could not be made.

    Being a group of its own also keeps the terminal's Ctrl-C (``SIGINT``
    to the foreground group) off the envs' processes: the worker closes
    them in order when the learner closes it.
    """
    if not hasattr(os, "killpg"):
        return None
    try:
        os.setpgid(0, 0)
    except OSError:
        return None
    leader = os.getpid()
    guard = os.fork()
    if guard:
        return guard
    # the guard: plain system calls only, and never back into the worker's
    # code (os._exit on every path)
    try:
        os.closerange(3, _max_fd())
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        wake = getattr(signal, "SIGUSR1", None)
        if wake is not None and sys.platform.startswith("linux") \
                and hasattr(signal, "sigtimedwait"):
            signal.pthread_sigmask(signal.SIG_BLOCK, {wake})
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(1, wake)  # PR_SET_PDEATHSIG = 1
        else:
            wake = None
        while os.getppid() == leader:
            if wake is not None:
                signal.sigtimedwait({wake}, interval)
            else:
                time.sleep(interval)
        os.killpg(leader, signal.SIGKILL)
    finally:
        os._exit(0)


def _max_fd():
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (AttributeError, ValueError, OSError):
        return 1024


def end_group(pgid):
    """Kill what is left of process group ``pgid`` (a worker's, whose pid
    it is: see :func:`guard_group`), once the worker is gone; quiet if
    nothing is left."""
    if pgid is None or not hasattr(os, "killpg"):
        return
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def ignore_interrupts():
    """Let the learner handle Ctrl-C: a terminal sends ``SIGINT`` to the
    whole process group, and the worker should stop in order when the
    learner closes it, not die in the middle of a step."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def check_timeouts(**timeouts):
    """Validate timeout arguments given by name, up front.

    ``shutdown_timeout`` must be a finite number of seconds of at least
    0; any other (``timeout``, ``start_timeout``) may also be ``None``,
    which drops the deadline (an infinite number would make every wait
    unbounded in another way, and some waits cannot take it).

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
        if value == math.inf:
            raise ValueError(
                f"{name} must be a finite number of seconds, got inf" + (
                    "" if name == "shutdown_timeout"
                    else " (None drops the deadline)"))


def first_timeout(timeout, start_timeout):
    """The bound of the first wait: ``timeout`` plus the start-up allowance
    ``start_timeout`` (``None`` adds nothing, so a finite ``timeout`` keeps
    the first wait finite); ``None`` when ``timeout`` is ``None`` (no
    deadline, the workers' liveness still checked)."""
    if timeout is None:
        return None
    return timeout + (start_timeout or 0.0)


def ended(process):
    """Whether a started ``process`` has ended (``waitpid``, or the
    forkserver's report): true as soon as it is gone, even where its
    sentinel stays silent (see the module docstring)."""
    return process.exitcode is not None


def wait_ended(processes, timeout):
    """Wait up to ``timeout`` s until every one of ``processes`` has
    ended; returns those still running."""
    deadline = time.monotonic() + timeout
    while True:
        running = [proc for proc in processes if not ended(proc)]
        remaining = deadline - time.monotonic()
        if not running or remaining <= 0:
            return running
        multiprocessing.connection.wait([proc.sentinel for proc in running],
                                        min(POLL_INTERVAL, remaining))


def join_or_kill(processes, timeout, groups=False):
    """Join ``processes`` within ``timeout`` s in all, then terminate, then
    kill what is left; with ``groups``, then kill what is left of each
    one's process group (:func:`end_group`). Idempotent."""
    running = wait_ended(processes, timeout)
    for proc in running:
        proc.terminate()
    running = wait_ended(running, 1.0)
    for proc in running:
        proc.kill()
    wait_ended(running, 1.0)
    if groups:
        for proc in processes:
            end_group(proc.pid)


def local_rank():
    """This process's ``(local_rank, local_world_size)``: its rank among
    the ranks of a distributed run on this machine, and their number.

    The ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` of the environment, which
    ``torchrun`` sets (``torch.distributed`` has no other account of which
    ranks share a machine: :func:`torch.distributed.get_node_local_rank`
    reads the same variable); ``(0, 1)`` where neither is set. Another
    launcher sets both, or the workers are given their cores.

    Raises
    ------
    ValueError
        One of them set without the other, not an int, or out of range
        (``0 <= LOCAL_RANK < LOCAL_WORLD_SIZE``); the message names the
        variable and its value.
    """
    rank = os.environ.get("LOCAL_RANK")
    size = os.environ.get("LOCAL_WORLD_SIZE")
    if rank is None and size is None:
        return 0, 1
    if rank is None or size is None:
        given, missing = (("LOCAL_RANK", rank), "LOCAL_WORLD_SIZE") \
            if size is None else (("LOCAL_WORLD_SIZE", size), "LOCAL_RANK")
        raise ValueError(
            f"the environment has {given[0]}={given[1]!r} but no {missing}: "
            f"the ranks of a machine are told by both (torchrun sets them); "
            f"set it, or give cpu_affinity one set of cores per worker")
    try:
        rank, size = int(rank), int(size)
    except ValueError:
        raise ValueError(
            f"LOCAL_RANK and LOCAL_WORLD_SIZE of the environment must be "
            f"ints, got {os.environ['LOCAL_RANK']!r} and "
            f"{os.environ['LOCAL_WORLD_SIZE']!r}") from None
    if not 0 <= rank < size:
        raise ValueError(f"the environment's LOCAL_RANK={rank} must be at "
                         f"least 0 and below its LOCAL_WORLD_SIZE={size}")
    return rank, size


def rank_cores(allowed, local_rank=0, local_world_size=1):
    """The share of the cores ``allowed`` of local rank ``local_rank``
    among ``local_world_size`` ranks on one machine (what
    ``cpu_affinity="auto"`` pins that rank's workers on, round robin).

    The cores, in order, are cut into ``local_world_size`` consecutive
    blocks whose sizes differ by at most one: the ranks' shares never
    overlap, and rank 0 of 1 has all of them. With fewer cores than ranks
    an overlap cannot be avoided: rank ``r`` gets core ``r`` modulo their
    number.

    Parameters
    ----------
    allowed : collection of int
        The cores (``os.sched_getaffinity(0)``); not empty.
    local_rank, local_world_size : int
        See :func:`local_rank`.

    Returns
    -------
    tuple of int
        Sorted, not empty.

    Examples
    --------
    >>> rank_cores(range(8), 1, 2)
    (4, 5, 6, 7)
    >>> rank_cores([0, 1, 2], 1, 2)
    (1, 2)
    >>> rank_cores([0, 1], 2, 3)  # fewer cores than ranks
    (0,)
    """
    cores = sorted(allowed)
    n = len(cores)
    if n < local_world_size:
        return (cores[local_rank % n],)
    return tuple(cores[local_rank * n // local_world_size:
                       (local_rank + 1) * n // local_world_size])


def check_cpu_affinity(cpu_affinity, n_workers):
    """Check ``cpu_affinity=`` up front: ``None`` (where the OS likes),
    ``"auto"`` (worker ``i`` on the ``i``-th core, round robin, of this
    rank's share, :func:`rank_cores`, of the cores this process may use,
    ``os.sched_getaffinity(0)``: all of them but in a distributed run of
    many ranks on this machine, :func:`local_rank`), or one collection of
    cores per worker. Returns it, the collections as tuples.

    Raises
    ------
    ValueError
        This platform has no affinity call (``os.sched_setaffinity``), a
        core this process may not use, not one set per worker, or (for
        ``"auto"``) a local rank that the environment gives wrong.
    TypeError
        Anything else; the message names ``cpu_affinity``.
    """
    if cpu_affinity is None:
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError(f"cpu_affinity={cpu_affinity!r} needs "
                         f"os.sched_setaffinity, which {sys.platform} lacks: "
                         f"leave it None")
    if isinstance(cpu_affinity, str):
        if cpu_affinity != "auto":
            raise ValueError(f"cpu_affinity must be None, 'auto' or one set "
                             f"of cores per worker, got {cpu_affinity!r}")
        local_rank()  # the workers read it again: wrong, say so here
        return cpu_affinity
    try:
        sets = [tuple(sorted(cores)) for cores in cpu_affinity]
    except TypeError:
        raise TypeError(f"cpu_affinity must be None, 'auto' or one set of "
                        f"cores per worker, got {cpu_affinity!r}") from None
    if len(sets) != n_workers:
        raise ValueError(f"cpu_affinity must hold one set of cores per "
                         f"worker ({n_workers}), got {len(sets)}")
    allowed = os.sched_getaffinity(0)
    for cores in sets:
        if not cores or any(isinstance(c, bool) or not isinstance(
                c, numbers.Integral) for c in cores):
            raise TypeError(f"cpu_affinity: each worker's cores must be a "
                            f"non-empty set of ints, got {cores!r}")
        if not set(cores) <= allowed:
            raise ValueError(f"cpu_affinity: cores {sorted(set(cores) - allowed)}"
                             f" are not among those this process may use, "
                             f"{sorted(allowed)}")
    return tuple(sets)


class AutoAffinity(namedtuple("AutoAffinity",
                              "local_rank local_world_size")):
    """``cpu_affinity="auto"`` of the learner of local rank ``local_rank``
    of ``local_world_size``, as its workers get it
    (:func:`worker_cpu_affinity`)."""

    __slots__ = ()


def worker_cpu_affinity(cpu_affinity):
    """What the workers get of a checked ``cpu_affinity``: ``"auto"`` with
    the learner's local rank (an :class:`AutoAffinity` of
    :func:`local_rank`), anything else as it is.

    Read in the learner, so that every worker pins on its learner's share
    whatever its environment: a fork server inherits the environment of
    the moment it started, a Ray actor the raylet's.
    """
    if isinstance(cpu_affinity, str) and cpu_affinity == "auto":
        return AutoAffinity(*local_rank())
    return cpu_affinity


def set_cpu_affinity(cpu_affinity, index):
    """Pin this worker (number ``index``) as ``cpu_affinity`` says (checked
    by :func:`check_cpu_affinity`, the learner's local rank given by
    :func:`worker_cpu_affinity`: ``"auto"`` alone reads this process's);
    returns the cores, or ``None``."""
    if cpu_affinity is None:
        return None
    if isinstance(cpu_affinity, AutoAffinity) or cpu_affinity == "auto":
        ranks = cpu_affinity if isinstance(cpu_affinity, AutoAffinity) \
            else local_rank()
        share = rank_cores(os.sched_getaffinity(0), *ranks)
        cores = {share[index % len(share)]}
    else:
        cores = set(cpu_affinity[index])
    os.sched_setaffinity(0, cores)
    return cores
