"""Workers as Ray actors, both sides (for :mod:`.cluster`).

The Ray counterparts of :mod:`._session`'s worker loop and of
:mod:`._supervisor` (Ray is imported by whoever calls them, never at
import):

- :class:`RemoteWorker`, a Ray actor that drives the worker
  :class:`._session.Session` by method calls: ``start()`` (seed, make
  the envs, reset; returns :class:`Started`, where it runs),
  ``fill(params, calls)`` (keep the ``call_envs`` calls, load the
  parameters if new, apply the calls, collect into its own buffer, return
  ``(Ready, fragment)``), ``close()`` (close the envs, return its count).
  Everything the session raises is returned as a
  :class:`._session.Failed`, never raised through Ray;
- :func:`join`: join a Ray cluster or start a local one, and shut it down
  after the last rollout that started it;
- :class:`RemoteSupervisor`, the learner's side of N such workers:

  - **start** worker ``w`` (generation ``g``): create its Ray actor (the
    protocol's options, never Ray's own restarts) and call ``start()``;
  - **pump**: one ``ray.wait`` on the oldest pending call of every
    worker; the results of each worker's calls go to the protocol in the
    order of its calls (Ray may show a later one first), a
    :class:`._session.Failed` or a Ray error of the call (the actor or
    its node died: :class:`~rlplay.engine.errors.WorkerDied` naming the
    worker, its pid and its node) is a failure;
  - **replace** (``restarts``), under the policy of :mod:`._restarts`
    (the budget, never an actor's exception, no crash loop): kill the
    actor, forget its calls (the fragment being filled is lost) and create
    generation ``g + 1`` after ``restart_delay`` seconds;
  - **shut down**, idempotent and ordered: call ``close()`` on every
    worker and wait for it (and for the fills queued before it) within
    ``shutdown_timeout``; kill every actor; wait, within
    ``shutdown_timeout`` too, until Ray reports them dead (a call of a
    killed actor fails) and the processes of those that ran on this
    machine have exited. ``graceful=False`` goes straight to the kill. The
    queued fills are not cancelled: cancelling a queued call of a Ray
    actor leaves a gap in the sequence of its calls, and Ray 2.60 holds
    every later call (``close()`` here) for 30 s waiting for it.
"""
import contextlib
import enum
import functools
import os
import time
import weakref
from typing import Any, NamedTuple
from collections.abc import Mapping

import torch

from ..errors import WorkerDied
from ..pool import views
from ..utils.mp import ErrorRecord
from ._session import Failed, Ready, Session
from ._control import CallLog, CallMail
from ._restarts import Member, RestartPolicy, reported

__all__ = ["RemoteWorker", "RemoteSupervisor", "Started", "join",
           "ray_options", "ACTOR_OPTIONS"]

# what each worker asks of Ray unless the caller's options say otherwise
ACTOR_OPTIONS = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
# how long one wait of a pump lasts while something may interrupt it
# (``interrupt``: a prefetch thread's commands), which no pipe can wake
# in a ``ray.wait`` (seconds)
INTERRUPT_SLICE = 0.005


class Started(NamedTuple):
    """Where a worker runs: Ray ``node`` id, its ``ip``, the
    actor's ``pid``."""
    node: Any
    ip: Any
    pid: Any


