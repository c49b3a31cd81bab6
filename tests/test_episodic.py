"""Whole episodes (rlplay.engine.rollout.episodic) and lanes
(rlplay.engine.lanes): every episode equals a brute-force episode of the
same seeded env, none missing, none duplicated, none glued across a gap."""
import functools
import os

import numpy as np
import pytest
import torch

from rlplay.engine.core import Meta
from rlplay.engine.lanes import Lanes
from rlplay.engine.nested import suply
from rlplay.engine.rollout import episodic, same

from envs import (ENV_INFO, SOURCES, CountingEnv, EndlessEnv, StructuredEnv,
                  VaryingEnv, flaky_factory, source_factory, varying_factory)
from generators import CountingActor, make
from reference import brute_episodes, column_seeds, reference


def split(batch):
    """The episodes of a batch, one dict of numpy arrays each."""
    out = []
    off = batch.offsets.numpy()
    for i in range(batch.n_episodes):
        a, b = off[i], off[i + 1]
        out.append(dict(
            obs=batch.obs[a + i:b + i + 1, 0].numpy(),
            act=batch.act[a:b].numpy(), rew=batch.rew[a:b].numpy(),
            value=batch.actor["value"][a:b].numpy(),
            h=batch.actor["h"][a:b].numpy(),
            t=batch.env["t"][a:b].numpy(),
            done=batch.env["done"][a:b].numpy(),
            t_mask=batch.env_mask["t"][a:b].numpy(),
            terminated=bool(batch.terminated[i]),
            truncated=bool(batch.truncated[i]),
            length=int(batch.length[i]), ret=float(batch.ret[i]),
            hx=None if batch.hx is None else batch.hx[i].numpy(),
            worker=int(batch.meta.worker[i]), env=int(batch.meta.env[i]),
            generation=int(batch.meta.generation[i]),
            version=(int(batch.meta.version_first[i]),
                     int(batch.meta.version_last[i]))))
    return out


def assert_episode_equal(got, want):
    assert got["length"] == want["length"]
    np.testing.assert_array_equal(got["obs"], want["obs"])
    np.testing.assert_array_equal(got["act"], want["act"])
    np.testing.assert_array_equal(got["rew"], want["rew"])
    np.testing.assert_array_equal(got["value"], want["value"])
    np.testing.assert_array_equal(got["h"], want["h"])
    np.testing.assert_array_equal(got["t"], want["t"])
    np.testing.assert_array_equal(got["done"], want["done"])
    assert got["t_mask"].all()
    assert (got["terminated"], got["truncated"]) == (want["terminated"],
                                                     want["truncated"])
    assert got["ret"] == want["ret"]
    if got["hx"] is not None:
        np.testing.assert_array_equal(got["hx"], want["hx"])


def collect_episodes(feed, n_batches):
    got = []
    for _, batch in zip(range(n_batches), feed):
        check_packed_and_padded_agree(batch)
        got.extend(split(batch))
    return got


def by_column(episodes):
    columns = {}
    for ep in episodes:
        columns.setdefault((ep["worker"], ep["env"], ep["generation"]),
                           []).append(ep)
    return columns


def check_packed_and_padded_agree(batch):
    pad = batch.padded()
    off = batch.offsets
    for i in range(batch.n_episodes):
        a, b, L = int(off[i]), int(off[i + 1]), int(batch.length[i])
        assert bool(pad.mask[:L + 1, i].all()) and not pad.mask[L + 1:, i].any()
        suply(lambda p, x: torch.testing.assert_close(
            p[:L + 1, i], x[a + i:b + i + 1], rtol=0, atol=0), pad.obs,
            batch.obs)
        suply(lambda p, x: torch.testing.assert_close(
            p[1:L + 1, i], x[a:b], rtol=0, atol=0), pad.act, batch.act)
        torch.testing.assert_close(pad.rew[1:L + 1, i], batch.rew[a:b])
        suply(lambda p, x: torch.testing.assert_close(
            p[:L, i], x[a:b], rtol=0, atol=0), pad.actor, batch.actor)
        suply(lambda p, x: torch.testing.assert_close(
            p[:L, i], x[a:b], rtol=0, atol=0), pad.env, batch.env)
        suply(lambda p, x: torch.testing.assert_close(
            p[:L, i], x[a:b], rtol=0, atol=0), pad.env_mask, batch.env_mask)
        assert not pad.rew[L + 1:, i].any() and not pad.rew[0, i]


