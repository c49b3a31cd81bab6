"""Double-buffered collection: one worker process fills one shared buffer
while the learner trains on the other (a barrier flip-flop).

Protocol
--------
The learner allocates two fragment buffers ``A`` and ``B`` in one shared
segment (:mod:`~rlplay.engine.workers._buffers`, the mechanism of ``multi``), a shared copy of
the actor's parameters (:class:`~rlplay.engine.workers.SharedParams`, version ``v0``)
and starts the worker, which runs the worker loop of
:mod:`~rlplay.engine.workers._session`: ``single`` is the protocol of ``multi`` with one
worker, two buffers and one fragment per batch, and the rule below on
publishing. Fragment ``k`` goes to buffer ``k % 2`` and is collected
with the parameters of version ``max(k - 1, 0)``: the policy lag is
exactly one batch. ``v_k`` is what the learner's actor holds at
``next()`` #k (counting from 0), that is after training on fragments
``0 .. k - 1``::

    learner                                       worker
    -------                                       ------
    rollout(): probe env, A, B, v0,
               start the worker ────────────────► seed, make envs, reset
                                                  load v0, collect #0 → A
    next() #0: wait for "ready A" ◄──────────────  Ready(A)
               yield A (#0, v0)                   load v0, collect #1 → B
    ...train on #0...                             (a free buffer: no wait)
    next() #1: wait for "ready B" ◄──────────────  Ready(B)
               publish v1, Give(A) ─────────────► load v1, collect #2 → A
               yield B (#1, v0)
    ...train on #1...
    next() #2: wait for "ready A" ◄──────────────  Ready(A)
               publish v2, Give(B) ─────────────► load v2, collect #3 → B
               yield A (#2, v1)

    next() #k, k ≥ 1: wait for "ready" of #k; publish v_k; hand back the
    buffer of #k-1, where the worker collects #k+1 with v_k; yield #k.

Set-up: the learner makes one probe env with the factory to size the
buffers, and closes it (a failure there is raised directly, as by
``same.rollout``). The worker makes its own ``n_envs`` envs with the seeds
``same.rollout`` gives its envs (collector 0 of ``entropy``), seeds its
global generators from that collector's sequence, and runs its copy of
the actor (on the CPU, or on ``actor_device``) on one torch thread.

Between two ``next()`` calls the learner owns the yielded buffer and the
worker the other one; they swap at ``next()``. The yielded batch is a
fresh copy of it (``copy=True``, the default), or with ``copy=False`` the
shared buffer itself, valid until the next ``next()``.

Why publish only after "ready" of #k: the shared copy holds one version;
the worker loads ``v_{k-1}`` when it starts #k, which is before it reports
#k ready, so the learner may overwrite it with ``v_k`` then and not before.
Publishing earlier would let a slow worker load ``v_k`` for #k (no lag).
The ``call_envs`` calls made before ``next()`` #k go with ``v_k``, down the
pipe before ``Give``, and are applied before #k+1 (``call_envs`` in
:mod:`rlplay.engine.rollout`).

With ``publish="manual"``, ``next()`` publishes nothing (it still hands
back the buffer of #k-1) and each fragment records the publications made
by ``feed.publish()`` before its worker started it: the lag is the
caller's. With ``prefetch=1`` a thread of the learner waits for #k and
copies it out while the caller trains on #k-1; ``next()`` #k then
publishes and hands back as above, so the versions are those without
prefetch (docs/how-to/prefetch.md).

Waits: ``timeout`` bounds the time ``next()`` waits without news from the
worker, the parameter lock included (``start_timeout`` more while it
starts; ``timeout=None`` alone removes the bound), watching its sentinel
and its exit status, so a worker that dies is reported within a tenth of
a second, whatever its env started. The worker
waits for the learner as long as the learner lives (training takes what it
takes) and dies with it, whatever it is doing.

Errors: the worker catches every exception (factory, ``reset``, ``step``,
the actor) and reports it; the learner raises it as
:class:`~rlplay.engine.errors.WorkerError` with the worker's exception
type, message and traceback. A silent death raises
:class:`~rlplay.engine.errors.WorkerDied` with the exit code or signal
name, an exhausted wait :class:`~rlplay.engine.errors.RolloutTimeout`.
Any of them (or Ctrl-C) breaks the generator (see :mod:`._states`): the
worker is torn down at once, and every later ``next()`` raises the same
error again, never a silent end of iteration. ``close()`` by the user ends
the iteration (``StopIteration``).

Restarts (``restarts=N``): a worker that dies, or whose factory or envs
raise, is replaced (see "When environments crash" in
docs/concepts/order-and-generations.md). The fragment it was filling
is discarded; the replacement starts from resets with seeds of its own
generation, loads the latest parameters (``v_{k-1}`` while fragment ``k``
is due, so the lag stays exactly 1) and refills that buffer with fragment
``k``. The equivalence with ``same.rollout`` ends at the restart.

Shutdown: ``close()``, leaving ``with`` or ``closing(...)``, dropping the
generator, or the interpreter's exit stops the worker in the supervisor's
order (stop order, bounded join, ``SIGTERM``, ``SIGKILL``, close the
pipe); the buffers are released with the generator (a batch the learner
still holds keeps its own memory alive).
"""
import time