class RemoteWorker:
    """A worker as a Ray actor (see the module docstring).

    Parameters
    ----------
    config : WorkerConfig
        Its ``buffers`` give the layout of the one fragment buffer it
        allocates (``segment`` is ``None``); its ``params`` are ``None``
        (each request carries them).
    """

    def __init__(self, config):
        import ray
        spec = config.spec  # one object in the store for every worker
        if isinstance(spec, ray.ObjectRef):
            spec = ray.get(spec)
        self.session = Session(spec, config.index, config.collector,
                               config.generation, config.seq, config.calls)
        self.layout, self.threads = config.buffers, config.threads
        self.buffer, self.idle_since = None, 0.0

    def start(self):
        import ray
        try:
            self.session.start(self.threads)
            self.buffer = views(torch.zeros(self.layout.stride,
                                            dtype=torch.uint8),
                                self.layout.spec)
            self.session.begin(self.buffer)
        except BaseException as exc:  # noqa: BLE001 - sent to the learner
            return self.session.failure(exc)
        self.idle_since = time.perf_counter()
        return Started(ray.get_runtime_context().get_node_id(),
                       ray.util.get_node_ip_address(), os.getpid())

    def fill(self, params, calls=None):
        tic, session = time.perf_counter(), self.session
        try:
            session.stage = f"collect (fragment {session.ctx.seq})"
            if calls is not None:  # a CallEnvs, applied by fill()
                session.receive(calls)
            version = session.load(params)
            elapsed = session.fill(self.buffer, version)
        except BaseException as exc:  # noqa: BLE001 - sent to the learner
            return session.failure(exc)
        waited, self.idle_since = tic - self.idle_since, time.perf_counter()
        # Ray copies these numpy views into the object store as it returns
        return (Ready(None, session.ctx.seq - 1, version, waited, elapsed,
                      session.calls.applied), self.buffer.npy)

    def close(self):
        seq = None if self.session.ctx is None else self.session.ctx.seq
        self.session.close()
        return seq


@functools.cache
def _remote_class():
    import ray
    return ray.remote(RemoteWorker)


# rollouts on a Ray that rlplay started (shut down after the last one)
_STARTED = {"users": 0}


def join(address=None):
    """Join Ray (``address``, else ``RAY_ADDRESS``, else a new local Ray;
    nothing if this process has joined one already); returns a function
    that releases it (idempotent), shutting Ray down when rlplay started
    it and no other rollout uses it."""
    import ray
    if ray.is_initialized():
        if not _STARTED["users"]:
            return lambda: None  # the caller's Ray
    else:  # a bare ray.init() joins any cluster that a temp file names
        ray.init(address=address if address is not None
                 else os.environ.get("RAY_ADDRESS", "local"))
    _STARTED["users"] += 1
    done = []

    def release():
        if not done:
            done.append(True)
            _STARTED["users"] -= 1
            if not _STARTED["users"] and ray.is_initialized():
                ray.shutdown()
    return release


def ray_options(options):
    """:data:`ACTOR_OPTIONS` updated with ``options`` (a dict), checked."""
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"actor_options must be a dict of options of "
                        f"ray.remote, got {options!r}")
    options = {**ACTOR_OPTIONS, **(options or {})}
    if options.get("max_restarts") or options.get("max_task_retries"):
        raise ValueError(
            "actor_options: rlplay replaces failed workers itself "
            "(restarts=); Ray's max_restarts and max_task_retries would "
            "rerun a worker with the same seeds and repeat its fragments")
    return dict(options, max_restarts=0, max_task_retries=0)


class _Phase(enum.Enum):
    STARTING = "starting"   # its actor is created, start() not returned
    RUNNING = "running"
    DOWN = "down"           # no actor; a replacement is due at ``due``


class _Member(Member):
    """What the supervisor knows of worker ``index``."""

    def __init__(self, index, account):
        super().__init__(index, account)
        self.handle = self.where = None
        self.phase = _Phase.DOWN
        account["node"] = None


def _kill(handles, local_pids, release, timeout):
    """Kill the actors ``handles`` and wait up to ``timeout`` s until Ray
    knows them dead (a call of a killed actor fails) and the processes
    ``local_pids`` (the actors' on this machine) have exited, then
    ``release()`` Ray; plain data only, also the finalizer of a dropped
    generator."""
    import ray
    deadline = time.monotonic() + timeout
    with contextlib.suppress(Exception):
        for handle in handles.values():
            ray.kill(handle, no_restart=True)
        probes = [handle.__ray_ready__.remote() for handle in handles.values()]
        if probes:
            ray.wait(probes, num_returns=len(probes), timeout=timeout)
    # Ray marks an actor dead before its process is gone: wait for those
    # of this machine too, so that none outlives its generator
    while local_pids and time.monotonic() < deadline:
        local_pids.difference_update(
            [pid for pid in local_pids if _gone(pid)])
        if local_pids:
            time.sleep(0.01)
    handles.clear()
    local_pids.clear()
    with contextlib.suppress(Exception):
        release()


