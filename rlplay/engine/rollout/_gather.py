"""The learner's side of the generators that gather fragments from many
workers: :mod:`~rlplay.engine.rollout.multi` (processes on this machine)
and :mod:`~rlplay.engine.rollout.cluster` (Ray actors), written once.

``next()`` number ``k`` publishes the parameters ``v_k``, waits (bounded,
watching every worker) until ``n_per_batch`` fragments no older than
``v_k - max_lag`` are ready, dropping the stale ones, collates them into
the batch, hands their buffers (or requests) back to the workers and
delivers the batch. What differs is where fragments come from: a *source
of ready fragments*, which the shared-memory pool
(:class:`~rlplay.engine.workers.SharedBuffers`) and the Ray requests
(:class:`~.cluster.RayRequests`) each implement, as
:class:`~rlplay.engine.workers.SharedParams` and :class:`~rlplay.engine.workers.RayParams`
implement one parameter interface:

- ``ready``: a :class:`~rlplay.engine.workers.ReadyQueue` of the arrivals, in order;
- ``time_collect``, ``time_worker_wait``: the workers' seconds, in all;
- ``fragment(arrival)``: the arrival's leaves (numpy), in the order of
  :meth:`~rlplay.engine.workers._batch.Collation.sources`;
- ``release(arrivals, supervisor)``: hand the buffers (requests) of
  collated arrivals back to the workers;
- ``recycle(arrival, supervisor)``: the same for a stale one;
- ``close()``.

:class:`Gather` is that learner's side, a part that both generators hold
(``_gather``), made by one constructor for both: the keywords they share
are defined (and checked) once, here. It is made of the other parts: the
set-up (:class:`~._base.SetUp`), the delivery
(:class:`~._delivery.Delivery`), the supervision of the workers
(:class:`~._supervised.Supervision`, which holds the source of ready
fragments) and the collation
(:class:`~rlplay.engine.workers.Collation`). What differs is a part, the
*fleet* of workers (worker processes on this machine,
:class:`~.multi.Processes`; Ray actors, :class:`~.cluster.RayActors`),
which offers

- ``devices(actor_device, n_actors)``: where each worker runs its actor
  (:func:`~rlplay.engine.devices.worker_devices`), checked up front;
- ``check_capacity(template, n_actors, n_buffers)``: raise
  :class:`~rlplay.engine.errors.CapacityError` where the workers' buffers
  would not fit;
- ``start(supervision, actor, spec, template, n_actors, n_buffers,
  owner)``: start ``n_actors`` workers sharing ``spec``, with
  ``n_buffers`` fragments of the layout ``template`` in flight, from
  where the run of ``supervision.setup`` says, under its restart policy:
  it sets the ``params``, ``source`` (the source of ready fragments) and
  ``supervisor`` of ``supervision`` and the set-up's ``stats``; the
  workers go when ``owner`` (the generator) is dropped; on a failure, it
  closes what was made and raises.
"""
import time

from ..errors import RolloutTimeout
from ..workers import Collation, check_hx_dim
from ._base import (RESTART_DELAY, SHUTDOWN_TIMEOUT, START_TIMEOUT, TIMEOUT,
                    Deadline, Delivery, Lifecycle, SetUp, Status)
from ._calls import call_envs
from ._prefetch import (Prefetch, Prepared, check_prefetch, check_publish,
                        publish)
from ._supervised import (Supervision, supervised_params, supervised_pid,
                          supervised_pids)

__all__ = ["Gather", "Pooled", "check_pool"]


def check_pool(n_buffers, n_per_batch, n_actors):
    """The progress rule of a pool: ``n_buffers >= n_per_batch``.

    Raises
    ------
    ValueError
        Naming both numbers.
    """
    if n_buffers < n_per_batch:
        raise ValueError(
            f"n_buffers={n_buffers} cannot form a batch of n_per_batch="
            f"{n_per_batch} fragments: the pool needs n_buffers >= "
            f"n_per_batch (and n_per_batch + n_actors = "
            f"{n_per_batch + n_actors} keeps every worker busy while the "
            f"learner collates)")