from ..core.finals import fill_final
from ..errors import RolloutTimeout
from ..utils.mp import get_context
from ..devices import worker_devices
from ..workers import Collation, SharedBuffers
from ._base import (RESTART_DELAY, SHUTDOWN_TIMEOUT, START_TIMEOUT, TIMEOUT,
                    Deadline, Delivery, Lifecycle, SetUp, Unpack,
                    WorkerKeywords, spell_out)
from ._calls import call_envs
from ._prefetch import Prefetch, Prepared, check_prefetch, check_publish
from ._prefetch import publish
from ._supervised import (Supervision, supervised_params, supervised_pid,
                          supervised_pids, supervised_process)

__all__ = ["rollout", "Rollout"]


class Rollout(Lifecycle):
    """The generator that :func:`rollout` returns (documented there). Its
    parts: the set-up (``_setup``, a :class:`~._base.SetUp`), the
    supervision of its worker (``_supervision``, a
    :class:`~._supervised.Supervision`, whose ``source``, the two shared
    buffers, is its source of fragments), the collation (``_collation``,
    none where the shared buffer is the batch) and the delivery
    (``delivery``)."""

    def __init__(self, factory, actor, n_steps, n_envs, *, entropy=None,
                 sticky=False, env_info=None, final=True, device=None,
                 pinned=False, copy=True, check_spaces="first",
                 start_method=None, timeout=TIMEOUT,
                 start_timeout=START_TIMEOUT,
                 shutdown_timeout=SHUTDOWN_TIMEOUT, restarts=0,
                 restart_delay=RESTART_DELAY, cpu_affinity=None,
                 resume=None, actor_device=None, prefetch=0,
                 publish="next"):
        # one batch ahead at most: see "Progress" in ._prefetch
        check_prefetch(prefetch, 1), check_publish(publish)
        self._setup = setup = SetUp(
            "single", actor, dict(n_steps=n_steps, n_envs=n_envs,
                                  sticky=sticky),
            [("n_steps", n_steps, 1), ("n_envs", n_envs, 1)],
            entropy=entropy, resume=resume,
            timeouts=dict(timeout=timeout, start_timeout=start_timeout,
                          shutdown_timeout=shutdown_timeout),
            restarts=restarts, restart_delay=restart_delay, sticky=sticky,
            check_spaces=check_spaces, cpu_affinity=cpu_affinity)
        run = setup.run
        self.actor, self.hx_dim = actor, getattr(actor, "hx_dim", 1)
        self.delivery = delivery = Delivery(device, pinned, copy)
        self.device = delivery.device
        self.timeout, self.start_timeout = timeout, start_timeout
        self._supervision = supervision = Supervision(
            setup, delivery, timeout, start_timeout)
        n_steps, n_envs = int(n_steps), int(n_envs)
        mp_ctx = get_context(start_method)
        devices = worker_devices(actor_device, 1,
                                 start_method=mp_ctx.get_start_method())
        # the worker's actor is a CPU copy; the buffers are sized with it in
        # this process, from a probe env the factory makes and we close
        spec, template = setup.probe(
            factory, actor, n_steps, n_envs, sticky=sticky,
            env_info=env_info, final=final, check_spaces=check_spaces,
            cpu_affinity=cpu_affinity, actor_device=devices,
            sparse_final=True)
        # the worker leaves the copies of obs in `final` to the learner,
        # which makes them as it copies the fragment (or in the shared
        # buffer itself, when that is the batch)
        self._in_place = delivery.device is None and not delivery.copy \
            and not delivery.pinned
        # (no host batch of its own where the shared buffer is the batch)
        self._collation = None if self._in_place else Collation(
            template, self.hx_dim, 1, delivery.host_pinned, sticky)
        self._sticky = sticky
        self._held = None  # the arrival whose buffer the learner holds
        # the first batch of this part of the run (> 0 for a resume)
        self._first = run.counters.get("batches", 0)
        supervision.workers(mp_ctx, 1, actor, lambda params: SharedBuffers(
            template, 2, 1, spec, params,
            what=f"two buffers of {n_steps} steps of {n_envs} envs",
            start_method=mp_ctx.get_start_method(), run=run),
            name="rlplay-single")
        self.stats = setup.stats
        self.buffers = tuple(supervision.source.buffers)
        try:
            turns = [(self._collation, delivery)] + [
                (Collation(template, self.hx_dim, 1, delivery.host_pinned,
                           sticky), Delivery(device, pinned, copy))
                for _ in range(prefetch if not copy else 0)]
            self._prefetch = Prefetch(
                self, supervision, actor, self.stats, prefetch, publish,
                turns, kind="single", join_timeout=shutdown_timeout)
        except BaseException:
            supervision.close(False, self.stats)
            raise

    call_envs = call_envs
    publish = publish

    def __iter__(self):
        return self

    def __next__(self):
        return self._guarded(self._next, stop=StopIteration)

    def _next(self):
        # one step of the protocol in the module docstring (with prefetch:
        # of _prefetch's)
        prefetch = self._prefetch
        if prefetch.thread is not None:
            return prefetch.thread.next()
        tic = self.stats.begin()
        deadline = Deadline(self._supervision.bound())
        arrival = self._arrive(deadline)
        self._advance(arrival, deadline)
        waited = time.perf_counter() - tic
        return self._hand_out(self._collate(arrival), waited)

    def _what(self):
        return f"fragment {self.stats['batches']}"

    def _arrive(self, deadline=None):
        """Wait for "ready" of fragment #k; returns its arrival."""
        supervision = self._supervision
        shared, supervisor = supervision.source, supervision.supervisor
        k, what = self.stats["batches"], self._what()
        deadline = Deadline(supervision.bound()) if deadline is None \
            else deadline
        supervisor.pump(0, what)
        if not supervision.wait(lambda: len(shared.ready), what, deadline):
            raise RolloutTimeout(
                f"no {what} within {deadline.bound} s although the "
                f"worker is alive; raise timeout= for slow envs")
        arrival, = shared.ready.take(1, 0, None, None)
        # (its version is max(k - 1, first) unless publish() was called)
        assert arrival.index == (k - self._first) % 2, arrival
        return arrival

    def _advance(self, arrival, deadline=None):
        """Publish ``v_k`` (only now: see the docstring), hand back the
        buffer of #k-1, hold #k's."""
        if self.stats["batches"] > self._first:
            if self._prefetch.mode == "next":
                self._prefetch.publish(deadline)
            supervision = self._supervision
            supervision.source.release([self._held], supervision.supervisor)
        self._held = arrival

    def _collate(self, arrival):
        """The batch of #k (a :class:`~._prefetch.Prepared`)."""
        toc = time.perf_counter()
        buffer = self.buffers[arrival.index]
        batch = self._batch(buffer, *self._prefetch.turn())
        return Prepared(batch, buffer.npy, arrival,
                        time.perf_counter() - toc, arrival.version)

    def _hand_out(self, prepared, waited):
        supervision, stats = self._supervision, self.stats
        shared = supervision.source
        shared.ready.delivered([prepared.arrived])
        version = self._prefetch.version()  # v_k, over #k's: a lag of 1
        stats.batch(prepared.npy, waited=waited,
                    collected=shared.time_collect - stats["time_collect"],
                    worker_waited=shared.time_worker_wait
                    - stats["time_worker_wait"],
                    version=version, lag=version - prepared.oldest)
        stats["restarts"] = supervision.supervisor.restarts
        return prepared.batch

    def _batch(self, buffer, collation, delivery):
        """The batch of ``buffer`` (the shared fragment that the learner
        holds), its ``final`` completed."""
        if self._in_place:
            if buffer.npy.final is not None:
                fill_final(buffer.npy, self._sticky)
            return buffer.pyt
        delivery.wait()  # the last device copy read the host batch
        fresh = delivery.fresh_host
        host, _ = collation.collate([Collation.sources(buffer.npy)],
                                    fresh=fresh)
        return host if fresh else delivery(host)

    def state_dict(self):
        """What rlplay owns of this run, for ``resume=`` (see
        ``resume`` in :mod:`rlplay.engine.rollout`, and "Long runs" in the
        docs): the seeding tree's place, the worker's next
        ``meta.seq`` (after the last fragment yielded) and generation, the
        counters; a continuation's parameters start at the version of the
        number of batches yielded (or of the publications, where
        ``publish()`` made more). A batch prepared ahead (``prefetch``)
        and not yet yielded is not counted: the continuation collects
        its ``meta.seq`` again. Valid in any state (after ``close()``
        too)."""
        supervision, prefetch = self._supervision, self._prefetch
        return prefetch.command(lambda: self._setup.state(
            max(self.stats["batches"], prefetch.version()),
            supervision.supervisor.positions(supervision.source.ready)))

    params, pids, pid = supervised_params, supervised_pids, supervised_pid
    process = supervised_process

    def _close(self, graceful):
        self._prefetch.stop()
        self.buffers = None  # the learner's views: the pool goes with them
        self._supervision.close(graceful, self.stats)


