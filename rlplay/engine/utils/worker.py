"""One worker process and its pipe, seen from both ends.

Learner side, :class:`WorkerProcess` starts a daemonic worker with a duplex
pipe, receives from it with a bounded wait that watches the worker's
sentinel (:func:`rlplay.engine.utils.mp.recv`), and shuts it down in order.
Worker side, :class:`LearnerLink` waits for the learner's next order while
checking that the learner is still alive, so an orphaned worker exits on
its own.

Shutdown order (:meth:`WorkerProcess.close`, idempotent):

1. send :data:`STOP` (a broken pipe is ignored: the worker may be gone);
2. join the worker within ``timeout`` seconds (it finishes the fragment or
   the evaluation in progress, closes its envs and returns);
3. ``SIGTERM``, then ``SIGKILL``, each followed by a short join
   (:func:`rlplay.engine.utils.mp.join_or_kill`);
4. close the learner's end of the pipe and release the process object
   (its sentinel); shared memory is freed when the owner drops its tensors.

Workers are daemonic: should the interpreter exit with one still running,
:mod:`multiprocessing` terminates it at exit instead of waiting for it.

Both ends of a generator's set-up live here too: :func:`probe_layout` sizes
the buffers in the learner from a probe env, and :func:`start_worker` is the
prelude of every worker entry point.

A worker started with ``forkserver`` is forked from a server process that
imports :data:`FORKSERVER_PRELOAD` once (:func:`preload_forkserver`), so a
worker starts in milliseconds instead of importing torch anew.
"""
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal

import cloudpickle
import torch

from .mp import POLL_INTERVAL, WorkerDied, join_or_kill, recv
from ..seeds import seed_worker

__all__ = [
    "STOP",
    "FORKSERVER_PRELOAD",
    "Cloudpickled",
    "WorkerProcess",
    "LearnerLink",
    "preload_forkserver",
    "ignore_interrupts",
    "start_worker",
]

# the order that ends a worker
STOP = "stop"

# modules the forkserver imports once, before forking any worker
FORKSERVER_PRELOAD = ("torch", "numpy", "gymnasium", "rlplay.engine")

# how long a worker that closed its pipe may take to exit (seconds)
EXIT_TIMEOUT = 1.0



