"""The learner side of N worker processes: start, watch, replace, shut down.

A :class:`Supervisor` runs the workers of one generator and owns
everything about them that is not protocol. The protocol is an object
that it serves (the same callbacks as :class:`~._ray.RemoteSupervisor`
calls): ``accounts`` (a dict per worker, which the supervisor extends),
``config(w, generation)`` (worker ``w``'s
:class:`._session.WorkerConfig`), ``on_started(w)``, ``on_message(w,
message)`` and ``on_lost(w)`` (worker ``w`` is retired for a restart:
the number of fragments it had in flight, which the protocol reclaims).


- **start** worker ``w`` (generation ``g``) with a fresh duplex pipe, as an
  ordinary, non-daemonic process (an env may start processes of its own),
  with every ``call_envs`` call published so far (:mod:`._control`);
- **post** the calls published since to the workers (:meth:`post_calls`,
  under the flow control of :class:`~._control.CallMail`);
- **pump**: one bounded wait on every pipe and every process sentinel,
  of at most :data:`POLL_INTERVAL` at a time; messages go to the
  protocol, a :class:`._session.Failed` report or a silent death
  (SIGKILL, ``os._exit``, segfault) is a failure. A death is seen on the
  sentinel, or by ``waitpid`` after each wait
  (:func:`~rlplay.engine.utils.mp.ended`): under ``fork`` and ``spawn``
  the processes that the worker's envs fork inherit its end of the
  sentinel (and of its pipe), which stay silent while they live;
- **replace** a failed worker (opt-in, ``restarts``, a budget for the
  run): retire it (terminate it, release the parameter lock it may have
  died holding, close its pipe), let the protocol reclaim the fragments it
  had in flight (discarded, never delivered in part), and start generation
  ``g + 1`` after ``restart_delay`` seconds with seeds of its own. An
  exception raised by the actor (or by rlplay's checks of what the actor
  and the envs return) is never restarted; neither is a crash loop (two
  generations of one worker in a row that failed before delivering
  anything), nor anything once the budget is spent: the failure is raised,
  with the count ("... after 2 restarts");
- **shut down**, idempotent and ordered: send ``STOP`` to every worker;
  join them within ``shutdown_timeout`` while reading their last messages
  (each finishes what it is doing, closes its envs and says ``Bye``);
  ``SIGTERM``, then ``SIGKILL``, the ones left; then ``SIGKILL`` what is
  left of each worker's process group (the processes its envs started:
  see :func:`~rlplay.engine.utils.mp.guard_group`); close the pipes.
  After a failure the learner does not wait for the workers' cooperation:
  ``graceful=False`` goes straight to ``SIGTERM``. A worker retired for a
  restart takes its group with it alike.

The supervisor registers its shutdown with :mod:`multiprocessing`'s exit
handler at a priority that runs before that handler joins the remaining
non-daemonic children, so an interpreter that exits without closing the
generator stops its workers instead of waiting for them.
"""
import multiprocessing.connection
import multiprocessing.util
import os
import sys
import threading
import time

from ..errors import WorkerDied
from ..utils.mp import (POLL_INTERVAL, ended, join_or_kill,
                        preload_forkserver, wait_ended)
from ._session import STOP, Bye, Failed, Ready, Result, main
from ._control import CallMail
from ._restarts import Member, RestartPolicy, reported

__all__ = ["Supervisor", "EXIT_PRIORITY"]

# multiprocessing runs finalizers of priority >= 0 before joining children
EXIT_PRIORITY = 10
# how long a worker that reported a failure may take to exit on its own
# before it is terminated (seconds)
RETIRE_TIMEOUT = 0.2


class _Worker(Member):
    """What the supervisor knows of worker ``index``."""

    def __init__(self, index, account):
        super().__init__(index, account)
        self.process = self.conn = None
        self.pid, self.eof = None, False
        self.heard = False          # anything received from this process
        self.deferred = None        # a failure held back (False: it died)


