"""How a replay buffer draws: each sampler is a class of its own that the
buffer holds beside its storage (:mod:`._nodes`).

A sampler of transitions hears of the nodes about to be overwritten
(``forget``) and of the nodes that got a successor (``linked``), draws
indices (``draw``), and adds to a node's bytes and to the buffer's state
what it keeps (``extra_bytes``, ``state``). :func:`draw_windows` draws the
windows of :meth:`~rlplay.engine.replay.Replay.sample_sequences`.
"""
import numpy as np

from ._state import check_number, shown
from ._sumtree import _SumTree


class _Uniform:
    """Every transition held alike, with replacement."""

    extra_bytes = 0

    def allocate(self, capacity):
        pass

    def forget(self, slots):
        pass

    def linked(self, slots):
        pass

    def draw(self, nodes, batch_size, rng):
        lo, hi = nodes.window()
        nxt, C = nodes.store["next"], nodes.capacity
        out = np.empty(0, np.int64)
        # draw from every node held and keep those with a successor
        share = max(nodes.linked / (hi - lo), 1e-3)
        while len(out) < batch_size:
            k = int((batch_size - len(out)) / share * 1.1) + 8
            draw = rng.integers(lo, hi, size=k)
            out = np.concatenate([out, draw[nxt[draw % C] >= 0]])
        return out[:batch_size]

    def state(self):
        return {}

    def loaded(self, state, capacity, allocated):
        return _Uniform()


class _Prioritized:
    """Transition ``i`` with probability ``p_i**alpha / sum(p**alpha)``,
    stratified (one draw in each of ``batch_size`` equal parts of the
    total), with importance weights; see
    :class:`~rlplay.engine.replay.PrioritizedReplay`."""

    extra_bytes = 2 * 8 + 1  # float64 sums and minimums; the levels above

    def __init__(self, alpha, beta, eps):
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.max_priority = 1.0
        self.tree = None  # made with the store, once memory is checked

    def allocate(self, capacity):
        self.tree = _SumTree(capacity)

    def forget(self, slots):
        self.tree.set(slots, np.zeros(len(slots)))

    def linked(self, slots):
        self.tree.set(slots, np.full(len(slots),
                                     self.max_priority ** self.alpha))

    def draw(self, nodes, batch_size, rng, beta):
        """Indices and their importance weights (float32)."""
        tree = self.tree
        total = tree.total
        if not total > 0:
            raise ValueError("every transition held has priority 0")
        # one draw in each of batch_size equal parts of the total mass
        mass = (np.arange(batch_size) + rng.random(batch_size)) \
            * (total / batch_size)
        slots = tree.find(np.minimum(mass, np.nextafter(total, 0)))
        priority = tree.get(slots)
        for _ in range(64):
            lost = priority <= 0  # rounding at a range's edge
            if not lost.any():
                break
            slots[lost] = tree.find(rng.random(int(lost.sum())) * total)
            priority = tree.get(slots)
        else:
            raise RuntimeError("the sum tree drew transitions of priority "
                               "0 over and over")
        n = nodes.linked
        weight = (n * (priority / total)) ** -beta
        weight /= (n * tree.smallest / total) ** -beta
        return nodes.store["number"][slots], weight.astype(np.float32)

    def update(self, nodes, index, priorities):
        """Checked ``index`` (int64) and ``priorities`` (float64, >= 0);
        those whose node was overwritten are ignored."""
        if nodes.store is None or not len(index):
            return
        keep = nodes.linked_at(index)
        if not keep.any():
            return
        self.max_priority = max(self.max_priority,
                                float(priorities[keep].max()))
        self.tree.set(index[keep] % nodes.capacity,
                      (priorities[keep] + self.eps) ** self.alpha)

    def state(self):
        return {"tree": None if self.tree is None else self.tree.state(),
                "max_priority": self.max_priority, "alpha": self.alpha,
                "beta": self.beta, "eps": self.eps}

    def loaded(self, state, capacity, allocated):
        """A sampler made from ``state`` (checked: ``ValueError`` or
        ``TypeError`` naming the entry)."""
        for key in ("tree", "max_priority", "alpha", "beta", "eps"):
            if key not in state:
                raise ValueError(f"state[{key!r}] is missing: a buffer's "
                                 f"state_dict() holds it")
        value = {key: check_number(state[key], f"state[{key!r}]", TypeError)
                 for key in ("max_priority", "alpha", "beta", "eps")}
        out = _Prioritized(value["alpha"], value["beta"], value["eps"])
        out.max_priority = value["max_priority"]
        if allocated:
            out.allocate(capacity)
            if not isinstance(state["tree"], dict):
                raise TypeError(f"state['tree'] must be a dict of the "
                                f"priorities, got {shown(state['tree'])}")
            try:
                out.tree.load(state["tree"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"state['tree']: {exc}") from None
        return out


def draw_windows(nodes, batch_size, steps, rng):
    """``batch_size`` windows of ``steps + 1`` nodes, each starting at row
    0 of a fragment whose actor state was kept (uniformly, with
    replacement), following the links.

    Returns the entries of ``nodes.hx`` drawn, the slots of the rows
    ``(steps + 1, batch_size)`` and their mask (False past the window's
    last node)."""
    store, C = nodes.store, nodes.capacity
    entries = np.flatnonzero(nodes.linked_at(nodes.hx["node"]))
    if not len(entries):
        raise ValueError("no window can start yet: no fragment's row 0 "
                         "with a transition after it is held")
    pick = entries[rng.integers(len(entries), size=batch_size)]
    rows = np.empty((steps + 1, batch_size), np.int64)
    mask = np.empty((steps + 1, batch_size), bool)
    at, going = nodes.hx["node"][pick] % C, np.ones(batch_size, bool)
    nxt = store["next"]
    for t in range(steps + 1):
        rows[t], mask[t] = at, going
        after = nxt[at]
        going = going & (after >= 0)
        at = np.where(going, after % C, at)
    return pick, rows, mask
