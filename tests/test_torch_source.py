"""Torch-native sources and the torch fragment loop, on the CPU.

- :class:`rlplay.envs.TorchCartPole` collected by the torch loop gives,
  field for field, the fragments that the numpy loop gives over
  Gymnasium's own CartPole driven with the same reset states and the same
  (deterministic) actor, in each autoreset mode: next-step (Gymnasium's
  ``CartPoleVectorEnv``, lost calls), same-step and disabled (a
  ``SyncVectorEnv`` of ``CartPoleEnv``).
- Every invariant of the layout over longer runs; no numpy conversion
  during collection (``Tensor.numpy`` and ``Tensor.__array__`` counted).
- Gymnasium's ``NumpyToTorch`` over a native vector env is a torch source
  whose fragments equal those of the env itself.
- A same-step source that ends an episode without its final observation
  is refused; bad counts and sticky are refused (the episode loop takes
  torch sources: test_torch_episodes.py).
- The consumers (episodes, Replay, returns, RunningNorm) and the process
  generators take such fragments.
"""
import functools
import itertools

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from cartpoles import (Balancer, counting, sync_reference, torch_cartpole,
                       vector_reference)
from generators import CountingActor, assert_fragments_equal, without_version
from rlplay.engine import (BaseActorModule, Replay, RunningNorm, acted,
                           episode_stats)
from rlplay.engine.core import episode_edges
from rlplay.engine.envs import TorchSource
from rlplay.engine.nested import suply
from rlplay.engine.returns import gae
from rlplay.engine.rollout import episodic, multi, same, single
from rlplay.engine.seeds import env_seed_sequences, reset_seed, shared_seed
from rlplay.envs import TorchCartPole

from bounds import STEADY, START  # the reasons in bounds.py

T, B = 12, 5
MODES = {"NextStep": vector_reference,
         "SameStep": functools.partial(sync_reference, mode="SameStep"),
         "Disabled": functools.partial(sync_reference, mode="Disabled")}


def fragments(factory, n=4, n_envs=B, **kwargs):
    with same.rollout(factory, Balancer(), T, n_envs, entropy=7,
                      **kwargs) as feed:
        return [suply(torch.clone, b) for b in itertools.islice(feed, n)]


@pytest.mark.parametrize("mode", MODES)
def test_torch_cartpole_equals_gymnasium(mode):
    got = fragments(functools.partial(torch_cartpole, B, mode=mode))
    want = fragments(functools.partial(MODES[mode], B))
    for g, w in zip(got, want):
        assert_fragments_equal(g, w)
    ends = sum(int(episode_edges(f).ends.sum()) for f in got)
    truncations = sum(int(episode_edges(f).truncated.sum()) for f in got)
    assert ends > 5 and truncations > 0
    lost = sum(int((~acted(f)[1:]).sum()) for f in got)
    assert (lost > 0) == (mode == "NextStep")


def check_invariants(frags):
    """Row T is the next row 0; stepno counts from every fin; a lost call
    (not acted) follows an end and holds no reward or statistics; ends
    carry their statistics, final equals obs where no episode ended."""
    previous = None
    for f in frags:
        moved = acted(f)
        fin, stepno = f.state.fin, f.state.stepno
        if previous is not None:
            for field in ("state", "truncated", "final", "stats"):
                suply(lambda x, y: torch.testing.assert_close(
                    x[0], y[-1], rtol=0, atol=0),
                    getattr(f, field), getattr(previous, field))
        previous = f
        assert not moved[0].any()
        assert torch.equal(stepno[1:], torch.where(
            fin[1:], 0, stepno[:-1] + 1))
        lost = ~moved[1:]
        assert torch.equal(lost, lost & fin[1:] & fin[:-1])
        assert not f.state.rew[1:][lost].any()
        ends = episode_edges(f).ends[1:]  # row 0 repeats the last row T
        length, ret = f.stats.length[1:], f.stats.ret[1:]
        assert (length[ends] >= 1).all() and not length[~ends].any()
        assert not ret[~ends].any()
        assert torch.equal(f.final[1:][~ends], f.state.obs[1:][~ends])
        assert not (f.truncated[1:] & ~ends).any()


