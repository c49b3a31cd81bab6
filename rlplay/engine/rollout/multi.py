"""Many actors: worker processes fill a pool of shared fragment buffers and
the learner collates the ready ones into batches.

Protocol
--------
The learner sizes one fragment buffer of ``B = n_per_actor`` envs from a
probe env (made by ``factory`` here and closed at once) and the actor,
checks that ``n_buffers`` of them fit (:mod:`rlplay.engine.utils.pool`),
allocates them in *one* shared segment, makes a shared copy of the actor's
parameters (:class:`SharedParams`, version ``v0``) and starts ``n_actors``
workers. Worker ``i`` steps envs ``i * B .. (i + 1) * B - 1``, seeded as
collector ``i`` (worker 0 sees the seeds of ``same.rollout``).

Each buffer is owned by one side at a time, and moves round this cycle::

    free (queued to a worker) ─► filling (that worker) ─► ready (queued to
    the learner) ─► collating (the learner, inside next()) ─► free ...

Timeline (``k`` counts batches, ``v_k`` is the version published by
``next()`` number ``k``)::

    learner                                     worker i
    -------                                     --------
    rollout(): probe env, pool, v0, workers ──► seed, make envs, reset
               hand out all buffer indices ───► [b, ...] (round robin)
                                                take b, load v, collect → b
    next() #k: publish v_k                 ◄──  "ready b" (seq, v)
               wait for n_per_batch ready       take b', load v', collect
               (drop any with v < v_k - max_lag: back to free)
               copy them into the batch
               hand their indices back ───────► (queued for later)
               (copy the batch to the device)
               yield the batch
    ...train...                                 collect while buffers last,
                                                then wait for the learner
    close():   stop ──────────────────────────► finish the fragment, "bye"
               join, SIGTERM, SIGKILL, close the pipes, unmap the pool

The learner hands a freed buffer to the worker that holds the fewest, so a
fast worker gets more. A worker loads the latest parameters before each
fragment and records their version in ``meta.version``. The lag of a
fragment (``v_k`` minus its version) counts the batches published while it
was collected and while it waited for the learner, behind at most
``n_buffers - 1`` others; ``max_lag`` bounds it by dropping older ones.

Progress rule: ``n_buffers >= n_per_batch``. The learner copies the
fragments into its own batch and hands their buffers back *before* it
yields, so it never holds a buffer while the caller trains: with at least
``n_per_batch`` buffers, whenever fewer than ``n_per_batch`` are ready the
others are with workers, which fill them, and a batch always forms.
With fewer, it never would. ``n_buffers >= n_per_batch + n_actors`` keeps
every worker busy while the learner collates, and more buffers let the
workers run further ahead (at the price of lag).

The batch is ``(1 + T, n_per_batch * B, ...)``: slot ``s`` (columns ``s * B
.. (s + 1) * B - 1``) holds one fragment; ``hx`` is concatenated along the
actor's ``hx_dim`` and ``meta`` along its only dimension. It is allocated
once, on the host (page-locked with ``pinned=True``) or, with a CUDA
``device``, on the device, filled through non-blocking copies from a
page-locked staging batch; it is reused, valid until the next ``next()``,
unless ``copy=True``.

Waits and errors: every wait of the learner is bounded (``timeout`` without
news from any worker, ``start_timeout`` more for the first batch;
``timeout=None`` alone removes the bound) and
watches every worker's sentinel, so a worker that dies without a word is
reported at once as :class:`WorkerDied` with its exit code or signal (also
when ``next()`` finds it dead, with fragments still to deliver); the lock of
the shared parameters, which a worker killed while loading them would never
release, is taken with such a wait too. A worker catches every exception
(factory, ``reset``, ``step``, the actor) and sends it as an
:class:`ErrorRecord`, raised as :class:`WorkerError`; the factory's errors
in the learner's probe env are raised as they are. A timeout
raises :class:`RolloutTimeout`. After any of them the rollout is closed and
every later ``next()`` raises the same error again, never a silent end.
Workers wait for the learner as long as it lives (training takes what it
takes) and exit when it dies.

Shutdown (``close()``, leaving ``with``/``closing``, dropping the rollout,
the interpreter's exit), idempotent, in order: send ``stop`` to every
worker; join them all within ``shutdown_timeout`` while reading their last
messages (each finishes the fragment in hand and says "bye"); ``SIGTERM``,
then ``SIGKILL`` those left; close the pipes; unmap the pool and drop the
shared parameters. Workers are daemonic, so an interpreter that exits
without closing does not wait for them.
"""
import contextlib
import multiprocessing.connection
import time
import weakref
from collections import deque, namedtuple
from functools import partial

