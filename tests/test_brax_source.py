"""Brax envs as JAX sources (:class:`rlplay.envs.Brax` behind
:class:`~rlplay.envs.JaxSource`), on JAX's CPU; skipped where Brax is
absent. The consumers, the ``Evaluator`` and the no-host-transfer check
over Brax are parametrised with gymnax's in test_jax_source.py.

- Fragments of Brax's inverted pendulum collected by ``same.rollout``
  equal, leaf for leaf, those of a plain loop over one Brax env at a
  time (Brax's own compiled ``reset`` and ``step``, the keys the adapter
  documents, Gymnasium's ``TimeLimit``): observations, true last
  observations at terminations and at time limits, rewards, ends,
  truncations, step counts, statistics; with the ``spring`` pipeline and
  with MuJoCo's MJX (``backend="mjx"``).
- Brax's own ``EpisodeWrapper`` and ``AutoResetWrapper`` over the same
  env, stepped with the same actions, give the same rewards, ``done``
  (ends) and ``info["truncation"]`` (truncations) through each env's
  first episode, with ``action_repeat`` 2 (after it Brax restarts an env
  from its first state, the adapter from a fresh reset).
- ``call_envs("set_params", episode_length=...)`` sets the time limit;
  observations that are dicts come as dicts.
- HalfCheetah: what agrees with Gymnasium's HalfCheetah-v5 exactly (the
  spaces, the time of a step, the time limit at 1,000 steps, the reward
  as its forward and control terms).
"""
import itertools
import math

import numpy as np
import pytest
import torch

pytest.importorskip("brax")
jax = pytest.importorskip("jax")

import gymnasium  # noqa: E402
from brax import envs as brax_envs  # noqa: E402
from brax.envs.wrappers import training  # noqa: E402

from brax_envs import (B, LIMIT, Nudger, brax_pendulum,  # noqa: E402
                       brax_pendulum_env, brax_reference)
from generators import assert_fragments_equal  # noqa: E402
from rlplay.engine import BaseActorModule  # noqa: E402
from rlplay.engine.nested import suply  # noqa: E402
from rlplay.engine.rollout import same  # noqa: E402
from rlplay.envs import Brax, JaxSource  # noqa: E402

T = 12


def fragments(factory, n=3, n_envs=B, actor=None, **kwargs):
    with same.rollout(factory, actor or Nudger(), T, n_envs, entropy=7,
                      **kwargs) as feed:
        return [suply(torch.clone, b) for b in itertools.islice(feed, n)]


@pytest.mark.parametrize("backend", ["spring", "mjx"])
def test_fragments_equal_a_plain_brax_loop(backend):
    got = fragments(lambda: brax_pendulum(backend=backend))
    want = fragments(lambda: brax_reference(backend=backend))
    for g, w in zip(got, want):
        assert_fragments_equal(g, w)
    fin = torch.cat([f.state.fin[1:] for f in got])
    truncated = torch.cat([f.truncated[1:] for f in got])
    final = torch.cat([f.final[1:] for f in got])
    obs = torch.cat([f.state.obs[1:] for f in got])
    length = torch.cat([f.stats.length[1:] for f in got])
    terminated = fin & ~truncated
    assert terminated.any() and truncated.any()
    # a termination: the pole's angle past 0.2 rad in the last observation
    assert (final[terminated][:, 1].abs() > 0.2).all()
    # a time limit: LIMIT steps, the pole still up
    assert (length[truncated] == LIMIT).all()
    assert (final[truncated][:, 1].abs() <= 0.2).all()
    # the next observation is the reset one, not the last
    assert (final[fin] != obs[fin]).any(-1).all()
    assert torch.equal(final[~fin], obs[~fin])