class ResetActor(CountingActor):
    """CountingActor whose ``reset`` sets the state to 7 (not the initial
    zeros), so that an episode's starting ``hx`` tells where it came
    from."""

    def reset(self, hx, at):
        return hx.masked_fill(at[:, None], 7.0)


# ------------------------------------------------------------------ lanes --

def _meta(worker, env, seq, generation):
    n = len(seq)
    return Meta(version=np.zeros(n, np.int64), worker=np.array(worker),
                env=np.array(env), seq=np.array(seq),
                generation=np.array(generation))


def test_lanes_follow_columns_and_find_every_gap():
    lanes = Lanes()
    # two workers, one column each; worker 0's two fragments in one batch
    got = lanes.follow(_meta([0, 0, 1], [0, 0, 1], [0, 1, 0], [0, 0, 0]))
    assert got[0].tolist() == [0, 0, 1]
    assert got[1].tolist() == [False, True, False]
    got = lanes.follow(_meta([1, 0], [1, 0], [1, 3], [0, 0]))  # 2 missing
    assert got[0].tolist() == [1, 0] and got[1].tolist() == [True, False]
    got = lanes.follow(_meta([0, 0], [0, 0], [4, 4], [0, 0]))  # repeated
    assert got[1].tolist() == [True, False]
    got = lanes.follow(_meta([1], [1], [2], [1]))  # a restart
    assert got[1].tolist() == [False]
    assert lanes.counts == {"new": 2, "generation": 1, "missing": 1,
                            "disorder": 1}
    state = lanes.state_dict()
    again = Lanes()
    again.load_state_dict(state)
    assert again.follow(_meta([1, 0], [1, 0], [3, 5], [1, 0]))[1].all()
    assert len(again) == 2 and again.keys() == [(0, 0), (1, 1)]


# --------------------------------------------------- exactness, per kind --

@pytest.mark.parametrize("kind", ["same", "single", "multi"])
def test_every_episode_equals_the_brute_force_one(kind):
    actor = ResetActor()
    n_envs = 3
    feed = make(kind, varying_factory, actor, 4, n_envs, n_actors=2,
                n_per_batch=2, n_buffers=4, entropy=7, env_info=ENV_INFO)
    workers = 2 if kind == "multi" else 1
    got = []
    with episodic.episodes(feed, 5, actor=actor) as eps:
        # 60 episodes, and on until every worker has some: which worker's
        # fragments come first is the scheduler's (a worker that starts
        # late on a busy machine may deliver nothing for a while); bounded
        for _, batch in zip(range(2000), eps):
            check_packed_and_padded_agree(batch)
            got.extend(split(batch))
            if len(got) >= 60 and len({ep["worker"] for ep in got}) == \
                    workers:
                break
        stats = dict(eps.stats)
    assert stats["emitted"] == len(got) and stats["cut"] == 0
    columns = by_column(got)
    assert {w for w, _, _ in columns} == set(range(workers))
    for (worker, env, generation), episodes in columns.items():
        assert generation == 0
        j = env - worker * n_envs
        assert 0 <= j < n_envs
        seed = column_seeds(7, n_envs, worker)[j]
        want = brute_episodes(VaryingEnv(), seed, len(episodes),
                              hx_first=[7, 7], hx_reset=[7, 7])
        for g, w in zip(episodes, want):  # in order: none missing
            assert_episode_equal(g, w)
    # both kinds of end, and episodes over several fragments
    assert {ep["truncated"] for ep in got} == {True, False}
    assert max(ep["length"] for ep in got) > 8