import numpy as np
import torch

from ..core import Fragment, check_count, collect, episode_stats, startup
from ..envs import close_envs, make_envs
from ..seeds import (collector_seed_sequence, env_seed_sequences, seed_sequence)
from ..nested import flatten, suply
from ..shared import Delivery
from ..utils.mp import (POLL_INTERVAL, ErrorRecord, RolloutTimeout,
                        WorkerDied, check_timeouts,
                        first_timeout, get_context, join_or_kill)
from ..utils.params import LOCK_TIMEOUT, SharedParams, _tensors, cpu_copy
from ..utils.pool import Segment, check_capacity, layout, views
from ..utils.worker import (STOP, Cloudpickled, LearnerLink, WorkerProcess,
                            start_worker)
from ._base import Generator, probe_layout

__all__ = ["rollout", "Rollout", "TIMEOUT", "START_TIMEOUT",
           "SHUTDOWN_TIMEOUT"]

# the longest the learner waits without news of any worker (seconds)
TIMEOUT = 60.0
# extra time allowed for the workers' start-up before the first batch
# (seconds): a spawned interpreter imports torch, then envs are made, reset
START_TIMEOUT = 60.0
# how long close() waits for the workers to stop on their own (seconds)
SHUTDOWN_TIMEOUT = 5.0
# torch threads per worker: n_actors processes already share the cores
WORKER_THREADS = 1

_READY, _BYE = "ready", "bye"

_Config = namedtuple(
    "_Config", "index factory actor params segment spec stride n_buffers "
               "free entropy n_per_actor sticky")


# ---------------------------------------------------------------- worker --

def _worker(conn, config):
    """Worker ``config.index``: the right-hand side of the protocol."""
    link = LearnerLink(conn)
    stage, envs, segment = "start-up", [], config.segment
    try:
        factory, actor = start_worker(
            collector_seed_sequence(config.entropy, config.index),
            config.factory, config.actor, WORKER_THREADS)
        stage = "the factory"
        seeds = env_seed_sequences(config.entropy, config.n_per_actor,
                                   config.index)
        envs = make_envs(factory, seeds)
        buffers = [views(segment.flat, config.spec, i * config.stride)
                   for i in range(config.n_buffers)]
        stage = "reset"
        first = config.index * config.n_per_actor
        ctx = startup(envs, actor, buffers[0], seeds, worker=config.index,
                      env_ids=np.arange(first, first + config.n_per_actor))
        stage = "collect"
        _serve(link, actor, config, buffers, ctx, deque(config.free))
        link.send((_BYE, ctx.seq))
    except BaseException as exc:  # noqa: BLE001 - reported to the learner
        link.send(ErrorRecord(exc, stage))
    finally:
        buffers = ctx = None
        close_envs(envs, quiet=True)
        segment.close()
        link.close()


def _serve(link, actor, config, buffers, ctx, free):
    """Fill free buffers until told to stop (or the learner is gone)."""
    params, version = config.params, None

    while True:
        tic = time.perf_counter()
        index = _take(link, free)
        if index is None:
            return
        toc = time.perf_counter()
        version = params.load(actor, version, check=link.check)
        collect(actor, buffers[index], ctx, sticky=config.sticky,
                version=version)
        link.send((_READY, index, ctx.seq - 1, version, toc - tic,
                   time.perf_counter() - toc))


def _take(link, free):
    """The next free buffer index, or ``None`` on stop; waits only when the
    worker holds no free buffer (and then as long as the learner lives)."""
    while not free or link.poll():
        order = link.recv()
        if order is None:
            return None
        free.extend(order)
    return free.popleft()


# --------------------------------------------------------------- learner --