def test_brax_wrappers_agree_through_the_first_episode():
    """``done`` and ``info["truncation"]`` of Brax's ``EpisodeWrapper``
    are the adapter's ends and truncations, its rewards the same sums
    over ``action_repeat`` steps, its observations the same until an
    env's first end (where ``AutoResetWrapper`` writes the first state of
    the env over the last one, which the adapter keeps)."""
    env = brax_envs.get_environment("inverted_pendulum", backend="spring")
    n, length, repeat = 4, 7, 2
    ours = Brax(env, num_envs=n, episode_length=length, action_repeat=repeat)
    theirs = training.wrap(env, episode_length=length, action_repeat=repeat)
    key = jax.random.PRNGKey(0)  # raw: EpisodeWrapper reads its shape
    state, obs = jax.jit(ours.reset)(key, ours.params)
    brax_state = jax.jit(theirs.reset)(jax.random.split(key, n))
    np.testing.assert_array_equal(obs, brax_state.obs)
    action = jax.numpy.array([[1.0], [0.0], [1.0], [-0.1]])
    step, brax_step = jax.jit(ours.step), jax.jit(theirs.step)
    ended = np.zeros(n, bool)
    steps = 0
    while not ended.all():
        out = step(jax.random.key(steps), state, action, ours.params)
        brax_state = brax_step(brax_state, action)
        steps += 1
        live = ~ended
        done = np.asarray(brax_state.done) != 0
        brax_truncated = np.asarray(brax_state.info["truncation"]) != 0
        end = np.asarray(out.terminated | out.truncated)
        np.testing.assert_array_equal(end[live], done[live])
        np.testing.assert_array_equal(np.asarray(out.truncated)[live],
                                      brax_truncated[live])
        np.testing.assert_array_equal(np.asarray(out.reward)[live],
                                      np.asarray(brax_state.reward)[live])
        going = live & ~done
        np.testing.assert_array_equal(np.asarray(out.obs)[going],
                                      np.asarray(brax_state.obs)[going])
        ended |= end
        state = out.state
    # the time limit counts steps of the env: ceil(7 / 2) steps here
    assert steps == math.ceil(length / repeat)


def test_call_envs_sets_the_time_limit():
    with same.rollout(brax_pendulum, Nudger(), T, B, entropy=3) as feed:
        first = suply(torch.clone, next(feed))
        assert feed.call_envs("set_params", episode_length=4) == 1
        second = suply(torch.clone, next(feed))
        third = suply(torch.clone, next(feed))
    assert not first.truncated.any()
    assert torch.all(second.meta.control == 1)
    # the envs 4 steps or more into their episodes truncate at their
    # first step, then every 4 steps, before any pole falls
    ends = second.truncated[1:]
    assert (second.stats.length[1][ends[0]] >= 4).all()
    assert (second.stats.length[2:][ends[1:]] == 4).all()
    assert torch.equal(third.state.fin, third.truncated)
    assert (third.stats.length[1:][third.truncated[1:]] == 4).all()
    assert third.truncated[1:].sum() >= 2 * B


def test_bad_arguments():
    env = brax_envs.get_environment("inverted_pendulum", backend="spring")
    with pytest.raises(TypeError, match="without Brax's VmapWrapper"):
        Brax(training.wrap(env, episode_length=10))
    with pytest.raises(TypeError, match="AutoResetWrapper"):
        Brax(training.AutoResetWrapper(env))
    with pytest.raises(ValueError, match="backend='mjx' differs"):
        Brax(env, backend="mjx")
    with pytest.raises(TypeError, match="make an env by name"):
        Brax(env, n_frames=3)
    with pytest.raises(TypeError, match="must be a Brax Env"):
        Brax(object())
    with pytest.raises(ValueError, match="episode_length must be at least"):
        Brax(env, episode_length=0)
    with pytest.raises(TypeError, match="action_repeat must be an int"):
        Brax(env, action_repeat=1.5)
    assert brax_pendulum_env().backend == "spring"


