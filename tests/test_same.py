"""The same-process generator: iteration, copies, closing, stats, seeds."""
import functools
from contextlib import closing

import gymnasium
import numpy as np
import pytest
import torch
from torch import nn

from envs import CountingEnv
from rlplay.engine import BaseActorModule, PolicyActor, episode_stats
from rlplay.engine.seeds import env_seed_sequences
from rlplay.engine.nested import flatten
from rlplay.engine.rollout import same


class Steady(BaseActorModule):
    """Acts ``self.action`` everywhere (a parameter the test may change)."""

    def __init__(self, action=1):
        super().__init__()
        self.action = nn.Parameter(torch.tensor(float(action)),
                                   requires_grad=False)

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        action = torch.full(fin.shape, int(self.action), dtype=torch.int64)
        return action, (), {"obs": obs[..., 0].clone()}

    def reset(self, hx, at):
        return ()


class Closable(CountingEnv):
    log = []

    def close(self):
        Closable.log.append(self)


def counting(term_every=3, trunc_at=None):
    return functools.partial(CountingEnv, term_every=term_every,
                             trunc_at=trunc_at)


def test_yields_the_reused_buffer():
    feed = same.rollout(counting(), Steady(), 4, 2, entropy=0, copy=False)
    with closing(feed):
        first = next(feed)
        obs = first.state.obs.clone()
        second = next(feed)
    assert second is first and second is feed.buffer.pyt
    assert not torch.equal(second.state.obs, obs)  # overwritten in place
    torch.testing.assert_close(second.state.obs[0], obs[-1])


def test_copy_gives_independent_batches():
    with same.rollout(counting(), Steady(), 4, 2, entropy=0,
                      copy=True) as feed:
        first = next(feed)
        kept = [x.clone() for x in flatten(first)]
        second = next(feed)
    assert second is not first
    for a, b in zip(flatten(first), flatten(feed.buffer.pyt)):
        assert a.data_ptr() != b.data_ptr()
    for a, b in zip(flatten(first), kept):
        assert torch.equal(a, b)  # untouched by the next collection
    torch.testing.assert_close(second.state.obs[0], first.state.obs[-1])


def test_copies_equal_the_buffer():
    with same.rollout(counting(), Steady(), 3, 2, entropy=5,
                      copy=False) as a, \
            same.rollout(counting(), Steady(), 3, 2, entropy=5,
                         copy=True) as b:
        for _ in range(3):
            for x, y in zip(flatten(next(a)), flatten(next(b))):
                assert torch.equal(x, y)


def test_closing_and_context_manager():
    Closable.log.clear()
    feed = same.rollout(Closable, Steady(), 2, 3)
    with closing(feed):
        next(feed)
    assert Closable.log == list(feed.envs)
    with pytest.raises(StopIteration):
        next(feed)
    feed.close()  # idempotent
    assert len(Closable.log) == 3

    Closable.log.clear()
    with same.rollout(Closable, Steady(), 2, 2) as feed:
        assert iter(feed) is feed
    assert Closable.log == list(feed.envs)
    assert list(feed) == []


def test_close_after_breaking_out_of_a_loop():
    Closable.log.clear()
    feed = same.rollout(Closable, Steady(), 2, 2)
    with closing(feed):
        for k, _ in enumerate(feed):
            if k == 2:
                break
    assert len(Closable.log) == 2


def test_a_failed_set_up_closes_the_envs():
    class WrongAction(Steady):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            return torch.zeros(fin.shape[1]), (), {}

    Closable.log.clear()
    with pytest.raises(ValueError, match="action of shape"):
        same.rollout(Closable, WrongAction(), 2, 2)
    assert len(Closable.log) == 2


def test_stats_and_version():
    with same.rollout(counting(term_every=3), Steady(2), 5, 2,
                      entropy=0) as feed:
        assert feed.stats["batches"] == 0 and feed.stats["steps"] == 0
        for k in range(3):
            batch = next(feed)
            assert batch.meta.version.tolist() == [k, k]
            assert batch.meta.seq.tolist() == [k, k]
            stats = feed.stats
            assert stats["batches"] == k + 1
            assert stats["steps"] == 5 * 2 * (k + 1)
            returns, lengths = episode_stats(batch)
            np.testing.assert_array_equal(stats["returns"], returns)
            np.testing.assert_array_equal(stats["lengths"], lengths)
        assert stats["time_collect"] > 0 and stats["steps_per_s"] > 0
        # every episode lasts 3 steps of reward 2
        assert set(stats["returns"].tolist()) == {6.0}
        assert set(stats["lengths"].tolist()) == {3}


def test_policy_lag_is_zero():
    actor = Steady(1)
    with same.rollout(counting(term_every=None), actor, 3, 2) as feed:
        assert next(feed).state.act[1:].eq(1).all()
        actor.action.fill_(4)
        batch = next(feed)
        assert batch.state.act[1:].eq(4).all()
        assert batch.state.rew[1:].eq(4).all()