class _Workers:
    """The learner's side of the protocol: the workers, their pipes, the
    pool and the shared parameters, which :meth:`shutdown` releases.

    It holds no reference to the :class:`Rollout`, so that it can be its
    finalizer.
    """

    def __init__(self, n_actors, shutdown_timeout):
        self.n_actors, self.shutdown_timeout = n_actors, shutdown_timeout
        self.workers = []  # WorkerProcess, in index order
        self.segment = self.params = self.sources = None
        self.ready = deque()  # (worker, index, seq, version), arrival order
        self.holding = [0] * n_actors  # buffers each worker holds
        self.accounts = [{"received": 0, "delivered": 0, "dropped": 0,
                          "discarded": 0, "collected": None}
                         for _ in range(n_actors)]
        self.time_worker_wait = self.time_collect = 0.0
        self.eof = [False] * n_actors
        self.closed = False

    # messages
    def _handle(self, w, message):
        if isinstance(message, ErrorRecord):
            raise message.to_exception(worker=w)
        kind = message[0]
        if kind == _READY:
            _, index, seq, version, waited, elapsed = message
            self.ready.append((w, index, seq, version))
            self.holding[w] -= 1
            self.accounts[w]["received"] += 1
            self.time_worker_wait += waited
            self.time_collect += elapsed
        elif kind == _BYE:
            self.accounts[w]["collected"] = message[1]

    def _died(self, w, what):
        proc = self.workers[w].process
        proc.join(POLL_INTERVAL)  # its exit code, if it is on its way out
        return WorkerDied.of(proc, w, what)

    def _drain(self, w, what):
        """Handle every message worker ``w`` has sent so far."""
        conn = self.workers[w].conn
        try:
            while conn.poll():
                self._handle(w, conn.recv())
        except (EOFError, OSError):
            self.eof[w] = True
            raise self._died(w, what) from None

    def pump(self, timeout, what):
        """Wait up to ``timeout`` s (``None``: no bound) for news from any
        worker and handle it; returns the number of fragments received.

        Raises ``WorkerError`` for a worker's error, ``WorkerDied`` for a
        worker that is gone (after reading its last words).
        """
        received = len(self.ready)
        conns = [wp.conn for wp in self.workers]
        sentinels = [wp.process.sentinel for wp in self.workers]
        ready = multiprocessing.connection.wait(conns + sentinels, timeout)
        for w, conn in enumerate(conns):
            if conn in ready:
                self._drain(w, what)
        for w, sentinel in enumerate(sentinels):
            if sentinel in ready:
                self._drain(w, what)
                raise self._died(w, what)
        return len(self.ready) - received

    def publish(self, actor, timeout):
        """Publish the actor's parameters; returns the new version.

        The lock is waited for at most ``timeout`` seconds
        (:data:`LOCK_TIMEOUT` for ``None``: no live worker holds it longer
        than one copy), reading the workers' news meanwhile: a worker
        killed while holding the lock never releases it."""
        return self.params.publish(
            actor, check=partial(self.pump, 0, "the parameter lock"),
            timeout=LOCK_TIMEOUT if timeout is None else timeout)

    def give(self, indices):
        """Hand free buffers to the workers that hold the fewest."""
        orders = {}
        for index in indices:
            w = min(range(self.n_actors), key=self.holding.__getitem__)
            self.holding[w] += 1
            orders.setdefault(w, []).append(index)
        for w, order in orders.items():
            try:
                self.workers[w].conn.send(order)
            except (OSError, EOFError):
                self._drain(w, "a free buffer to be taken")
                raise self._died(w, "a free buffer to be taken") from None

    def gather(self, n, version, max_lag, timeout, what):
        """Take ``n`` ready fragments no older than ``version - max_lag``,
        dropping older ones; returns ``[(worker, index, version), ...]``."""
        taken = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self.ready and len(taken) < n:
                w, index, _, fragment_version = self.ready.popleft()
                if max_lag is not None and \
                        fragment_version < version - max_lag:
                    self.accounts[w]["dropped"] += 1
                    self.give([index])
                    continue
                self.accounts[w]["delivered"] += 1
                taken.append((w, index, fragment_version))
            if len(taken) == n:
                return taken
            remaining = None if deadline is None else \
                deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RolloutTimeout(
                    f"no fragment for {what} within {timeout} s ({len(taken)}"
                    f" of {n} in hand) although the {self.n_actors} workers "
                    f"are alive; raise timeout= for slow envs")
            if self.pump(remaining, what) and timeout is not None:
                deadline = time.monotonic() + timeout  # news: wait afresh

    # shutdown
    def _drain_quietly(self, w):
        # at shutdown: read what is left, for the accounts; errors are moot
        if self.eof[w]:
            return
        conn = self.workers[w].conn
        try:
            while conn.poll():
                message = conn.recv()
                if not isinstance(message, ErrorRecord):
                    self._handle(w, message)
        except (EOFError, OSError):
            self.eof[w] = True

    def shutdown(self):
        """Stop everything, in the order of the module docstring."""
        if self.closed:
            return
        self.closed = True
        for wp in self.workers:
            wp.send(STOP)
        deadline = time.monotonic() + self.shutdown_timeout
        running = list(range(len(self.workers)))
        while running:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waits = [self.workers[w].process.sentinel for w in running] + [
                self.workers[w].conn for w in running if not self.eof[w]]
            ready = multiprocessing.connection.wait(waits, remaining)
            for w in list(running):
                wp = self.workers[w]
                if wp.conn in ready or wp.process.sentinel in ready:
                    self._drain_quietly(w)
                if wp.process.sentinel in ready:
                    running.remove(w)
        join_or_kill([wp.process for wp in self.workers], 0.0)
        for w, wp in enumerate(self.workers):
            self._drain_quietly(w)  # last words, sent just before exiting
            with contextlib.suppress(ValueError):  # a process unkillable
                wp.close(0.0)  # the pipe and the process object
        self.ready.clear()
        for account in self.accounts:
            account["discarded"] = (account["received"] -
                                    account["delivered"] -
                                    account["dropped"])
        # the pool's views go first, so that unmapping it frees the memory
        self.sources = None
        if self.segment is not None:
            self.segment.close()
        self.params = None


