"""Replay buffers fed by any generator, exact at every boundary.

A :class:`Replay` takes the batches of any generator (``same``, ``single``,
``multi``, ``cluster``) and keeps their transitions for off-policy learning
(DQN, SAC): ``extend(batch)`` after every batch, ``sample(...)`` as often as
the learner wants.

How a batch is stored. Every env column of the run is a *lane*
(``meta.worker``, ``meta.env``; see :mod:`rlplay.engine.lanes`). A lane's
states are kept once each, as *nodes* of a ring of ``capacity`` nodes
numbered by a running count (the oldest are overwritten first), each linked
to the node an executed action led to from it:

- a row that an executed action led to (:func:`rlplay.engine.core.acted`)
  is a node holding that action, its reward and the parameter version that
  chose it; where the episode ended there (``fin``), the node holds the
  true final observation (``final``) and how the episode ended, and has no
  successor;
- the first observation of the next episode (a row with ``fin`` that an
  executed action follows) is a node of its own, with no predecessor;
- row 0 of a fragment that continues its lane is the lane's last node (the
  actor info there, a lookahead's in the previous fragment, is replaced by
  the real call's); after a gap in the lane (a new ``meta.generation``, a
  missing or out-of-order ``meta.seq``, the lane's first fragment) it is a
  node with no predecessor: nothing is ever linked across a gap;
- rows that no executed action led to (frozen rows of ``sticky=True``, the
  lost calls of a next-step vector source) are no transitions and are not
  stored.

A *transition* is a node with a successor: ``obs`` (the node's), ``act``,
``rew`` and ``version`` (its successor's), ``info`` (the actor's info at
the node, from the call that chose ``act``). An ``n``-step transition
follows the links: ``rew`` is the discounted sum of the rewards of the
steps taken (:func:`rlplay.engine.returns.n_step`), ``next_obs`` the
observation reached, ``discount`` ``gamma**k`` for the ``k`` steps taken,
or 0 where the episode terminated within them. The window stops after
``n`` steps, at an episode end (a truncation keeps its discount: the
learner bootstraps from the true final observation it returns as
``next_obs``) and at the last node known of its lane (a fragment not yet
seen, or a gap: the learner bootstraps from the state reached, exact for
the ``k`` steps taken). Nodes are numbered by a running count, so an index
that was sampled names its node for good: once the node is overwritten the
index is stale, and :meth:`PrioritizedReplay.update` ignores it.

Each observation is stored once (the successor's observation is the next
node's), the true final observations only where episodes ended, in the
dtypes of the batch (uint8 stays uint8). Transitions come out as tensors on
the buffer's ``device``. Sampling draws from a numpy generator seeded with
``seed``: the same batches and the same seed give the same samples.
"""
import os
from collections import namedtuple

import numpy as np
import torch

from .core import acted, check_count
from .lanes import Lanes
from .nested import StructureError, check_structure, flatten, suply
from .returns import n_step as _n_step
from .shared import check_device

__all__ = ["Replay", "PrioritizedReplay", "Transitions", "Sequences"]

Transitions = namedtuple(
    "Transitions",
    "obs act rew next_obs discount info version index weight")
Transitions.__doc__ = """A batch of sampled transitions (tensors; ``weight``
is ``None`` but for :class:`PrioritizedReplay`):

====================  ==================================================
``obs``               the observations the actions were taken at
``act``               the actions
``rew``               float32, the discounted sum of the ``k`` rewards of
                      the window
``next_obs``          the observation reached after ``k`` steps (the true
                      final observation where the episode ended)
``discount``          float32, ``gamma**k``, 0 after a termination:
                      the target is ``rew + discount * V(next_obs)``
``info``              the actor's info at ``obs``
``version``           int64, the parameter version that chose ``act``
``index``             int64, the transitions' indices (for ``update``)
``weight``            float32, importance weights (prioritized only)
====================  ==================================================
"""

Sequences = namedtuple(
    "Sequences", "obs act rew fin truncated mask info version hx index")
Sequences.__doc__ = """Windows for a recurrent actor, time-major; see
:meth:`Replay.sample_sequences`."""

# nodes: how a lane's step ended at a node (the node of an episode end
# holds the true final observation)
_GOES_ON, _TERMINATED, _TRUNCATED = 0, 1, 2


