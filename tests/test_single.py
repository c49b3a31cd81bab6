"""single.rollout: equivalence with same.rollout, the policy lag, the mode,
the delivery options, statistics and resource hygiene."""
import functools
import gc
import itertools
import os
import weakref
from contextlib import closing

import numpy as np
import pytest
import torch
from torch import nn

from envs import ENV_INFO, CountingEnv, FaultyEnv, counting_factory
from generators import without_version
from rlplay.engine import BaseActorModule, PolicyActor, episode_stats
from rlplay.engine.nested import suply, tuply
from rlplay.engine.rollout import same, single
from rlplay.engine import WorkerError

T, B = 5, 3


class RuleActor(BaseActorModule):
    """A deterministic actor: ``act = (floor(obs) + shift) % 5``.

    ``shift`` is a parameter the tests bump; ``hx`` counts the steps since
    the episode started; ``info`` records ``shift``, the train/eval mode
    and ``hx``, so that a fragment tells which parameters collected it.
    """

    def __init__(self):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(()), requires_grad=False)

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if hx is None:
            hx = torch.zeros(1, obs.shape[1], 1)
        action = (obs[..., 0].floor().long() + self.shift.long()) % 5
        info = {"shift": self.shift.expand(obs.shape[:2]).clone(),
                "training": torch.full(obs.shape[:2], float(self.training)),
                "hx": hx[0, :, 0].unsqueeze(0).clone()}
        return action, hx + 1, info


def leaves_equal(a, b):
    """Whether two fragments hold the same values everywhere (pairs of
    leaves that differ are listed on failure)."""
    different = []

    def compare(pair):
        x, y = pair
        if not (x.dtype == y.dtype and torch.equal(x, y)):
            different.append((x, y))

    tuply(compare, a, b)
    assert not different, different
    return True


def factory_with_ends(seed):
    # terminations every 3 steps or truncations at 4, by the env's seed:
    # both kinds of episode end appear within a few fragments
    if seed % 2:
        return CountingEnv(term_every=3)
    return CountingEnv(trunc_at=4)


@pytest.mark.parametrize("sticky, final, copy", [
    (False, True, True), (True, True, True), (True, False, True),
    (False, True, False), (True, True, False)])
def test_equivalence_with_same(sticky, final, copy):
    """Every leaf of same's fragments; the worker leaves the copies of
    ``obs`` in ``final`` to the learner, which makes them as it copies the
    fragment (``copy=True``) or in the shared buffer (``copy=False``)."""
    actor = RuleActor().eval()
    kwargs = dict(entropy=1234, sticky=sticky, final=final, env_info=ENV_INFO)
    with closing(same.rollout(factory_with_ends, actor, T, B,
                              **kwargs)) as feed:
        expected = [suply(torch.clone, batch)
                    for batch in itertools.islice(feed, 6)]
    with closing(single.rollout(factory_with_ends, actor, T, B,
                                start_method="fork", copy=copy,
                                **kwargs)) as feed:
        # copy=False: the shared buffer, until the next next()
        got = [suply(torch.clone, batch)
               for batch in itertools.islice(feed, 6)]
    assert any(batch.truncated.any() for batch in got)
    assert any((batch.state.fin[1:] & ~batch.truncated[1:]).any()
               for batch in got)
    for k, (want, have) in enumerate(zip(expected, got)):
        assert leaves_equal(without_version(have), without_version(want))
        # same has no lag, single exactly one batch
        assert (want.meta.version == k).all()
        assert (have.meta.version == max(k - 1, 0)).all()


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_equivalence_with_same_for_a_sampling_actor(start_method):
    # both draw the actor's samples from a torch stream seeded by `entropy`
    # (same: its own stream; single: the worker's global generator)
    policy = nn.Linear(1, 5)
    nn.init.zeros_(policy.weight)  # uniform over the 5 actions
    nn.init.zeros_(policy.bias)
    actor = PolicyActor(policy)
    kwargs = dict(entropy=99, copy=True)
    with closing(same.rollout(factory_with_ends, actor, T, B,
                              **kwargs)) as feed:
        expected = list(itertools.islice(feed, 4))
    with closing(single.rollout(factory_with_ends, actor, T, B,
                                start_method=start_method, **kwargs)) as feed:
        got = list(itertools.islice(feed, 4))
    actions = torch.cat([batch.state.act[1:] for batch in got])
    assert len(actions.unique()) > 2  # the actor really samples
    for want, have in zip(expected, got):
        assert leaves_equal(without_version(have), without_version(want))