@pytest.mark.parametrize("mode", MODES)
def test_every_invariant_of_the_layout(mode):
    frags = fragments(functools.partial(torch_cartpole, 16, mode=mode),
                      n=8, n_envs=16)
    check_invariants(frags)
    returns, lengths = np.concatenate(
        [np.stack(episode_stats(f)) for f in frags], axis=1)
    assert len(lengths) > 20
    np.testing.assert_array_equal(returns, lengths)  # a reward of 1


@pytest.mark.parametrize("mode", MODES)
def test_no_numpy_conversion_during_collection(monkeypatch, mode):
    factory = functools.partial(torch_cartpole, B, mode=mode)
    with same.rollout(factory, Balancer(), T, B, entropy=1) as feed:
        next(feed)  # its space checks read one host copy of it
        calls = counting(monkeypatch)
        for batch in itertools.islice(feed, 3):
            pass
        assert calls == []
        assert isinstance(feed.envs, TorchSource)
    monkeypatch.undo()
    with same.rollout(factory, Balancer(), T, B, entropy=1,
                      check_spaces="never", copy=False) as feed:
        calls = counting(monkeypatch)
        for batch in itertools.islice(feed, 3):
            assert batch is feed.buffer.pyt  # delivered as it is
        assert calls == []


# Gymnasium vector envs of CartPole-v1 cut at 10 steps: the native one
# (next-step, lost calls), and SyncVectorEnv in disabled autoreset (a
# partial reset). (NumpyToTorch cannot convert the info of a same-step
# SyncVectorEnv once an episode ended: its final_obs is an array of
# objects, which DLPack refuses.)
NUMPY_SOURCES = {
    "native": dict(vectorization_mode="vector_entry_point"),
    "sync-disabled": dict(vectorization_mode="sync", vector_kwargs=dict(
        autoreset_mode=AutoresetMode.DISABLED))}


def numpy_source(kind):
    return gymnasium.make_vec("CartPole-v1", B, max_episode_steps=10,
                              **NUMPY_SOURCES[kind])


def converted_source(kind):
    from gymnasium.wrappers.vector import NumpyToTorch
    return NumpyToTorch(numpy_source(kind))


@pytest.mark.parametrize("kind", NUMPY_SOURCES)
def test_numpy_to_torch_is_a_torch_source(kind):
    pytest.importorskip("array_api_compat")
    got = fragments(functools.partial(converted_source, kind))
    want = fragments(functools.partial(numpy_source, kind))
    for g, w in zip(got, want):
        assert_fragments_equal(g, w)
    assert sum(int(episode_edges(f).ends.sum()) for f in got) >= B


class Informed(TorchCartPole):
    """Next-step CartPole whose info holds the cart's position where its
    velocity is positive (``info["pos"]``, ``info["_pos"]``)."""

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        return obs, rew, terminated, truncated, {
            "pos": obs[:, 0].double(), "_pos": obs[:, 1] > 0}


def test_env_info_where_present_and_never_at_lost_calls():
    factory = functools.partial(Informed, B, max_episode_steps=6)
    for f in fragments(factory, env_info={"pos": np.zeros((), np.float64),
                                          "absent": np.zeros(2)}):
        moved = acted(f)[1:]
        present = (f.state.obs[1:, :, 1] > 0) & moved
        assert (~moved).any()
        assert torch.equal(f.env_mask["pos"], present)
        assert torch.equal(f.env["pos"], torch.where(
            present, f.state.obs[1:, :, 0].double(), 0))
        assert not f.env_mask["absent"].any() and not f.env["absent"].any()


class NoFinal(TorchCartPole):
    """Same-step autoreset without ``info["final_obs"]``."""

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        return obs, rew, terminated, truncated, {}


def test_a_same_step_source_without_its_final_observation():
    factory = functools.partial(NoFinal, B, max_episode_steps=5,
                                autoreset_mode="same_step")
    with same.rollout(factory, Balancer(), T, B) as feed:
        with pytest.raises(ValueError, match="without their true last"):
            next(feed)
    frags = fragments(factory, n=2, final=False)
    assert frags[0].final is None


