"""The learner's side of a generator whose workers a supervisor runs
(:class:`Supervised`): ``single``, ``multi``, ``cluster`` and the
evaluator; ``same`` runs none and does not import this."""
from ..utils.mp import first_timeout
from ..workers import SharedParams, Supervisor
from ._base import SetUp
from ._stats import Stats

__all__ = ["Supervised"]


class Supervised(SetUp):
    """The learner's side of a generator whose workers a
    :class:`~rlplay.engine.workers.Supervisor` runs (processes,
    :meth:`_workers`), or a :class:`~rlplay.engine.workers.RemoteSupervisor`
    (cluster): the bounded wait
    for news, the error latch's restart count, pids, and the release of
    what the workers share (``_supervisor``, ``delivery``, ``_source``,
    ``params``: those set). :attr:`process` is for worker processes
    only."""

    _supervisor = _source = params = None

    def _workers(self, ctx, n_workers, protocol, *, name, stats=Stats):
        """Share the actor's parameters (:class:`~rlplay.engine.workers.SharedParams`,
        at the run's version), make the protocol that the workers serve
        and the source of fragments, ``protocol(params)`` (see
        :class:`~rlplay.engine.workers.Supervisor`), and its ``stats(accounts)``,
        and start ``n_workers`` worker processes named ``f"{name}-{w}"``
        under the restart policy of :meth:`SetUp._begin`. On a failure,
        closes the generator (``_close(graceful=False)``) and raises."""
        self.params = SharedParams(self.actor, ctx,
                                   version=self._run.version)
        try:
            self._source = protocol(self.params)
            self._count(stats(self._source.accounts))
        except BaseException:
            self._close(graceful=False)
            raise
        self._supervise(lambda: Supervisor(
            ctx, n_workers, self._source, name=name, params=self.params,
            run=self._run, calls=self._calls, **self._policy))

    def _supervise(self, make):
        """Make the supervisor (``make()``) and start its workers; on a
        failure, close the generator (``_close(graceful=False)``) and
        raise."""
        try:
            self._supervisor = make()
            self._supervisor.start_all()
        except BaseException:
            self._close(graceful=False)
            raise

    def _publish(self, actor, check, timeout):
        """Publish the ``call_envs`` calls made since the last time (sent
        to the workers first) and ``actor``'s parameters; returns their
        version (see :mod:`rlplay.engine.workers._control`)."""
        self._calls.publish()
        self._supervisor.post_calls()
        return self.params.publish(actor, check=check, timeout=timeout)

    def _close(self, graceful):
        """Stop the workers, then let go of what they shared: the device
        copies in flight first (none may read freed memory), the buffers
        (``_source``), the parameters."""
        if self._supervisor is not None:
            self._supervisor.shutdown(graceful)
        delivery = getattr(self, "delivery", None)
        if delivery is not None:
            delivery.close()
        source = getattr(self, "_source", None)
        if source is not None:
            source.close()
        if getattr(self, "params", None) is not None:
            self.params.close()
            self.params = None

    def _break(self, exc):
        # the count that the error's message gives ("after 2 restarts"),
        # even when no batch followed the last restart
        stats = getattr(self, "stats", None)
        if self._supervisor is not None and stats is not None:
            stats["restarts"] = self._supervisor.restarts
        super()._break(exc)

    def _bound(self):
        # how long to wait without news: start-up time too while a worker
        # has not delivered yet (the first batch, or a replacement)
        return first_timeout(self.timeout, self.start_timeout) \
            if self._supervisor.starting else self.timeout

    def _await(self, done, what, deadline, renew=True):
        """Pump news until ``done()`` is true (returns ``True``) or
        ``deadline`` passes (``False``); news renews the deadline by
        :meth:`_bound` unless ``renew`` is false. Worker failures raise."""
        while not done():
            remaining = deadline.remaining()
            if remaining == 0:
                if not (renew and self._supervisor.replacing):
                    return False
                # the restart delay is no stall: the replacement's start
                # renews the deadline again (with start_timeout)
                deadline.renew(self._bound())
                remaining = deadline.remaining()
            if self._supervisor.pump(remaining, what) and renew:
                deadline.renew(self._bound())
        return True

    @property
    def pids(self):
        """The pid of each worker (of its latest generation)."""
        return self._supervisor.pids

    @property
    def process(self):
        """Worker 0's process object (``None`` between generations)."""
        return self._supervisor.workers[0].process

    @property
    def pid(self):
        return self._supervisor.pids[0]