def test_equivalence_spawn_with_closures():
    # a lambda factory and an actor class defined here travel by value
    class LocalActor(BaseActorModule):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()), requires_grad=False)

        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            action = (obs[..., 0] * self.scale).long() % 5
            return action, (), {"obs": obs[..., 0] * self.scale}

        def reset(self, hx, at):
            return ()

    term_every = 2
    factory = lambda: CountingEnv(term_every=term_every)  # noqa: E731
    actor = LocalActor()
    with closing(same.rollout(factory, actor, T, B, entropy=7,
                              copy=True)) as feed:
        expected = list(itertools.islice(feed, 3))
    with closing(single.rollout(factory, actor, T, B, entropy=7, copy=True,
                                start_method="spawn")) as feed:
        got = list(itertools.islice(feed, 3))
    for want, have in zip(expected, got):
        assert leaves_equal(without_version(have), without_version(want))


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_lag_is_exactly_one_batch(start_method):
    actor = RuleActor()
    n_batches = 7
    with closing(single.rollout(CountingEnv, actor, T, B, entropy=3,
                                start_method=start_method)) as feed:
        for k, batch in enumerate(itertools.islice(feed, n_batches)):
            shift = max(k - 1, 0)  # what the actor held at next() #k-1
            assert (batch.meta.version == shift).all()
            assert (batch.actor["shift"] == shift).all()
            # act[t + 1] = f(obs[t]) with the shift of version k - 1
            obs = batch.state.obs[:-1, :, 0].floor().long()
            assert torch.equal(batch.state.act[1:], (obs + shift) % 5)
            assert torch.equal(batch.state.rew[1:],
                               batch.state.act[1:].float())
            with torch.no_grad():
                actor.shift += 1  # one training step per batch
    assert k == n_batches - 1


def test_mode_follows_the_learner():
    actor = RuleActor().train()
    # the mode set after batch k reaches batch k + 2 (published at the
    # next next(), used for the fragment after the one in flight)
    modes = [True, False, False, True, False, True, True]
    expected = [True, True] + modes[:-2]
    with closing(single.rollout(CountingEnv, actor, T, B,
                                start_method="fork")) as feed:
        for k, batch in enumerate(itertools.islice(feed, len(modes))):
            assert (batch.actor["training"] == float(expected[k])).all(), k
            actor.train(modes[k])


def test_reused_buffers_and_copies():
    actor = RuleActor()
    with closing(single.rollout(CountingEnv, actor, T, B, copy=False,
                                start_method="fork")) as feed:
        batches = list(itertools.islice(feed, 4))
        assert feed.stats["batches"] == 4
    ptrs = [batch.state.obs.data_ptr() for batch in batches]
    # the two shared buffers, in turn
    assert ptrs[0] == ptrs[2] and ptrs[1] == ptrs[3] and ptrs[0] != ptrs[1]
    assert batches[0].state.obs.is_shared()

    with closing(single.rollout(CountingEnv, actor, T, B, copy=True,
                                start_method="fork")) as feed:
        copies = list(itertools.islice(feed, 4))
    assert len({batch.state.obs.data_ptr() for batch in copies}) == 4
    # row T of a fragment is row 0 of the next one
    for prev, this in zip(copies, copies[1:]):
        assert torch.equal(prev.state.obs[-1], this.state.obs[0])
        assert torch.equal(prev.meta.seq + 1, this.meta.seq)