class Supervisor(RestartPolicy):
    """Start, watch, replace and shut down the workers of a generator.

    Parameters
    ----------
    ctx : multiprocessing context
    n_workers : int
    protocol : object
        What the workers serve (see the module docstring).
    name : str
        Process names are ``f"{name}-{w}"``.
    params : SharedParams, optional
        Whose lock a dead worker may hold.
    restarts : int
        The budget of replacements for the run.
    restart_delay : float
        Seconds before a replacement starts.
    shutdown_timeout : float
    calls : CallLog, optional
        The generator's ``call_envs`` calls, which the workers get.

    Attributes
    ----------
    accounts : list of dict
        The protocol's, per worker, extended with ``restarts``, ``lost``
        fragments and the ``last_cause`` (``"type: message"``) of its last
        failure.
    restarts : int
        Replacements so far.
    interrupt : int or None
        A file descriptor that ends a wait of :meth:`pump` when it
        becomes readable (a prefetch thread's wake-up pipe, read by its
        owner: ``rlplay.engine.rollout._prefetch``); ``None``: none.
    """

    interrupt = None

    def __init__(self, ctx, n_workers, protocol, *, name, params=None,
                 restarts, restart_delay, shutdown_timeout, run=None,
                 calls=None):
        preload_forkserver(ctx)
        self.ctx, self.protocol = ctx, protocol
        self.name, self.params = name, params
        self.shutdown_timeout = shutdown_timeout
        self.workers = [_Worker(w, protocol.accounts[w])
                        for w in range(n_workers)]
        self.mail = None if calls is None else CallMail(calls, n_workers,
                                                        gated=True)
        RestartPolicy.__init__(self, self.workers, restarts, restart_delay,
                               run)
        self._owner = os.getpid()
        # the parent-death signal follows the thread that forks (see
        # utils.mp.guard_parent): safe from the main thread or the server
        self._pdeathsig = (ctx.get_start_method() == "forkserver" or
                           threading.current_thread() is
                           threading.main_thread())
        self._finalizer = multiprocessing.util.Finalize(
            self, Supervisor._shutdown,
            args=(self.workers, shutdown_timeout, True),
            exitpriority=EXIT_PRIORITY)

    # ------------------------------------------------------------ start --
    def start_all(self):
        """Start every worker (generation 0)."""
        for wk in self.workers:
            self._start(wk)

    def _config(self, wk):
        """Worker ``wk``'s start bundle: the protocol's, with the calls
        published so far."""
        config = self.protocol.config(wk.index, wk.generation)
        if self.mail is not None:
            config = config._replace(calls=self.mail.start(wk.index))
        return config

    def _spawn(self, wk, target, config, name):
        """Start ``target(conn, config, pdeathsig)`` in a process named
        ``name``, on a fresh duplex pipe whose other end ``wk`` keeps
        (with the process and its pid)."""
        conn, child = self.ctx.Pipe(duplex=True)
        process = self.ctx.Process(
            target=target, args=(child, config, self._pdeathsig),
            name=name, daemon=False)
        try:
            process.start()
        except BaseException:
            conn.close()
            raise
        finally:
            # only the process holds its end now: when it is gone, ours
            # sees EOF
            child.close()
        wk.process, wk.conn, wk.pid = process, conn, process.pid
        wk.eof = False

    def _start(self, wk):
        self._spawn(wk, main, self._config(wk), f"{self.name}-{wk.index}")
        wk.heard = wk.delivered = False
        wk.due = wk.deferred = None
        self.protocol.on_started(wk.index)

    @property
    def pids(self):
        return [wk.pid for wk in self.workers]

    # ------------------------------------------------------------- pump --
    def pump(self, timeout, what):
        """Wait up to ``timeout`` s (``None``: no bound) for news from any
        worker and handle it; returns the number of messages handled (and
        replacements started).

        Raises
        ------
        WorkerError, WorkerDied
            A worker failed and is not to be replaced.
        """
        for wk in self.workers:
            if wk.deferred is not None:  # news delivered before a failure
                failed, wk.deferred = wk.deferred, None
                self._failed(wk, failed or None, what)
                return 1
        news = self.start_due(self._start)
        live = [wk for wk in self.workers if wk.process is not None]
        waits = [wk.conn for wk in live if not wk.eof] + [
            wk.process.sentinel for wk in live]
        if self.interrupt is not None:  # ends the wait, read by its owner
            waits.append(self.interrupt)
        timeout = self.until_due(timeout)
        if waits:  # at most one poll: a silent sentinel is no proof of life
            timeout = POLL_INTERVAL if timeout is None \
                else min(timeout, POLL_INTERVAL)
        ready = multiprocessing.connection.wait(waits, timeout) if waits \
            else time.sleep(timeout or 0) or []
        for wk in live:
            if wk.process is None:
                continue  # retired while draining another worker
            if wk.conn in ready:
                news += self._drain(wk, what)
            if wk.process is not None and (wk.process.sentinel in ready
                                           or ended(wk.process)):
                drained = self._drain(wk, what)
                if wk.process is not None and wk.deferred is None:
                    if drained:  # deliver those first, fail on the next pump
                        wk.deferred = False
                    else:
                        self._failed(wk, None, what)
                news += drained
        return news + self.start_due(self._start)

    def check(self, what):
        """Raise if a worker failed (a liveness check for waits that are not
        on the pipes, such as the parameter lock); consumes messages."""
        self.pump(0, what)

    def post_calls(self):
        """Send each live worker the calls published that it may get now
        (:meth:`~._control.CallMail.take`)."""
        for wk in self.workers if self.mail is not None else ():
            order = wk.process is not None and self.mail.take(wk.index)
            if order:
                self.send(wk.index, order)

    def send(self, w, order):
        """Send ``order`` to worker ``w``; a worker found gone is a
        failure (raised, or replaced: then the order is void)."""
        wk = self.workers[w]
        try:
            wk.conn.send(order)
        except (OSError, EOFError):
            drained = self._drain(wk, "an order to be taken")
            if wk.process is not None and wk.deferred is None:
                if drained:
                    wk.deferred = False
                else:
                    self._failed(wk, None, "an order to be taken")

    def _drain(self, wk, what):
        news, generation = 0, wk.generation
        try:
            while wk.generation == generation and not wk.eof \
                    and wk.conn.poll():
                message = wk.conn.recv()
                wk.heard = True
                if isinstance(message, Failed):
                    if news:  # deliver those first, fail on the next pump
                        wk.deferred = message
                        return news
                    self._failed(wk, message, what)
                    return news + 1
                if not isinstance(message, Bye):
                    wk.delivered = True
                if isinstance(message, (Ready, Result)) and \
                        self.mail is not None:
                    self.mail.applied_by(wk.index, message.control)
                news += 1
                self.protocol.on_message(wk.index, message)
        except (EOFError, OSError):
            wk.eof = True
        return news

    # ---------------------------------------------------------- failure --
    def _failed(self, wk, failed, what):
        if failed is not None:
            self._fail(wk, *reported(failed, wk.index))
        else:
            wait_ended([wk.process], POLL_INTERVAL)  # its exit code, if on
            # its way
            exc = WorkerDied.of(wk.process, wk.index, what)
            if not wk.heard and wk.process.exitcode == 1:
                exc.args = (exc.args[0] + _start_up_hint(self.ctx),)
            self._fail(wk, exc, True, f"WorkerDied: {exc}")
        self._retire(wk)
        self._replace(wk, self.protocol.on_lost(wk.index))

    def _retire(self, wk):
        process, pid = wk.process, wk.pid
        join_or_kill([process], RETIRE_TIMEOUT, groups=True)
        if self.params is not None:
            self.params.recover(pid)
        wk.conn.close()
        process.close()
        wk.process = wk.conn = None

    # --------------------------------------------------------- shutdown --
    def shutdown(self, graceful=True):
        """Stop every worker in the order of the module docstring;
        idempotent. ``graceful=False`` does not wait for them."""
        if self.closed:
            return
        self.closed = True
        if graceful:
            self._finalizer()
        else:
            self._finalizer.cancel()
            Supervisor._shutdown(self.workers, 0.0, False,
                                 owner=self._owner)

    @staticmethod
    def _shutdown(workers, timeout, graceful, owner=None):
        # a staticmethod of plain data: the finalizer holds no reference to
        # the supervisor (or it would never be collected)
        if owner is not None and owner != os.getpid():
            return  # a forked copy of the learner: not its workers
        live = [wk for wk in workers if wk.process is not None]
        for wk in live:
            try:
                wk.conn.send(STOP)
            except (OSError, EOFError):
                pass
        if graceful:
            deadline = time.monotonic() + timeout
            running = list(live)
            while running and time.monotonic() < deadline:
                waits = [wk.process.sentinel for wk in running] + [
                    wk.conn for wk in running if not wk.eof]
                ready = multiprocessing.connection.wait(
                    waits, min(POLL_INTERVAL,
                               max(0.0, deadline - time.monotonic())))
                for wk in list(running):
                    if wk.conn in ready:
                        _discard(wk)
                    if wk.process.sentinel in ready or ended(wk.process):
                        running.remove(wk)
        join_or_kill([wk.process for wk in live], 0.0, groups=True)
        for wk in live:
            _discard(wk)
            wk.conn.close()
            try:
                wk.process.close()
            except ValueError:  # unkillable: keep the object
                pass
            wk.process = wk.conn = None


def _discard(wk):
    # at shutdown: read what is left (unblocks a worker writing to a full
    # pipe); errors are moot now; fragments still arriving count as
    # received (to be discarded), the worker's last count is kept
    try:
        while not wk.eof and wk.conn.poll():
            message = wk.conn.recv()
            if isinstance(message, Ready) and "received" in wk.account:
                wk.account["received"] += 1
            elif isinstance(message, Bye):
                wk.account["collected"] = message.seq
    except (EOFError, OSError):
        wk.eof = True


def _start_up_hint(ctx):
    # a spawned or forkserver worker re-imports the main script; without
    # the guard it starts a generator again while bootstrapping and exits
    # with code 1 before saying anything
    if ctx.get_start_method() == "fork":
        return ""
    main_module = sys.modules.get("__main__")
    if getattr(main_module, "__file__", None) is None:
        return ""
    return (f" during its start-up: under the {ctx.get_start_method()!r} "
            f"start method a worker imports the main script "
            f"{main_module.__file__!r} again, so a script must create "
            f"generators under `if __name__ == \"__main__\":` (or use "
            f"start_method='fork')")