def test_dict_observations_and_tuple_actions():
    from test_core_layout import StructuredActor
    feed = same.rollout(lambda: StructuredEnv(term_every=3),
                        StructuredActor(), 5, 2)
    with episodic.episodes(feed, 4) as eps:
        batch = next(eps)
    assert batch.hx is None and set(batch.obs) == {"pos", "flag", "pair"}
    L = batch.length.tolist()
    assert L == [3, 3, 3, 3]
    # state rows t = 0 1 2 3 of each episode (row 3 the true last one)
    pos = batch.obs["pos"][:, 0].reshape(4, 4)
    assert pos.tolist() == [[0, 1, 2, 3]] * 4
    assert batch.obs["pair"][1].shape == (16, 3)
    assert batch.obs["pair"][1].dtype == torch.int8
    # actions: (stepno % 3, [0.25, 0.5] * (t + 1)) as the actor chose them;
    # rewards the sums of what the envs executed, clipped into the Box's +-1
    assert batch.act[0].reshape(4, 3).tolist() == [[0, 1, 2]] * 4
    assert batch.act[1][:3].tolist() == [[0.25, 0.5], [0.5, 1.0],
                                         [0.75, 1.5]]
    assert batch.rew[:3].tolist() == [0.75, 2.5, 3.75]
    assert batch.actor["flag"].reshape(4, 3).tolist() == [[0, 1, 0]] * 4
    check_packed_and_padded_agree(batch)
    pad = batch.padded()
    assert pad.obs["pair"][0].shape == (4, 4, 2)


# ------------------------------------------------- vector sources, sticky --

def counting_oracle(episodes, end_rule):
    """Episodes of CountingEnv-based envs checked from the env's own
    definition: per column, episode ``i`` starts at ``offset + 100 * i``
    (none missing, none duplicated), counts up by one per step, acts as
    CountingActor and ends where ``end_rule(offset, i, L)`` says."""
    for key, eps in by_column(episodes).items():
        offset = eps[0]["obs"][0]
        for i, ep in enumerate(eps):
            L = ep["length"]
            first = offset + 100 * i
            np.testing.assert_array_equal(ep["obs"], first + np.arange(L + 1))
            acts = (first + np.arange(L)).astype(int) % 5
            acts = (acts + np.arange(L)) % 5
            np.testing.assert_array_equal(ep["act"], acts)
            np.testing.assert_array_equal(ep["rew"], acts)
            assert ep["ret"] == acts.sum()
            assert end_rule(offset, i, L) == (ep["terminated"],
                                              ep["truncated"])


def ends_rule(offset, i, L, trunc_at=5):
    k = int(offset) // 1000
    term = next(t for t in range(1, 100) if (t + k) % 7 == 0 or
                t >= trunc_at)
    assert L == term
    return (L + k) % 7 == 0, (L + k) % 7 != 0


@pytest.mark.parametrize("source", SOURCES)
def test_episodes_over_every_kind_of_source(source):
    factory, kwargs = source_factory(source)
    feed = same.rollout(factory, CountingActor(), 6, 8, entropy=3,
                        env_info=ENV_INFO, **kwargs)
    with episodic.episodes(feed, 8) as eps:
        got = collect_episodes(eps, 10)
    assert eps.stats["cut"] == 0
    counting_oracle(got, ends_rule)
    assert len(by_column(got)) == 8


# ------------------------------------------------------------ gaps, cuts --

def _episodes_of(fragments, n=1, **kwargs):
    eps = episodic.episodes(iter(fragments), n, **kwargs)
    got = []
    try:
        while True:
            got.extend(split(next(eps)))
    except StopIteration:
        pass
    return got, eps.stats


def _runs(delivered, T=4):
    """The global rows ``[first, last]`` of each run of consecutive
    fragments in the order delivered."""
    runs = []
    for f in delivered:
        if runs and f == runs[-1][1] + 1:
            runs[-1][1] = f
        else:
            runs.append([f, f])
    return [(T * a, T * b + T) for a, b in runs]


def _expected(seeds, count, runs, generation):
    """(column, index) -> brute-force episode, for the episodes whose rows
    lie wholly within one run."""
    out = {}
    for j, seed in enumerate(seeds):
        want = brute_episodes(VaryingEnv(), seed, count, hx_first=[0, 0],
                              hx_reset=[0, 0])
        start = 0
        for i, ep in enumerate(want):
            end = start + ep["length"]
            if any(a <= start and end <= b for a, b in runs):
                out[generation, j, i] = ep
            start = end
    return out


