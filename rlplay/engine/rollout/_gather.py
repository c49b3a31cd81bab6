"""The learner's side of the generators that gather fragments from many
workers: :mod:`~rlplay.engine.rollout.multi` (processes on this machine)
and :mod:`~rlplay.engine.rollout.cluster` (Ray actors), written once.

``next()`` number ``k`` publishes the parameters ``v_k``, waits (bounded,
watching every worker) until ``n_per_batch`` fragments no older than
``v_k - max_lag`` are ready, dropping the stale ones, collates them into
the batch, hands their buffers (or requests) back to the workers and
delivers the batch. What differs is where fragments come from: a *source
of ready fragments*, which the shared-memory pool
(:class:`~._buffers.SharedBuffers`) and the Ray requests
(:class:`~.cluster.RayRequests`) each implement, as
:class:`~._params.SharedParams` and :class:`~._params.RayParams`
implement one parameter interface:

- ``ready``: a :class:`~._batch.ReadyQueue` of the arrivals, in order;
- ``time_collect``, ``time_worker_wait``: the workers' seconds, in all;
- ``fragment(arrival)``: the arrival's leaves (numpy), in the order of
  :meth:`~._batch.Collation.sources`;
- ``release(arrivals, supervisor)``: hand the buffers (requests) of
  collated arrivals back to the workers;
- ``recycle(arrival, supervisor)``: the same for a stale one.
"""
import time

from ..errors import RolloutTimeout
from ._base import Deadline, Generator, Status
from ._supervisor import Supervised

__all__ = ["Gathered", "check_pool"]


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


class Gathered(Supervised, Generator):
    """An iterator of batches collated from the fragments of many workers.

    A subclass sets, before the first ``next()``: ``actor`` (the learner's),
    ``params``, ``delivery`` (:class:`~._delivery.Delivery`), ``max_lag``,
    ``n_per_batch``, ``timeout``, ``start_timeout``, ``stats``
    (:class:`~._base.Stats`), ``_collation`` (:class:`~._batch.Collation`),
    ``_source`` (the source of ready fragments) and ``_supervisor``.
    """

    @property
    def version(self):
        """The parameter version published by the last ``next()``."""
        return self.stats["version"]

    def _next(self):
        # the rows "next() #k" of the timelines of multi and cluster
        source, supervisor, stats = (self._source, self._supervisor,
                                     self.stats)
        tic = stats.begin()
        what = f"batch {stats['batches']}"
        deadline = Deadline(self._bound())
        supervisor.pump(0, what)  # deaths are reported at once
        version = self.params.publish(
            self.actor, check=lambda: supervisor.check(what),
            timeout=deadline.lock_timeout())
        taken = []

        def stale(arrival):
            source.recycle(arrival, supervisor)

        def enough():
            taken.extend(source.ready.take(self.n_per_batch - len(taken),
                                           version, self.max_lag, stale))
            return len(taken) == self.n_per_batch

        if not self._await(enough, what, deadline):
            source.ready.give_back(taken)
            raise RolloutTimeout(
                f"no fragment for {what} within {deadline.bound} s "
                f"({len(taken)} of {self.n_per_batch} in hand) although "
                f"the {len(supervisor.accounts)} workers are alive; raise "
                f"timeout= for slow envs")
        toc = time.perf_counter()
        self.delivery.wait()  # the last device copy read the host batch
        self._collation.collate([source.fragment(a) for a in taken])
        source.ready.delivered(taken)
        source.release(taken, supervisor)
        batch = self.delivery(self._collation.host)
        stats.batch(self._collation.npy, waited=toc - tic,
                    collected=source.time_collect - stats["time_collect"],
                    worker_waited=source.time_worker_wait
                    - stats["time_worker_wait"],
                    collated=time.perf_counter() - toc, version=version,
                    lag=version - min(a.version for a in taken))
        stats["dropped"] = source.ready.dropped
        stats["restarts"] = supervisor.restarts
        return batch

    def poll(self, timeout=0.0):
        """The number of fragments ready for the next batch, waiting up to
        ``timeout`` seconds for one if there is none.

        Raises the worker errors that :meth:`__next__` would.
        """
        if self.status is Status.CLOSED:
            return 0
        return self._guarded(self._poll, timeout)

    def _poll(self, timeout):
        ready, deadline = self._source.ready, time.monotonic() + timeout
        self._supervisor.pump(0, "fragments")
        while not len(ready):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._supervisor.pump(remaining, "fragments")
        return len(ready)
