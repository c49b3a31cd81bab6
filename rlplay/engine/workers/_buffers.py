"""Fragment buffers shared with worker processes, and who holds which.

One mechanism for ``single`` and ``multi``: :class:`SharedBuffers` lays
``n_buffers`` fragment buffers out in *one* shared segment
(:class:`~rlplay.engine.pool.Segment`, checked against ``/dev/shm`` and
the file-descriptor limits first), tracks which buffers each worker holds
(free, or being filled), receives the workers' :class:`._session.Ready`
reports into a :class:`~._batch.ReadyQueue` and makes each worker's start
bundle: it is the protocol that the :class:`~._supervisor.Supervisor`
serves, and the source of ready fragments of the learner's side
(:class:`rlplay.engine.rollout._gather.Gather`). A worker retired for a
restart leaves the buffers it held to its replacement: the fragment it was
filling is discarded, never delivered in part.

It holds no reference to the generator or to the supervisor (which its
methods take as an argument), so that the supervisor's exit handler may
call it while the generator is collected.
"""
from collections import deque

from ..nested import flatten
from ..pool import Segment, check_capacity, layout, views
from ._batch import Arrival, Collation, ReadyQueue, new_account
from ._session import Buffers, Bye, Give, Ready, WorkerConfig

__all__ = ["SharedBuffers", "WORKER_THREADS"]

# torch threads per worker: the workers already share the cores
WORKER_THREADS = 1


class SharedBuffers:
    """``n_buffers`` fragment buffers laid out as ``template``, shared.

    Parameters
    ----------
    template : Fragment of tensors
        One buffer (from :func:`~._base.probe_layout`).
    n_buffers, n_workers : int
    spec : SessionSpec
        What every worker shares.
    params : SharedParams
    what : str
        For capacity messages.
    start_method : str
        For the file-descriptor check.

    Attributes
    ----------
    buffers : list of Aliased
        The learner's views of each buffer.
    held : list of deque
        Per worker, the buffers it holds, in the order it fills them.
    ready : ReadyQueue
    accounts : list of dict
        Per worker (shared with the supervisor's, which adds its own keys).
    """

    def __init__(self, template, n_buffers, n_workers, spec, params, *,
                 what, start_method, run=None):
        self._spec, self.stride = self.check_capacity(
            template, n_buffers, n_workers, what=what,
            start_method=start_method)
        self.segment = Segment.create(self.stride * n_buffers, what=what)
        self.buffers = [views(self.segment.flat, self._spec, i * self.stride)
                        for i in range(n_buffers)]
        self.spec, self.params = spec, params
        self.held = [deque(range(w, n_buffers, n_workers))
                     for w in range(n_workers)]
        self.accounts = [new_account() for _ in range(n_workers)]
        self.ready = ReadyQueue(self.accounts, run)
        counters = {} if run is None else run.counters
        self.time_collect = counters.get("time_collect", 0.0)
        self.time_worker_wait = counters.get("time_worker_wait", 0.0)
        self._sources = None

    @staticmethod
    def check_capacity(template, n_buffers, n_workers, *, what,
                       start_method):
        """Check that ``n_buffers`` buffers laid out as ``template`` fit in
        ``/dev/shm``, and the file descriptors; returns the layout
        ``(spec, stride)``.

        Raises
        ------
        CapacityError
            Saying what to change (``final=False`` too, where the final
            observations take a good part of the pool).
        """
        spec, stride = layout(template)
        hint = ""
        if template.final is not None:
            final = sum(x.numel() * x.element_size()
                        for x in flatten(template.final))
            if final * 4 >= stride:  # image observations, typically
                hint = (f"; final=False drops the final observations, "
                        f"{final * n_buffers / 2**20:.1f} MiB of it")
        check_capacity(stride * n_buffers, what=what, hint=hint)
        # a worker is handed the pool, the parameters, its pipe and the
        # parameters' shared counters; the learner keeps a pipe end and a
        # sentinel per worker
        check_capacity(0, n_fds=1 + 3 * n_workers, what=what, worker_fds=5,
                       start_method=start_method)
        return spec, stride

    def config(self, w, generation):
        """Worker ``w``'s start bundle: it fills the buffers it holds, and
        numbers its fragments on from those received (from where the run
        it continues left off, when resumed)."""
        return WorkerConfig(
            spec=self.spec, index=w, collector=w, generation=generation,
            seq=self.ready.numbered_from(w), params=self.params,
            buffers=Buffers(self.segment, self._spec, self.stride),
            free=list(self.held[w]), evaluation=None, threads=WORKER_THREADS)

    def on_started(self, w):
        """Worker ``w`` was started (it takes its buffers with it)."""

    def on_message(self, w, message):
        if isinstance(message, Ready):
            self.held[w].remove(message.index)
            self.ready.push(Arrival(w, message.index, message.seq,
                                    message.version))
            self.time_collect += message.elapsed
            self.time_worker_wait += message.waited
        elif isinstance(message, Bye):
            self.accounts[w]["collected"] = message.seq

    def on_lost(self, w):
        """Worker ``w`` is being replaced: the buffers it held go to the
        replacement; returns the fragment lost in flight (0 or 1)."""
        return int(bool(self.held[w]))

    def assign(self, indices):
        """Hand free buffers to the workers that hold the fewest; returns
        ``{w: [index, ...]}``."""
        orders = {}
        for index in indices:
            w = min(range(len(self.held)), key=lambda w: len(self.held[w]))
            self.held[w].append(index)
            orders.setdefault(w, []).append(index)
        return orders

    # the source of ready fragments (see rollout._gather.Gather)
    def fragment(self, arrival):
        """The leaves of an arrival's buffer, in :class:`Collation`'s
        order."""
        if self._sources is None:
            self._sources = [Collation.sources(buffer.npy)
                             for buffer in self.buffers]
        return self._sources[arrival.index]

    def release(self, arrivals, supervisor):
        """Hand the buffers of ``arrivals`` back to the workers that hold
        the fewest (a replacement on its way takes them at start)."""
        for w, indices in self.assign([a.index for a in arrivals]).items():
            if supervisor.workers[w].process is not None:
                supervisor.send(w, Give(indices))

    def recycle(self, arrival, supervisor):
        """A stale fragment's buffer, back to the workers."""
        self.release([arrival], supervisor)

    def close(self):
        """Count the undelivered fragments and unmap the pool (the
        learner's views first, so that the memory is freed)."""
        self.ready.close()
        self.buffers = self._sources = None
        self.segment.close()