class Gather:
    """The learner's side of a generator that collates the fragments of
    many workers into batches (see the module docstring).

    Parameters
    ----------
    kind : str
        ``"multi"`` or ``"cluster"``.
    fleet
        The workers' fleet (see the module docstring).
    owner : object
        The generator: its workers go when it is dropped (Ray's).
    factory, actor, n_steps, n_actors, n_per_actor, n_buffers, n_per_batch
        As documented by the generators.
    max_lag : int, optional
        As documented by the generators.
    entropy, sticky, env_info, final, device, pinned, copy, check_spaces,
    timeout, start_timeout, shutdown_timeout, restarts, restart_delay,
    cpu_affinity, resume, actor_device, prefetch, publish
        The shared keywords (:mod:`rlplay.engine.rollout`).

    Attributes
    ----------
    setup : SetUp
    delivery : Delivery
    supervision : Supervision
        Its ``source`` is the source of ready fragments.
    collation : Collation
    stats : dict
        :class:`~._base.Stats`, made by the fleet's ``start``.
    prefetch : Prefetch
        The publication and the prefetching (:mod:`._prefetch`).
    """

    def __init__(self, kind, fleet, owner, factory, actor, n_steps,
                 n_actors, n_per_actor, n_buffers, n_per_batch, *,
                 max_lag=None, entropy=None, sticky=False, env_info=None,
                 final=True, device=None, pinned=False, copy=True,
                 check_spaces="first", timeout=TIMEOUT,
                 start_timeout=START_TIMEOUT,
                 shutdown_timeout=SHUTDOWN_TIMEOUT, restarts=0,
                 restart_delay=RESTART_DELAY, cpu_affinity=None,
                 resume=None, actor_device=None, prefetch=0,
                 publish="next"):
        check_prefetch(prefetch), check_publish(publish)
        counts = [("n_steps", n_steps, 1), ("n_actors", n_actors, 1),
                  ("n_per_actor", n_per_actor, 1), ("n_buffers", n_buffers, 1),
                  ("n_per_batch", n_per_batch, 1)]
        self.setup = setup = SetUp(
            kind, actor, dict(n_steps=n_steps, n_actors=n_actors,
                              n_per_actor=n_per_actor,
                              n_per_batch=n_per_batch, sticky=sticky),
            counts + ([] if max_lag is None else [("max_lag", max_lag, 0)]),
            n_workers=n_actors, entropy=entropy, resume=resume,
            timeouts=dict(timeout=timeout, start_timeout=start_timeout,
                          shutdown_timeout=shutdown_timeout),
            restarts=restarts, restart_delay=restart_delay, sticky=sticky,
            check_spaces=check_spaces, cpu_affinity=cpu_affinity)
        self.actor, self.hx_dim = actor, getattr(actor, "hx_dim", 1)
        self.delivery = Delivery(device, pinned, copy)
        self.supervision = Supervision(setup, self.delivery, timeout,
                                       start_timeout)
        check_pool(n_buffers, n_per_batch, n_actors)
        devices = fleet.devices(actor_device, n_actors)
        self.max_lag, self.n_per_batch = max_lag, n_per_batch
        # the workers' actor is a CPU copy; the buffers are sized with it
        # here from a probe env that the factory makes and we close at once
        spec, template = setup.probe(
            factory, actor, n_steps, n_per_actor, sticky=sticky,
            env_info=env_info, final=final, check_spaces=check_spaces,
            cpu_affinity=cpu_affinity, name="n_per_actor",
            actor_device=devices, sparse_final=True)
        check_hx_dim(template.hx, self.hx_dim, n_per_actor)
        # before the learner's batch is allocated (zero-filled gigabytes
        # for a pool that would not fit anyway)
        fleet.check_capacity(template, n_actors, n_buffers)
        self.collation = Collation(template, self.hx_dim, n_per_batch,
                                   self.delivery.host_pinned, sticky)
        fleet.start(self.supervision, actor, spec, template, n_actors,
                    n_buffers, owner)
        self.stats = setup.stats
        try:
            turns = [(self.collation, self.delivery)] + [
                (Collation(template, self.hx_dim, n_per_batch,
                           self.delivery.host_pinned, sticky),
                 Delivery(device, pinned, copy))
                for _ in range(prefetch if not copy else 0)]
            self.prefetch = Prefetch(
                self, self.supervision, actor, self.stats, prefetch, publish,
                turns, kind=kind, join_timeout=shutdown_timeout)
        except BaseException:
            self.supervision.close(False, self.stats)
            raise

    _pending = 0  # batches prepared, not yet handed out (prefetch)
    _taking = ()  # the arrivals taken for the batch being prepared

    def state_dict(self):
        """The generator's ``state_dict()`` (documented there)."""
        supervision, prefetch = self.supervision, self.prefetch
        return prefetch.command(lambda: self.setup.state(
            prefetch.version(),
            supervision.supervisor.positions(supervision.source.ready)))

    def next(self):
        """The next batch: the rows "next() #k" of the timelines of multi
        and cluster (with prefetch: of :mod:`._prefetch`'s)."""
        prefetch = self.prefetch
        if prefetch.thread is not None:
            return prefetch.thread.next()
        supervision = self.supervision
        tic = self.stats.begin()
        deadline = Deadline(supervision.bound())
        supervision.supervisor.pump(0, self._what())  # deaths at once
        self._advance(None, deadline)
        taken = self._arrive(deadline)
        waited = time.perf_counter() - tic
        return self._hand_out(self._collate(taken), waited)

    def _what(self):
        return f"batch {self.stats['batches'] + self._pending}"

    def _advance(self, taken, deadline=None):
        """Publish (``publish="next"``)."""
        if self.prefetch.mode == "next":
            self.prefetch.publish(deadline)

    def _arrive(self, deadline=None):
        """Wait for ``n_per_batch`` fragments no older than the latest
        publication minus ``max_lag`` (dropping the stale ones); returns
        their arrivals."""
        supervision = self.supervision
        source, supervisor = supervision.source, supervision.supervisor
        what, params = self._what(), supervision.params
        deadline = Deadline(supervision.bound()) if deadline is None \
            else deadline
        self._taking = taken = []

        def stale(arrival):
            source.recycle(arrival, supervisor)

        def enough():
            taken.extend(source.ready.take(self.n_per_batch - len(taken),
                                           params.version, self.max_lag,
                                           stale))
            return len(taken) == self.n_per_batch

        if not supervision.wait(enough, what, deadline):
            source.ready.give_back(taken)
            self._taking = ()
            raise RolloutTimeout(
                f"no fragment for {what} within {deadline.bound} s "
                f"({len(taken)} of {self.n_per_batch} in hand) although "
                f"the {len(supervisor.accounts)} workers are alive; raise "
                f"timeout= for slow envs")
        return taken

    def _collate(self, taken):
        """Copy the ``taken`` fragments into a batch, hand their buffers
        back and deliver it (a :class:`~._prefetch.Prepared`)."""
        source = self.supervision.source
        toc = time.perf_counter()
        collation, delivery = self.prefetch.turn()
        delivery.wait()  # the last device copy read the host batch
        # a fresh batch on the host is collated into straight away
        fresh = delivery.fresh_host
        host, npy = collation.collate([source.fragment(a) for a in taken],
                                      fresh=fresh)
        source.release(taken, self.supervision.supervisor)
        self._taking = ()
        batch = host if fresh else delivery(host)
        self._pending += 1
        return Prepared(batch, npy, taken, time.perf_counter() - toc,
                        min(a.version for a in taken))

    def _hand_out(self, prepared, waited):
        """Count ``prepared`` delivered (now: see ``state_dict``) in the
        statistics; returns its batch."""
        source, stats = self.supervision.source, self.stats
        self._pending -= 1
        source.ready.delivered(prepared.arrived)
        version = self.prefetch.version()
        stats.batch(prepared.npy, waited=waited,
                    collected=source.time_collect - stats["time_collect"],
                    worker_waited=source.time_worker_wait
                    - stats["time_worker_wait"],
                    collated=prepared.collated, version=version,
                    lag=version - prepared.oldest)
        stats["dropped"] = source.ready.dropped
        stats["restarts"] = self.supervision.supervisor.restarts
        return prepared.batch

    def poll(self, timeout):
        """The generator's ``poll(timeout)`` (documented there), once it
        is open."""
        deadline = time.monotonic() + timeout
        count = self.prefetch.command(self._in_hand, 0)
        while not count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            count = self.prefetch.command(self._in_hand, remaining)
        return count

    def _in_hand(self, timeout):
        # one wait (of at most a poll interval), then the fragments ready
        # for the batches to come: queued, taken for the batch being
        # prepared, and in the batches prepared (prefetch)
        supervision = self.supervision
        supervision.supervisor.pump(timeout, "fragments")
        return len(supervision.source.ready) + len(self._taking) + \
            self.n_per_batch * self._pending

    def close(self, graceful):
        """The generator's close: the prefetch thread first, then the
        workers and what they share."""
        self.prefetch.stop()
        self.supervision.close(graceful, self.stats)


