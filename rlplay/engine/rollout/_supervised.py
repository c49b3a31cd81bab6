"""The supervision of a generator's workers (:class:`Supervision`), a part
of ``single``, ``multi``, ``cluster`` and the evaluator; ``same`` runs no
worker and does not import this."""
from ..utils.mp import first_timeout
from ..workers import SharedParams, Supervisor
from ._stats import Stats

__all__ = ["Supervision", "supervised_params", "supervised_pids",
           "supervised_pid", "supervised_process"]


class Supervision:
    """The learner's side of the workers that a
    :class:`~rlplay.engine.workers.Supervisor` runs (processes,
    :meth:`workers`), or a :class:`~rlplay.engine.workers.RemoteSupervisor`
    (cluster, :meth:`supervise`): the bounded wait for news
    (:meth:`wait`), the publication of the parameters and the
    ``call_envs`` calls (:meth:`publish`), pids, and the ordered release
    of what the workers share (:meth:`close`). It holds no reference to
    its generator, so that dropping the generator closes it at once.

    Parameters
    ----------
    setup : SetUp
        The generator's set-up (:class:`~._base.SetUp`): its run, its
        ``call_envs`` log and its restart policy.
    delivery : Delivery or None
        The generator's delivery, closed after the workers stop.
    timeout, start_timeout : float or None
        The bounds of a wait without news (see :meth:`bound`).

    Attributes
    ----------
    supervisor : Supervisor or RemoteSupervisor
        Set by :meth:`supervise`.
    source
        What the supervisor serves, and the generator's source of
        fragments (or of results): its memory is released on close.
    params : SharedParams or RayParams
        The published parameters (``None`` once closed).
    """

    def __init__(self, setup, delivery, timeout, start_timeout):
        self.setup, self.delivery = setup, delivery
        self.timeout, self.start_timeout = timeout, start_timeout
        self.supervisor = self.source = self.params = None

    def workers(self, ctx, n_workers, actor, protocol, *, name, stats=Stats,
                supervisor=Supervisor):
        """Share ``actor``'s parameters
        (:class:`~rlplay.engine.workers.SharedParams`, at the run's
        version), make the protocol that the workers serve and the source
        of fragments, ``protocol(params)`` (see
        :class:`~rlplay.engine.workers.Supervisor`), and its
        ``stats(accounts)`` (kept by the set-up), and start ``n_workers``
        worker processes named ``f"{name}-{w}"`` under the restart policy,
        run by ``supervisor`` (a :class:`~rlplay.engine.workers.Supervisor`
        class, or a factory of the same arguments). On a failure, closes
        what was made and raises."""
        setup = self.setup
        self.params = SharedParams(actor, ctx, version=setup.run.version)
        try:
            self.source = protocol(self.params)
            setup.count(stats(self.source.accounts))
        except BaseException:
            self.close(graceful=False)
            raise
        self.supervise(lambda: supervisor(
            ctx, n_workers, self.source, name=name, params=self.params,
            run=setup.run, calls=setup.calls, **setup.policy))

    def supervise(self, make):
        """Make the supervisor (``make()``) and start its workers; on a
        failure, close what was made and raise."""
        try:
            self.supervisor = make()
            self.supervisor.start_all()
        except BaseException:
            self.close(graceful=False)
            raise

    def publish(self, actor, check, timeout):
        """Publish the ``call_envs`` calls made since the last time (sent
        to the workers first) and ``actor``'s parameters; returns their
        version (see :mod:`rlplay.engine.workers._control`)."""
        self.setup.calls.publish()
        self.supervisor.post_calls()
        return self.params.publish(actor, check=check, timeout=timeout)

    def close(self, graceful, stats=None):
        """Stop the workers, then let go of what they shared: the device
        copies in flight first (none may read freed memory), the buffers
        (``source``), the parameters. After a failure (``graceful=False``)
        ``stats["restarts"]`` first takes the count that the error's
        message gives ("after 2 restarts"), even when no batch followed
        the last restart."""
        supervisor = self.supervisor
        if supervisor is not None:
            if not graceful and stats is not None:
                stats["restarts"] = supervisor.restarts
            supervisor.shutdown(graceful)
        if self.delivery is not None:
            self.delivery.close()
        if self.source is not None:
            self.source.close()
        if self.params is not None:
            self.params.close()
            self.params = None

    def bound(self):
        """How long to wait without news: start-up time too while a worker
        has not delivered yet (the first batch, or a replacement)."""
        return first_timeout(self.timeout, self.start_timeout) \
            if self.supervisor.starting else self.timeout

    def wait(self, done, what, deadline, renew=True):
        """Pump news until ``done()`` is true (returns ``True``) or
        ``deadline`` passes (``False``); news renews the deadline by
        :meth:`bound` unless ``renew`` is false. Worker failures raise."""
        supervisor = self.supervisor
        while not done():
            remaining = deadline.remaining()
            if remaining == 0:
                if not (renew and supervisor.replacing):
                    return False
                # the restart delay is no stall: the replacement's start
                # renews the deadline again (with start_timeout)
                deadline.renew(self.bound())
                remaining = deadline.remaining()
            if supervisor.pump(remaining, what) and renew:
                deadline.renew(self.bound())
            self.between()
        return True

    def between(self):
        """Called by :meth:`wait` between two waits; a prefetch thread
        sets its own (it runs the caller's commands there: see
        :mod:`._prefetch`)."""

    @property
    def pids(self):
        """The pid of each worker (of its latest generation)."""
        return self.supervisor.pids

    @property
    def process(self):
        """Worker 0's process object (``None`` between generations)."""
        return self.supervisor.workers[0].process


# the generator's views of its supervision, given to each class that has
# one as ``params = supervised_params`` (as ``call_envs``, :mod:`._calls`)
supervised_params = property(
    lambda self: self._supervision.params,
    doc="""The published parameters: the shared copy of ``single``,
    ``multi`` and the evaluator, ``cluster``'s object in Ray's store
    (``None`` once closed).""")
supervised_pids = property(
    lambda self: self._supervision.pids,
    doc="The pid of each worker (of its latest generation), in a list.")
supervised_pid = property(
    lambda self: self._supervision.pids[0],
    doc="The pid of the first worker (of its latest generation).")
supervised_process = property(
    lambda self: self._supervision.process,
    doc="The worker's process object (``None`` between generations).")