class Push(BaseActorModule):
    """Every env pushed with +1."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return torch.ones(stepno.shape + (1,)), hx, {}


def test_dict_observations():
    """Brax's ``fast`` test env with observations as a dict: their
    fragments are dicts of ``(1 + T, B, ...)`` tensors, the true last
    ones at each time limit (the point's position and speed after 5
    pushes, by Brax's equations: the speed grows by dt = 0.02 a push,
    the position by the speed times dt)."""
    env = brax_envs.get_environment("fast", obs_mode="dict_state")
    source = Brax(env, num_envs=3, episode_length=5)
    assert source.single_observation_space == gymnasium.spaces.Dict(
        {"state": gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)})
    frag, = fragments(lambda: JaxSource(source), n=1, n_envs=3,
                      actor=Push())
    obs, final = frag.state.obs["state"], frag.final["state"]
    assert obs.shape == final.shape == (T + 1, 3, 2)
    ends = torch.zeros(T + 1, dtype=bool)
    ends[[5, 10]] = True
    assert torch.equal(frag.truncated, ends[:, None].expand(T + 1, 3))
    speed, position = np.float32(0), np.float32(0)
    for _ in range(5):
        speed = speed + np.float32(0.02)
        position = position + speed * np.float32(0.02)
    for t in (5, 10):
        np.testing.assert_allclose(final[t].numpy(),
                                   [[position, speed]] * 3, rtol=1e-6)
        assert (obs[t] == 0).all()  # Brax's reset of the env
        # the reward is the position the step reached
        np.testing.assert_allclose(frag.state.rew[t].numpy(), position,
                                   rtol=1e-6)


# ------------------------------------------------------------ HalfCheetah --

CHEETAH_BACKEND = "generalized"  # the quicker of the two MuJoCo-like ones


def test_halfcheetah_agrees_with_gymnasiums_where_exact():
    """Brax's halfcheetah behind the adapter and Gymnasium's
    HalfCheetah-v5: the same spaces (17 observations: the positions but
    the first, then the velocities; 6 actions in [-1, 1]), the same time
    of a step (5 steps of 0.01 s, within float32), the same time limit
    (1,000 steps, a truncation, never a termination), and a reward that
    is Gymnasium's, ``(x_after - x_before) / dt - 0.1 * sum(action**2)``,
    recomputed from the states at every step (within float32 rounding:
    Brax computes it in float32)."""
    env = brax_envs.get_environment("halfcheetah", backend=CHEETAH_BACKEND)
    reference = gymnasium.make("HalfCheetah-v5")
    cheetah = Brax(env, num_envs=2)
    source = JaxSource(cheetah)
    assert source.single_observation_space.shape == \
        reference.observation_space.shape == (17,)
    assert source.single_action_space == reference.action_space
    assert env.dt.dtype == np.float32
    np.testing.assert_allclose(env.dt, reference.unwrapped.dt, rtol=1e-7)
    assert int(cheetah.params.episode_length) == \
        reference.spec.max_episode_steps == 1000

    reset, step = jax.jit(cheetah.reset), jax.jit(cheetah.step)
    state, _ = reset(jax.random.key(1), cheetah.params)
    phase = np.arange(6, dtype=np.float32)
    for t in range(1000):
        action = np.stack([np.sin(0.3 * t + phase),
                           np.cos(0.2 * t + phase)]).astype(np.float32)
        x_before = np.asarray(state[0].pipeline_state.x.pos[:, 0, 0])
        out = step(jax.random.key(t), state, jax.numpy.asarray(action),
                   cheetah.params)
        assert not np.asarray(out.terminated).any()
        if t < 999:
            assert not np.asarray(out.truncated).any()
            x_after = np.asarray(out.state[0].pipeline_state.x.pos[:, 0, 0])
            np.testing.assert_allclose(
                np.asarray(out.reward),
                (x_after - x_before) / np.float32(env.dt)
                - 0.1 * np.square(action).sum(-1), rtol=1e-4, atol=1e-5)
        state = out.state
    assert np.asarray(out.truncated).all()
    assert (np.asarray(state[1]) == 0).all()  # reset: a new episode