def test_bad_counts_and_sticky_are_refused():
    factory = functools.partial(torch_cartpole, 4)
    with pytest.raises(ValueError, match="n_envs=8 columns from a torch"):
        same.rollout(factory, Balancer(), T, 8)
    with pytest.raises(ValueError, match="sticky=True .* a torch-native "
                                         "source"):
        same.rollout(factory, Balancer(), T, 4, sticky=True)
    for mode in ("later", "", 3, None):
        with pytest.raises(ValueError, match=f"autoreset_mode must be one "
                           f"of .*got {mode!r}"):
            TorchCartPole(2, autoreset_mode=mode)
    for mode in ("same_step", "SameStep", "SAME_STEP",
                 AutoresetMode.SAME_STEP):
        assert TorchCartPole(2, autoreset_mode=mode).mode is \
            AutoresetMode.SAME_STEP
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="device='cuda' needs CUDA, "
                           "but torch.cuda.is_available.. is False"):
            TorchCartPole(4, device="cuda")
    with pytest.raises(RuntimeError, match="device='meta' cannot hold the "
                       "env's tensors and generator on this machine: "):
        TorchCartPole(4, device="meta")
    with pytest.raises(TypeError, match="num_envs must be an int"):
        TorchCartPole(2.0)


def test_consumers_take_its_fragments():
    factory = functools.partial(torch_cartpole, B, mode="NextStep")
    frags = fragments(factory, n=6)
    want = fragments(functools.partial(vector_reference, B), n=6)
    # whole episodes, rebuilt across fragments, equal the reference's
    got_eps = list(episodic.episodes(iter(frags), 6, max_length=64))
    want_eps = list(episodic.episodes(iter(want), 6, max_length=64))
    assert len(got_eps) == len(want_eps) >= 1
    for g, w in zip(got_eps, want_eps):
        assert torch.equal(g.obs, w.obs) and torch.equal(g.ret, w.ret)
    replay = Replay(1000, seed=0)
    for f in frags:
        replay.extend(f)
    sample = replay.sample(32, n_step=3, gamma=0.9)
    assert sample.obs.shape == (32, 4)
    f = frags[0]
    value = f.state.obs[..., 0]  # any value, laid out as the rows
    adv = gae(f.state.rew, f.state.fin, f.truncated, value, f.final[..., 0],
              gamma=0.99, lam=0.95, mask=~acted(f))
    assert adv.shape == (T, B) and not adv[~acted(f)[1:]].any()
    norm = RunningNorm((4,))
    norm.update_from(frags[0])
    assert int(norm.count) == int(acted(frags[0])[1:].sum())


def test_single_and_multi_equal_same():
    factory = functools.partial(torch_cartpole, B, mode="SameStep")
    want = fragments(factory, n=3)
    with single.rollout(factory, Balancer(), T, B, entropy=7,
                        start_method="fork", timeout=STEADY,
                        start_timeout=START) as feed:
        got = [suply(torch.clone, b) for b in itertools.islice(feed, 3)]
    for g, w in zip(got, want):
        assert_fragments_equal(without_version(g), without_version(w))
    with multi.rollout(factory, Balancer(), T, 1, B, 2, 1, entropy=7,
                       start_method="fork", timeout=STEADY,
                       start_timeout=START) as feed:
        got = [suply(torch.clone, b) for b in itertools.islice(feed, 3)]
    for g, w in zip(got, want):
        assert_fragments_equal(without_version(g), without_version(w))


class PoleCartPole(TorchCartPole):
    """A torch CartPole whose pole length a call changes (its own method,
    once for all its envs); the length is in the info."""

    def set_length(self, length):
        self.length = length


def test_call_envs_reaches_a_torch_source_between_fragments():
    """``call_envs`` on a torch source: its own method, applied before the
    next fragment, stamped as ``meta.control``; nothing comes back to the
    host while collecting (the torch loop)."""
    made = []

    def factory():
        made.append(PoleCartPole(B))
        return made[-1]

    with same.rollout(factory, Balancer(), T, B, entropy=7) as feed:
        first = next(feed)
        assert feed.call_envs("set_length", 0.25) == 1
        second = next(feed)
    assert made[-1].length == 0.25
    assert torch.all(first.meta.control == 0)
    assert torch.all(second.meta.control == 1)
    assert torch.all(second.meta.agent == 0)


# -------------------------------------------- one seed for all its envs --

class Torchify(gymnasium.vector.VectorWrapper):
    """A numpy vector env as a torch source on the CPU (its ``device``
    says so): its outputs as tensors, the actions back to numpy, no info;
    what Gymnasium's ``NumpyToTorch`` does, without ``array_api_compat``."""

    device = torch.device("cpu")

    def reset(self, *, seed=None, options=None):
        obs, _ = self.env.reset(seed=seed, options=options)
        return torch.as_tensor(obs), {}

    def step(self, actions):
        obs, rew, terminated, truncated, _ = self.env.step(actions.numpy())
        return (torch.as_tensor(obs), torch.as_tensor(rew),
                torch.as_tensor(terminated), torch.as_tensor(truncated), {})


