"""The learner side of multi and cluster, without processes: the ready
queue (arrival order, staleness, accounts) and the collation of fragments
into a batch."""
import types

import numpy as np
import pytest
import torch

from rlplay.engine.core import EpisodeStats, Fragment, Meta, State
from rlplay.engine.workers._batch import (Arrival, Collation, ReadyQueue,
                                          check_hx_dim)


def accounts(n):
    return [{} for _ in range(n)]


def test_arrivals_are_taken_in_arrival_order_and_accounted():
    queue = ReadyQueue(accounts(2))
    for arrival in (Arrival(1, 0, 0, 5), Arrival(0, 3, 0, 5),
                    Arrival(1, 1, 1, 6)):
        queue.push(arrival)
    assert len(queue) == 3
    dropped = []
    taken = queue.take(2, version=6, max_lag=None, drop=dropped.append)
    assert [(a.worker, a.seq) for a in taken] == [(1, 0), (0, 0)]
    assert dropped == [] and len(queue) == 1
    queue.delivered(taken)
    assert queue.next_seq == [1, 1]
    assert [acc["received"] for acc in queue.accounts] == [1, 2]
    assert [acc["delivered"] for acc in queue.accounts] == [1, 1]
    queue.close()
    assert [acc["discarded"] for acc in queue.accounts] == [0, 1]


def test_stale_arrivals_are_dropped_under_max_lag():
    queue = ReadyQueue(accounts(2))
    queue.push(Arrival(0, 0, 0, 2))    # version 2: stale at 5 with lag 2
    queue.push(Arrival(1, 1, 0, 3))    # just in time
    queue.push(Arrival(0, 2, 1, 5))
    dropped = []
    taken = queue.take(2, version=5, max_lag=2, drop=dropped.append)
    assert [(a.worker, a.seq) for a in taken] == [(1, 0), (0, 1)]
    assert [(a.worker, a.seq) for a in dropped] == [(0, 0)]
    assert queue.accounts[0]["dropped"] == 1 and queue.dropped == 1
    # max_lag=0 is on-policy: only the current version
    queue.push(Arrival(1, 3, 1, 4))
    assert queue.take(1, version=5, max_lag=0, drop=dropped.append) == []
    assert queue.dropped == 2


def test_given_back_arrivals_come_first_again_in_order():
    queue = ReadyQueue(accounts(1))
    for seq in range(3):
        queue.push(Arrival(0, seq, seq, 0))
    taken = queue.take(2, 0, None, lambda a: None)
    queue.give_back(taken)
    assert [a.seq for a in queue.take(3, 0, None, lambda a: None)] == \
        [0, 1, 2]


def test_a_worker_arrivals_come_in_seq_order():
    queue = ReadyQueue(accounts(1))
    queue.push(Arrival(0, 0, 4, 0))
    with pytest.raises(AssertionError):
        queue.push(Arrival(0, 1, 4, 0))


def test_forget_drops_one_workers_arrivals():
    queue = ReadyQueue(accounts(2))
    for worker, seq in ((0, 0), (1, 0), (0, 1)):
        queue.push(Arrival(worker, seq, seq, 0))
    gone = queue.forget(0)
    assert [(a.worker, a.seq) for a in gone] == [(0, 0), (0, 1)]
    assert [(a.worker, a.seq) for a in queue.queue] == [(1, 0)]


def test_a_resumed_run_numbers_on_and_keeps_its_drops():
    run = types.SimpleNamespace(seq=[7, 3], counters={"dropped": 4})
    queue = ReadyQueue(accounts(2), run)
    assert queue.numbered_from(0) == 7 and queue.numbered_from(1) == 3
    queue.push(Arrival(1, 0, 3, 0))
    assert queue.numbered_from(1) == 4
    assert queue.dropped == 4
    queue.delivered(queue.take(1, 0, None, lambda a: None))
    assert queue.next_seq == [7, 4]


def fragment(T, B, worker, hx_dim=1, offset=0):
    """A fragment whose every leaf tells its rows and columns apart."""
    rows = torch.arange(1 + T).reshape(-1, 1)
    cols = torch.arange(B).reshape(1, -1) + offset
    grid = rows * 100 + cols
    hx = torch.arange(B).float() + offset
    hx = hx.reshape(1, B, 1) if hx_dim == 1 else hx.reshape(B, 1)
    return Fragment(
        state=State(stepno=grid, obs=grid.unsqueeze(-1).float().repeat(
            1, 1, 3), act=grid, rew=grid.float(), fin=grid % 2 == 0),
        truncated=grid % 3 == 0, final=grid.unsqueeze(-1).float(),
        actor={"value": grid.float()}, env={}, env_mask={}, hx=hx,
        stats=EpisodeStats(ret=grid.double(), length=grid),
        meta=Meta(*[torch.full((B,), worker + k) for k in range(5)]))


def npy(frag):
    from rlplay.engine.nested import suply
    return suply(torch.Tensor.numpy, frag)


@pytest.mark.parametrize("fresh", [False, True], ids=["reused", "fresh"])
@pytest.mark.parametrize("hx_dim", [0, 1])
@pytest.mark.parametrize("n_per_batch", [1, 3])
def test_collation_puts_slot_s_in_columns_s_B_to_s_B_plus_B(n_per_batch,
                                                            hx_dim, fresh):
    T, B = 4, 2
    frags = [fragment(T, B, 10 * s, hx_dim, offset=B * s)
             for s in range(n_per_batch)]
    collation = Collation(frags[0], hx_dim, n_per_batch)
    sources = [Collation.sources(npy(f)) for f in frags]
    if fresh:  # a reused batch that held something else
        collation.collate(sources[::-1])
    host, views = collation.collate(sources, fresh=fresh)
    # a fresh batch is new memory each time; the reused one is the host
    assert (host is not collation.host) == fresh
    if fresh:
        again, _ = collation.collate(sources, fresh=True)
        assert not np.shares_memory(again.state.obs.numpy(),
                                    host.state.obs.numpy())
    assert host.state.obs.shape == (1 + T, n_per_batch * B, 3)
    want = fragment(T, n_per_batch * B, 0, hx_dim)
    for got, expected in ((host.state.stepno, want.state.stepno),
                          (host.state.obs, want.state.obs),
                          (host.final, want.final),
                          (host.actor["value"], want.actor["value"]),
                          (host.stats.ret, want.stats.ret),
                          (host.hx, want.hx)):
        assert torch.equal(got, expected)
    for s in range(n_per_batch):
        cols = slice(s * B, (s + 1) * B)
        assert torch.equal(host.meta.worker[cols], torch.full((B,), 10 * s + 1))
    # the numpy views are views of the batch
    assert np.shares_memory(views.state.obs, host.state.obs.numpy())


def test_collation_refuses_an_hx_without_its_env_dimension():
    frag = fragment(2, 3, 0, hx_dim=1)
    with pytest.raises(ValueError, match="hx_dim"):
        check_hx_dim(frag.hx, 0, 3)
    with pytest.raises(ValueError, match="n_per_actor=3"):
        Collation(frag._replace(hx=torch.zeros(1, 2, 1)), 1, 2)