def _n_storages(params):
    # shared storages travel as one file descriptor each (empty ones as none)
    return len({t.untyped_storage().data_ptr() for t in flatten(params.tensors)
                if t.numel()})


def _env_dims(hx_dim):
    # the env dimension of each field of a fragment, for collation
    return Fragment(state=1, truncated=1, final=1, actor=1, env=1,
                    env_mask=1, hx=hx_dim, stats=1, meta=0)


def _check_hx(hx, hx_dim, n_per_actor):
    for leaf in flatten(hx):
        if leaf.dim() <= hx_dim or leaf.shape[hx_dim] != n_per_actor:
            raise ValueError(
                f"the actor's hx holds a tensor of shape {tuple(leaf.shape)}"
                f", which has no env dimension of size n_per_actor="
                f"{n_per_actor} at hx_dim={hx_dim}: set hx_dim on the "
                f"actor's class to the env dimension of its hx, so that "
                f"fragments of several workers can be collated")


def _batch_like(template, dims, n_per_batch, pinned):
    """Zero tensors laid out as ``template`` with ``n_per_batch`` times the
    envs along each field's env dimension."""
    def alloc(leaf, dim):
        shape = list(leaf.shape)
        shape[dim] *= n_per_batch
        return torch.zeros(shape, dtype=leaf.dtype, pin_memory=pinned)

    return Fragment(*[suply(partial(alloc, dim=dim), field)
                      for field, dim in zip(template, dims)])


