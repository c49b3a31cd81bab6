"""Brax's inverted pendulum for the tests of :class:`rlplay.envs.Brax`
(its ``spring`` pipeline: the quickest of Brax's to compile on a CPU),
and its reference: a plain loop over one Brax env at a time, stepped by
Brax's own compiled ``step`` with the keys that :class:`~rlplay.envs.Brax`
documents, as a Gymnasium ``SyncVectorEnv`` under ``TimeLimit`` in
same-step autoreset (Gymnasium's time limit, not the adapter's).

Importing it needs JAX and Brax: a test module imports it after
``pytest.importorskip("brax")``.
"""
import functools

import gymnasium
import jax
import numpy as np
import torch
from brax import envs as brax_envs
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import TimeLimit

from rlplay.engine import BaseActorModule
from rlplay.envs import Brax, JaxSource

B, LIMIT = 5, 15
BACKEND = "spring"


@functools.lru_cache(maxsize=None)
def pendulum(backend=BACKEND):
    """One Brax env object a backend: its compilations are shared."""
    return brax_envs.get_environment("inverted_pendulum", backend=backend)


@functools.lru_cache(maxsize=None)
def brax_pendulum_env(n_envs=B, limit=LIMIT, backend=BACKEND):
    return Brax(pendulum(backend), num_envs=n_envs, episode_length=limit)


def brax_pendulum(n_envs=B, limit=LIMIT, backend=BACKEND):
    """The factory of the tests (module level: spawned workers import
    it)."""
    return JaxSource(brax_pendulum_env(n_envs, limit, backend))


class Nudger(BaseActorModule):
    """A deterministic actor for the pendulum: the even columns push right
    at full force (their poles fall within a few steps: terminations),
    the odd ones push against the pole's lean (they reach the time limit);
    ``info``: the sum of the observation."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(1.0))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        lean = obs[..., 1] + 0.5 * obs[..., 3]
        act = torch.clamp(2.0 * lean * self.w, -1.0, 1.0).unsqueeze(-1)
        act = act.clone()
        act[:, ::2] = 1.0
        return act.detach(), hx, {"sum": obs.sum(-1)}


class Keys:
    """The per-env keys of a :class:`~rlplay.envs.JaxSource` over
    :class:`~rlplay.envs.Brax`: ``start(seed)`` at a full reset, ``advance()``
    at every later call (a step, a masked reset); ``block[j]`` is env
    ``j``'s key of the call."""

    def __init__(self, n):
        self.n, self.key, self.block = n, None, None

    def start(self, seed):
        self.key = jax.random.key(int(seed))
        self.advance()

    def advance(self):
        self.key, sub = jax.random.split(self.key)
        self.block = jax.random.split(sub, self.n)


class BraxOne(gymnasium.Env):
    """Column ``j`` of the reference: Brax's own ``reset`` and ``step``
    (compiled once for every column), reset with the key of
    ``keys.block[j]``."""

    def __init__(self, keys, j, backend=BACKEND):
        env = pendulum(backend)
        self.keys, self.j = keys, j
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (4,),
                                                      np.float32)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._reset, self._step = _compiled(env)
        self.state = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self._reset(self.keys.block[self.j])
        return np.asarray(self.state.obs), {}

    def step(self, action):
        state = self.state.replace(done=jax.numpy.zeros_like(self.state.done))
        self.state = self._step(state, np.asarray(action, np.float32))
        return (np.asarray(self.state.obs), float(self.state.reward),
                bool(self.state.done), False, {})


@functools.lru_cache(maxsize=None)
def _compiled(env):
    return jax.jit(env.reset), jax.jit(env.step)


class BraxLoop(SyncVectorEnv):
    """The reference: :class:`BraxOne` columns under ``TimeLimit``, in
    same-step autoreset, drawing the keys of the source."""

    def __init__(self, n_envs=B, limit=LIMIT, backend=BACKEND):
        keys = Keys(n_envs)
        super().__init__([functools.partial(
            lambda j: TimeLimit(BraxOne(keys, j, backend), limit), j)
            for j in range(n_envs)], autoreset_mode=AutoresetMode.SAME_STEP)
        self.keys = keys

    def reset(self, *, seed=None, options=None):
        if options and "reset_mask" in options:
            self.keys.advance()
        else:
            self.keys.start(seed[0] if isinstance(seed, list) else seed)
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        self.keys.advance()
        return super().step(actions)


def brax_reference(n_envs=B, limit=LIMIT, backend=BACKEND):
    return BraxLoop(n_envs, limit, backend)