def test_stats():
    actor = RuleActor()
    with single.rollout(factory_with_ends, actor, T, B,
                        start_method="fork") as feed:
        for k, batch in enumerate(itertools.islice(feed, 3)):
            returns, lengths = episode_stats(batch)
            assert np.array_equal(feed.stats["returns"], returns)
            assert np.array_equal(feed.stats["lengths"], lengths)
            # the version of this next() (the calls before it, as same's),
            # lag its distance to the fragment's: 1 from the second on
            assert feed.stats["version"] == k
            assert feed.stats["lag"] == k - int(batch.meta.version.min())
            assert feed.stats["lag"] == min(k, 1)
        stats = feed.stats
    assert stats["batches"] == 3 and stats["steps"] == 3 * T * B
    assert len(stats["lengths"]) > 0
    # the keys of same.rollout, with the same meanings
    assert set(stats) == STATS_KEYS
    for key in ("time_collect", "time_learner_wait", "time_worker_wait",
                "time_wall", "steps_per_s", "steps_per_s_collect"):
        assert stats[key] >= 0.0, key
    assert stats["time_wall"] >= stats["time_learner_wait"]
    assert stats["steps_per_s"] == pytest.approx(
        stats["steps"] / stats["time_wall"])
    assert stats["steps_per_s_collect"] == pytest.approx(
        stats["steps"] / stats["time_collect"])


# one set of keys for every generator (rlplay.engine.rollout._base.Stats)
STATS_KEYS = {"steps", "batches", "time_collect", "time_wall",
              "time_learner_wait", "time_worker_wait", "time_collate",
              "steps_per_s", "steps_per_s_collect", "returns", "lengths",
              "dropped", "version", "lag", "restarts", "workers"}


def test_same_reports_the_same_stats():
    with closing(same.rollout(CountingEnv, RuleActor(), T, B)) as feed:
        next(feed)
        assert set(feed.stats) == STATS_KEYS


def test_creating_a_rollout_leaves_the_learners_random_numbers_alone():
    # sizing the buffers calls a sampling actor in this process
    actor = PolicyActor(nn.Linear(1, 5))
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    single.rollout(CountingEnv, actor, T, B, start_method="fork").close()
    assert torch.equal(torch.rand(1), expected)


def test_bad_arguments_fail_up_front():
    actor = RuleActor()
    with pytest.raises(ValueError, match="n_steps"):
        single.rollout(CountingEnv, actor, 0, B)
    with pytest.raises(TypeError, match="n_envs"):
        single.rollout(CountingEnv, actor, T, 2.0)
    with pytest.raises(ValueError, match="start_method"):
        single.rollout(CountingEnv, actor, T, B, start_method="telepathy")
    with pytest.raises(ValueError, match="timeout"):
        single.rollout(CountingEnv, actor, T, B, timeout=-1)
    with pytest.raises(ValueError, match="shutdown_timeout must be a number"):
        single.rollout(CountingEnv, actor, T, B, shutdown_timeout=None)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            single.rollout(CountingEnv, actor, T, B, device="cuda")
        with pytest.raises(RuntimeError, match="CUDA"):
            single.rollout(CountingEnv, actor, T, B, pinned=True)


def test_close_is_idempotent_and_ends_iteration():
    feed = single.rollout(CountingEnv, RuleActor(), T, B,
                          start_method="fork")
    next(feed)
    feed.close()
    feed.close()
    with pytest.raises(StopIteration):
        next(feed)
    assert list(feed) == []


