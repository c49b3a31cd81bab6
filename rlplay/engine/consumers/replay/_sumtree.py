"""The sum tree of :class:`~rlplay.engine.replay.PrioritizedReplay`."""
import numpy as np


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
