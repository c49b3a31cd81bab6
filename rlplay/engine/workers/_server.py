"""Served inference: one member runs the actor for every worker of a pool.

The workers of a served ``multi.rollout`` step envs only. Their fragment
loop calls a :class:`~rlplay.engine.policy.ServedPolicy`, whose requests
name rows of the shared pool (buffer, row, ``seq`` and kind, written into
the group's doorbell slot, :mod:`._doors`); the *server*, a process that
the :class:`ServedSupervisor` runs beside the workers, maps the same
pool, gathers the rows of the requests it serves (``obs`` and the rest of
the state row, ``hx`` from the group's in slot), calls the actor once on
their concatenation (once per parameter version and kind in the batch),
writes the actions, ``info`` and ``hx_next`` back into the rows and the
out slots and answers each request in its slot with the version that
acted. Each side spins a little for the other, then sleeps on the pipe
between them (one per group), where the other side rings a byte: nothing
else crosses the pipes.

Timeline (one worker, ``groups=2``; ``g0``/``g1`` its env groups, each
stepped by a thread of its own while the server computes the other's
actions)::

    learner               server                       worker w
    -------               ------                       --------
    start server ───────► map pool, actor on device
    start w, Attach(w) ─► (w's pipes, one per group)    make envs, reset
                                                   ◄── ask g0 row 0
                                                   ◄── ask g1 row 0
                          pin v for (w, seq): latest
                          (at its first request served)
                          serve g0 of every worker:
                          act, info, hx into rows ───► g0: step its envs
                          serve g1 of every worker:    (g1 waits)
                          act, info, hx into rows ◄─── ask g0 row 1
                                                  ───► g1: step its envs
                          serve g0 of every worker ◄── ask g1 row 1
                          ...                          ...
                                                       fragment done:
                                                       Ready(b, seq, v) to
                                                       the learner
    retire w: Drop(w) ──► drop w's pipes and requests
    close(): STOP ──────► Bye

Batching (``deadline``): in lock-step (``None``) the server serves the
groups in turn, ``g0`` then ``g1`` then ``g0``..., each once every
*collecting* worker has asked for it: a worker collects from its first
request until it says it is idle (an :data:`~._doors.IDLE` request: it
holds no buffer and waits for the learner). So the batches are the same
from run to run, and a sampling actor's draws too, as long as no worker
waits for a buffer (enough buffers for the batches the learner takes). With a deadline
(seconds), a group is served as soon as every collecting worker asked for
it, and whatever has arrived is served once the oldest request waited
``deadline``: batches form from what is there.

Versions: the server pins, for each worker and fragment, the latest
published version when it serves the fragment's first request (loading it
from :class:`~._params.SharedParams` into a copy of its own), keeps the
versions still pinned, and splits a batch into one forward call per
version: every action of a fragment comes from the version its
``meta.version`` records. Without ``max_lag`` (:attr:`ServeOptions.share`)
a fragment that starts while others run with the version just before the
latest takes theirs, so that workers out of step keep one call a round.

Faults: the server is supervised like a worker. An exception is reported
(:class:`~._messages.Failed`, never restarted: it is the actor's, or
rlplay's) and raised in the learner as a
:class:`~rlplay.engine.errors.WorkerError` naming the server; a death as
:class:`~rlplay.engine.errors.WorkerDied` naming it. A worker that dies
is retired by the supervisor, which tells the server to drop it
(:class:`~._messages.Drop`) before its replacement attaches with pipes of
its own. A worker whose server is gone waits for the learner's ``STOP``.
The server exits within a second of the learner's death, as workers do.

Devices: the server initialises CUDA (on ``device``), never a worker;
rows go to the device through :class:`~rlplay.engine.policy.DevicePolicy`
(page-locked staging, non-blocking copies).
"""
import copy
import multiprocessing
import multiprocessing.connection
import multiprocessing.reduction
import select
import time
from typing import Any, NamedTuple, Optional

import torch

from ..errors import WorkerDied, describe_exitcode
from ..nested import flatten, getitem, suply
from ..policy import DevicePolicy, FeedForwardPolicy, as_policy
from ..pool import Segment, layout, views
from ..seeds import collector_seed_sequence, seed_worker
from ..shared import copy_
from ..utils.mp import (POLL_INTERVAL, Cloudpickled, ErrorRecord, ended,
                        guard_group, guard_parent, ignore_interrupts,
                        wait_ended)
