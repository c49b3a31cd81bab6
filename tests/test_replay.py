"""Replay buffers (rlplay.engine.replay): every transition the buffer can
return equals the brute-force one of the same seeded env, n-step sums and
discounts exact at terminations, truncations, fragment edges and gaps;
prioritized sampling, stale updates, state round trips, bad input."""
import functools
import math
import pickle

import numpy as np
import pytest
import torch

from rlplay.engine.nested import check_structure, flatten
from rlplay.engine.consumers.replay import PrioritizedReplay, Replay, _SumTree
from rlplay.engine.returns import n_step
from rlplay.engine.rollout import same

from envs import (SOURCES, CountingEnv, StructuredEnv, source_factory,
                  varying_factory)
from generators import CountingActor, make
from reference import brute_episodes, column_seeds

GAMMA = 0.5  # powers of 1/2 and integer rewards: float32 sums are exact


# ------------------------------------------------------------- reference --

@functools.lru_cache(maxsize=64)
def lane_steps(seed, count):
    """The first ``count`` steps of a VaryingEnv column reset with ``seed``
    under CountingActor (brute force, one step at a time)."""
    steps = []
    for ep in brute_episodes(varying_factory(), seed, count, hx_first=[0, 0],
                             hx_reset=[0, 0]):
        L = ep["length"]
        for k in range(L):
            end = k == L - 1
            steps.append(dict(k=k, 
                obs=ep["obs"][k], act=ep["act"][k], rew=ep["rew"][k],
                value=ep["value"][k], h=ep["h"][k],
                next_obs=ep["obs"][k + 1],
                terminated=end and ep["terminated"],
                truncated=end and ep["truncated"]))
        if len(steps) >= count:
            return steps[:count]


def expected(steps, p, n, run_stop):
    """The n-step transition of step ``p``, its window cut at an episode
    end, after ``n`` steps and at ``run_stop`` (nothing known from
    there)."""
    G, discount, q = 0.0, 1.0, p
    while True:
        s = steps[q]
        G += discount * s["rew"]
        discount *= GAMMA
        if s["terminated"]:
            return G, 0.0, s["next_obs"]
        if s["truncated"] or q - p + 1 == n or q + 1 == run_stop:
            return G, discount, s["next_obs"]
        q += 1


def check_against_reference(replay, seeds, runs, n, *, versions=None):
    """Every transition held equals the reference's, and every reference
    step of the runs delivered is held exactly once.

    seeds: lane key -> the column's seed; runs: lane key -> [(start,
    stop)] steps delivered (stop excluded); versions: lane key -> step ->
    version, optional."""
    index = replay.indices()
    tr = replay.transitions(index, n_step=n, gamma=GAMMA)
    lanes = replay._nodes.store["lane"][index % replay.capacity]
    keys = replay.lanes.keys()
    seen = {}
    for i in range(len(index)):
        key = tuple(keys[lanes[i]])
        stop = max(b for _, b in runs[key])
        steps = lane_steps(seeds[key], stop)
        where = {float(s["obs"]): q for q, s in enumerate(steps)}
        p = where[float(tr.obs[i, 0])]
        run_stop = next(b for a, b in runs[key] if a <= p < b)
        G, discount, next_obs = expected(steps, p, n, run_stop)
        s = steps[p]
        assert tr.act[i].item() == s["act"]
        assert tr.rew[i].item() == G, (key, p, n)
        assert tr.discount[i].item() == discount, (key, p, n)
        assert tr.next_obs[i, 0].item() == next_obs, (key, p, n)
        assert tr.info["value"][i].item() == s["value"]
        np.testing.assert_array_equal(tr.info["h"][i].numpy(), s["h"])
        if versions is not None:
            assert tr.version[i].item() == versions[key][p]
        seen.setdefault(key, []).append(p)
    for key, ps in seen.items():
        assert sorted(ps) == sorted(p for a, b in runs[key]
                                    for p in range(a, b))
    assert set(seen) == set(runs)
    assert len(replay) == sum(b - a for r in runs.values() for a, b in r)


