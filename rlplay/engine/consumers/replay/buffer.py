"""The replay buffers: :class:`Replay` (uniform) and
:class:`PrioritizedReplay`, each a node storage, a writer and a sampler
wired together (see :mod:`rlplay.engine.replay`)."""
import numpy as np

from ...core.layout import check_count
from ...nested import flatten
from ...devices import check_device
from . import _gather, _state
from ._nodes import _Nodes, node_bytes
from ._samplers import _Prioritized, _Uniform, draw_windows
from ._writer import _Writer, host_parts, node_rows, numpy

__all__ = ["Replay", "PrioritizedReplay"]


class Replay:
    """A ring of transitions fed by the batches of any generator, sampled
    uniformly.

    Parameters
    ----------
    capacity : int
        Nodes held: one per state an executed action led to, plus one per
        episode start (the oldest are overwritten first). The memory they
        take is checked once the layout is known (``example``, or the
        first batch given to :meth:`extend`), before anything is
        allocated: a ``MemoryError`` that names the capacity.
    device : torch.device or str, optional
        Where sampled transitions go (the CPU by default).
    pinned : bool
        Gather sampled transitions in pinned memory before moving them to a
        CUDA ``device`` (asynchronously).
    seed : int or numpy.random.SeedSequence, optional
        Seeds the sampling generator (fresh entropy if ``None``).
    example : Fragment, optional
        A batch (or a generator's buffer) to size the storage from now;
        otherwise the first batch given to :meth:`extend` does.
    actor : BaseActorModule or generator, optional
        The generator (its ``hx_dim``, which is its actor's) or its actor:
        with it, the actor's state at row 0 of every fragment is kept, and
        :meth:`sample_sequences` draws windows that start there.

    Attributes
    ----------
    lanes : Lanes
        The lanes followed; ``lanes.counts`` tells how many gaps were met.

    Examples
    --------
    >>> import gymnasium
    >>> import torch
    >>> from rlplay.engine import PolicyActor
    >>> from rlplay.engine.rollout import same
    >>> actor = PolicyActor(torch.nn.Linear(4, 2))
    >>> replay = Replay(10_000, seed=0)
    >>> with same.rollout(lambda: gymnasium.make("CartPole-v1"), actor,
    ...                   n_steps=16, n_envs=4, entropy=0) as feed:
    ...     for _, batch in zip(range(8), feed):
    ...         replay.extend(batch)
    >>> len(replay) >= 8 * 16 * 4 - 4 * 8
    True
    >>> tr = replay.sample(32, n_step=3, gamma=0.99)
    >>> tr.obs.shape, tr.act.shape, tr.rew.dtype, tr.discount.shape
    (torch.Size([32, 4]), torch.Size([32]), torch.float32, torch.Size([32]))
    """

    def __init__(self, capacity, *, device=None, pinned=False, seed=None,
                 example=None, actor=None):
        self._init(capacity, _Uniform(), device, pinned, seed, example,
                   actor)

    def _init(self, capacity, sampler, device, pinned, seed, example,
              actor):
        check_count("capacity", capacity, 2)
        self.capacity = int(capacity)
        self.device = check_device(device, pinned)
        self.pinned = bool(pinned)
        self._rng = np.random.default_rng(seed)
        # the actor's env axis of hx: with it, the hx at row 0 of every
        # fragment is kept, for sample_sequences
        self._nodes = _Nodes(self.capacity,
                             None if actor is None else int(actor.hx_dim))
        self._writer = _Writer()
        self._sampler = sampler
        if example is not None:
            self._allocate(host_parts(example))

    def _allocate(self, parts):
        self._nodes.allocate(parts, self._sampler.extra_bytes)
        self._sampler.allocate(self.capacity)

    # ------------------------------------------------------------ sizes --
    @property
    def lanes(self):
        """The lanes followed (a :class:`~rlplay.engine.lanes.Lanes`);
        ``lanes.counts`` tells how many gaps were met."""
        return self._writer.lanes

    @property
    def hx_dim(self):
        """The actor's env axis of ``hx`` (``None``: no ``actor=``)."""
        return self._nodes.hx_dim

    def __len__(self):
        """The transitions that can be sampled: nodes held that have a
        successor."""
        return self._nodes.linked

    @property
    def n_stored(self):
        """Nodes held (transitions, episode ends and lanes' last nodes)."""
        return min(self._nodes.total, self.capacity)

    @property
    def nbytes_per_node(self):
        """Bytes one node takes (``None`` before the layout is known)."""
        if self._nodes.store is None:
            return None
        return node_bytes([x[0] for x in flatten(self._nodes.store["data"])],
                          self._sampler.extra_bytes)

    # ----------------------------------------------------------- extend --
    def extend(self, batch):
        """Store the transitions of a batch (copied: the batch may be a
        view that the generator reuses).

        Each field comes to the host once (one ``.cpu()`` per leaf of a
        batch on a device; ``final`` only at the rows where episodes
        ended), and each observation is read once.

        Parameters
        ----------
        batch : Fragment
            A batch of any generator (``final=True``), in the order the
            generator yields them, numpy or torch (on any device).

        Raises
        ------
        ValueError
            The batch has no ``final``, or does not match the layout of the
            first batch (or ``example``), or one batch makes more nodes than
            ``capacity``; the buffer is left as it was.
        """
        parts = host_parts(batch)
        if self._nodes.store is None:
            self._allocate(parts)
        nodes = self._nodes
        nodes.check_layout(parts)
        executed, starts, n_max = node_rows(parts, self.capacity)
        # nothing changes above this line
        place = self._writer.place(parts, executed, starts, n_max,
                                   nodes.total, self.capacity)
        nodes.write(parts, place, self._sampler)
        nodes.link(place.src, place.dst)
        self._sampler.linked(place.src % self.capacity)
        # the real actor info at row 0 of a continuing column replaces the
        # lookahead stored with the lane's last node
        cont = np.flatnonzero(place.held)
        if len(cont):
            nodes.replace_info(place.row0[cont], parts["info"], cont)
        if nodes.hx is not None:
            nodes.keep_hx(parts["hx"], place.row0)

    # ----------------------------------------------------------- sample --
    def _check_sample(self, batch_size, n_step, gamma):
        check_count("batch_size", batch_size)
        check_count("n_step", n_step)
        gamma = _state.check_gamma(gamma)
        if batch_size > len(self):
            raise ValueError(f"batch_size={batch_size} is more than the "
                             f"{len(self)} transitions held")
        return gamma

    def sample(self, batch_size, *, n_step=1, gamma=0.99):
        """``batch_size`` transitions drawn uniformly (with replacement).

        Parameters
        ----------
        batch_size : int
            At most ``len(self)``.
        n_step : int
            Steps summed per transition (the window may stop earlier: see
            the module docstring).
        gamma : float
            In ``[0, 1]``.

        Returns
        -------
        Transitions
        """
        gamma = self._check_sample(batch_size, n_step, gamma)
        index = self._sampler.draw(self._nodes, batch_size, self._rng)
        return self._out(_gather.transitions(self._nodes, index, n_step,
                                             gamma))

    def _out(self, out):
        return _gather.to_device(out, self.device, self.pinned)

    def indices(self):
        """The indices of every transition held (oldest first)."""
        if self._nodes.store is None:
            return np.empty(0, np.int64)
        numbers = np.arange(*self._nodes.window(), dtype=np.int64)
        return numbers[self._nodes.linked_at(numbers)]

    def transitions(self, index, *, n_step=1, gamma=0.99):
        """The transitions of ``index`` (indices of transitions held, e.g.
        from :meth:`indices` or a :class:`Transitions`).

        Raises
        ------
        ValueError
            An index that names no transition held (never stored,
            overwritten, or a node with no successor).
        """
        check_count("n_step", n_step)
        gamma = _state.check_gamma(gamma)
        index = numpy(index).astype(np.int64).reshape(-1)
        if self._nodes.store is None:
            raise ValueError("the buffer is empty")
        bad = ~self._nodes.linked_at(index)
        if bad.any():
            lo, hi = self._nodes.window()
            raise ValueError(f"index {int(index[bad][0])} names no "
                             f"transition held (held: {lo} .. {hi - 1})")
        return self._out(_gather.transitions(self._nodes, index, n_step,
                                             gamma))

    def sample_sequences(self, batch_size, length, *, burn_in=0):
        """``batch_size`` windows of ``burn_in + length`` steps for a
        recurrent actor, each starting at row 0 of a fragment (where the
        actor's state was kept), drawn uniformly with replacement.

        A window follows its lane's transitions; it stops at an episode end
        (the row where the episode ended holds its true last observation,
        with ``fin`` and ``truncated`` set) and at the last node known of
        the lane; the rows after that are padding, ``mask`` False (zeros).

        Parameters
        ----------
        batch_size : int
        length, burn_in : int
            The window has ``burn_in + length + 1`` state rows.

        Returns
        -------
        Sequences
            Time-major ``(burn_in + length + 1, batch_size, ...)``, laid out
            as a fragment's rows: ``obs``, ``act`` and ``rew`` (the action
            and reward that led to each row; row 0's are its node's),
            ``fin`` (an episode ended at the row), ``truncated``, ``mask``,
            ``info``, ``version``; ``hx`` the actor's state at row 0
            (``batch_size`` along the actor's ``hx_dim``); ``index`` the
            first row's transition.

        Raises
        ------
        ValueError
            The buffer was made without ``actor=``, or holds no window's
            start; bad counts.
        """
        check_count("batch_size", batch_size)
        check_count("length", length)
        check_count("burn_in", burn_in, 0)
        if self._nodes.hx is None:
            raise ValueError("sample_sequences needs the actor's states: "
                             "make the buffer with actor=")
        pick, rows, mask = draw_windows(self._nodes, batch_size,
                                        burn_in + length, self._rng)
        return self._out(_gather.sequences(self._nodes, pick, rows, mask))

    # ------------------------------------------------------------ state --
    def state_dict(self):
        """Everything :meth:`load_state_dict` needs to go on as this buffer
        would: contents, lanes, the sampling generator (picklable; arrays
        are the buffer's own, as a module's ``state_dict`` holds its
        tensors)."""
        nodes = self._nodes
        return {"kind": type(self).__name__, "capacity": self.capacity,
                "store": nodes.store, "cur": self._writer.cur,
                "hx": nodes.hx, "hx_dim": nodes.hx_dim,
                "total": nodes.total, "linked": nodes.linked,
                "lanes": self._writer.lanes.state_dict(),
                "rng": self._rng.bit_generator.state,
                **self._sampler.state()}

    def load_state_dict(self, state):
        """Go on from :meth:`state_dict` (of a buffer of the same kind and
        capacity); the arrays are copied.

        Raises
        ------
        ValueError, TypeError
            A state of another kind or capacity, or a damaged one (a key
            missing, an entry of another type or shape); the message names
            the entry (``state['cur']``) and what was found. A refused
            state leaves the buffer as it was: everything is checked and
            built before anything is assigned.
        """
        out = _state.loaded(state, type(self).__name__, self.capacity)
        sampler = self._sampler.loaded(state, self.capacity,
                                       out["store"] is not None)
        nodes = _Nodes(self.capacity, out["hx_dim"])
        nodes.store, nodes.hx = out["store"], out["hx"]
        nodes.total, nodes.linked = out["total"], out["linked"]
        self._nodes, self._sampler, self._rng = nodes, sampler, out["rng"]
        self._writer = _Writer(out["lanes"], out["cur"])


