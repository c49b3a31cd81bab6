"""Batches are the user's to keep: every generator yields a fresh batch by
default (``copy=True``), so that ``list(islice(feed, 3))`` holds three
different fragments; ``copy=False`` is the documented fast path that
yields a reused batch, valid until the next ``next()``."""
import itertools

import pytest
import torch

from envs import CountingEnv
from generators import CountingActor, make
from rlplay.engine.nested import flatten

from bounds import STEADY as BOUND  # the reason in bounds.py


def three(kind, **kwargs):
    if kind != "same":
        kwargs.update(timeout=BOUND)
    with make(kind, CountingEnv, CountingActor(), 4, 2, n_actors=1,
              entropy=0, **kwargs) as feed:
        return list(itertools.islice(feed, 3))


@pytest.mark.parametrize("kind", ["same", "single", "multi"])
def test_kept_batches_are_three_different_fragments_by_default(kind):
    batches = three(kind)
    pointers = {leaf.data_ptr() for batch in batches
                for leaf in flatten(batch) if leaf.numel()}
    assert len(pointers) == 3 * sum(1 for leaf in flatten(batches[0])
                                    if leaf.numel())
    assert [int(b.meta.seq[0]) for b in batches] == [0, 1, 2]
    for prev, this in zip(batches, batches[1:]):
        # row T of a fragment is row 0 of the next, as collected
        assert torch.equal(prev.state.obs[-1], this.state.obs[0])
        assert not torch.equal(prev.state.obs, this.state.obs)


@pytest.mark.parametrize("kind, n_buffers", [("same", 1), ("single", 2),
                                             ("multi", 1)])
def test_copy_false_yields_the_reused_batch(kind, n_buffers):
    batches = three(kind, copy=False)
    assert len({b.state.obs.data_ptr() for b in batches}) == n_buffers
    # the first batch was overwritten by the later ones
    assert int(batches[0].meta.seq[0]) != 0