# --------------------------------------------------- exactness, per kind --

@pytest.mark.parametrize("kind", ["same", "single", "multi"])
def test_every_transition_equals_the_brute_force_one(kind):
    n_envs, T = 3, 4
    feed = make(kind, varying_factory, CountingActor(), T, n_envs,
                n_actors=2, n_per_batch=2, n_buffers=4, entropy=7)
    workers = 2 if kind == "multi" else 1
    # room for every batch read: a worker that starts late on a busy
    # machine leaves the other to fill many batches first
    replay = Replay(200_000, seed=0)
    fragments = {}
    with feed:
        for _, batch in zip(range(4000), feed):
            replay.extend(batch)
            for worker, env in zip(batch.meta.worker.tolist(),
                                   batch.meta.env.tolist()):
                fragments[worker, env] = fragments.get((worker, env), 0) + 1
            # on until every worker delivered 5 fragments (bounded)
            if len(fragments) == workers * n_envs \
                    and min(fragments.values()) >= 5:
                break
    assert replay.lanes.counts["new"] == workers * n_envs
    assert sum(replay.lanes.counts.values()) == workers * n_envs
    seeds = {(w, w * n_envs + j): column_seeds(7, n_envs, w)[j]
             for w in range(workers) for j in range(n_envs)}
    runs = {key: [(0, T * k)] for key, k in fragments.items()}
    for n in (1, 3, 20):
        check_against_reference(replay, seeds, runs, n)
    # both kinds of end were met
    tr = replay.transitions(replay.indices(), n_step=1, gamma=GAMMA)
    assert {0.0, GAMMA} == set(tr.discount.tolist())


