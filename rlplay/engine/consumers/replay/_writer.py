"""Which rows of a batch become nodes of a replay buffer, their numbers and
their links (see :mod:`rlplay.engine.replay` for the rules); the storage
(:mod:`._nodes`) writes them.

A batch is read on the host: each field (a leaf of ``obs``, ``act``, ...)
comes over once, with one ``.cpu()`` where it is a tensor on a device;
``final`` only at the rows where episodes ended, gathered where it lives.
"""
from collections import namedtuple

import numpy as np
import torch

from ...core.layout import acted, episode_edges
from ..lanes import Lanes
from ...nested import suply


def numpy(x):
    """``x`` on the host as a numpy array (a view where it is one)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _rows_of(x):
    """A function of ``(t, j)`` that returns ``x[t, j]`` on the host; a
    tensor on a device is indexed there, so only those rows come over."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.device.type != "cpu":
            def rows(t, j):
                at = torch.from_numpy(np.stack([t, j])).to(x.device)
                return x[at[0], at[1]].cpu().numpy()
            return rows
    x = numpy(x)
    return lambda t, j: x[t, j]


def host_parts(batch):
    """The fields of ``batch`` a node keeps, on the host, its episode edges
    (:func:`~rlplay.engine.core.episode_edges`), and the rest (``final`` as
    a function of the rows wanted).

    Raises ``ValueError`` for a batch without ``final`` or ``acted``, or
    whose flags are not shaped alike (nothing is changed)."""
    if batch.final is None:
        raise ValueError(
            "the batch has no final observations (final=None): a "
            "replay buffer needs them to store episode ends exactly; "
            "make the generator with final=True (the default)")
    fin, moved = numpy(batch.state.fin), numpy(acted(batch))
    truncated = numpy(batch.truncated)
    if fin.ndim != 2 or truncated.shape != fin.shape \
            or moved.shape != fin.shape:
        raise ValueError(
            f"a batch's fin, truncated and acted must be (1 + T, B) arrays "
            f"of one shape, got {fin.shape}, {truncated.shape} and "
            f"{moved.shape}")
    edges = episode_edges(batch._replace(
        state=batch.state._replace(fin=fin), truncated=truncated,
        acted=moved))
    return {
        "obs": suply(numpy, batch.state.obs),
        "final": suply(_rows_of, batch.final),
        "act": suply(numpy, batch.state.act),
        "info": suply(numpy, batch.actor),
        "rew": numpy(batch.state.rew),
        "fin": fin,
        "executed": moved,
        "starts": edges.starts,
        "ends": edges.ends,
        "truncated": edges.truncated,
        "version": numpy(batch.meta.version),
        "meta": type(batch.meta)(*map(numpy, batch.meta)),
        "hx": suply(numpy, batch.hx),
    }


def node_rows(parts, capacity):
    """The rows an executed action led to, and those that may start an
    episode (row 0: all, until the lanes say which columns continue; row
    ``T``: every episode start, whether it goes on is not known yet).

    Raises ``ValueError`` for a batch that cannot be stored (nothing is
    changed)."""
    T1, B = parts["fin"].shape
    executed = parts["executed"]
    starts = parts["starts"].copy()
    starts[0] = True
    n_max = int(executed.sum() + starts.sum())
    if n_max > capacity:
        raise ValueError(
            f"a batch of {T1 - 1} steps x {B} columns makes up to "
            f"{n_max} nodes, more than capacity={capacity}")
    return executed, starts, n_max


_Placement = namedtuple("_Placement", [
    "n",        # the new nodes, numbered from the buffer's total on
    "t", "j",   # (n,): the row and column of each
    "arrival",  # (n,): an executed action led to it (else: a start)
    "ended",    # (n,): an episode ended there (it holds final)
    "lanes",    # (B,): each column's lane
    "src", "dst",  # the links made
    "row0",     # (B,): the node at row 0 of each column
    "held",     # (B,): the column continues its lane's last node held
])


class _Writer:
    """The lanes followed and each lane's last node (``cur``, -1 if
    none)."""

    def __init__(self, lanes=None, cur=None):
        self.lanes = Lanes() if lanes is None else lanes
        self.cur = np.empty(0, np.int64) if cur is None else cur

    def place(self, parts, executed, starts, n_max, total, capacity):
        """Number the nodes of a batch from ``total`` on (lane by lane,
        per row the node an action led to first, then an episode start)
        and link them; the lanes and their last nodes move on."""
        ends = parts["ends"]
        T1, B = ends.shape
        lanes, continues = self.lanes.follow(parts["meta"])
        # a lane's last node is linked to only while it is held at the end
        # of this batch
        src0, last_col = self._row0(lanes, continues,
                                    total + n_max - capacity)
        held = (src0 >= 0) | (src0 <= -2)
        starts[0] = ~held
        counts = (executed.astype(np.int64) + starts).T.ravel()
        tops = np.cumsum(counts)
        first = (total + tops - counts).reshape(B, T1).T
        n = int(tops[-1]) if len(tops) else 0
        rep = np.where(starts, first + executed,
                       np.where(executed & ~ends, first, -1))
        # row 0 of a continuing column: the lane's last node (or the row T
        # node of an earlier column of this batch)
        rep[0] = np.where(starts[0], rep[0], src0)
        in_batch = src0 <= -2
        if in_batch.any():
            rep[0, in_batch] = rep[-1, -2 - src0[in_batch]]
        # links: the node of row t-1 -> the node of row t, where an
        # executed action led from one to the other
        t, j = np.nonzero(executed)
        src, dst = rep[t - 1, j], first[t, j]
        pos = np.repeat(np.arange(B * T1), counts)
        j, t = np.divmod(pos, T1)
        arrival = np.arange(n) - (tops - counts)[pos] \
            < executed.T.ravel()[pos]
        for lane, col in last_col.items():
            self.cur[lane] = rep[-1, col]
        return _Placement(n=n, t=t, j=j, arrival=arrival,
                          ended=arrival & ends[t, j], lanes=lanes, src=src,
                          dst=dst, row0=rep[0], held=held)

    def _row0(self, lanes, continues, oldest_kept):
        """Where row 0 of each column continues from: the lane's last node
        (>= 0), column ``k`` of this batch (``-2 - k``), or nothing (-1);
        and the column of this batch that last had each lane."""
        if len(self.cur) < len(self.lanes):
            grown = np.full(len(self.lanes), -1, np.int64)
            grown[:len(self.cur)] = self.cur
            self.cur = grown
        src0 = np.full(len(lanes), -1, np.int64)
        last_col = {}
        for j, lane in enumerate(lanes.tolist()):
            if continues[j]:
                prev = last_col.get(lane)
                src0[j] = -2 - prev if prev is not None else self.cur[lane]
            last_col[lane] = j
        src0[(src0 >= 0) & (src0 < oldest_kept)] = -1
        return src0, last_col