def test_numpy_integer_counts():
    with same.rollout(counting(), Steady(), np.int64(3), np.int32(2)) as feed:
        assert next(feed).state.obs.shape == (4, 2, 1)


def test_options_pass_through():
    with same.rollout(counting(term_every=2), Steady(), 3, 2, final=False,
                      env_info={"done": 0.0}, sticky=True) as feed:
        batch = next(feed)
    assert batch.final is None and set(batch.env) == {"done"}
    # sticky: frozen after the end at row 2
    assert batch.state.fin[:, 0].tolist() == [True, False, True, True]
    assert batch.env_mask["done"][:, 0].tolist() == [False, True, False]


def test_cpu_device_yields_the_host_buffer():
    with same.rollout(counting(), Steady(), 2, 1, device="cpu",
                      copy=False) as feed:
        assert next(feed) is feed.buffer.pyt


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
@pytest.mark.parametrize("options", [{"device": "cuda"}, {"pinned": True},
                                     {"device": "cuda:0", "copy": True}])
def test_cuda_options_fail_up_front_without_cuda(options):
    calls = []

    def factory():
        calls.append(None)
        return CountingEnv()

    with pytest.raises(RuntimeError, match="needs CUDA, but "
                                           r"torch.cuda.is_available\(\) is "
                                           "False"):
        same.rollout(factory, Steady(), 2, 2, **options)
    assert calls == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_delivery_on_cuda():
    with same.rollout(counting(), Steady(), 3, 2, device="cuda",
                      entropy=1) as feed, \
            same.rollout(counting(), Steady(), 3, 2, entropy=1) as host:
        for _ in range(2):
            batch, expected = next(feed), next(host)
            torch.cuda.synchronize()
            for x, y in zip(flatten(batch), flatten(expected)):
                assert x.device.type == "cuda"
                assert torch.equal(x.cpu(), y)
        assert all(x.is_pinned() for x in flatten(feed.buffer.pyt))
    with same.rollout(counting(), Steady(), 3, 2, device="cuda",
                      copy=True) as feed:
        first = next(feed)
        kept = first.state.obs.clone()
        next(feed)
        torch.cuda.synchronize()
        assert torch.equal(first.state.obs, kept)


# seeds and reproducibility

def collect(factory, actor, entropy, n_batches=3, torch_seed=None, **kw):
    if torch_seed is not None:
        torch.manual_seed(torch_seed)
    with same.rollout(factory, actor, 8, 3, entropy=entropy, copy=True,
                      **kw) as feed:
        return [next(feed) for _ in range(n_batches)]


def assert_identical(run_a, run_b):
    for a, b in zip(run_a, run_b):
        leaves_a, leaves_b = flatten(a), flatten(b)
        assert len(leaves_a) == len(leaves_b)
        for x, y in zip(leaves_a, leaves_b):
            assert x.dtype == y.dtype and torch.equal(x, y)


def test_same_entropy_identical_fragments():
    factory = counting(term_every=4, trunc_at=3)
    assert_identical(collect(factory, Steady(), 123),
                     collect(factory, Steady(), 123))


def test_different_entropies_different_env_streams():
    factory = counting(term_every=4)
    a, b = collect(factory, Steady(), 1), collect(factory, Steady(), 2)
    assert not torch.equal(a[0].state.obs, b[0].state.obs)
    # and the envs of one run differ from each other
    first = a[0].state.obs[0, :, 0].tolist()
    assert len(set(first)) == 3


def test_env_seeds_come_from_the_entropy():
    # CountingEnv offsets its observations by a draw from its reset seed
    batch = collect(counting(), Steady(), 77, n_batches=1)[0]
    expected = []
    for ss in env_seed_sequences(77, 3):
        env = CountingEnv()
        env.reset(seed=int(ss.generate_state(1)[0]))
        expected.append(float(env.offset))
    assert batch.state.obs[0, :, 0].tolist() == expected


def test_factory_receives_the_child_seed():
    seeds = []

    def factory(seed=None):
        seeds.append(seed)
        return CountingEnv()

    collect(factory, Steady(), 5, n_batches=1)
    assert seeds == [int(ss.generate_state(1)[0])
                     for ss in env_seed_sequences(5, 3)]


def test_cartpole_with_a_sampling_actor_is_reproducible():
    factory = functools.partial(gymnasium.make, "CartPole-v1")

    def actor():
        torch.manual_seed(0)
        return PolicyActor(nn.Sequential(nn.Linear(4, 8), nn.Tanh(),
                                         nn.Linear(8, 2)))

    a = collect(factory, actor(), 9, torch_seed=1)
    b = collect(factory, actor(), 9, torch_seed=1)
    assert_identical(a, b)
    c = collect(factory, actor(), 10, torch_seed=1)
    assert not torch.equal(a[0].state.obs, c[0].state.obs)