class PrioritizedReplay(Replay):
    """A :class:`Replay` that samples transition ``i`` with probability
    ``p_i**alpha / sum(p**alpha)`` (Schaul et al., 2016).

    A new transition gets the largest priority given so far (1 at first);
    :meth:`update` sets the priorities of sampled transitions, ignoring
    those whose node was overwritten since they were sampled. Samples carry
    importance weights ``(N * P(i))**-beta`` divided by their largest
    possible value (that of the least likely transition held), ``N =
    len(self)``. Priorities live in a float64 sum tree, updated and
    searched without a Python loop over items; sampling is stratified (one
    draw in each of ``batch_size`` equal parts of the total).

    Parameters
    ----------
    capacity, device, pinned, seed, example, actor
        As :class:`Replay`.
    alpha : float
        How much priorities count (0: uniform).
    beta : float
        The importance-weight exponent (a learner usually anneals it to 1;
        ``sample(beta=...)`` overrides it).
    eps : float
        Added to every priority given to :meth:`update`, so that no
        transition held becomes impossible to draw.
    """

    def __init__(self, capacity, *, alpha=0.6, beta=0.4, eps=1e-6,
                 device=None, pinned=False, seed=None, example=None,
                 actor=None):
        sampler = _Prioritized(*(_state.check_number(value, name)
                                 for name, value in (("alpha", alpha),
                                                     ("beta", beta),
                                                     ("eps", eps))))
        self._init(capacity, sampler, device, pinned, seed, example, actor)

    alpha = property(lambda self: self._sampler.alpha,
                     lambda self, value: setattr(self._sampler, "alpha",
                                                 value),
                     doc="How much priorities count (0: uniform).")
    beta = property(lambda self: self._sampler.beta,
                    lambda self, value: setattr(self._sampler, "beta",
                                                value),
                    doc="The importance-weight exponent of sample().")
    eps = property(lambda self: self._sampler.eps,
                   lambda self, value: setattr(self._sampler, "eps", value),
                   doc="Added to every priority given to update().")

    def sample(self, batch_size, *, n_step=1, gamma=0.99, beta=None):
        """``batch_size`` transitions drawn by priority, with ``weight``.

        Parameters are as :meth:`Replay.sample`; ``beta`` overrides the
        buffer's.
        """
        gamma = self._check_sample(batch_size, n_step, gamma)
        beta = _state.check_number(self.beta if beta is None else beta,
                                   "beta")
        index, weight = self._sampler.draw(self._nodes, batch_size,
                                           self._rng, beta)
        out = _gather.transitions(self._nodes, index, n_step, gamma)
        return self._out(out._replace(weight=weight))

    def update(self, index, priorities):
        """Set the priorities of transitions (``index`` from a sample);
        those whose node was overwritten meanwhile are ignored.

        Raises
        ------
        TypeError
            ``index`` not of ints (a float index names no node), or
            ``priorities`` not numbers (nothing is changed).
        ValueError
            ``priorities`` not shaped as ``index``, or not finite and
            >= 0 (nothing is changed).
        """
        index, priorities = numpy(index), numpy(priorities)
        if index.dtype.kind not in "iu":
            raise TypeError(f"index must hold the ints of a sample's index, "
                            f"got {index.dtype} {_state.shown(index)}")
        if priorities.dtype.kind not in "iuf":
            raise TypeError(f"priorities must be numbers, got "
                            f"{priorities.dtype} {_state.shown(priorities)}")
        index = index.astype(np.int64).reshape(-1)
        priorities = priorities.astype(np.float64)
        if priorities.shape not in ((len(index),), (len(index), 1)):
            raise ValueError(f"priorities must be shaped as index "
                             f"({len(index)},), got {priorities.shape}")
        priorities = priorities.reshape(-1)
        if not np.isfinite(priorities).all() or (priorities < 0).any():
            raise ValueError("priorities must be finite and >= 0")
        self._sampler.update(self._nodes, index, priorities)
