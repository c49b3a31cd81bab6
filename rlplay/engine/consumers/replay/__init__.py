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

The package composes a buffer of separate pieces: the node storage
(``_nodes``), the placing of a batch's rows as nodes and links
(``_writer``), the samplers (``_samplers``: uniform, prioritized with its
sum tree in ``_sumtree``, sequence windows), the n-step gather
(``_gather``) and the checks of a saved state (``_state``);
:mod:`.buffer` holds :class:`Replay` and :class:`PrioritizedReplay`, which
wire them.
"""

from ._gather import Sequences, Transitions
from ._sumtree import _SumTree  # noqa: F401 (tests reach the tree)
from .buffer import PrioritizedReplay, Replay

__all__ = ["Replay", "PrioritizedReplay", "Transitions", "Sequences"]