class Pooled(Lifecycle):
    """What the generators of a pool (``multi``, ``cluster``) share: each
    makes its :class:`Gather` part with its fleet and hands it to
    :meth:`_adopt`; every call goes to that part.
    """

    def _adopt(self, gather):
        self._gather = gather
        self._setup, self._supervision = gather.setup, gather.supervision
        self.actor, self.hx_dim = gather.actor, gather.hx_dim
        self.delivery, self.device = gather.delivery, gather.delivery.device
        self.timeout = gather.supervision.timeout
        self.start_timeout = gather.supervision.start_timeout
        self.max_lag, self.n_per_batch = gather.max_lag, gather.n_per_batch
        self.stats = gather.stats
        self._prefetch = gather.prefetch

    call_envs = call_envs
    publish = publish

    def __iter__(self):
        return self

    def __next__(self):
        return self._guarded(self._gather.next, stop=StopIteration)

    def poll(self, timeout=0.0):
        """The number of fragments ready for the next batch, waiting up to
        ``timeout`` seconds for one if there is none.

        Raises the worker errors that :meth:`__next__` would.
        """
        if self.status is Status.CLOSED:
            return 0
        return self._guarded(self._gather.poll, timeout)

    def state_dict(self):
        """What rlplay owns of this run, for ``resume=`` (see
        ``resume`` in :mod:`rlplay.engine.rollout`, and "Long runs" in the
        docs): the seeding tree's place, each worker's next
        ``meta.seq`` (after its last fragment yielded) and generation, the
        counters and the parameter version (the publications so far). A
        batch prepared ahead (``prefetch``) and not yet yielded is not
        counted: the continuation collects its ``meta.seq`` again. Valid
        in any state (after ``close()`` too)."""
        return self._gather.state_dict()

    @property
    def version(self):
        """The parameter version at the last ``next()`` (published by it,
        with ``publish="next"``)."""
        return self.stats["version"]

    params, pids, pid = supervised_params, supervised_pids, supervised_pid

    def _close(self, graceful):
        self._gather.close(graceful)