class Cloudpickled:
    """An object pickled with cloudpickle now, unpickled by :meth:`load`.

    Unlike :class:`rlplay.engine.utils.mp.CloudpickleWrapper`, the object is
    not rebuilt while the worker process starts, but when the worker calls
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


class WorkerProcess:
    """A started worker and the learner's end of its pipe.

    Parameters
    ----------
    ctx : multiprocessing context
    target : callable
        The worker's entry point, called as ``target(conn, *args)`` with the
        worker's end of the pipe; module-level, so that every start method
        can find it.
    args : tuple
        Picklable start arguments (shared tensors travel as handles).
    name : str
        The process name.

    Attributes
    ----------
    process : multiprocessing.Process
    pid : int
    """

    def __init__(self, ctx, target, args, *, name):
        preload_forkserver(ctx)
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=target, args=(child_conn, *args),
                                   name=name, daemon=True)
        try:
            self.process.start()
        except BaseException:
            self.conn.close()
            raise
        finally:
            # only the worker holds its end now: when the worker is gone,
            # the learner's end sees EOF
            child_conn.close()
        self.pid = self.process.pid
        self.closed = False
        self._owner = os.getpid()

    def send(self, message):
        """Send ``message``; a broken pipe is ignored (the next
        :meth:`recv` or :meth:`poll` says why the worker is gone)."""
        try:
            self.conn.send(message)
        except (OSError, EOFError):  # BrokenPipeError, ConnectionResetError
            pass

    def recv(self, timeout, *, what):
        """The next message, waiting at most ``timeout`` seconds.

        Raises ``WorkerDied`` or ``RolloutTimeout``, see
        :func:`rlplay.engine.utils.mp.recv`.
        """
        return recv(self.conn, [self.process], timeout, what=what, worker=0)

    def poll(self, *, what):
        """The next message if one is there, else ``None``; never waits.

        Raises ``WorkerDied`` if the worker is gone with nothing more to say.
        """
        if self.conn.poll() or not self.process.is_alive():
            # a message, its last words, or an EOF followed by its exit
            return self.recv(EXIT_TIMEOUT, what=what)
        return None

    def check_alive(self, what="the worker"):
        """Raise ``WorkerDied`` if the worker has exited; consumes nothing
        (a liveness check for waits that are not on the pipe)."""
        if not self.process.is_alive():
            self.process.join(0)
            raise WorkerDied.of(self.process, 0, what)

    def close(self, timeout):
        """Stop the worker in the order of the module docstring."""
        if self.closed or os.getpid() != self._owner:
            return  # done, or a forked copy of the learner: not its worker
        self.closed = True
        try:
            self.send(STOP)
            join_or_kill([self.process], timeout)
        finally:
            self.conn.close()
            if self.process.exitcode is not None:
                self.process.close()  # its sentinel; refused while it runs


class LearnerLink:
    """The worker's end of the pipe, watching that the learner lives.

    The learner is gone when the pipe reaches EOF, when the parent process's
    sentinel fires (see :func:`multiprocessing.parent_process`), or when this
    process was re-parented (its parent pid changed).
    """

    def __init__(self, conn):
        self.conn = conn
        parent = multiprocessing.parent_process()
        self.sentinels = [conn] + ([parent.sentinel] if parent is not None
                                   and parent.sentinel is not None else [])
        self.ppid = os.getppid()

    def alive(self):
        """Whether the learner seems alive (cheap; checked every poll)."""
        return os.getppid() == self.ppid

    def check(self):
        """Raise ``SystemExit`` if the learner is gone (a liveness check
        for waits that are not on the pipe)."""
        if not self.alive():
            raise SystemExit("the learner is gone")

    def poll(self):
        """Whether an order (or the learner's end) is waiting, so that
        :meth:`recv` returns at once; never waits."""
        return bool(multiprocessing.connection.wait(self.sentinels, 0)) \
            or not self.alive()

    def recv(self):
        """The learner's next order, or ``None`` when it says :data:`STOP`
        or is gone.

        The wait has no deadline, since the learner may train for as long
        as it likes, but it ends within :data:`POLL_INTERVAL` of the
        learner's death.
        """
        while True:
            ready = multiprocessing.connection.wait(self.sentinels,
                                                    POLL_INTERVAL)
            if self.conn in ready:
                try:
                    order = self.conn.recv()
                except (EOFError, OSError):
                    return None
                return None if order == STOP else order
            if ready or not self.alive():
                return None  # the parent's sentinel fired

    def send(self, message):
        """Send ``message``; ``False`` if the learner is gone."""
        try:
            self.conn.send(message)
            return True
        except (OSError, EOFError):
            return False

    def close(self):
        self.conn.close()


def ignore_interrupts():
    """Let the learner handle Ctrl-C: a terminal sends ``SIGINT`` to the
    whole process group, and the worker should stop in order when the
    learner closes it, not die in the middle of a step."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_worker(seed_sequence, factory, actor, n_threads=1):
    """The prelude of a worker entry point; returns ``(factory, actor)``.

    Leaves ``SIGINT`` to the learner (:func:`ignore_interrupts`), runs torch
    on ``n_threads`` threads (one per worker, as torch's DataLoader workers
    do: the learner and the other workers share the cores), seeds the
    global generators from the collector's ``seed_sequence``
    (:func:`rlplay.engine.utils.seed_worker`) and loads the
    :class:`Cloudpickled` ``factory`` and ``actor``. Call it inside the
    worker's error handling, so that a factory or actor that cannot be
    rebuilt is reported as a :class:`WorkerError`.
    """
    ignore_interrupts()
    torch.set_num_threads(n_threads)
    seed_worker(seed_sequence)
    return factory.load(), actor.load()