def test_versions_and_the_same_generators_layout():
    T = 4
    replay = Replay(1000, seed=0)
    with same.rollout(varying_factory, CountingActor(), T, 2,
                      entropy=5) as feed:
        for _, batch in zip(range(6), feed):
            replay.extend(batch)
    seeds = {(0, j): column_seeds(5, 2)[j] for j in range(2)}
    runs = {key: [(0, 6 * T)] for key in seeds}
    versions = {key: [p // T for p in range(6 * T)] for key in seeds}
    check_against_reference(replay, seeds, runs, 2, versions=versions)


# ----------------------------------------------------------- sequences --

def test_sequences_start_with_the_stored_hx_and_carry_the_masks():
    T, n_envs = 4, 3
    actor = CountingActor()
    with same.rollout(varying_factory, actor, T, n_envs, entropy=7) as feed:
        replay = Replay(10_000, seed=0, actor=feed)  # its hx_dim, the actor's
        assert replay.hx_dim == actor.hx_dim == 0
        for _, batch in zip(range(10), feed):
            replay.extend(batch)
    seeds = {(0, j): column_seeds(7, n_envs)[j] for j in range(n_envs)}
    ref = {}
    for key, seed in seeds.items():
        for q, s in enumerate(lane_steps(seed, 10 * T)):
            ref[float(s["obs"])] = (key, q, s)
    sq = replay.sample_sequences(64, 6, burn_in=2)
    assert sq.obs.shape == (9, 64, 1) and sq.mask.shape == (9, 64)
    assert sq.hx.shape == (64, 2)  # CountingActor: hx_dim = 0
    assert sq.mask[0].all() and sq.mask[1].all()
    ended_somewhere = False
    for i in range(64):
        key, q, s = ref[float(sq.obs[0, i, 0])]
        # a window starts at row 0 of a fragment, with the actor's state
        # there: the info at row 0 is that state plus (x, stepno)
        assert q % T == 0
        want_h = sq.hx[i].numpy() + np.array([s["obs"], s["k"]],
                                             np.float32)
        np.testing.assert_array_equal(sq.info["h"][0, i].numpy(), want_h)
        steps = lane_steps(seeds[key], 10 * T)
        for t in range(1, 9):
            if not sq.mask[t, i]:
                assert not sq.mask[t:, i].any()
                assert (sq.obs[t:, i] == 0).all()
                break
            step = steps[q + t - 1]
            assert sq.obs[t, i, 0].item() == step["next_obs"]
            assert sq.act[t, i].item() == step["act"]
            assert sq.rew[t, i].item() == step["rew"]
            ended = step["terminated"] or step["truncated"]
            assert sq.fin[t, i].item() == ended
            assert sq.truncated[t, i].item() == step["truncated"]
            if ended:  # the window stops at the episode's end
                ended_somewhere = True
                assert not sq.mask[t + 1:, i].any()
                break
            if q + t < len(steps):  # else the lane's last node: a lookahead
                assert sq.info["value"][t, i].item() == \
                    steps[q + t]["value"]
    assert ended_somewhere
    with pytest.raises(ValueError, match="actor="):
        Replay(100).sample_sequences(1, 2)


# ---------------------------------------------------------------- gaps --

def _copies(n_batches, entropy=11, T=4):
    with same.rollout(varying_factory, CountingActor(), T, 2,
                      entropy=entropy, copy=True) as feed:
        return [batch for _, batch in zip(range(n_batches), feed)]


@pytest.mark.parametrize("gap", ["missing", "disorder", "generation"])
def test_nothing_is_linked_across_a_gap(gap):
    T = 4
    batches = _copies(6)
    seeds = {(0, j): column_seeds(11, 2)[j] for j in range(2)}
    replay = Replay(1000, seed=0)
    if gap == "missing":  # fragment 2 dropped
        for k in (0, 1, 3, 4, 5):
            replay.extend(batches[k])
        runs = [(0, 2 * T), (3 * T, 6 * T)]
    elif gap == "disorder":  # fragment 3 before 2: 2 is a gap of its own
        for k in (0, 1, 3, 2, 4, 5):
            replay.extend(batches[k])
        runs = [(0, 2 * T), (3 * T, 4 * T), (2 * T, 3 * T), (4 * T, 6 * T)]
    else:  # fragment 3 on is stamped with a new generation
        for k in range(6):
            if k >= 3:
                batches[k].meta.generation[:] = 1
            replay.extend(batches[k])
        runs = [(0, 3 * T), (3 * T, 6 * T)]
    check_against_reference(replay, seeds, {key: runs for key in seeds}, 5)
    assert replay.lanes.counts[gap] == 2


# ------------------------------------------------- every kind of source --

@pytest.mark.parametrize("source", SOURCES)
def test_transitions_of_every_kind_of_source(source):
    """On a CountingEnv the observation goes up by one per step and the
    reward is the action: a transition stitched across an episode end, a
    lost call or a frozen row breaks one of the two."""
    factory, kwargs = source_factory(source)
    replay = Replay(10_000, seed=0)
    executed = 0
    with same.rollout(factory, CountingActor(), 6, 8, entropy=3,
                      **kwargs) as feed:
        for _, batch in zip(range(12), feed):
            replay.extend(batch)
            fin, length = batch.state.fin, batch.stats.length
            executed += int((~(fin & (length == 0)))[1:].sum())
    assert len(replay) == executed
    index = replay.indices()
    one = replay.transitions(index, n_step=1, gamma=GAMMA)
    assert torch.equal(one.next_obs - one.obs, torch.ones_like(one.obs))
    assert torch.equal(one.rew, one.act.float())
    ends = one.discount == 0
    assert ends.any() and (one.discount[~ends] == GAMMA).all()
    for n in (2, 5):
        tr = replay.transitions(index, n_step=n, gamma=GAMMA)
        k = torch.where(tr.discount > 0, torch.log2(tr.discount).neg(),
                        torch.nan)
        took = (tr.next_obs - tr.obs)[:, 0]
        known = ~torch.isnan(k)
        assert torch.equal(took[known], k[known])
        assert (took >= 1).all() and (took <= n).all()


# -------------------------------------------------------- the n-step sum --

def test_n_step_equals_a_plain_loop():
    rng = np.random.default_rng(0)
    rew = rng.normal(size=(6, 50))
    cut = rng.random((6, 50)) < 0.3
    G, discount, last = n_step(torch.from_numpy(rew), torch.from_numpy(cut),
                               0.9)
    for i in range(50):
        g, d = 0.0, 1.0
        for k in range(6):
            g, d = g + d * rew[k, i], d * 0.9
            if cut[k, i]:
                break
        assert math.isclose(G[i].item(), g, rel_tol=1e-12)
        assert math.isclose(discount[i].item(), d, rel_tol=1e-12)
        assert last[i].item() == k


# ------------------------------------------------------------ sampling --

def _filled(cls=Replay, capacity=10_000, n_batches=10, **kwargs):
    replay = cls(capacity, seed=1, **kwargs)
    with same.rollout(varying_factory, CountingActor(), 8, 4,
                      entropy=2) as feed:
        for _, batch in zip(range(n_batches), feed):
            replay.extend(batch)
    return replay


def test_sampling_is_reproducible_from_the_seed_and_uniform():
    a, b = _filled(), _filled()
    for _ in range(3):
        x, y = a.sample(64, n_step=2, gamma=0.9), b.sample(64, n_step=2,
                                                           gamma=0.9)
        assert torch.equal(x.index, y.index) and torch.equal(x.obs, y.obs)
    held = set(a.indices().tolist())
    draws = np.concatenate([a.sample(256).index.numpy()
                            for _ in range(200)])
    assert set(draws.tolist()) <= held
    counts = np.bincount(np.searchsorted(sorted(held), draws),
                         minlength=len(held))
    # chi-square against uniform, a bound that fails at p < 1e-6
    expect = len(draws) / len(held)
    chi2 = ((counts - expect) ** 2 / expect).sum()
    dof = len(held) - 1
    assert chi2 < dof + 5 * 2 * math.sqrt(dof) + 30


def test_the_ring_overwrites_the_oldest_and_never_links_to_them():
    replay = _filled(capacity=100, n_batches=20)
    lo = replay._nodes.total - replay.capacity
    index = replay.indices()
    assert (index >= lo).all() and len(index) == len(replay)
    assert len(replay) <= 100
    tr = replay.transitions(index, n_step=4, gamma=GAMMA)
    took = (tr.next_obs - tr.obs)[:, 0]
    assert (took >= 1).all() and (took <= 4).all()
    with pytest.raises(ValueError, match="names no transition"):
        replay.transitions([lo - 1])


# --------------------------------------------------------- prioritized --

def test_sum_tree_finds_by_mass():
    tree = _SumTree(5)
    tree.set([0, 1, 2, 3, 4], [1.0, 0.0, 2.0, 0.0, 1.0])
    assert tree.total == 4.0 and tree.smallest == 1.0
    got = tree.find(np.array([0.0, 0.999, 1.0, 2.5, 3.0, 3.999]))
    assert got.tolist() == [0, 0, 2, 2, 4, 4]
    tree.set([4, 4], [5.0, 3.0])  # the last value given wins
    assert tree.total == 6.0


@pytest.mark.parametrize("n", [1, 7, 64, 65, 300])
def test_sum_tree_levels_agree_with_a_cumulative_sum(n):
    # a fanout of 4 and a top of 8 entries make up to four levels here
    rng = np.random.default_rng(n)
    tree = _SumTree(n, fanout=4, top=8)
    leaves = np.zeros(n)
    for _ in range(20):
        slots = rng.integers(0, n, rng.integers(1, 2 * n + 1))
        values = rng.random(len(slots)) * (rng.random(len(slots)) < 0.7)
        tree.set(slots, values)
        leaves[slots] = values
        assert np.array_equal(tree.get(np.arange(n)), leaves)
        assert tree.total == pytest.approx(leaves.sum(), rel=1e-12)
        positive = leaves[leaves > 0]
        assert tree.smallest == (positive.min() if len(positive)
                                 else np.inf)
        if not leaves.sum() > 0:
            continue
        cum = np.cumsum(leaves)
        mass = rng.random(200) * cum[-1]
        # away from the edges of the ranges, where rounding may differ
        mass = mass[np.abs(mass[:, None] - cum[None, :]).min(1) > 1e-9]
        want = np.searchsorted(cum, mass, side="right")
        assert tree.find(mass).tolist() == want.tolist()
        assert (leaves[tree.find(mass)] > 0).all()
    other = _SumTree(n, fanout=4, top=8)
    other.load(tree.state())
    assert [x.tolist() for x in other.sum] == [x.tolist() for x in tree.sum]
    assert [x.tolist() for x in other.min] == [x.tolist() for x in tree.min]


def test_prioritized_frequencies_match_the_priorities():
    replay = _filled(PrioritizedReplay, alpha=1.0, beta=1.0, eps=0.0)
    index = replay.indices()
    prio = (index % 4 + 1).astype(np.float64)  # 1, 2, 3, 4
    replay.update(index, prio)
    draws = np.concatenate([replay.sample(256).index.numpy()
                            for _ in range(200)])
    counts = np.bincount(draws % 4, minlength=4)
    share = np.bincount(index % 4, weights=prio, minlength=4)
    expect = share / share.sum() * len(draws)
    chi2 = ((counts - expect) ** 2 / expect).sum()
    assert chi2 < 35  # 3 degrees of freedom: fails at p < 1e-6
    tr = replay.sample(256)
    # weights: (N P(i))**-1 over the largest, that of priority 1
    want = (1.0 / (prio[np.searchsorted(index, tr.index.numpy())]))
    np.testing.assert_allclose(tr.weight.numpy(), want, rtol=1e-6)


def test_stale_priority_updates_are_ignored():
    replay = _filled(PrioritizedReplay, capacity=200, n_batches=4,
                     alpha=1.0)
    old = replay.indices()[:10]
    with same.rollout(varying_factory, CountingActor(), 8, 4,
                      entropy=9) as feed:
        for _, batch in zip(range(10), feed):
            replay.extend(batch)
    assert (old < replay._nodes.total - replay.capacity).all()
    before = replay._sampler.tree.state()["leaves"].copy()
    replay.update(old, np.full(10, 1000.0))
    assert np.array_equal(replay._sampler.tree.state()["leaves"], before)
    assert replay._sampler.max_priority == 1.0


def test_new_transitions_get_the_largest_priority():
    replay = _filled(PrioritizedReplay, n_batches=2, alpha=1.0, eps=0.0)
    index = replay.indices()
    replay.update(index[:1], [7.0])
    with same.rollout(varying_factory, CountingActor(), 8, 4,
                      entropy=2) as feed:
        batch = next(feed)
    replay.extend(batch)
    new = np.setdiff1d(replay.indices(), index)
    tree = replay._sampler.tree
    assert len(new) and np.all(tree.get(new % replay.capacity) == 7)


# --------------------------------------------------------------- state --

@pytest.mark.parametrize("cls", [Replay, PrioritizedReplay])
def test_state_dict_round_trips(cls):
    replay = _filled(cls, capacity=300, n_batches=6, actor=CountingActor())
    state = pickle.loads(pickle.dumps(replay.state_dict()))
    again = cls(300)
    again.load_state_dict(state)
    assert len(again) == len(replay)
    for _ in range(2):
        x, y = replay.sample(32, n_step=3), again.sample(32, n_step=3)
        for a, b in zip(x, y):
            if a is not None:
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    with same.rollout(varying_factory, CountingActor(), 8, 4, entropy=2,
                      copy=True) as feed:
        batches = [b for _, b in zip(range(8), feed)][6:]
    for b in batches:  # both follow on the same lanes
        replay.extend(b)
        again.extend(b)
    assert np.array_equal(replay.indices(), again.indices())
    assert replay.lanes.counts == again.lanes.counts
    x, y = replay.sample_sequences(8, 3), again.sample_sequences(8, 3)
    torch.testing.assert_close(x.obs, y.obs, rtol=0, atol=0)
    torch.testing.assert_close(x.hx, y.hx, rtol=0, atol=0)
    with pytest.raises(ValueError, match="does not load"):
        Replay(301).load_state_dict(state)


# ------------------------------------------------------------ layouts --

def _stored(replay):
    state = replay.state_dict()
    return [x.tolist() for x in flatten(state["store"])], state["cur"]


@pytest.mark.parametrize("where", ["strided", "cuda"])
def test_a_batch_is_stored_alike_from_any_memory(where):
    # the rows of a batch go straight into the ring where its fields
    # flatten to rows without a copy, row by row where they do not (a
    # strided view), and a batch on a device comes over once (final only
    # at the episode ends): all store the same, across the ring's wrap
    if where == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with same.rollout(varying_factory, CountingActor(), 8, 4, entropy=2,
                      copy=True) as feed:
        batches = [b for _, b in zip(range(20), feed)]

    def moved(x):
        if where == "cuda":
            return x.to("cuda")
        return np.asfortranarray(x.numpy())  # (1 + T, B) rows: no view

    plain, other = Replay(100, seed=0), Replay(100, seed=0)
    for b in batches:
        plain.extend(b)
        other.extend(b._replace(
            state=b.state._replace(obs=moved(b.state.obs),
                                   act=moved(b.state.act)),
            final=moved(b.final), actor={k: moved(v)
                                         for k, v in b.actor.items()}))
    assert plain.lanes.counts["new"] == 4 and plain.n_stored == 100
    got, want = _stored(other), _stored(plain)
    assert got[0] == want[0] and np.array_equal(got[1], want[1])



def test_dict_observations_and_small_dtypes_stay_as_they_are():
    from test_core_layout import StructuredActor
    replay = Replay(1000, seed=0)
    with same.rollout(lambda: StructuredEnv(term_every=3), StructuredActor(),
                      5, 2) as feed:
        for _, batch in zip(range(4), feed):
            replay.extend(batch)
    tr = replay.sample(16, n_step=2)
    assert set(tr.obs) == set(batch.state.obs)
    check_structure(tr.obs, batch.state.obs)
    for got, nxt, leaf in zip(flatten(tr.obs), flatten(tr.next_obs),
                              flatten(batch.state.obs)):
        assert got.dtype == nxt.dtype == leaf.dtype
        assert got.shape[1:] == nxt.shape[1:] == leaf.shape[2:]
    assert any(leaf.dtype == torch.int8 for leaf in flatten(tr.obs))


def test_memory_is_checked_before_allocating():
    with same.rollout(lambda: CountingEnv(term_every=3), CountingActor(),
                      4, 2) as feed:
        batch = next(feed)
    with pytest.raises(MemoryError, match="capacity="):
        Replay(10 ** 15, example=batch)
    assert Replay(10, example=batch).nbytes_per_node > 0


# ----------------------------------------------------------- bad input --

def test_bad_input_is_refused_and_leaves_the_buffer_as_it_was():
    replay = _filled(n_batches=3)
    state = pickle.dumps(replay.state_dict())
    with same.rollout(lambda: StructuredEnv(term_every=3),
                      __import__("test_core_layout").StructuredActor(),
                      5, 2) as feed:
        other = next(feed)
    with pytest.raises(ValueError, match="layout"):
        replay.extend(other)
    with same.rollout(varying_factory, CountingActor(), 8, 4,
                      final=False) as feed:
        no_final = next(feed)
    with pytest.raises(ValueError, match="final"):
        replay.extend(no_final)
    with pytest.raises(ValueError, match="n_step"):
        replay.sample(4, n_step=0)
    with pytest.raises(ValueError, match="batch_size"):
        replay.sample(len(replay) + 1)
    with pytest.raises(ValueError, match="gamma"):
        replay.sample(4, gamma=1.5)
    with pytest.raises(TypeError, match="batch_size"):
        replay.sample(4.0)
    with pytest.raises(ValueError, match="capacity"):
        Replay(1)
    with pytest.raises(ValueError, match="more than capacity"):
        small = Replay(10)
        small.extend(no_final._replace(final=no_final.state.obs))
    assert pickle.dumps(replay.state_dict()) == state
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplay(10, alpha=-1)
    prio = _filled(PrioritizedReplay, n_batches=2)
    with pytest.raises(ValueError, match="priorities"):
        prio.update(prio.indices()[:3], [1.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match="shaped"):
        prio.update(prio.indices()[:3], [1.0])


@pytest.mark.parametrize("cls", [Replay, PrioritizedReplay])
def test_a_capacity_too_large_is_refused_before_anything_is_allocated(cls):
    with same.rollout(lambda: CountingEnv(term_every=3), CountingActor(),
                      4, 2) as feed:
        batch = next(feed)
    for capacity in (10 ** 13, 10 ** 30):
        replay = cls(capacity)  # nothing allocated before the layout
        assert replay.nbytes_per_node is None
        with pytest.raises(MemoryError, match=f"capacity={capacity}"):
            cls(capacity, example=batch)
        with pytest.raises(MemoryError, match=f"capacity={capacity}"):
            replay.extend(batch)
        assert replay.n_stored == 0 and len(replay) == 0
    with pytest.raises(TypeError, match="capacity"):
        cls(1e13)


def test_update_refuses_indices_and_priorities_of_another_type():
    prio = _filled(PrioritizedReplay, n_batches=2)
    before = pickle.dumps(prio.state_dict())
    index = prio.indices()[:3]
    with pytest.raises(TypeError, match="index must hold the ints"):
        prio.update(index + 0.7, [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="index must hold the ints"):
        prio.update(torch.as_tensor(index, dtype=torch.float32),
                    [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="priorities must be numbers"):
        prio.update(index, ["1", "2", "3"])
    assert pickle.dumps(prio.state_dict()) == before
    prio.update(torch.as_tensor(index), np.array([1, 2, 3], np.int32))


def _damaged_state(state, key, value):
    state = dict(state)
    if value is KeyError:
        del state[key]
    else:
        state[key] = value
    return state


@pytest.mark.parametrize("cls", [Replay, PrioritizedReplay])
def test_a_damaged_state_is_refused_and_leaves_the_buffer_as_it_was(cls):
    replay = _filled(cls, n_batches=3)
    good = replay.state_dict()
    saved = pickle.dumps(good)
    cases = [("cur", KeyError), ("lanes", KeyError), ("rng", KeyError),
             ("store", KeyError), ("total", KeyError),
             ("store", "abc"), ("store", {"data": 1}), ("cur", "abc"),
             ("cur", good["cur"][:-1]), ("lanes", None), ("lanes", {}),
             ("rng", None), ("rng", {"state": 1}), ("total", "3"),
             ("linked", -1), ("hx", "abc")]
    if cls is PrioritizedReplay:
        cases += [("tree", KeyError), ("tree", None),
                  ("tree", {"leaves": np.zeros(3)}),
                  ("max_priority", "big"), ("alpha", float("nan"))]
    for key, value in cases:
        with pytest.raises((ValueError, TypeError),
                           match=rf"state\['{key}'\]"):
            replay.load_state_dict(_damaged_state(good, key, value))
        assert pickle.dumps(replay.state_dict()) == saved, (key, value)
    for state in ([good], None, "state"):
        with pytest.raises(TypeError, match="state must be a dict"):
            replay.load_state_dict(state)
    assert pickle.dumps(replay.state_dict()) == saved
    # and it goes on as it would have
    sample = replay.sample(8, n_step=2)
    replay.load_state_dict(pickle.loads(saved))
    assert torch.equal(replay.sample(8, n_step=2).index, sample.index)