class Rollout(Generator):
    """An endless iterator of batches collated from worker processes.

    Use :func:`rollout` to make one. It is a context manager, ``close()``
    is idempotent, and dropping it (or the interpreter's exit) closes it.

    Attributes
    ----------
    params : SharedParams
        The shared copy of the actor's parameters the workers load.
    version : int
        The parameter version published by the last ``next()``.
    pids : list of int
        The workers' process ids.
    stats : dict
        ``steps`` (env steps delivered), ``batches``, ``dropped`` (stale
        fragments dropped under ``max_lag``), ``version`` (the last version
        published), ``lag`` (the largest ``version - meta.version`` in the
        last batch), ``time_learner_wait`` (seconds ``next()`` waited for
        fragments), ``time_worker_wait`` (seconds, summed over workers,
        that they waited for a free buffer), ``time_collect`` (seconds,
        summed over workers, spent collecting the fragments received),
        ``time_collate`` (seconds spent copying fragments into batches),
        ``time_wall`` (seconds since the first ``next()`` began),
        ``steps_per_s`` (``steps / time_wall``: what the learner gets,
        training included), ``steps_per_s_collect`` (``steps /
        time_collect``; ``time_collect`` being summed over the workers,
        about the rate of one worker), ``returns``
        and ``lengths`` of the episodes that ended in the last batch, and
        ``workers``: per
        worker, fragments ``received`` by the learner, ``delivered``,
        ``dropped``, ``discarded`` (received, undelivered at close) and
        ``collected`` (the worker's own count, once it stopped cleanly).
    """

    def __init__(self, factory, actor, n_steps, n_actors, n_per_actor,
                 n_buffers, n_per_batch, *, entropy=None, sticky=False,
                 env_info=None, final=True, device=None, pinned=False,
                 copy=False, max_lag=None, start_method=None,
                 timeout=TIMEOUT, start_timeout=START_TIMEOUT,
                 shutdown_timeout=SHUTDOWN_TIMEOUT):
        delivery = Delivery(device, pinned, copy)
        for name, value in (("n_steps", n_steps), ("n_actors", n_actors),
                            ("n_per_actor", n_per_actor),
                            ("n_buffers", n_buffers),
                            ("n_per_batch", n_per_batch)):
            check_count(name, value)
        if n_buffers < n_per_batch:
            raise ValueError(
                f"n_buffers={n_buffers} cannot form a batch of n_per_batch="
                f"{n_per_batch} fragments: the pool needs n_buffers >= "
                f"n_per_batch (and n_per_batch + n_actors = "
                f"{n_per_batch + n_actors} keeps every worker busy while "
                f"the learner collates)")
        if max_lag is not None:
            check_count("max_lag", max_lag, 0)
        check_timeouts(timeout=timeout, start_timeout=start_timeout,
                       shutdown_timeout=shutdown_timeout)
        mp_ctx = get_context(start_method)
        entropy = seed_sequence(entropy)  # one root for every worker
        self.actor, self.copy, self.max_lag = actor, copy, max_lag
        self.n_per_batch, self.n_per_actor = n_per_batch, n_per_actor
        self.timeout, self.start_timeout = timeout, start_timeout
        self._closed, self._error = False, None
        self._started = None

        # the workers' actor, on the CPU; the buffers are sized with it here
        # from a probe env that the factory makes and we close at once
        worker_actor = cpu_copy(actor)
        shipped = (Cloudpickled(factory), Cloudpickled(worker_actor))
        template = probe_layout(factory, worker_actor, n_steps, n_per_actor,
                                entropy, env_info=env_info, final=final)
        hx_dim = getattr(actor, "hx_dim", 1)
        _check_hx(template.hx, hx_dim, n_per_actor)
        spec, stride = layout(template)

        # capacity, before anything is shared: the pool and the parameters
        # in /dev/shm; then, once the parameters are shared, the file
        # descriptors (one per shared storage, in every process)
        what = (f"a pool of {n_buffers} buffers of {stride} bytes for "
                f"{n_actors} workers")
        check_capacity(stride * n_buffers + sum(
            t.numel() * t.element_size() for t in _tensors(actor)),
            what=what)

        self._workers = workers = _Workers(n_actors, shutdown_timeout)
        # runs the shutdown when this object is collected or at exit
        self._finalizer = weakref.finalize(self, workers.shutdown)
        try:
            workers.params = SharedParams(actor, mp_ctx)
            # a worker is handed the parameters' storages, the pool, its
            # pipe and the two shared counters of the parameters
            check_capacity(0, n_fds=1 + 3 * n_actors, what=what,
                           worker_fds=_n_storages(workers.params) + 4,
                           start_method=mp_ctx.get_start_method())
            workers.segment = Segment.create(stride * n_buffers)
            buffers = [views(workers.segment.flat, spec, i * stride)
                       for i in range(n_buffers)]
            self._allocate_batch(template, hx_dim, delivery)
            workers.sources = [
                [leaf for field in buffer.npy for leaf in flatten(field)]
                for buffer in buffers]
            del buffers
            for w in range(n_actors):
                config = _Config(w, *shipped, workers.params, workers.segment,
                                 spec, stride, n_buffers,
                                 list(range(w, n_buffers, n_actors)),
                                 entropy, n_per_actor, sticky)
                workers.workers.append(WorkerProcess(
                    mp_ctx, _worker, (config,), name=f"rlplay-multi-{w}"))
                workers.holding[w] = len(config.free)
            workers.segment.close_fd()  # every worker has its own now
        except BaseException:
            self._finalizer()
            raise
        self.stats = {"steps": 0, "batches": 0, "dropped": 0, "version": 0,
                      "lag": 0, "time_learner_wait": 0.0,
                      "time_worker_wait": 0.0, "time_collect": 0.0,
                      "time_collate": 0.0, "time_wall": 0.0,
                      "steps_per_s": 0.0, "steps_per_s_collect": 0.0,
                      "returns": None, "lengths": None,
                      "workers": workers.accounts}

    def _allocate_batch(self, template, hx_dim, delivery):
        self.delivery, self.device = delivery, delivery.device
        n_per_batch, B = self.n_per_batch, self.n_per_actor
        dims = _env_dims(hx_dim)
        # the host batch (the one yielded, or the source of device copies)
        self._host = _batch_like(template, dims, n_per_batch,
                                 delivery.host_pinned)
        self._host_npy = suply(torch.Tensor.numpy, self._host)
        # per slot, the numpy views its fragment is copied into, in the
        # order of a buffer's flattened leaves
        self._targets = [
            [leaf.narrow(dim, s * B, B).numpy()
             for field, dim in zip(self._host, dims)
             for leaf in flatten(field)]
            for s in range(n_per_batch)]

    @property
    def params(self):
        """The shared copy of the actor's parameters (``None`` once
        closed): ``next()`` publishes to it, workers load from it."""
        return self._workers.params

    @property
    def pids(self):
        return [wp.pid for wp in self._workers.workers]

    @property
    def version(self):
        """The parameter version published by the last ``next()``."""
        return self.stats["version"]

    def __next__(self):
        # one round of the learner's side of the protocol (module docstring)
        if self._error is not None:
            raise self._error
        if self._closed:
            raise StopIteration
        try:
            return self._next()
        except BaseException as exc:
            self._fail(exc)
            raise

    def _next(self):
        # the rows "next() #k" of the timeline in the module docstring
        workers, stats = self._workers, self.stats
        tic = time.perf_counter()
        first = self._started is None
        if first:
            self._started = tic
        k = stats["batches"]
        timeout = (first_timeout(self.timeout, self.start_timeout) if first
                   else self.timeout)
        workers.pump(0, f"batch {k}")  # deaths are reported at once
        version = workers.publish(self.actor, timeout)
        taken = workers.gather(self.n_per_batch, version, self.max_lag,
                               timeout, f"batch {k}")
        toc = time.perf_counter()
        # the last device copy must have read the host batch first
        self.delivery.wait()
        for targets, (_, index, _) in zip(self._targets, taken):
            for target, source in zip(targets, workers.sources[index]):
                np.copyto(target, source)
        workers.give([index for _, index, _ in taken])
        batch = self.delivery(self._host)
        done = time.perf_counter()

        T, B = self._host_npy.state.rew.shape
        stats["steps"] += (T - 1) * B
        stats["batches"] += 1
        stats["version"] = version
        stats["lag"] = version - min(v for _, _, v in taken)
        stats["dropped"] = sum(a["dropped"] for a in workers.accounts)
        stats["time_learner_wait"] += toc - tic
        stats["time_worker_wait"] = workers.time_worker_wait
        stats["time_collect"] = workers.time_collect
        stats["time_collate"] += done - toc
        stats["time_wall"] = done - self._started
        stats["steps_per_s"] = stats["steps"] / max(stats["time_wall"], 1e-9)
        stats["steps_per_s_collect"] = stats["steps"] / max(
            stats["time_collect"], 1e-9)
        stats["returns"], stats["lengths"] = episode_stats(self._host_npy)
        return batch

    def poll(self, timeout=0.0):
        """The number of fragments ready for the next batch, waiting up to
        ``timeout`` seconds for one if there is none.

        Raises the worker errors that :meth:`__next__` would.
        """
        if self._error is not None:
            raise self._error
        if self._closed:
            return 0
        workers = self._workers
        deadline = time.monotonic() + timeout
        try:
            workers.pump(0, "fragments")
            while not workers.ready:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                workers.pump(remaining, "fragments")
        except BaseException as exc:
            self._fail(exc)
            raise
        return len(workers.ready)

    def _fail(self, exc):
        # a broken rollout stays broken: later next() raise the same error
        if not isinstance(exc, (KeyboardInterrupt, GeneratorExit)):
            self._error = exc
        self.close()

    def close(self):
        """Stop the workers and release the pool (see the module
        docstring); later ``next()`` calls stop the iteration. Idempotent.
        """
        self._closed = True
        self._finalizer()