def _gone(pid):
    """Whether process ``pid`` has exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:  # no such process (or no /proc: cannot wait for it)
        return True


class RemoteSupervisor(RestartPolicy):
    """Start, watch, replace and shut down N :class:`RemoteWorker` actors.

    Parameters
    ----------
    n_workers : int
    protocol : object
        What the workers serve, with the callbacks of
        :class:`~._supervisor.Supervisor`'s protocol: ``accounts``,
        ``config(w, generation)`` (the :class:`._session.WorkerConfig`
        of worker ``w``'s actor), ``on_started(w)`` (its actor was
        created: the protocol may :meth:`call` it at once, Ray queues the
        calls after ``start``), ``on_message(w, value)`` (a ``fill``
        returned ``value``) and ``on_lost(w)``.
    options : dict
        From :func:`ray_options`.
    release : callable
        From :func:`join`, called at shutdown.
    owner : object, optional
        Whose collection kills the actors and calls ``release`` (the
        supervisor by default): the generator, which the protocol's
        callbacks must not reference.
    restarts, restart_delay, shutdown_timeout, calls
        As for :class:`~._supervisor.Supervisor`; each worker's calls go
        with its ``fill`` requests (``mail.take(w)``, made by the
        protocol: a worker runs its requests in order).

    Attributes
    ----------
    restarts : int
    accounts : list of dict
        The protocol's, extended as :class:`~._supervisor.Supervisor`
        extends them (and with each worker's ``node``).
    pids, nodes : list
        Each worker's pid and Ray node id (``None`` until it started).
    interrupt : object or None
        Set (by a prefetch thread, whose commands interrupt its waits):
        each wait of :meth:`pump` lasts at most :data:`INTERRUPT_SLICE`.
    """

    interrupt = None

    def __init__(self, n_workers, protocol, *, options, release, restarts,
                 restart_delay, shutdown_timeout, owner=None, run=None,
                 calls=None):
        self.members = [_Member(w, protocol.accounts[w])
                        for w in range(n_workers)]
        self.mail = CallMail(calls if calls is not None else CallLog(),
                             n_workers, gated=False)
        RestartPolicy.__init__(self, self.members, restarts, restart_delay,
                               run)
        self.protocol, self.options = protocol, options
        self.shutdown_timeout = shutdown_timeout
        self.pending = {}  # ref -> (member, method), in the order of calls
        self._handles = {}
        self._local_pids = set()  # of the actors on this machine
        import ray
        self._node = ray.get_runtime_context().get_node_id()
        self._finalizer = weakref.finalize(
            self if owner is None else owner, _kill, self._handles,
            self._local_pids, release, shutdown_timeout)

    def start_all(self):
        for member in self.members:
            self._start(member)

    def _start(self, member):
        config = self.protocol.config(member.index, member.generation)
        member.handle = _remote_class().options(**self.options).remote(
            config._replace(calls=self.mail.start(member.index)))
        self._handles[member.index] = member.handle
        member.phase, member.where, member.due = _Phase.STARTING, None, None
        member.delivered = False
        self.call(member.index, "start")
        self.protocol.on_started(member.index)

    def call(self, w, method, *args):
        """Call ``method`` of worker ``w``'s actor (it must have one)."""
        member = self.members[w]
        ref = getattr(member.handle, method).remote(*args)
        self.pending[ref] = (member, method)

    def post_calls(self):
        """Nothing to send: each ``fill`` request carries the calls."""

    def running(self, w):
        """Whether worker ``w`` has an actor (starting or running)."""
        return self.members[w].phase is not _Phase.DOWN

    @property
    def pids(self):
        return [m.where and m.where.pid for m in self.members]

    @property
    def nodes(self):
        return [m.where and m.where.node for m in self.members]

    # ------------------------------------------------------------- pump --
    def pump(self, timeout, what):
        """Wait up to ``timeout`` s (``None``: no bound) for any pending
        call and handle every one that returned; returns how many did (and
        the workers started). Failures not replaced are raised."""
        import ray
        news = self.start_due(self._start)
        timeout = self.until_due(timeout)
        if self.interrupt is not None:
            timeout = INTERRUPT_SLICE if timeout is None \
                else min(timeout, INTERRUPT_SLICE)
        refs = list(self.pending)
        # a worker runs its calls in order, but Ray may show their results
        # out of order (each reply travels on its own): wait on each
        # worker's oldest call only, and take a worker's results in the
        # order of its calls, up to the first one not seen yet
        heads = list({call[0].index: ref for ref, call
                      in reversed(self.pending.items())}.values())
        if not refs:
            time.sleep(timeout or 0.0)
        elif ray.wait(heads, num_returns=1, timeout=timeout)[0]:
            done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            behind = set()  # workers with an earlier call not seen yet
            for ref in refs:
                if ref not in self.pending:  # retired meanwhile
                    continue
                member = self.pending[ref][0]
                if member.index in behind or ref not in done:
                    behind.add(member.index)
                    continue
                news += 1
                self._receive(ref, *self.pending.pop(ref), what)
        return news + self.start_due(self._start)

    def check(self, what):
        """Raise if a worker failed; consumes results (as
        :meth:`Supervisor.check <._supervisor.Supervisor.check>`)."""
        self.pump(0, what)

    def _receive(self, ref, member, method, what):
        import ray
        try:
            value = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # outside the session
            return self._failed(member, Failed(ErrorRecord(exc, method),
                                               False))
        except ray.exceptions.RayError as exc:  # the actor or its node died
            return self._failed(member, self._died(member, exc, what))
        if isinstance(value, Failed):
            return self._failed(member, value)
        if method == "start":
            member.phase, member.where = _Phase.RUNNING, value
            member.account["node"] = value.node
            if value.node == self._node:
                self._local_pids.add(value.pid)
        else:
            member.delivered = True
            self.protocol.on_message(member.index, value)

    @staticmethod
    def _died(member, exc, what):
        where = member.where
        at = "" if where is None else \
            f" (pid {where.pid} on node {where.node} at {where.ip})"
        return WorkerDied(
            f"worker {member.index}{at} died while the learner waited for "
            f"{what}: {type(exc).__name__}: {exc}", worker=member.index,
            node=where and where.node)

    # ---------------------------------------------------------- failure --
    def _failed(self, member, failure):
        if isinstance(failure, Failed):
            self._fail(member, *reported(failure, member.index))
        else:
            self._fail(member, failure, True, f"WorkerDied: {failure}")
        self._retire(member)
        self._replace(member, self.protocol.on_lost(member.index))

    def _retire(self, member):
        import ray
        with contextlib.suppress(Exception):
            ray.kill(member.handle, no_restart=True)
        self.pending = {ref: call for ref, call in self.pending.items()
                        if call[0] is not member}
        self._handles.pop(member.index, None)
        member.handle, member.phase = None, _Phase.DOWN

    # --------------------------------------------------------- shutdown --
    def shutdown(self, graceful=True):
        """Stop every worker in the order of the module docstring;
        idempotent."""
        if self.closed:
            return
        self.closed = True
        live = [m for m in self.members if m.handle is not None]
        if graceful and live:
            self._finish(live)
        for member in live:
            member.handle, member.phase = None, _Phase.DOWN
        self.pending.clear()
        self._finalizer()  # kills them all, then releases Ray

    def _finish(self, live):
        # a fill that still returns is counted as received (and discarded)
        import ray
        fills = [ref for ref, (_, method) in self.pending.items()
                 if method == "fill"]
        closing = {m.handle.close.remote(): m for m in live}
        refs = fills + list(closing)
        done = ray.wait(refs, num_returns=len(refs),
                        timeout=self.shutdown_timeout)[0]
        for ref in done:
            try:
                value = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # the actor is gone
            if ref in closing:
                closing[ref].account["collected"] = value
            elif not isinstance(value, Failed):
                self.pending[ref][0].account["received"] += 1