@pytest.mark.parametrize("gap", ["missing", "disorder", "generation"])
def test_never_glued_across_a_gap(gap):
    actor = CountingActor()
    frags = reference(varying_factory, actor, 4, 2, 11, count=14,
                      env_info=ENV_INFO)
    delivered = list(range(14))
    if gap == "missing":
        delivered = delivered[:5] + delivered[6:]
    elif gap == "disorder":
        delivered = delivered[:5] + [6, 5] + delivered[7:]
    stream = [frags[f] for f in delivered]
    if gap == "generation":  # a restart: from its own resets, seq going on
        stream = stream[:5] + reference(varying_factory, actor, 4, 2, 11,
                                        count=9, generation=1, seq=5,
                                        env_info=ENV_INFO)
        want = _expected(column_seeds(11, 2), 20, _runs(range(5)), 0)
        want.update(_expected(column_seeds(11, 2, generation=1), 20,
                              _runs(range(9)), 1))
    else:
        want = _expected(column_seeds(11, 2), 20, _runs(delivered), 0)
    got, stats = _episodes_of(stream, actor=actor)
    assert stats["cut"] >= 1
    assert stats["emitted"] == len(got) == len(want)
    # each emitted episode is one of those expected, exactly, once
    seen = set()
    for ep in got:
        key = next(k for k, w in want.items()
                   if k[:2] == (ep["generation"], ep["env"])
                   and w["obs"][0] == ep["obs"][0])
        assert key not in seen
        seen.add(key)
        assert_episode_equal(ep, want[key])


# --------------------------------------------------------- bounded memory --

def test_max_length_holds_memory_flat_on_an_env_that_never_ends():
    flags = iter([True, False])
    feed = same.rollout(lambda: EndlessEnv(next(flags)), CountingActor(), 8,
                        2)
    eps = episodic.episodes(feed, 4, max_length=50)
    sizes = []
    with eps:
        for _, batch in zip(range(60), eps):
            # only column 1's episodes (3 steps each) are whole
            assert batch.meta.env.tolist() == [1] * 4
            assert batch.length.tolist() == [3] * 4
            sizes.append(eps.held_rows)
    assert eps.stats["too_long"] == 1 and eps.stats["emitted"] == 240
    # the store stopped growing long before the end (60 batches of episodes
    # read 90 fragments, 1620 rows)
    assert sizes[10:] == [sizes[10]] * 50
    assert sizes[-1] <= 8 * 18


def test_an_episode_longer_than_max_length_is_dropped_and_counted():
    feed = same.rollout(varying_factory, CountingActor(), 4, 2, entropy=7,
                        env_info=ENV_INFO)
    with episodic.episodes(feed, 8, max_length=6) as eps:
        got = collect_episodes(eps, 5)
    assert max(ep["length"] for ep in got) <= 6
    assert eps.stats["too_long"] > 0



@pytest.mark.parametrize("max_length, too_long", [(3, 1), (4, 0)])
def test_an_open_episode_is_dropped_as_soon_as_it_passes_max_length(
        max_length, too_long):
    """One batch of 4 steps of an episode that goes on: with 4 steps it is
    too long for max_length=3 at once (not one step later, in the next
    batch), and not for max_length=4."""
    with same.rollout(CountingEnv, CountingActor(), 4, 1, entropy=0) as feed:
        batches = [next(feed)]
    eps = episodic.episodes(batches, 1, max_length=max_length)
    with pytest.raises(StopIteration):
        next(eps)
    assert eps.stats["batches"] == 1
    assert eps.stats["too_long"] == too_long

# ------------------------------------------------------------- bad input --

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_episodes=0), ValueError, "n_episodes must be at least 1, got 0"),
    (dict(n_episodes=2.0), TypeError, "n_episodes must be an int"),
    (dict(max_length=0), ValueError, "max_length must be at least 1"),
    (dict(actor="actor"), TypeError, "actor must be the generator's actor"),
])
def test_bad_arguments_are_refused_up_front(kwargs, error, match):
    args = dict(n_episodes=2)
    args.update(kwargs)
    n = args.pop("n_episodes")
    with pytest.raises(error, match=match):
        episodic.episodes(iter([]), n, **args)


def test_a_feed_without_final_observations_is_refused():
    feed = same.rollout(varying_factory, CountingActor(), 4, 2, final=False)
    with episodic.episodes(feed, 2) as eps:
        with pytest.raises(ValueError, match="final=True"):
            next(eps)