def _numpy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _available_memory():
    """Bytes of memory available to new allocations (``None``: unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_gamma(gamma):
    if isinstance(gamma, bool) or not isinstance(
            gamma, (int, float, np.floating, np.integer)) \
            or not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
    return float(gamma)


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
    actor : BaseActorModule, optional
        The actor of the generator, for its ``hx_dim``: with it, the
        actor's state at row 0 of every fragment is kept, and
        :meth:`sample_sequences` draws windows that start there.

    Attributes
    ----------
    lanes : Lanes
        The lanes followed; ``lanes.counts`` tells how many gaps were met.

    Examples
    --------
    >>> import gymnasium
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
        check_count("capacity", capacity, 2)
        # the actor's env axis of hx: with it, the hx at row 0 of every
        # fragment is kept, for sample_sequences
        self.hx_dim = None if actor is None else int(actor.hx_dim)
        self._hx = None
        self.capacity = int(capacity)
        self.device = check_device(device, pinned)
        self.pinned = bool(pinned)
        self._rng = np.random.default_rng(seed)
        self.lanes = Lanes()
        self._cur = np.empty(0, np.int64)  # lane -> its last node, or -1
        self._total = 0                    # nodes written so far
        self._linked = 0                   # nodes held that have a successor
        self._store = None
        if example is not None:
            self._allocate(self._parts(example))

    # ------------------------------------------------------------ sizes --
    def __len__(self):
        """The transitions that can be sampled: nodes held that have a
        successor."""
        return self._linked

    @property
    def n_stored(self):
        """Nodes held (transitions, episode ends and lanes' last nodes)."""
        return min(self._total, self.capacity)

    @property
    def nbytes_per_node(self):
        """Bytes one node takes (``None`` before the layout is known)."""
        if self._store is None:
            return None
        return self._node_bytes([x[0] for x in flatten(self._store["data"])])

    def _node_bytes(self, leaves):
        data = sum(x.nbytes for x in flatten(leaves))
        # rew (4), end (1), version, next, lane, number (8 each)
        return data + 4 + 1 + 4 * 8 + self._extra_bytes()

    def _extra_bytes(self):
        return 0

    # ----------------------------------------------------------- layout --
    @staticmethod
    def _parts(batch):
        """The numpy fields of ``batch`` a node keeps, and the rest."""
        if batch.final is None:
            raise ValueError(
                "the batch has no final observations (final=None): a "
                "replay buffer needs them to store episode ends exactly; "
                "make the generator with final=True (the default)")
        return {
            "obs": suply(_numpy, batch.state.obs),
            "final": suply(_numpy, batch.final),
            "act": suply(_numpy, batch.state.act),
            "info": suply(_numpy, batch.actor),
            "rew": _numpy(batch.state.rew),
            "fin": _numpy(batch.state.fin),
            "truncated": _numpy(batch.truncated),
            "length": _numpy(batch.stats.length),
            "version": _numpy(batch.meta.version),
            "meta": type(batch.meta)(*map(_numpy, batch.meta)),
            "hx": suply(_numpy, batch.hx),
        }

    @staticmethod
    def _layout(parts):
        """One node's leaves (shape and dtype) as a nested structure."""
        def node(x):
            return np.empty(x.shape[2:], x.dtype)
        return {"obs": suply(node, parts["obs"]),
                "act": suply(node, parts["act"]),
                "info": suply(node, parts["info"])}

    def _check_layout(self, parts):
        fin = parts["fin"]
        if fin.ndim != 2:
            raise ValueError(f"a batch's fin must be (1 + T, B), got shape "
                             f"{fin.shape}")
        want = self._store["data"]
        got = self._layout(parts)
        try:
            check_structure(want, got)
        except (StructureError, TypeError, ValueError) as exc:
            raise ValueError(f"the batch does not match the buffer's "
                             f"layout: {exc}") from None

        def same(w, g):
            if w.shape[1:] != g.shape or w.dtype != g.dtype:
                raise ValueError(
                    f"the batch does not match the buffer's layout: a leaf "
                    f"of {g.dtype} {g.shape} per row where the buffer "
                    f"holds {w.dtype} {w.shape[1:]}")
        suply(same, want, got)

    def _allocate(self, parts):
        C = self.capacity
        layout = self._layout(parts)
        need = C * self._node_bytes(layout)
        have = _available_memory()
        if have is not None and need > have:
            raise MemoryError(
                f"capacity={C} needs {need / 2**30:.2f} GiB "
                f"({need // C} bytes per node) but {have / 2**30:.2f} GiB "
                f"of memory is available: lower the capacity")
        self._store = {
            "data": suply(lambda x: np.zeros((C, *x.shape), x.dtype),
                          layout),
            "rew": np.zeros(C, np.float32),
            "end": np.zeros(C, np.int8),
            "version": np.zeros(C, np.int64),
            "next": np.full(C, -1, np.int64),
            "lane": np.full(C, -1, np.int64),
            "number": np.full(C, -1, np.int64),
        }
        if self.hx_dim is not None:
            T1, B = parts["fin"].shape
            # one entry per column per batch: enough for every fragment
            # whose row 0 is still held
            H = -(-C // max(1, T1 - 1)) + B
            dim = self.hx_dim
            self._hx = {
                "node": np.full(H, -1, np.int64),
                "data": suply(lambda h: np.zeros(
                    (H, *np.delete(h.shape, dim)), h.dtype), parts["hx"]),
                "total": 0}

    # ----------------------------------------------------------- extend --
    def extend(self, batch):
        """Store the transitions of a batch (copied: the batch may be a
        view that the generator reuses).

        Parameters
        ----------
        batch : Fragment
            A batch of any generator (``final=True``), in the order the
            generator yields them.

        Raises
        ------
        ValueError
            The batch has no ``final``, or does not match the layout of the
            first batch (or ``example``), or one batch makes more nodes than
            ``capacity``; the buffer is left as it was.
        """
        parts = self._parts(batch)
        if self._store is None:
            self._allocate(parts)
        self._check_layout(parts)
        fin, length = parts["fin"], parts["length"]
        T1, B = fin.shape
        if parts["truncated"].shape != fin.shape \
                or length.shape != fin.shape:
            raise ValueError("the batch's truncated and stats.length must "
                             "be shaped as its fin")
        executed = acted(_Rows(fin, length))
        starts = np.zeros_like(fin)
        # a row with fin starts an episode where an executed action follows
        # it; at row T that is not known yet: it is kept
        starts[:-1] = fin[:-1] & executed[1:]
        starts[-1] = fin[-1]
        starts[0] = True  # until the lanes say which columns continue
        n_max = int(executed.sum() + starts.sum())
        if n_max > self.capacity:
            raise ValueError(
                f"a batch of {T1 - 1} steps x {B} columns makes up to "
                f"{n_max} nodes, more than capacity={self.capacity}")
        # nothing changes above this line
        lanes, continues = self.lanes.follow(parts["meta"])
        if len(self._cur) < len(self.lanes):
            grown = np.full(len(self.lanes), -1, np.int64)
            grown[:len(self._cur)] = self._cur
            self._cur = grown
        base = self._total
        # a lane's last node is linked to only while it is held at the end
        # of this batch
        oldest_kept = base + n_max - self.capacity
        src0 = np.full(B, -1, np.int64)
        last_col = {}  # lane -> the column of this batch that last had it
        cur = self._cur
        for j in range(B):
            lane = int(lanes[j])
            if continues[j]:
                prev = last_col.get(lane)
                src0[j] = -2 - prev if prev is not None else cur[lane]
            last_col[lane] = j
        held = ((src0 >= 0) & (src0 >= oldest_kept)) | (src0 <= -2)
        starts[0] = ~held
        src0[~held] = -1

        # number the new nodes lane by lane (column-major): per row, the
        # node an action led to first, then an episode start
        counts = (executed.astype(np.int64) + starts).T.ravel()
        ends = np.cumsum(counts)
        first = (base + ends - counts).reshape(B, T1).T
        n = int(ends[-1]) if len(ends) else 0
        arrival = first
        start_id = first + executed
        rep = np.where(starts, start_id,
                       np.where(executed & ~fin, arrival, -1))
        # row 0 of a continuing column: the lane's last node (or the row T
        # node of an earlier column of this batch)
        in_batch = src0 <= -2
        rep[0] = np.where(starts[0], rep[0], src0)
        if in_batch.any():
            rep[0, in_batch] = rep[-1, -2 - src0[in_batch]]

        self._write_nodes(parts, executed, starts, counts, base, n, lanes)
        # links: the node of row t-1 -> the node of row t, where an
        # executed action led from one to the other
        t, j = np.nonzero(executed)
        src, dst = rep[t - 1, j], arrival[t, j]
        self._link(src, dst)
        # the real actor info at row 0 of a continuing column replaces the
        # lookahead stored with the lane's last node
        cont = np.flatnonzero(held)
        if len(cont):
            slots = rep[0, cont] % self.capacity
            suply(lambda dst, src: dst.__setitem__(slots, src[0, cont]),
                  self._store["data"]["info"], parts["info"])
        for lane, j in last_col.items():
            cur[lane] = rep[-1, j]
        if self._hx is not None:
            self._keep_hx(parts["hx"], rep[0])
        self._total = base + n

    def _write_nodes(self, parts, executed, starts, counts, base, n, lanes):
        C, store = self.capacity, self._store
        T1, B = executed.shape
        numbers = base + np.arange(n, dtype=np.int64)
        slots = numbers % C
        # nodes overwritten: those with a successor leave the count
        old = store["number"][slots]
        self._linked -= int(np.count_nonzero((old >= 0)
                                             & (store["next"][slots] >= 0)))
        self._forget(slots)
        pos = np.repeat(np.arange(B * T1), counts)
        j, t = pos // T1, pos % T1
        occurrence = np.arange(n) - (np.cumsum(counts) - counts)[pos]
        is_arrival = occurrence < executed.T.ravel()[pos]
        ended = is_arrival & parts["fin"][t, j]
        data = store["data"]

        def put(dst, obs, final):
            shape = (n, *[1] * (obs.ndim - 2))
            dst[slots] = np.where(ended.reshape(shape), final[t, j],
                                  obs[t, j])
        suply(put, data["obs"], parts["obs"], parts["final"])
        suply(lambda dst, src: dst.__setitem__(slots, src[t, j]),
              data["act"], parts["act"])

        def put_info(dst, src):
            shape = (n, *[1] * (src.ndim - 2))
            dst[slots] = np.where(ended.reshape(shape), 0, src[t, j])
        suply(put_info, data["info"], parts["info"])
        store["rew"][slots] = np.where(is_arrival, parts["rew"][t, j], 0)
        store["end"][slots] = np.where(
            ended, np.where(parts["truncated"][t, j], _TRUNCATED,
                            _TERMINATED), _GOES_ON)
        store["version"][slots] = parts["version"][j]
        store["next"][slots] = -1
        store["lane"][slots] = lanes[j]
        store["number"][slots] = numbers

    def _keep_hx(self, hx, nodes):
        """The actor's state at row 0 of each column, for the node there."""
        store = self._hx
        H = len(store["node"])
        k = (store["total"] + np.arange(len(nodes))) % H
        store["node"][k] = nodes
        dim = self.hx_dim
        suply(lambda dst, src: dst.__setitem__(k, np.moveaxis(src, dim, 0)),
              store["data"], hx)
        store["total"] += len(nodes)

    def _forget(self, slots):
        """``slots`` are about to hold new nodes."""

    def _link(self, src, dst):
        self._store["next"][src % self.capacity] = dst
        self._linked += len(src)

    # ----------------------------------------------------------- sample --
    def _window(self):
        return max(0, self._total - self.capacity), self._total

    def _check_sample(self, batch_size, n_step, gamma):
        check_count("batch_size", batch_size)
        check_count("n_step", n_step)
        gamma = _check_gamma(gamma)
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
        return self._gather(self._draw(batch_size), n_step, gamma)

    def _draw(self, batch_size):
        lo, hi = self._window()
        nxt, C = self._store["next"], self.capacity
        out = np.empty(0, np.int64)
        # draw from every node held and keep those with a successor
        share = max(len(self) / (hi - lo), 1e-3)
        while len(out) < batch_size:
            k = int((batch_size - len(out)) / share * 1.1) + 8
            draw = self._rng.integers(lo, hi, size=k)
            out = np.concatenate([out, draw[nxt[draw % C] >= 0]])
        return out[:batch_size]

    def indices(self):
        """The indices of every transition held (oldest first)."""
        if self._store is None:
            return np.empty(0, np.int64)
        lo, hi = self._window()
        numbers = np.arange(lo, hi, dtype=np.int64)
        return numbers[self._store["next"][numbers % self.capacity] >= 0]

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
        gamma = _check_gamma(gamma)
        index = _numpy(index).astype(np.int64).reshape(-1)
        if self._store is None:
            raise ValueError("the buffer is empty")
        lo, hi = self._window()
        slots = index % self.capacity
        bad = (index < lo) | (index >= hi)
        bad[~bad] = self._store["next"][slots[~bad]] < 0
        if bad.any():
            raise ValueError(f"index {int(index[bad][0])} names no "
                             f"transition held (held: {lo} .. {hi - 1})")
        return self._gather(index, n_step, gamma)

    def _gather(self, index, n_step, gamma):
        store, C = self._store, self.capacity
        slots = index % C
        nxt, end, rew = store["next"], store["end"], store["rew"]
        first = nxt[slots] % C
        if n_step == 1:
            reached = first
            G = rew[first]
            discount = np.full(len(index), gamma, np.float32)
        else:
            nodes = np.empty((n_step, len(index)), np.int64)
            rews = np.empty((n_step, len(index)), np.float32)
            cuts = np.empty((n_step, len(index)), bool)
            at = first
            for k in range(n_step):
                nodes[k], rews[k] = at, rew[at]
                after = nxt[at]
                cuts[k] = (end[at] != _GOES_ON) | (after < 0)
                at = np.where(cuts[k], at, after % C)
            G, discount, last = _n_step(rews, cuts, np.float32(gamma))
            reached = nodes[last, np.arange(len(index))]
        discount[end[reached] == _TERMINATED] = 0.0
        data = store["data"]
        return Transitions(
            obs=self._out(_take(data["obs"], slots)),
            act=self._out(_take(data["act"], first)),
            rew=self._out(G),
            next_obs=self._out(_take(data["obs"], reached)),
            discount=self._out(discount),
            info=self._out(_take(data["info"], slots)),
            version=self._out(store["version"][first]),
            index=self._out(index),
            weight=None)

    def _out(self, tree):
        """numpy arrays (fresh, from a gather) as tensors on the device."""
        if type(tree) is np.ndarray:
            return self._move(torch.from_numpy(tree))
        return suply(lambda x: self._move(torch.from_numpy(x)), tree)

    def _move(self, x):
        if self.device is None or self.device.type == "cpu":
            return x
        if self.pinned:
            return x.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device)

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
        if self._hx is None:
            raise ValueError("sample_sequences needs the actor's states: "
                             "make the buffer with actor=")
        store, C = self._store, self.capacity
        lo, hi = self._window()
        nodes = self._hx["node"]
        held = (nodes >= lo) & (nodes < hi)
        held[held] = store["next"][nodes[held] % C] >= 0
        entries = np.flatnonzero(held)
        if not len(entries):
            raise ValueError("no window can start yet: no fragment's row 0 "
                             "with a transition after it is held")
        pick = entries[self._rng.integers(len(entries), size=batch_size)]
        first = nodes[pick]
        L = burn_in + length
        rows = np.empty((L + 1, batch_size), np.int64)
        mask = np.empty((L + 1, batch_size), bool)
        at, going = first % C, np.ones(batch_size, bool)
        nxt = store["next"]
        for t in range(L + 1):
            rows[t], mask[t] = at, going
            after = nxt[at]
            going = going & (after >= 0)
            at = np.where(going, after % C, at)
        end = store["end"][rows]
        data = store["data"]

        def pad(x):
            return np.where(mask.reshape(*mask.shape, *[1] * (x.ndim - 2)),
                            x, np.zeros((), x.dtype))
        dim = self.hx_dim
        hx = suply(lambda h: np.ascontiguousarray(np.moveaxis(h[pick], 0,
                                                              dim)),
                   self._hx["data"])
        return Sequences(
            obs=self._out(suply(lambda x: pad(x[rows]), data["obs"])),
            act=self._out(suply(lambda x: pad(x[rows]), data["act"])),
            rew=self._out(pad(store["rew"][rows])),
            fin=self._out(mask & (end != _GOES_ON)),
            truncated=self._out(mask & (end == _TRUNCATED)),
            mask=self._out(mask),
            info=self._out(suply(lambda x: pad(x[rows]), data["info"])),
            version=self._out(pad(store["version"][rows])),
            hx=self._out(hx),
            index=self._out(first.copy()))

    # ------------------------------------------------------------ state --
    def state_dict(self):
        """Everything :meth:`load_state_dict` needs to go on as this buffer
        would: contents, lanes, the sampling generator (picklable; arrays
        are the buffer's own, as a module's ``state_dict`` holds its
        tensors)."""
        return {"kind": type(self).__name__, "capacity": self.capacity,
                "store": self._store, "cur": self._cur, "hx": self._hx,
                "hx_dim": self.hx_dim,
                "total": self._total, "linked": self._linked,
                "lanes": self.lanes.state_dict(),
                "rng": self._rng.bit_generator.state}

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
        self._assign(self._loaded(state))

    def _loaded(self, state):
        """What :meth:`load_state_dict` assigns, checked and copied."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict of state_dict(), got "
                            f"{type(state).__name__}")
        if state.get("kind") != type(self).__name__ \
                or state.get("capacity") != self.capacity:
            raise ValueError(
                f"a state of {state.get('kind')}(capacity="
                f"{state.get('capacity')}) does not load into "
                f"{type(self).__name__}(capacity={self.capacity})")
        for key in ("store", "cur", "hx", "hx_dim", "total", "linked",
                    "lanes", "rng"):
            if key not in state:
                raise ValueError(f"state[{key!r}] is missing: a buffer's "
                                 f"state_dict() holds it")
        C, out = self.capacity, {}
        store = state["store"]
        if store is not None:
            if not isinstance(store, dict) or not {
                    "data", "rew", "end", "version", "next", "lane",
                    "number"} <= store.keys():
                raise TypeError(f"state['store'] must be None or the dict "
                                f"of a buffer's arrays, got {_shown(store)}")
            store = suply(np.copy, store)
            for key, leaf in [(key, leaf) for key in store
                              for leaf in flatten(store[key])]:
                if not isinstance(leaf, np.ndarray) or leaf.ndim < 1 \
                        or len(leaf) != C:
                    raise ValueError(
                        f"state['store'][{key!r}] must hold arrays of "
                        f"{C} rows (the capacity), got {_shown(leaf)}")
        out["store"] = store
        out["hx_dim"] = _loaded_int(state, "hx_dim", none=True)
        hx = state["hx"]
        if hx is not None:
            if not isinstance(hx, dict) or not {"node", "total", "data"} \
                    <= hx.keys():
                raise TypeError(f"state['hx'] must be None or a dict of "
                                f"node, total and data, got {_shown(hx)}")
            hx = {"node": np.array(hx["node"], np.int64),
                  "total": _loaded_int(hx, "total", "state['hx']"),
                  "data": suply(np.copy, hx["data"])}
        out["hx"] = hx
        try:
            out["cur"] = np.array(state["cur"], np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise TypeError(f"state['cur'] must be an array of ints, got "
                            f"{_shown(state['cur'])}") from None
        out["total"] = _loaded_int(state, "total")
        out["linked"] = _loaded_int(state, "linked")
        lanes = state["lanes"]
        out["lanes"] = Lanes()
        try:
            out["lanes"].load_state_dict(lanes)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TypeError(f"state['lanes'] must be a Lanes.state_dict(), "
                            f"got {_shown(lanes)} ({exc!r})") from None
        if len(out["cur"]) != len(out["lanes"].keys()):
            raise ValueError(f"state['cur'] must hold one node per lane "
                             f"({len(out['lanes'].keys())}), got "
                             f"{len(out['cur'])}")
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = state["rng"]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise TypeError(f"state['rng'] must be the state of a numpy "
                            f"{type(rng.bit_generator).__name__}, got "
                            f"{_shown(state['rng'])}") from None
        out["rng"] = rng
        return out

    def _assign(self, out):
        self._store, self._hx, self.hx_dim = (out["store"], out["hx"],
                                              out["hx_dim"])
        self._cur, self._total, self._linked = (out["cur"], out["total"],
                                                out["linked"])
        self.lanes, self._rng = out["lanes"], out["rng"]


def _shown(value):
    # a value in a message: short
    text = repr(value)
    return text if len(text) <= 80 else f"{type(value).__name__} " \
        f"{text[:60]}..."


def _loaded_int(state, key, where="state", none=False):
    value = state[key] if key in state else None
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < 0:
        raise TypeError(f"{where}[{key!r}] must be an int >= 0, got "
                        f"{_shown(value)}")
    return int(value)


def _take(tree, rows):
    """``tree``'s leaves at ``rows`` (fresh arrays)."""
    if type(tree) is np.ndarray:
        return tree[rows]
    return suply(lambda x: x[rows], tree)


class _Rows:
    """What :func:`~rlplay.engine.core.acted` reads of a fragment."""

    def __init__(self, fin, length):
        self.state = _Fin(fin)
        self.stats = _Length(length)


_Fin = namedtuple("_Fin", "fin")
_Length = namedtuple("_Length", "length")


class _SumTree:
    """Sums (and minimums of the positive values) over ``n`` leaves, in
    float64: a wide tree, each level holding the sums of blocks of
    ``fanout`` entries of the level below, up to a top level of at most
    ``top`` entries that a search reads whole (100,000 leaves make two
    levels). An update takes the sums of the blocks it touched anew from
    their entries, level by level (no rounding accumulates); a search reads
    one block per draw and level, its running sums one matrix product (a
    numpy ``cumsum`` along a row is several times slower). No Python loop
    over items."""

    def __init__(self, n, fanout=32, top=4096):
        if fanout < 2 or top < 1:
            raise ValueError(f"fanout must be >= 2 and top >= 1, got "
                             f"{fanout} and {top}")
        self.n, self.fanout = n, fanout
        sizes, m = [], max(1, n)
        while m > top:
            m = -(-m // fanout) * fanout  # whole blocks
            sizes.append(m)
            m //= fanout
        sizes.append(m)
        self.sum = [np.zeros(m, np.float64) for m in sizes]
        self.min = [np.full(m, np.inf) for m in sizes]
        # blocks @ upper: the sums before each entry of a block, per row
        self._upper = np.triu(np.ones((fanout, fanout)), 1)

    @property
    def nbytes(self):
        return sum(x.nbytes for x in self.sum + self.min)

    @property
    def total(self):
        return float(np.cumsum(self.sum[-1])[-1])

    @property
    def smallest(self):
        """The smallest positive leaf (``inf`` if none)."""
        return float(self.min[-1].min())

    def set(self, slots, values):
        """Leaves ``slots`` get ``values`` (>= 0); a slot given twice gets
        its last value."""
        if not len(slots):
            return
        i = np.asarray(slots, np.int64)
        values = np.asarray(values, np.float64)
        self.sum[0][i] = values
        self.min[0][i] = np.where(values > 0, values, np.inf)
        F = self.fanout
        for below, above, low, high in zip(self.sum, self.sum[1:],
                                           self.min, self.min[1:]):
            # the blocks touched (one given twice is summed twice alike:
            # cheaper than a unique)
            i = i // F
            above[i] = below.reshape(-1, F)[i].sum(1)
            high[i] = low.reshape(-1, F)[i].min(1)

    def get(self, slots):
        return self.sum[0][np.asarray(slots, np.int64)]

    def find(self, mass):
        """The leaves whose cumulative ranges hold ``mass`` (in ``[0,
        total)``); a mass at ``total`` or past it (rounding) takes the
        last entry of the block it reaches, which may be a leaf of 0."""
        mass = np.array(mass, np.float64).reshape(-1)
        top = self.sum[-1]
        before = np.zeros(len(top) + 1)
        np.cumsum(top, out=before[1:])
        i = np.searchsorted(before, mass, side="right") - 1
        np.clip(i, 0, len(top) - 1, out=i)
        mass -= before[i]
        F, rows = self.fanout, np.arange(len(mass))
        for level in reversed(self.sum[:-1]):
            before = level.reshape(-1, F)[i] @ self._upper
            # the last entry whose range starts at or below the mass (the
            # first starts at 0; those of 0 that share its start come
            # before it)
            k = np.count_nonzero(before <= mass[:, None], axis=1) - 1
            mass -= before[rows, k]
            i = i * F + k
        return i

    def state(self):
        return {"leaves": self.sum[0][:self.n]}

    def load(self, state):
        if "leaves" in state:
            leaves = np.asarray(state["leaves"], np.float64)
        else:  # the binary tree of earlier versions: leaves in its half
            size = len(state["sum"]) // 2
            leaves = np.asarray(state["sum"][size:size + self.n], np.float64)
        if leaves.shape != (self.n,):
            raise ValueError(f"the saved priorities are {leaves.shape}, "
                             f"the buffer holds ({self.n},)")
        for x in self.sum:
            x.fill(0.0)
        for x in self.min:
            x.fill(np.inf)
        self.set(np.arange(self.n), leaves)


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
        for name, value in (("alpha", alpha), ("beta", beta), ("eps", eps)):
            if isinstance(value, bool) or not isinstance(
                    value, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, "
                                 f"got {value!r}")
        self.alpha, self.beta, self.eps = float(alpha), float(beta), \
            float(eps)
        self._max_priority = 1.0
        self._tree = None  # made with the store, once memory is checked
        super().__init__(capacity, device=device, pinned=pinned, seed=seed,
                         example=example, actor=actor)

    def _allocate(self, parts):
        super()._allocate(parts)
        self._tree = _SumTree(self.capacity)

    def _extra_bytes(self):
        return 2 * 8 + 1  # float64 sums and minimums; the levels above

    def _forget(self, slots):
        self._tree.set(slots, np.zeros(len(slots)))

    def _link(self, src, dst):
        super()._link(src, dst)
        self._tree.set(src % self.capacity,
                       np.full(len(src), self._max_priority ** self.alpha))

    def sample(self, batch_size, *, n_step=1, gamma=0.99, beta=None):
        """``batch_size`` transitions drawn by priority, with ``weight``.

        Parameters are as :meth:`Replay.sample`; ``beta`` overrides the
        buffer's.
        """
        gamma = self._check_sample(batch_size, n_step, gamma)
        beta = self.beta if beta is None else beta
        if isinstance(beta, bool) or not isinstance(
                beta, (int, float, np.integer, np.floating)) \
                or not np.isfinite(beta) or beta < 0:
            raise ValueError(f"beta must be a finite number >= 0, got "
                             f"{beta!r}")
        tree, C = self._tree, self.capacity
        total = tree.total
        if not total > 0:
            raise ValueError("every transition held has priority 0")
        # one draw in each of batch_size equal parts of the total mass
        mass = (np.arange(batch_size) + self._rng.random(batch_size)) \
            * (total / batch_size)
        slots = tree.find(np.minimum(mass, np.nextafter(total, 0)))
        priority = tree.get(slots)
        for _ in range(64):
            lost = priority <= 0  # rounding at a range's edge
            if not lost.any():
                break
            slots[lost] = tree.find(self._rng.random(int(lost.sum()))
                                    * total)
            priority = tree.get(slots)
        else:
            raise RuntimeError("the sum tree drew transitions of priority "
                               "0 over and over")
        index = self._store["number"][slots]
        out = self._gather(index, n_step, gamma)
        prob = priority / total
        n = len(self)
        weight = (n * prob) ** -float(beta)
        weight /= (n * tree.smallest / total) ** -float(beta)
        return out._replace(weight=self._out(weight.astype(np.float32)))

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
        index, priorities = _numpy(index), _numpy(priorities)
        if index.dtype.kind not in "iu":
            raise TypeError(f"index must hold the ints of a sample's index, "
                            f"got {index.dtype} {_shown(index)}")
        if priorities.dtype.kind not in "iuf":
            raise TypeError(f"priorities must be numbers, got "
                            f"{priorities.dtype} {_shown(priorities)}")
        index = index.astype(np.int64).reshape(-1)
        priorities = priorities.astype(np.float64)
        if priorities.shape not in ((len(index),), (len(index), 1)):
            raise ValueError(f"priorities must be shaped as index "
                             f"({len(index)},), got {priorities.shape}")
        priorities = priorities.reshape(-1)
        if not np.isfinite(priorities).all() or (priorities < 0).any():
            raise ValueError("priorities must be finite and >= 0")
        if self._store is None or not len(index):
            return
        lo, hi = self._window()
        slots = index % self.capacity
        keep = (index >= lo) & (index < hi)
        keep[keep] = self._store["next"][slots[keep]] >= 0
        if not keep.any():
            return
        self._max_priority = max(self._max_priority,
                                 float(priorities[keep].max()))
        self._tree.set(slots[keep],
                       (priorities[keep] + self.eps) ** self.alpha)

    def state_dict(self):
        state = super().state_dict()
        state.update(tree=None if self._tree is None else self._tree.state(),
                     max_priority=self._max_priority,
                     alpha=self.alpha, beta=self.beta, eps=self.eps)
        return state

    def _loaded(self, state):
        out = super()._loaded(state)
        for key in ("tree", "max_priority", "alpha", "beta", "eps"):
            if key not in state:
                raise ValueError(f"state[{key!r}] is missing: a buffer's "
                                 f"state_dict() holds it")
        for key in ("max_priority", "alpha", "beta", "eps"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(
                    value, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(value) or value < 0:
                raise TypeError(f"state[{key!r}] must be a finite number "
                                f">= 0, got {_shown(value)}")
            out[key] = float(value)
        tree = None
        if out["store"] is not None:
            tree = _SumTree(self.capacity)
            if not isinstance(state["tree"], dict):
                raise TypeError(f"state['tree'] must be a dict of the "
                                f"priorities, got {_shown(state['tree'])}")
            try:
                tree.load(state["tree"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"state['tree']: {exc}") from None
        out["tree"] = tree
        return out

    def _assign(self, out):
        super()._assign(out)
        self._tree, self._max_priority = out["tree"], out["max_priority"]
        self.alpha, self.beta, self.eps = out["alpha"], out["beta"], \
            out["eps"]
