"""The storage of a replay buffer: a ring of ``capacity`` nodes, numbered
by a running count, each a state of a lane with the action and reward that
led there and a link to its successor (see :mod:`rlplay.engine.replay`).

:class:`_Nodes` holds the arrays and writes, links and forgets nodes; it
does not know which rows of a batch become nodes (:mod:`._writer` says) nor
how nodes are drawn (:mod:`._samplers`).
"""
import os

import numpy as np

from ...nested import StructureError, check_structure, flatten, suply

# how a lane's step ended at a node (the node of an episode end holds the
# true final observation)
GOES_ON, TERMINATED, TRUNCATED = 0, 1, 2

# the arrays of a store, in the order of a state_dict
STORE_KEYS = ("data", "rew", "end", "version", "next", "lane", "number")


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


def layout(parts):
    """One node's leaves (shape and dtype) as a nested structure."""
    def node(x):
        return np.empty(x.shape[2:], x.dtype)
    return {"obs": suply(node, parts["obs"]),
            "act": suply(node, parts["act"]),
            "info": suply(node, parts["info"])}


def node_bytes(leaves, extra=0):
    """Bytes of one node of ``leaves`` (its data), ``extra`` a sampler's."""
    data = sum(x.nbytes for x in flatten(leaves))
    # rew (4), end (1), version, next, lane, number (8 each)
    return data + 4 + 1 + 4 * 8 + extra


class _Nodes:
    """The ring: ``store`` (``None`` until the layout is known) holds per
    slot ``data`` (``obs``, ``act``, ``info``), ``rew``, ``end``,
    ``version``, ``next`` (the successor's number, -1 if none), ``lane``
    and ``number`` (the node's, -1 if the slot never held one); ``hx`` the
    actor's state at row 0 of each fragment, for the node there."""

    def __init__(self, capacity, hx_dim=None):
        self.capacity = capacity
        self.hx_dim = hx_dim
        self.store = None
        self.hx = None
        self.total = 0   # nodes written so far
        self.linked = 0  # nodes held that have a successor

    def window(self):
        """The numbers of the nodes held: ``range(lo, hi)``."""
        return max(0, self.total - self.capacity), self.total

    def linked_at(self, index):
        """Which of ``index`` (int64) name a node held with a successor."""
        lo, hi = self.window()
        keep = (index >= lo) & (index < hi)
        keep[keep] = self.store["next"][index[keep] % self.capacity] >= 0
        return keep

    # ----------------------------------------------------------- layout --
    def allocate(self, parts, extra=0):
        """Make the arrays for the layout of ``parts`` (host fields of a
        batch), after checking that memory allows them."""
        C = self.capacity
        leaves = layout(parts)
        need = C * node_bytes(leaves, extra)
        have = _available_memory()
        if have is not None and need > have:
            raise MemoryError(
                f"capacity={C} needs {need / 2**30:.2f} GiB "
                f"({need // C} bytes per node) but {have / 2**30:.2f} GiB "
                f"of memory is available: lower the capacity")
        self.store = {
            "data": suply(lambda x: np.zeros((C, *x.shape), x.dtype),
                          leaves),
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
            self.hx = {
                "node": np.full(H, -1, np.int64),
                "data": suply(lambda h: np.zeros(
                    (H, *np.delete(h.shape, dim)), h.dtype), parts["hx"]),
                "total": 0}

    def check_layout(self, parts):
        """Raise ``ValueError`` unless ``parts`` fit the arrays."""
        fin = parts["fin"]
        if fin.ndim != 2:
            raise ValueError(f"a batch's fin must be (1 + T, B), got shape "
                             f"{fin.shape}")
        want = self.store["data"]
        got = layout(parts)
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

    # ------------------------------------------------------------ write --
    def write(self, parts, place, sampler):
        """Write the ``place.n`` new nodes of a batch after the last.

        Each leaf of ``obs``, ``act`` and ``info`` is read once: the rows of
        the nodes are scattered into the ring, then the slots of episode
        ends get their true final observation (and no actor info)."""
        C, store, n = self.capacity, self.store, place.n
        numbers = self.total + np.arange(n, dtype=np.int64)
        slots = numbers % C
        # nodes overwritten: those with a successor leave the count
        old = store["number"][slots]
        self.linked -= int(np.count_nonzero((old >= 0)
                                            & (store["next"][slots] >= 0)))
        sampler.forget(slots)
        t, j, ended = place.t, place.j, place.ended
        rows = t * parts["fin"].shape[1] + j
        start, data = self.total % C, store["data"]

        def scatter(dst, src):
            _scatter(dst, src, rows, start, t, j, slots)
        suply(scatter, data["obs"], parts["obs"])
        suply(scatter, data["act"], parts["act"])
        suply(scatter, data["info"], parts["info"])
        if ended.any():
            at, te, je = slots[ended], t[ended], j[ended]
            suply(lambda dst, final: dst.__setitem__(at, final(te, je)),
                  data["obs"], parts["final"])
            suply(lambda dst: dst.__setitem__(at, 0), data["info"])
        store["rew"][slots] = np.where(place.arrival, parts["rew"][t, j], 0)
        store["end"][slots] = np.where(
            ended, np.where(parts["truncated"][t, j], TRUNCATED,
                            TERMINATED),
            GOES_ON)
        store["version"][slots] = parts["version"][j]
        store["next"][slots] = -1
        store["lane"][slots] = place.lanes[j]
        store["number"][slots] = numbers
        self.total += n

    def link(self, src, dst):
        """Node ``src[k]`` is followed by node ``dst[k]``."""
        self.store["next"][src % self.capacity] = dst
        self.linked += len(src)

    def replace_info(self, nodes, info, columns):
        """The actor info of ``nodes`` is row 0 of ``info`` at
        ``columns``."""
        slots = nodes % self.capacity
        suply(lambda dst, src: dst.__setitem__(slots, src[0, columns]),
              self.store["data"]["info"], info)

    def keep_hx(self, hx, nodes):
        """The actor's state at row 0 of each column, for the node there."""
        store = self.hx
        H = len(store["node"])
        k = (store["total"] + np.arange(len(nodes))) % H
        store["node"][k] = nodes
        dim = self.hx_dim
        suply(lambda dst, src: dst.__setitem__(k, np.moveaxis(src, dim, 0)),
              store["data"], hx)
        store["total"] += len(nodes)


def _scatter(dst, src, rows, start, t, j, slots):
    """``dst[slots] = src[t, j]``, ``slots`` the ``len(rows)`` slots of the
    ring from ``start`` on, ``rows`` the flat ``t * B + j``.

    Where ``src`` (``(1 + T, B, ...)``) flattens to rows without a copy,
    ``numpy.take`` writes straight into the ring (at most two contiguous
    runs): no temporary batch of rows. ``mode="clip"`` keeps ``take`` from
    buffering its output (the rows are in range)."""
    try:
        flat = np.reshape(src, (src.shape[0] * src.shape[1], *src.shape[2:]),
                          copy=False)  # raises where a copy is needed
    except ValueError:
        dst[slots] = src[t, j]
        return
    n, C = len(rows), len(dst)
    head = min(n, C - start)
    np.take(flat, rows[:head], axis=0, out=dst[start:start + head],
            mode="clip")
    if head < n:
        np.take(flat, rows[head:], axis=0, out=dst[:n - head], mode="clip")