def _logs_seed(cls):
    """``cls`` (a vector env taking one seed for all its envs) that logs
    each reset's seed into ``log`` and refuses, as ALE's
    ``AtariVectorEnv``, a seed whose envs' seeds ``seed + j`` leave
    int32."""

    class Logged(cls):
        def __init__(self, *args, log, **kwargs):
            super().__init__(*args, **kwargs)
            self.log = log

        def reset(self, *, seed=None, options=None):
            if seed is not None and seed + self.num_envs > 2**31:
                raise TypeError(f"reset(): incompatible seed {seed}")
            self.log.append(seed)
            return super().reset(seed=seed, options=options)

    Logged.__name__ = f"Logged{cls.__name__}"
    return Logged


def test_a_torch_source_taking_one_seed_gets_the_numpy_sources_seed():
    """A source that seeds all its envs from one seed gets the first
    column's seed reduced modulo ``2**31 - num_envs``, torch or numpy
    alike (a larger one overflows ALE's int32 seeds): the same seed for
    the same entropy, whatever the kind of source."""
    from envs import LateVectorEnv
    torch_kind, numpy_kind = _logs_seed(TorchCartPole), \
        _logs_seed(LateVectorEnv)
    raw, seen = [], {"torch": [], "numpy": []}

    def factory(kind, seed):
        if kind == "torch":
            raw.append(seed)  # the first column's seed, as it is
            return torch_kind(3, log=seen[kind])
        return numpy_kind(3, log=seen[kind])

    actors = {"torch": Balancer(), "numpy": CountingActor()}
    for entropy in range(8):
        for kind in seen:
            with same.rollout(functools.partial(factory, kind),
                              actors[kind], 2, 3, entropy=entropy) as feed:
                next(feed)
    assert max(raw) >= 2**31 - 3  # unreduced, half of them overflow
    assert seen["torch"] == seen["numpy"] == [
        shared_seed(seed, 3) for seed in raw]


def one_seed_cartpole(wrapped):
    env = gymnasium.make_vec("CartPole-v1", B, max_episode_steps=10,
                             vectorization_mode="vector_entry_point")
    return Torchify(env) if wrapped else env


def past_int32(n_envs):
    """The first entropy whose first column's reset seed (collector 0) is
    at least ``2**31``."""
    return next(e for e in range(64) if reset_seed(
        env_seed_sequences(e, n_envs, 0)[0]) >= 2**31)


def collected(factory, actor, n_steps, n_envs, entropy, n):
    with same.rollout(factory, actor, n_steps, n_envs,
                      entropy=entropy) as feed:
        return [suply(torch.clone, b) for b in itertools.islice(feed, n)]


def test_a_wrapped_native_env_gives_the_data_of_the_env_itself():
    """Over an entropy whose first seed is past ``2**31``, a native
    vector env converted to torch gives the fragments of the env itself."""
    got, want = (collected(functools.partial(one_seed_cartpole, wrapped),
                           Balancer(), T, B, past_int32(B), 3)
                 for wrapped in (True, False))
    for g, w in zip(got, want):
        assert_fragments_equal(g, w)


def ale_pong(wrapped):
    ale_py = pytest.importorskip("ale_py")
    gymnasium.register_envs(ale_py)
    env = gymnasium.make_vec("ALE/Pong-v5", 2,
                             vectorization_mode="vector_entry_point")
    return Torchify(env) if wrapped else env


class PongActor(BaseActorModule):
    """Action ``stepno % 6`` of Pong's six."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return stepno % 6, (), {}

    def reset(self, hx, at):
        return ()


def test_ales_vector_env_as_a_torch_source_resets_for_every_entropy():
    """ALE's ``AtariVectorEnv`` converted to torch: no ``TypeError`` in its
    ``reset`` where the first seed is past ``2**31`` (about half the
    entropies), and the data of the env itself."""
    got, want = (collected(functools.partial(ale_pong, wrapped),
                           PongActor(), 4, 2, past_int32(2), 1)
                 for wrapped in (True, False))
    assert_fragments_equal(got[0], want[0])