def rollout(factory, actor, n_steps, n_actors, n_per_actor, n_buffers,
            n_per_batch, *, entropy=None, sticky=False, env_info=None,
            final=True, device=None, pinned=False, copy=False, max_lag=None,
            start_method=None, timeout=TIMEOUT, start_timeout=START_TIMEOUT,
            shutdown_timeout=SHUTDOWN_TIMEOUT):
    """Collect fragments in ``n_actors`` worker processes and yield batches
    of ``n_per_batch`` of them.

    Parameters
    ----------
    factory : callable
        Builds one Gymnasium env (with ``seed=`` if it accepts it); called
        ``n_per_actor`` times in each worker and once here, for a probe env
        that sizes the buffers. Closures and lambdas travel by cloudpickle.
    actor : BaseActorModule
        The learner's actor (on any device); each worker runs a CPU copy
        under ``torch.no_grad()``, loading its parameters and train/eval
        mode before each fragment. Its ``hx_dim`` tells the env dimension
        of ``hx`` leaves.
    n_steps : int
        ``T``, the steps per fragment.
    n_actors : int
        Worker processes.
    n_per_actor : int
        ``B``, the envs each worker steps together.
    n_buffers : int
        Shared fragment buffers in the pool, at least ``n_per_batch`` (see
        the progress rule in the module docstring).
    n_per_batch : int
        Fragments collated into one batch.
    entropy : int, optional
        Seeds the run reproducibly: worker ``i`` is collector ``i`` of
        :mod:`rlplay.engine.envs` (worker 0 reproduces ``same.rollout``).
    sticky, env_info, final
        As in :func:`rlplay.engine.rollout.same.rollout`.
    device : str or torch.device, optional
        Deliver batches on this device, through non-blocking copies from
        page-locked memory; a CUDA device without CUDA raises
        ``RuntimeError`` at once.
    pinned : bool
        Deliver batches in page-locked host memory; needs CUDA.
    copy : bool
        Yield a fresh copy of each batch instead of the reused one.
    max_lag : int, optional
        Drop fragments collected with a parameter version older than the
        current one minus ``max_lag`` (``0``: only fragments collected with
        the parameters of this very ``next()``); counted in ``stats``.
    start_method : str, optional
        ``'fork'``, ``'spawn'`` or ``'forkserver'`` (the default).
    timeout : float or None
        Seconds the learner waits without news from any worker before
        raising ``RolloutTimeout``; ``None``: no deadline, as long as they
        live.
    start_timeout : float or None
        Extra seconds allowed for the first batch (workers starting;
        ``None`` adds nothing).
    shutdown_timeout : float
        Seconds ``close()`` waits for the workers before terminating them.

    Yields
    ------
    batch : Fragment of tensors, shape = (1 + T, n_per_batch * B, ...)
        Slot ``s`` (env columns ``s * B .. (s + 1) * B - 1``) holds one
        fragment; ``meta`` tells its worker, envs, sequence number and
        parameter version. The batch is reused, valid until the next
        ``next()``, unless ``copy=True``.

    Raises
    ------
    ValueError, TypeError
        Bad counts (including ``n_buffers < n_per_batch``), or an actor
        whose outputs do not fit the envs.
    RuntimeError
        ``device='cuda'`` or ``pinned=True`` without CUDA.
    CapacityError
        The pool does not fit in ``/dev/shm`` or in the file-descriptor
        limit.
    WorkerError, WorkerDied, RolloutTimeout
        From ``next()``: see the module docstring.

    Examples
    --------
    >>> import functools, gymnasium, torch.nn as nn
    >>> from contextlib import closing
    >>> from rlplay.engine import PolicyActor
    >>> actor = PolicyActor(nn.Linear(4, 2))
    >>> factory = functools.partial(gymnasium.make, "CartPole-v1")
    >>> feed = rollout(factory, actor, 16, n_actors=2, n_per_actor=2,
    ...                n_buffers=4, n_per_batch=2, entropy=0)
    >>> with closing(feed):
    ...     batch = next(feed)
    >>> tuple(batch.state.obs.shape)
    (17, 4, 4)
    """
    return Rollout(factory, actor, n_steps, n_actors, n_per_actor, n_buffers,
                   n_per_batch, entropy=entropy, sticky=sticky,
                   env_info=env_info, final=final, device=device,
                   pinned=pinned, copy=copy, max_lag=max_lag,
                   start_method=start_method, timeout=timeout,
                   start_timeout=start_timeout,
                   shutdown_timeout=shutdown_timeout)