def rollout(factory, actor, n_steps, n_envs, *, start_method=None,
            **kwargs: Unpack[WorkerKeywords]):
    """Collect fragments in one worker process, double-buffered.

    Takes the arguments of :func:`rlplay.engine.rollout.same.rollout`, and
    yields the same fragments (for the same ``entropy`` and parameters),
    collected one batch behind the learner's parameters. Returns a
    :class:`Rollout`: an endless iterator and a context manager;
    ``close()`` is idempotent, and dropping it closes it too. The keywords
    every generator shares (``start_method``, the timeouts, ``prefetch``
    and ``publish`` included) are documented once, in
    :mod:`rlplay.engine.rollout`.

    Parameters
    ----------
    factory : callable
        Builds one Gymnasium env. It is called once in this process, for a
        probe env that sizes the buffers and is closed at once (an
        exception there is raised here, as by ``same``), then ``n_envs``
        times in the worker. Shipped with cloudpickle, so lambdas and
        closures work with every start method.
    actor : BaseActorModule
        The learner's actor (on any device). The worker runs a CPU copy,
        under ``torch.no_grad()``, and before each fragment loads the
        parameters and the train/eval mode the learner's actor had at the
        last ``next()``.
    n_steps : int
        ``T``, the steps per fragment.
    n_envs : int
        ``B``, the envs of the worker (seeded as ``same``'s envs: the
        worker is collector 0 of ``entropy``).

    Returns
    -------
    feed : Rollout
        An endless iterator of batches, ``Fragment`` of tensors of shape
        ``(1 + T, B, ...)``: each a fresh copy of the shared buffer (on
        ``device``, if given), yours to keep; with ``copy=False`` the
        shared buffer itself (or its reused pinned or device copy), valid
        until the next ``next()``. ``meta.version`` holds ``max(k - 1,
        0)`` for the ``k``-th batch.

    Raises
    ------
    WorkerError
        The worker raised (``exc_type``, ``type_name``,
        ``remote_traceback`` tell what and where).
    WorkerDied
        The worker ended without a word (``exitcode``).
    RolloutTimeout
        No fragment within the bound while the worker lives.
    ValueError
        The actor's parameters and buffers changed since the start (they
        cannot be published).

    Notes
    -----
    The attributes of ``feed``: ``buffers`` (the two shared host buffers,
    numpy and torch views), ``process`` and ``pid`` (the worker, of its
    current generation), ``params`` (the shared copy of the actor's
    parameters, ``None`` once closed), ``publish()`` (publish the
    actor's parameters now), ``hx_dim`` (the actor's, as ``same``'s) and
    ``stats`` (the keys of
    :data:`rlplay.engine.rollout.STATS_KEYS`, documented there;
    ``dropped`` is always 0 and ``lag`` 1 after the first batch;
    ``workers`` holds the one worker's counts).

    Examples
    --------
    >>> import functools, itertools, gymnasium, torch.nn as nn
    >>> from contextlib import closing
    >>> from rlplay.engine import PolicyActor
    >>> actor = PolicyActor(nn.Linear(4, 2))
    >>> factory = functools.partial(gymnasium.make, "CartPole-v1")
    >>> with closing(rollout(factory, actor, 16, 2, entropy=0)) as feed:
    ...     batches = [batch.meta.version[0].item() for batch in
    ...                itertools.islice(feed, 3)]
    >>> batches
    [0, 0, 1]
    """
    return Rollout(factory, actor, n_steps, n_envs,
                   start_method=start_method, **kwargs)


spell_out(rollout, Rollout.__init__)
