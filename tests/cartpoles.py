"""Gymnasium's CartPole driven with the reset states of
:class:`rlplay.envs.TorchCartPole`, the references of the torch loop's
tests, and a deterministic actor for them.

``TorchCartPole`` draws its reset states from a torch generator (one
``(4, num_envs)`` block at each full reset and at every step); Gymnasium's
envs draw theirs from numpy. An :class:`Oracle` draws the same blocks from
a torch generator seeded as the torch env is, and Gymnasium's envs take
their reset states from it (their ``np_random``): everything else
(dynamics, termination, time limit, autoreset) is Gymnasium's own code.

- :func:`vector_reference`: Gymnasium's ``CartPoleVectorEnv`` (next-step
  autoreset, no partial reset: lost calls);
- :func:`sync_reference`: a ``SyncVectorEnv`` of ``CartPoleEnv`` under a
  ``TimeLimit``, in same-step or disabled autoreset;
- :func:`counting`: a count of the tensors converted to numpy, for the
  tests that a torch loop converts none.
"""
import functools

import torch
from gymnasium.envs.classic_control.cartpole import (CartPoleEnv,
                                                     CartPoleVectorEnv)
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import TimeLimit

from rlplay.engine import BaseActorModule
from rlplay.envs import TorchCartPole

__all__ = ["Oracle", "vector_reference", "sync_reference", "torch_cartpole",
           "Balancer", "counting"]


class Oracle:
    """The blocks of reset states of a ``TorchCartPole`` of ``n`` envs, as
    numpy ``(4, n)`` arrays."""

    def __init__(self, n):
        self.n, self.generator, self.block = n, torch.Generator(), None

    def start(self, seed):
        self.generator.manual_seed(int(seed))
        return self.advance()

    def advance(self):
        u = torch.rand((4, self.n), generator=self.generator,
                       dtype=torch.float64)
        self.block = (-0.05 + (0.05 - -0.05) * u).numpy()
        return self.block


class _VectorRandom:
    # CartPoleVectorEnv draws once at reset (all envs) and once per step
    # (the envs that ended the step before)
    def __init__(self, env):
        self.env = env

    def uniform(self, low, high, size):
        env = self.env
        if env.fresh:
            env.fresh = False
            return env.oracle.block
        return env.oracle.advance()[:, env.prev_done]


class OracleVectorEnv(CartPoleVectorEnv):
    def __init__(self, num_envs, max_episode_steps):
        super().__init__(num_envs, max_episode_steps=max_episode_steps)
        self.oracle, self.fresh = Oracle(num_envs), False

    @property
    def np_random(self):
        return _VectorRandom(self)

    def reset(self, *, seed=None, options=None):
        self.oracle.start(seed)
        self.fresh = True
        return super().reset(seed=seed, options=options)


class _EnvRandom:
    def __init__(self, oracle, j):
        self.oracle, self.j = oracle, j

    def uniform(self, low, high, size):
        return self.oracle.block[:, self.j].copy()


class OracleCartPole(CartPoleEnv):
    def __init__(self, oracle, j):
        super().__init__()
        self._random = _EnvRandom(oracle, j)

    @property
    def np_random(self):
        return self._random


class OracleSync(SyncVectorEnv):
    """A ``SyncVectorEnv`` of :class:`OracleCartPole`: a step draws the
    next block, a full reset starts the oracle (a partial one draws
    none). ``oracle`` draws the blocks (an :class:`Oracle` by default: any
    object with its ``start``, ``advance`` and ``block``)."""

    def __init__(self, num_envs, max_episode_steps, mode, oracle=None):
        oracle = Oracle(num_envs) if oracle is None else oracle
        super().__init__([functools.partial(
            lambda j: TimeLimit(OracleCartPole(oracle, j), max_episode_steps),
            j) for j in range(num_envs)], autoreset_mode=mode)
        self.oracle = oracle

    def reset(self, *, seed=None, options=None):
        if not (options and "reset_mask" in options):
            self.oracle.start(seed[0] if isinstance(seed, list) else seed)
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        self.oracle.advance()
        return super().step(actions)


def vector_reference(num_envs, max_episode_steps=15):
    return OracleVectorEnv(num_envs, max_episode_steps)


def sync_reference(num_envs, max_episode_steps=15, mode="SameStep"):
    return OracleSync(num_envs, max_episode_steps, AutoresetMode(mode))


def torch_cartpole(num_envs, max_episode_steps=15, mode="NextStep",
                   device="cpu"):
    return TorchCartPole(num_envs, device=device,
                         max_episode_steps=max_episode_steps,
                         autoreset_mode=mode)


class Balancer(BaseActorModule):
    """A deterministic recurrent actor for CartPole, on any device: push
    against the pole's fall, the other way every fifth step of an episode;
    ``hx`` (``(B,)`` float32) counts the steps since the last reset;
    ``info``: the sum of the observation and ``hx``."""

    hx_dim = 0

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(1.0))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if hx is None:
            hx = torch.zeros(obs.shape[1], device=obs.device)
        hx = hx + 1
        push = (obs[..., 2] + 0.5 * obs[..., 3]) * self.w > 0
        act = (push ^ (stepno % 5 == 4)).long()
        return act, hx, {"sum": obs.sum(-1), "hx": hx.unsqueeze(0)}


def counting(monkeypatch):
    """The list that every later conversion of a tensor to numpy
    (``Tensor.numpy``, ``Tensor.__array__``) appends its name to."""
    calls = []
    for name in ("numpy", "__array__"):
        method = getattr(torch.Tensor, name)

        def counted(self, *args, method=method, name=name, **kwargs):
            calls.append(name)
            return method(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls
