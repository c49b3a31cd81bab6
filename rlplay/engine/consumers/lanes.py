"""Following env columns across batches: the one piece that tells, for
every column of a batch, which stream of fragments it belongs to and
whether it continues that stream's last fragment.

A *lane* is one env column of a run: ``(meta.worker, meta.env)``. Every
generator delivers a worker's fragments in ``meta.seq`` order (a batch of
``multi`` or ``cluster`` may hold several fragments of one worker, in
``seq`` order from left to right), and row 0 of a fragment repeats row
``T`` of the previous fragment of its lane. A column *continues* its lane
when the lane's previous fragment was the one just before it: same
``meta.generation`` and ``meta.seq`` one more. Anything else is a gap, and
a consumer never stitches across it:

- the first fragment of a lane (nothing to continue);
- a new ``meta.generation`` (a restarted worker, a resumed run: its row 0
  is a reset);
- a missing ``seq`` (a fragment dropped by ``max_lag``), or one that is not
  after the last (out of order, repeated).

:class:`Lanes` is used by :mod:`rlplay.engine.rollout.episodic` (whole
episodes) and :mod:`rlplay.engine.replay` (replay buffers). It looks at
``meta`` only.
"""
import numpy as np
import torch

__all__ = ["Lanes"]


class Lanes:
    """Lane numbers and continuity of the columns of successive batches.

    Lanes are numbered ``0, 1, ...`` in the order their first column is
    seen. ``counts`` tells how many columns started or broke a lane:
    ``{"new": ..., "generation": ..., "missing": ..., "disorder": ...}``
    (``missing``: ``seq`` jumped ahead; ``disorder``: ``seq`` not after
    the last one).

    Examples
    --------
    >>> from rlplay.engine.core import Meta
    >>> lanes = Lanes()
    >>> def meta(seq, generation=0):
    ...     return Meta(version=np.zeros(2, int), worker=np.zeros(2, int),
    ...                 env=np.array([0, 1]), seq=np.array(seq),
    ...                 generation=np.full(2, generation))
    >>> lanes.follow(meta([0, 0]))
    (array([0, 1]), array([False, False]))
    >>> lanes.follow(meta([1, 2]))
    (array([0, 1]), array([ True, False]))
    >>> lanes.follow(meta([2, 3], generation=1))
    (array([0, 1]), array([False, False]))
    """

    def __init__(self):
        self._index = {}      # (worker, env) -> lane
        self._last = []       # lane -> (generation, seq) of its last column
        self.counts = dict.fromkeys(
            ("new", "generation", "missing", "disorder"), 0)

    def __len__(self):
        return len(self._last)

    def keys(self):
        """The ``(worker, env)`` of each lane, in lane order."""
        keys = [None] * len(self._last)
        for key, lane in self._index.items():
            keys[lane] = key
        return keys

    def follow(self, meta):
        """Number the columns of one batch and say which continue.

        Parameters
        ----------
        meta : Meta
            The batch's ``meta`` (numpy or torch, ``(B,)`` each field),
            batches given in the order the generator yields them.

        Returns
        -------
        lanes : ndarray of int64, shape = (B,)
        continues : ndarray of bool, shape = (B,)
            Row 0 of column ``j`` is row ``T`` of the last fragment seen
            of its lane, with no fragment missing in between.
        """
        worker, env, seq, generation = (
            _ints(meta.worker), _ints(meta.env), _ints(meta.seq),
            _ints(meta.generation))
        n = len(seq)
        lanes = np.empty(n, np.int64)
        continues = np.zeros(n, bool)
        index, last, counts = self._index, self._last, self.counts
        for j in range(n):
            key = (worker[j], env[j])
            lane = index.get(key)
            here = (generation[j], seq[j])
            if lane is None:
                lane = index[key] = len(last)
                last.append(here)
                counts["new"] += 1
            else:
                gen, prev = last[lane]
                if gen != here[0]:
                    counts["generation"] += 1
                elif here[1] == prev + 1:
                    continues[j] = True
                elif here[1] > prev:
                    counts["missing"] += 1
                else:
                    counts["disorder"] += 1
                last[lane] = here
            lanes[j] = lane
        return lanes, continues

    def state_dict(self):
        """What :meth:`load_state_dict` needs to follow on (picklable)."""
        return {"keys": self.keys(), "last": list(self._last),
                "counts": dict(self.counts)}

    def load_state_dict(self, state):
        """Follow on from :meth:`state_dict`: the same lane numbers, and the
        next fragment of each lane continues it."""
        keys, last = state["keys"], state["last"]
        self._index = {tuple(key): lane for lane, key in enumerate(keys)}
        self._last = [tuple(x) for x in last]
        self.counts = dict(state["counts"])


def _ints(values):
    # a list of ints from numpy or torch (on any device)
    if isinstance(values, torch.Tensor):
        return values.tolist()
    return np.asarray(values).tolist()