def test_dropping_the_generator_stops_the_worker():
    feed = single.rollout(CountingEnv, RuleActor(), T, B,
                          start_method="fork")
    for _ in feed:
        break
    pid, alive = feed.pid, weakref.ref(feed)
    del feed, _
    gc.collect()
    assert alive() is None
    assert not os.path.exists(f"/proc/{pid}")  # stopped, joined and reaped


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _shm_footprint():
    """Our own shared-memory objects: /dev/shm entries named after this
    process, and /dev/shm files it maps (named semaphores, torch's
    segments); other processes' entries do not count."""
    pid = os.getpid()
    names = {name for name in os.listdir("/dev/shm")
             if f"_{pid}_" in name or f"-{pid}-" in name}
    with open("/proc/self/maps") as maps:
        mapped = {line.split(None, 5)[-1].strip() for line in maps
                  if "/dev/shm/" in line}
    return names, len(mapped)


def _cycle(i, start_method):
    actor = RuleActor()
    if i % 3 == 2:  # a worker error closes the generator itself
        factory = functools.partial(FaultyEnv, "step", at=2 * T)
        feed = single.rollout(factory, actor, T, B,
                              start_method=start_method)
        with pytest.raises(WorkerError):
            for _ in feed:
                pass
        return
    feed = single.rollout(counting_factory, actor, T, B,
                          start_method=start_method)
    if i % 3 == 0:
        with closing(feed):
            for batch in itertools.islice(feed, 3):
                pass
    else:  # break out and drop it
        for k, batch in enumerate(feed):
            if k == 2:
                break
        del feed
    del batch


# 50 cycles under fork and forkserver (a worker forked from the running
# server starts in milliseconds). Not under spawn: the learner's side of a
# cycle is forkserver's (the same named semaphores, buffers and channels;
# only how the worker process starts differs), and a spawned worker imports
# torch afresh (seconds each on a 2-core machine); that close() unlinks a
# spawned run's named semaphores is checked in test_guarantees.py
@pytest.mark.parametrize("start_method, n_cycles",
                         [("fork", 50), ("forkserver", 50)])
def test_no_leaks(start_method, n_cycles):
    for i in range(3):  # warm-up: lazily made helpers, caches
        _cycle(i, start_method)
    gc.collect()
    fds, (shm, mapped) = _fds(), _shm_footprint()
    for i in range(n_cycles):
        _cycle(i, start_method)
    gc.collect()
    new_shm, new_mapped = _shm_footprint()
    assert _fds() <= fds + 2
    assert new_shm <= shm
    assert new_mapped <= mapped


def test_policy_actor_on_gymnasium():
    gymnasium = pytest.importorskip("gymnasium")
    factory = functools.partial(gymnasium.make, "CartPole-v1")
    actor = PolicyActor(nn.Sequential(nn.Linear(4, 8), nn.Tanh(),
                                      nn.Linear(8, 2)))
    with closing(single.rollout(factory, actor, 32, 4, entropy=0,
                                start_method="fork")) as feed:
        batch = next(feed)
        assert tuple(batch.state.obs.shape) == (33, 4, 4)
        assert tuple(batch.actor["logp"].shape) == (33, 4)
        assert (batch.actor["logp"] <= 0).all()


class ManyTensorsActor(BaseActorModule):
    """An actor with more parameters and buffers than forkserver could pass
    as file descriptors one by one (it passes at most 252)."""

    def __init__(self, n_tensors=300):
        super().__init__()
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.full((2,), float(i)))
             for i in range(n_tensors)])
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        last = self.weights[-1][0] + self.steps
        return (torch.zeros(obs.shape[:2], dtype=torch.long), (),
                {"last": last.expand(obs.shape[:2]).clone()})

    def reset(self, hx, at):
        return ()


def test_actor_with_many_tensors_forkserver():
    actor = ManyTensorsActor()
    with closing(single.rollout(CountingEnv, actor, T, B,
                                start_method="forkserver")) as feed:
        for k, batch in enumerate(itertools.islice(feed, 4)):
            # the parameters and the buffer published at next() #k - 1
            assert (batch.actor["last"] == 299 + 2 * max(k - 1, 0)).all()
            with torch.no_grad():
                actor.weights[-1].add_(1)
                actor.steps += 1