def test_rollout_is_episodes_over_same():
    actor = ResetActor()
    with episodic.rollout(varying_factory, actor, 3, 6, n_steps=4,
                          entropy=7, env_info=ENV_INFO) as eps:
        got = collect_episodes(eps, 3)
    with episodic.episodes(same.rollout(varying_factory, actor, 4, 3,
                                        entropy=7, env_info=ENV_INFO),
                           6, actor=actor) as eps:
        want = collect_episodes(eps, 3)
    assert len(got) == len(want) == 18
    for g, w in zip(got, want):
        assert_episode_equal(g, w)


def test_hx_dim_is_read_from_the_feed():
    """Every generator tells its actor's hx_dim (CountingActor: 0), which
    episodes read from the feed; a plain iterable has none: the actor's
    (else 1) then."""
    actor = CountingActor()
    with same.rollout(varying_factory, actor, 4, 2, entropy=0) as feed:
        assert feed.hx_dim == 0
        assert episodic.episodes(feed, 2).hx_dim == 0
    assert episodic.episodes(iter([]), 1, actor=actor).hx_dim == 0
    assert episodic.episodes(iter([]), 1).hx_dim == 1


# ------------------------------------------------------------ restarts --

def test_episodes_cut_by_a_restart_are_never_emitted(tmp_path):
    actor = CountingActor()
    factory = functools.partial(
        flaky_factory, fault="exit", markers=[str(tmp_path / "m")], at=7,
        worker=0, term_every=3)
    feed = make("multi", factory, actor, 4, 2, n_actors=2, entropy=5,
                restarts=1, restart_delay=0.1, env_info=ENV_INFO)
    got = []
    with episodic.episodes(feed, 4, actor=actor) as eps:
        # until the replacement's episodes come (worker 1 goes on meanwhile;
        # bounded, so that a replacement that never comes fails the test)
        for _, batch in zip(range(5000), eps):
            check_packed_and_padded_agree(batch)
            got.extend(split(batch))
            if sum(ep["generation"] for ep in got) >= 4:
                break
        stats = eps.stats
    assert stats["generation"] == 2 and stats["cut"] >= 2
    columns = by_column(got)
    assert (0, 0, 1) in columns and (0, 0, 0) in columns
    for (worker, env, generation), episodes in columns.items():
        seed = column_seeds(5, 2, worker, generation)[env - 2 * worker]
        from envs import CountingEnv
        want = brute_episodes(CountingEnv(term_every=3), seed,
                              len(episodes), hx_first=[0, 0],
                              hx_reset=[0, 0])
        for g, w in zip(episodes, want):
            assert_episode_equal(g, w)
    # worker 0's first generation crashed in its 7th step, in its second
    # fragment (steps 5-8), which never arrived: of its episodes (steps
    # 1-3, 4-6, ...) only the first is whole; the second was cut
    assert len(columns[0, 0, 0]) == len(columns[0, 1, 0]) == 1


# ----------------------------------------------------------------- minari --

def in_turn(feed, n_workers, bound=10_000):
    """The batches of ``feed`` (one fragment each, fresh copies) taken
    from its workers in turn, each worker's in the order they came: a
    stream that does not depend on which worker the scheduler favours.
    Reads at most ``bound`` batches."""
    queues = [[] for _ in range(n_workers)]
    it, reads = iter(feed), 0
    for k in range(bound):
        queue = queues[k % n_workers]
        while not queue:
            assert reads < bound, f"worker {k % n_workers} sent nothing"
            batch = next(it)
            reads += 1
            queues[int(batch.meta.worker[0])].append(batch)
        yield queue.pop(0)


def noting_versions(batches, versions):
    """``batches`` (one fragment each), each fragment's ``meta.version``
    appended to ``versions[worker]`` as it passes (checking that a worker's
    fragments come in ``meta.seq`` order, so the list is indexed by seq)."""
    for batch in batches:
        noted = versions[int(batch.meta.worker[0])]
        assert int(batch.meta.seq[0]) == len(noted)
        noted.append(int(batch.meta.version[0]))
        yield batch