from ._doors import (ANS, BUFFER, FIRST_SLEEP, IDLE, KIND, REQ, SLEEPING,
                     SPIN_SECONDS, VERSION, WRITING, Doors, drain, fence,
                     ring, spin)
from ._messages import (STEP, Attach, Buffers, Bye, Drop, Failed, Request,
                        ServeLink)
from ._grouped import hx_slot
from ._restarts import reported
from ._session import LearnerLink
from ._supervisor import Supervisor, _Worker, EXIT_PRIORITY

__all__ = ["ServedSupervisor", "ServeOptions", "ServerConfig", "serve_main",
           "SERVER_COLLECTOR", "SERVED_STATS", "hx_slots"]

# the server's place in the seeding tree (its torch generator: a sampling
# actor's draws), beside the probe's and the evaluator's
SERVER_COLLECTOR = 2**31 - 3
# the counters the server keeps in shared memory, in this order
SERVED_STATS = ("served_calls", "served_rows", "time_serve_busy",
                "time_serve_forward")


class ServeOptions(NamedTuple):
    """How a pool is served (made by keyword).

    groups : int
        Env groups per worker.
    deadline : float or None
        ``None``: lock-step; else the longest a request waits for others.
    device : torch.device
        Where the server runs the actor.
    actor : Cloudpickled
        The actor (a CPU copy).
    entropy : SeedSequence
    hx : nested tensors or None
        One group's ``hx`` (a template), ``None`` for an actor without.
    hx_dim : int
    threads : int
        The server's torch threads (on the CPU).
    share : bool
        A fragment that starts while other workers' fragments run with
        the version before the latest takes theirs (``max_lag=None``).
    """
    groups: int
    deadline: Optional[float]
    device: Any
    actor: Any
    entropy: Any
    hx: Any
    hx_dim: int
    threads: int = 1
    share: bool = False


class ServerConfig(NamedTuple):
    """The server's start bundle (made by keyword): its
    :class:`ServeOptions`, the pool (:class:`~._messages.Buffers`), the
    ``hx`` slots (``Buffers`` or ``None``), the shared parameters, the
    counters (:data:`SERVED_STATS`, a shared array) and the number of
    workers."""
    options: ServeOptions
    buffers: Buffers
    hx: Any
    params: Any
    counters: Any
    n_workers: int
    doors: Any = None


def hx_slots(hx, n_workers, groups):
    """The shared ``hx`` slots of every worker's groups, in and out
    (:class:`~._messages.ServeLink`), laid out as ``hx`` (one group's):
    a :class:`~._messages.Buffers`, or ``None`` for an actor without
    ``hx``."""
    if hx is None or not flatten(hx):
        return None
    spec, stride = layout(hx)
    segment = Segment.create(stride * n_workers * groups * 2,
                             what="the served actor's hx slots")
    return Buffers(segment, spec, stride)


# ----------------------------------------------------------- the server --