@pytest.mark.filterwarnings("ignore:.*is set to None:UserWarning")
@pytest.mark.filterwarnings("ignore:env_spec is None:UserWarning")
def test_a_dataset_recorded_by_two_workers_loads_back(tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    # one fragment per batch, fresh copies, taken from the two workers in
    # turn: which worker delivers first is the scheduler's, so that the 24
    # episodes come from both workers whatever the machine's load
    T = 4  # steps a fragment
    feed = make("multi", varying_factory, CountingActor(), T, 2, n_actors=2,
                entropy=9, copy=True)
    versions = {0: [], 1: []}  # worker: its fragments' versions, by seq
    with feed:
        dataset = episodic.record(
            noting_versions(in_turn(feed, 2), versions), "varying/rlplay-v0",
            24, observation_space=VaryingEnv().observation_space,
            action_space=VaryingEnv().action_space,
            algorithm_name="CountingActor")
    assert dataset.total_episodes == 24
    loaded = minari.load_dataset("varying/rlplay-v0")
    assert loaded.total_episodes == 24
    columns = {}
    for ep in loaded.iterate_episodes():
        worker, env = int(ep.infos["worker"][0, 0]), int(ep.infos["env"][0, 0])
        columns.setdefault((worker, env), []).append(ep)
    assert {w for w, _ in columns} == {0, 1}
    for (worker, env), episodes in columns.items():
        seed = column_seeds(9, 2, worker)[env - 2 * worker]
        want = brute_episodes(VaryingEnv(), seed, len(episodes),
                              hx_first=[0, 0], hx_reset=[0, 0])
        start = 0  # the episode's first step in its column's stream
        for got, w in zip(episodes, want):
            np.testing.assert_array_equal(got.observations[:, 0], w["obs"])
            np.testing.assert_array_equal(got.actions, w["act"])
            np.testing.assert_array_equal(got.rewards, w["rew"])
            L = w["length"]
            assert got.terminations.tolist() == [False] * (L - 1) + [
                w["terminated"]]
            assert got.truncations.tolist() == [False] * (L - 1) + [
                w["truncated"]]
            # the versions of the fragments (T steps each) that hold the
            # episode's first and last steps: not always 1 and up, since a
            # worker may collect with v0 before the first next() publishes v1
            first, last = got.infos["version_first"], got.infos["version_last"]
            assert (first == first[0]).all() and (last == last[0]).all()
            assert first[0, 0] == versions[worker][start // T]
            assert last[0, 0] == versions[worker][(start + L - 1) // T]
            start += L


def test_record_needs_the_spaces():
    with pytest.raises(ValueError, match="env= .* or both"):
        episodic.record(iter([]), "x/y-v0", 2)


class Untouched:
    """A feed that fails the test if anything is collected from it."""

    def __iter__(self):
        return self

    def __next__(self):
        raise AssertionError("a batch was asked for before the dataset id "
                             "was checked")


def _tree(root):
    return sorted(os.path.relpath(os.path.join(path, name), root)
                  for path, dirs, files in os.walk(root)
                  for name in dirs + files)


@pytest.mark.parametrize("dataset_id, error, match", [
    ("", ValueError, "dataset_id must be"),
    (None, TypeError, "dataset_id must be a str, .* got NoneType None"),
    (42, TypeError, "dataset_id must be a str, .* got int 42"),
    ("no_version", ValueError, "got 'no_version'"),
    ("rel/x-vA", ValueError, "got 'rel/x-vA'"),
    ("rel/Bad Name-v0", ValueError, "got 'rel/Bad Name-v0'"),
    ("../../../escape/evil-v0", ValueError, "dataset_id must be"),
    ("/abs/evil-v0", ValueError, "dataset_id must be"),
    ("a/../../evil-v0", ValueError, "dataset_id must be"),
    ("old/exists-v0", ValueError, "exists already"),
])
def test_a_bad_dataset_id_is_refused_before_anything_is_collected(
        tmp_path, monkeypatch, dataset_id, error, match):
    pytest.importorskip("minari")
    datasets = tmp_path / "a" / "b" / "c" / "datasets"
    (datasets / "old" / "exists-v0").mkdir(parents=True)
    before = _tree(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(datasets))
    env = VaryingEnv()
    with pytest.raises(error, match=match):
        episodic.record(Untouched(), dataset_id, 2,
                        observation_space=env.observation_space,
                        action_space=env.action_space)
    assert _tree(tmp_path) == before