class _Server:
    """The server's state (see the module docstring)."""

    def __init__(self, config, link):
        self.config, self.link = config, link
        self.options = options = config.options
        self.groups, self.deadline = options.groups, options.deadline
        self.device = torch.device(options.device)
        self.stage = "start-up"
        self.conns = {}        # (w, g): the server's end of the pipe
        # every worker collects from the start (lock-step waits for the
        # first requests of all, whichever is attached first)
        self.collecting = set(range(config.n_workers))
        self.pending = [{} for _ in range(self.groups)]  # w: (req, t)
        self.pins = {}         # w: (seq, version)
        self.models = {}       # version: policy
        self._spare = []       # policies let go, loaded again later
        self._learner = None   # a poll object on the learner's pipe
        self.turn = 0          # lock-step: the group served next
        n_slots = config.n_workers * self.groups
        self.doors = config.doors
        self.gen = [-1] * n_slots   # the generation attached to each slot
        self.seen = [0] * n_slots   # the count taken last from each
        self.counts = {}       # (w, g): the count of the request served
        self._req = None if config.doors is None else \
            config.doors.slots[:, REQ]
        self.totals = [0, 0, 0.0, 0.0]  # SERVED_STATS
        self._nap = FIRST_SLEEP
        self._views, self._slots = {}, {}
        self.counters = config.counters

    def start(self):
        options = self.options
        torch.set_num_threads(options.threads)
        seed_worker(collector_seed_sequence(options.entropy,
                                            SERVER_COLLECTOR, 0))
        base = options.actor.load() if isinstance(
            options.actor, Cloudpickled) else options.actor
        for param in base.parameters():
            param.requires_grad_(False)
        self.base = base.to(self.device)
        segment, spec, stride = self.config.buffers
        self.buffers = [views(segment.flat, spec, i * stride).pyt
                        for i in range(segment.nbytes // stride)]
        self.B = self.buffers[0].state.fin.shape[1] // self.groups

    # ------------------------------------------------------------ loop --
    def run(self):
        while True:
            self.stage = "waiting"
            if not self._orders():
                return
            if not spin(self._scan, min(SPIN_SECONDS, self._timeout())):
                self._sleep()
            while True:
                batch = self._due()
                if not batch:
                    break
                self._serve(batch)

    def _sleep(self):
        """Sleep on the workers' pipes and the learner's (the server's flag
        set, :mod:`._doors`) until a ring, an order, the deadline of a
        pending request or a timeout, then take what arrived."""
        header = self.doors.header
        header[0] = 1
        fence()
        try:
            if self._scan():
                return
            waits = list(self.conns.values()) + self.link.sentinels
            nap = self._nap
            ready = multiprocessing.connection.wait(
                waits, min(self._timeout(), nap))
            self._nap = FIRST_SLEEP if ready else min(2 * nap, POLL_INTERVAL)
            for key, conn in list(self.conns.items()):
                if conn in ready and not drain(conn):
                    self._gone(key)
            self._scan()
        finally:
            header[0] = 0

    def _scan(self):
        """Take the requests counted in the slots since the last scan (of
        the generation attached to each slot; another's count is passed
        over); how many."""
        counts = self._req.tolist()
        seen = self.seen
        if counts == seen:
            return 0
        slots, gen, taken = self.doors.slots, self.gen, 0
        for i, count in enumerate(counts):
            if count == seen[i] or count == WRITING:
                continue  # nothing new, or fields being written
            slot = slots[i]
            fields = slot[BUFFER:KIND + 1].tolist()
            if int(slot[REQ]) != count:
                continue  # written since: taken at a later scan
            seen[i] = count
            if count >> 32 != gen[i]:
                continue  # a retired generation's
            taken += 1
            w, g = divmod(i, self.groups)
            buffer, row, seq, kind = fields
            if kind == IDLE:
                self.collecting.discard(w)
            else:
                self._pending(w, Request(buffer, row, g, seq, kind), count)
        return taken

    def _orders(self):
        """Take the learner's orders; ``False`` at ``STOP`` or when the
        learner is gone."""
        link = self.link
        if self._learner is None:  # one poll object: a call a round
            self._learner = select.poll()
            self._learner.register(link.conn.fileno(), select.POLLIN)
        while self._learner.poll(0) or not link.alive():
            order = link.recv()
            if order is None:
                link.send(Bye(0))
                return False
            if isinstance(order, Attach):
                for g in range(self.groups):
                    fd = multiprocessing.reduction.recv_handle(link.conn)
                    self.conns[order.worker, g] = \
                        multiprocessing.connection.Connection(fd)
                self.collecting.add(order.worker)
                for i in range(order.worker * self.groups,
                               (order.worker + 1) * self.groups):
                    self.gen[i], self.seen[i] = order.generation, 0
            elif isinstance(order, Drop):
                self._drop(order.worker)
        return True

    def _drop(self, w):
        for g in range(self.groups):
            conn = self.conns.pop((w, g), None)
            if conn is not None:
                conn.close()
            self.pending[g].pop(w, None)
        self.collecting.discard(w)
        self.pins.pop(w, None)
        for i in range(w * self.groups, (w + 1) * self.groups):
            self.gen[i] = -1

    def _timeout(self):
        if self.deadline is None:
            return POLL_INTERVAL
        oldest = [t for pending in self.pending
                  for _, t, _ in pending.values()]
        if not oldest:
            return POLL_INTERVAL
        return min(POLL_INTERVAL, max(0.0, min(oldest) + self.deadline
                                      - time.monotonic()))

    def _gone(self, key):
        """A worker's pipe at its EOF: the worker is gone (the learner
        retires it: Drop)."""
        w, g = key
        self.conns.pop(key).close()
        self.collecting.discard(w)
        self.pending[g].pop(w, None)

    def _pending(self, w, request, count=0):
        # the time of arrival: the deadline's (lock-step waits for none)
        self.pending[request.group][w] = (
            request, 0.0 if self.deadline is None else time.monotonic(),
            count)
        self.collecting.add(w)

    def _pinned(self, batch):
        """``[(w, g, request, version)]``: a fragment's first request
        served pins the version published last for the whole fragment
        (the workers of a lock-step round that begin fragments share
        it). With ``share``, a fragment that starts while other collecting
        workers' fragments run with the version before the latest takes
        their version: workers whose fragments do not start in the same
        round (one waited for a buffer) keep one actor call a round, for
        at most one version more of lag."""
        latest, pinned = None, []
        for w, g, request in batch:
            pin = self.pins.get(w)
            if pin is None or pin[0] != request.seq:
                if latest is None:
                    latest = self._latest()
                version = latest
                if self.options.share:
                    running = [v for u, (_, v) in self.pins.items()
                               if u != w and u in self.collecting]
                    if running and max(running) >= latest - 1:
                        version = max(running)
                pin = self.pins[w] = (request.seq, version)
            pinned.append((w, g, request, pin[1]))
        return pinned

    def _latest(self):
        """The version published last, loaded (a policy of its own: one
        let go before, or a copy of the actor); versions no longer pinned
        are let go."""
        params = self.config.params
        version = params.version
        if version not in self.models:
            self.stage = "loading parameters"
            policy = self._spare.pop() if self._spare else self._policy()
            version = params.load(policy.actor, None, check=self.link.check)
            self.models[version] = policy
        kept = {v for _, v in self.pins.values()} | {version}
        for old in [v for v in self.models if v not in kept]:
            self._spare.append(self.models.pop(old))
        return version

    def _policy(self):
        """A policy of a copy of the actor: on the CPU, a feed-forward
        actor's ``act`` is called on the rows as they are
        (:class:`~rlplay.engine.policy.FeedForwardPolicy`)."""
        model = copy.deepcopy(self.base)
        if self.device.type == "cpu":
            return as_policy(model)
        return DevicePolicy(model, self.device)

    def _due(self):
        """The requests to serve now, ``[(w, g, request)]`` (in worker
        order), or ``[]``."""
        collecting = self.collecting
        for g in ([self.turn] if self.deadline is None
                  else range(self.groups)):
            pending = self.pending[g]
            if pending and all(w in pending for w in collecting):
                self.turn = (g + 1) % self.groups
                return self._take([g])
        if self.deadline is None:
            return []
        now = time.monotonic()
        if any(t + self.deadline <= now for pending in self.pending
               for _, t, _ in pending.values()):
            return self._take(range(self.groups))
        return []

    def _take(self, groups):
        batch = []
        for g in groups:
            pending, self.pending[g] = self.pending[g], {}
            batch.extend((w, g, request)
                         for w, (request, _, _) in pending.items())
            self.counts.update(((w, g), count)
                               for w, (_, _, count) in pending.items())
        batch.sort(key=lambda item: (item[0], item[1]))
        return batch

    # --------------------------------------------------------- a batch --
    def _rows(self, b, g, t):
        """The views of row ``t`` of buffer ``b``, group ``g``: the state
        row, the action row ``t + 1`` and the info row ``t``."""
        key = (b, g, t)
        found = self._views.get(key)
        if found is None:
            pyt, cols = self.buffers[b], slice(g * self.B, (g + 1) * self.B)
            rows = (slice(t, t + 1), cols)
            act = None if t + 1 >= pyt.state.fin.shape[0] else getitem(
                pyt.state.act, (slice(t + 1, t + 2), cols))
            info = getitem(pyt.actor, rows)
            found = self._views[key] = (getitem(pyt.state, rows), act,
                                        info if flatten(info) else None)
        return found

    def _hx(self, w, g, out):
        key = (w, g, out)
        found = self._slots.get(key)
        if found is None:
            found = self._slots[key] = hx_slot(self.config.hx, w, g,
                                             self.groups, out)
        return found

    def _serve(self, batch):
        tic = time.perf_counter()
        batch = self._pinned(batch)
        forward = 0.0
        calls = {}
        for item in batch:
            calls.setdefault((item[3], item[2].kind), []).append(item)
        for (version, kind), items in calls.items():
            self.stage = "serving"
            forward += self._call(self.models[version], kind, items)
        self._answer(batch)
        totals = self.totals
        totals[0] += len(calls)
        totals[1] += len(batch) * self.B
        totals[2] += time.perf_counter() - tic
        totals[3] += forward
        self.counters[:] = totals

    def _answer(self, batch):
        """Write each request's version and count into its slot; ring the
        workers that sleep."""
        slots, counts = self.doors.slots, self.counts
        groups = self.groups
        for w, g, _, version in batch:
            slots[w * groups + g, VERSION] = version
        fence()
        for w, g, _, _ in batch:
            slots[w * groups + g, ANS] = counts.pop((w, g))
        fence()
        for w, g, _, _ in batch:
            conn = self.conns.get((w, g))
            if slots[w * groups + g, SLEEPING] and conn is not None:
                ring(conn)  # gone: the learner retires it

    def _call(self, policy, kind, items):
        hx_dim, has_hx = self.options.hx_dim, self.config.hx is not None
        rows = [self._rows(r.buffer, g, r.row) for _, g, r, _ in items]
        row = _joined([state for state, _, _ in rows], 1)
        hx = () if not has_hx else _joined(
            [self._hx(w, g, False) for w, g, _, _ in items], hx_dim)
        if has_hx and self.device.type != "cpu":
            hx = suply(lambda x: x.to(self.device), hx)
        # the step of a FeedForwardPolicy gives (B, ...), not (1, B, ...)
        lead = 0 if kind == STEP and isinstance(
            policy, FeedForwardPolicy) else 1
        tic = time.perf_counter()
        if kind == STEP:  # in inference mode (serve_main)
            act, hx_next, info = policy.step(row, hx)
        else:
            act, hx_next = None, None
            info = policy.lookahead(row, hx)
        if self.device.type != "cpu":
            # one copy to the host a leaf, then the parts on the host
            # (not a copy, and a wait, per worker)
            info, act, hx_next = (None if x is None else suply(
                _to_host, x) for x in (info, act, hx_next))
        toc = time.perf_counter()
        B = self.B
        if len(items) == 1 and not has_hx and type(act) is torch.Tensor:
            # one request (one worker's group) of a feed-forward actor:
            # its outputs as they are
            _, act_row, info_row = rows[0]
            if info_row is not None:
                copy_(info_row, info)
            act_row.copy_(act)
            return toc - tic
        for i, ((w, g, _, _), (_, act_row, info_row)) in enumerate(
                zip(items, rows)):
            def part(x, dim=lead):
                return x.narrow(dim, i * B, B)
            if info_row is not None:
                copy_(info_row, suply(part, info))
            if act is not None:
                copy_(act_row, suply(part, act))
            if hx_next is not None and has_hx:
                copy_(self._hx(w, g, True),
                      suply(lambda x: part(x, hx_dim), hx_next))
        return toc - tic


def _to_host(x):
    return x.to("cpu")


def _joined(trees, dim):
    if len(trees) == 1:
        return trees[0]
    return suply(lambda *xs: torch.cat(xs, dim), *trees)


def serve_main(conn, config, pdeathsig=True):
    """The server process's entry point (the protocol in the module
    docstring)."""
    guard_group()
    guard_parent(pdeathsig)
    ignore_interrupts()
    link = LearnerLink(conn)
    server = _Server(config, link)
    try:
        server.start()
        # inference mode for the whole loop: nothing the server makes is
        # ever differentiated (its outputs are copied into the rows), and
        # its tensors are cheaper to make than under no_grad
        with torch.inference_mode():
            server.run()
    except BaseException as exc:  # noqa: BLE001 - reported to the learner
        # never restarted: the actor's error, or rlplay's
        link.send(Failed(ErrorRecord(exc, server.stage), False))
    finally:
        for other in server.conns.values():
            other.close()
        config.buffers.segment.close()
        if config.hx is not None:
            config.hx.segment.close()
        link.close()


# ------------------------------------------------------ the supervisor --

class ServedSupervisor(Supervisor):
    """A :class:`~._supervisor.Supervisor` whose workers ask an inference
    server for their actions: it starts the server first (never replaced),
    gives each worker generation pipes of its own to it (the server's ends
    sent as file descriptors on the server's pipe), tells the server to
    drop a retired worker, watches the server at every pump (an error or
    a death is raised, naming it) and stops it with the workers.

    Parameters
    ----------
    options : ServeOptions
    counters : multiprocessing Array
        The server's counters (:data:`SERVED_STATS`).
    **kwargs
        As :class:`~._supervisor.Supervisor` (``params`` required).
    """

    def __init__(self, ctx, n_workers, protocol, *, options, counters,
                 **kwargs):
        super().__init__(ctx, n_workers, protocol, **kwargs)
        self.options, self.counters = options, counters
        self.server = _Worker("server", {})
        self._links = None
        self.hx = hx_slots(options.hx, n_workers, options.groups)
        self.doors = Doors.allocate(ctx, n_workers, options.groups)
        # the exit handler stops the server with the workers
        self._finalizer.cancel()
        self._finalizer = multiprocessing.util.Finalize(
            self, Supervisor._shutdown,
            args=(self.workers + [self.server], self.shutdown_timeout, True),
            exitpriority=EXIT_PRIORITY)

    def start_all(self):
        self._start_server()
        super().start_all()

    def _start_server(self):
        protocol = self.protocol
        config = ServerConfig(
            options=self.options,
            buffers=Buffers(protocol.segment, protocol._spec,
                            protocol.stride),
            hx=self.hx, params=self.params, counters=self.counters,
            n_workers=len(self.workers), doors=self.doors)
        self._spawn(self.server, serve_main, config, f"{self.name}-server")

    def _start(self, wk):
        pairs = [self.ctx.Pipe(duplex=True)
                 for _ in range(self.options.groups)]
        try:
            self._attach(wk, [ours for ours, _ in pairs])
        finally:
            for ours, _ in pairs:
                ours.close()
        self._links = [theirs for _, theirs in pairs]
        try:
            super()._start(wk)
        finally:
            self._links = None
            for _, theirs in pairs:
                theirs.close()

    def _attach(self, wk, conns):
        server = self.server
        try:
            server.conn.send(Attach(wk.index, wk.generation))
            for conn in conns:
                multiprocessing.reduction.send_handle(
                    server.conn, conn.fileno(), server.pid)
        except OSError:
            pass  # the server is gone: the next pump says so

    def _config(self, wk):
        return super()._config(wk)._replace(serve=ServeLink(
            conn=self._links, groups=self.options.groups, hx=self.hx,
            doors=self.doors))

    def _retire(self, wk):
        index = wk.index
        super()._retire(wk)
        try:
            self.server.conn.send(Drop(index))
        except (OSError, AttributeError):
            pass  # the server is gone: the next pump says so

    def pump(self, timeout, what):
        self._watch(what)
        news = super().pump(timeout, what)
        self._watch(what)
        return news

    def _watch(self, what):
        """Raise if the server reported an error or died."""
        server = self.server
        if server.process is None or self.closed:
            return
        try:
            while not server.eof and server.conn.poll():
                message = server.conn.recv()
                if isinstance(message, Failed):
                    exc = reported(message, None)[0]
                    exc.args = ("the inference server" + exc.args[0][
                        len("worker"):],)
                    raise exc
        except (EOFError, OSError):
            server.eof = True
        if ended(server.process):
            wait_ended([server.process], POLL_INTERVAL)
            code = server.process.exitcode
            raise WorkerDied(
                f"the inference server (pid {server.pid}) died with "
                f"{describe_exitcode(code)} while the learner waited for "
                f"{what}", exitcode=code)

    def shutdown(self, graceful=True):
        if self.closed:
            return
        super().shutdown(graceful)
        if not graceful:
            Supervisor._shutdown([self.server], 0.0, False,
                                 owner=self._owner)
        if self.hx is not None:
            self.hx.segment.close()

    def served(self):
        """The server's counters, ``{name: value}`` (:data:`SERVED_STATS`)."""
        return dict(zip(SERVED_STATS, self.counters[:]))
