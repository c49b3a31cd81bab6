"""CartPole, batched in torch: Gymnasium's ``CartPoleVectorEnv`` (the
equations, constants, spaces, termination and time limit of
``CartPole-v1``) stepped with torch operations on any device.

The dynamics run in float64, as Gymnasium's (a numpy float64 state); the
observations are that state rounded to float32. What differs is where
the reset states come from: a ``torch.Generator`` of the env's own on its
device (seeded by ``reset(seed=...)``), drawn in blocks of ``(4,
num_envs)`` uniform values in ``[-0.05, 0.05)`` (``low + (high - low) *
u``), one block at each full reset and one at every step, whatever
ended: the stream does not depend on what happened, so no step reads the
device back to the host. An env that ends takes its column of the
step's block.

Autoreset modes (``autoreset_mode=``, Gymnasium's ``AutoresetMode``):

- ``NEXT_STEP`` (the default, as Gymnasium's): an ended env's
  observation is its true last one; its next step ignores the action,
  resets it (reward 0, flags false);
- ``SAME_STEP``: an ended env is reset within the step; its true last
  observation is in ``info["final_obs"]`` (a dense ``(num_envs, 4)``
  tensor) where ``info["_final_obs"]`` holds;
- ``DISABLED``: nothing is reset until ``reset(options={"reset_mask":
  mask})`` (a bool tensor, array or list of ``num_envs``) resets the
  envs of ``mask`` (to their column of the last step's block).

Actions are not checked (a check reads them on the host): 1 pushes
right, anything else left.

Examples
--------
>>> import torch
>>> env = TorchCartPole(3)
>>> obs, info = env.reset(seed=0)
>>> tuple(obs.shape), obs.dtype
((3, 4), torch.float32)
>>> obs, rew, terminated, truncated, info = env.step(torch.ones(3, dtype=torch.int64))
>>> rew.tolist(), terminated.tolist()
([1.0, 1.0, 1.0], [False, False, False])
"""
import math
import numbers

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

__all__ = ["TorchCartPole"]


def _autoreset_mode(value):
    """``value`` (an ``AutoresetMode``, its value ``"NextStep"`` or its
    name in any case, ``"next_step"``) as an ``AutoresetMode``."""
    try:
        if isinstance(value, str) and \
                value.upper() in AutoresetMode.__members__:
            return AutoresetMode[value.upper()]
        return AutoresetMode(value)
    except ValueError:
        raise ValueError(f"autoreset_mode must be one of "
                         f"{[m.value for m in AutoresetMode]} (or "
                         f"{[m.name.lower() for m in AutoresetMode]}), got "
                         f"{value!r}") from None


def _check_present(device):
    """Refuse a ``device`` that this machine does not have (or where a
    ``torch.Generator`` cannot live: ``'meta'``), up front: torch would
    fail at the first tensor made there, a CUDA device without CUDA with
    an ``AssertionError``."""
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={str(device)!r} needs CUDA, but "
                           f"torch.cuda.is_available() is False (torch "
                           f"{torch.__version__})")
    try:  # the env's tensors, and its generator of reset states
        torch.empty(0, device=device)
        torch.Generator(device=device)
    except (RuntimeError, AssertionError) as exc:
        # torch's first sentence (the rest lists every backend)
        first = str(exc).strip().splitlines()[0].split(". ")[0] \
            if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"device={str(device)!r} cannot hold the env's "
                           f"tensors and generator on this machine: "
                           f"{first}") from None


class TorchCartPole(VectorEnv):
    """``num_envs`` CartPoles stepped together in torch (see the module
    docstring).

    Parameters
    ----------
    num_envs : int
        At least 1.
    device : torch.device or str
        Where the state and every output live.
    max_episode_steps : int
        The time limit (truncation), 500 as ``CartPole-v1``'s.
    autoreset_mode : AutoresetMode or str
        ``NEXT_STEP`` (the default), ``SAME_STEP`` or ``DISABLED`` (also
        as ``"next_step"``, ``"same_step"``, ``"disabled"``).

    Raises
    ------
    TypeError, ValueError
        A bad argument, naming it and what was given.
    RuntimeError
        A device that this machine does not have (CUDA without CUDA).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs=1, *, device="cpu", max_episode_steps=500,
                 autoreset_mode=AutoresetMode.NEXT_STEP):
        for name, value in (("num_envs", num_envs),
                            ("max_episode_steps", max_episode_steps)):
            if isinstance(value, bool) or not isinstance(value,
                                                         numbers.Integral):
                raise TypeError(f"{name} must be an int, got "
                                f"{type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        mode = _autoreset_mode(autoreset_mode)
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device must be a torch device, got "
                             f"{device!r}") from None
        _check_present(self.device)
        self.num_envs = int(num_envs)
        self.max_episode_steps = int(max_episode_steps)
        self.metadata = {**self.metadata, "autoreset_mode": mode}
        self.mode = mode
        # Gymnasium's CartPole constants
        self.gravity, self.masscart, self.masspole = 9.8, 1.0, 0.1
        self.total_mass = self.masspole + self.masscart
        self.length = 0.5  # half the pole's length
        self.polemass_length = self.masspole * self.length
        self.force_mag, self.tau = 10.0, 0.02
        self.theta_threshold_radians = 12 * 2 * math.pi / 360
        self.x_threshold = 2.4
        self.low, self.high = -0.05, 0.05
        high = np.array([self.x_threshold * 2, np.inf,
                         self.theta_threshold_radians * 2, np.inf],
                        dtype=np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.action_space = batch_space(self.single_action_space,
                                        self.num_envs)
        self.single_observation_space = spaces.Box(-high, high,
                                                   dtype=np.float32)
        self.observation_space = batch_space(self.single_observation_space,
                                             self.num_envs)
        self._push = torch.tensor([-self.force_mag, self.force_mag],
                                  dtype=torch.float64, device=self.device)
        self._generator = torch.Generator(device=self.device)
        self._generator.seed()
        self.state = self._block = None
        self.steps = torch.zeros(self.num_envs, dtype=torch.int64,
                                 device=self.device)
        self.prev_done = torch.zeros(self.num_envs, dtype=torch.bool,
                                     device=self.device)

    def _draw(self):
        """The next block of reset states, ``(4, num_envs)`` float64."""
        u = torch.rand((4, self.num_envs), generator=self._generator,
                       dtype=torch.float64, device=self.device)
        self._block = self.low + (self.high - self.low) * u
        return self._block

    def _obs(self):
        return self.state.T.to(torch.float32)

    def reset(self, *, seed=None, options=None):
        """Reset every env (seeding the generator with ``seed``, an int or
        the first of a list), or with ``options={"reset_mask": mask}``
        those of ``mask``; returns ``(obs, {})``."""
        mask = None if not options else options.get("reset_mask")
        if mask is not None and self.state is not None:
            mask = torch.as_tensor(mask, dtype=torch.bool,
                                   device=self.device)
            if mask.shape != (self.num_envs,):
                raise ValueError(f"reset_mask must have shape "
                                 f"({self.num_envs},), got "
                                 f"{tuple(mask.shape)}")
            self.state = torch.where(mask, self._block, self.state)
            self.steps.masked_fill_(mask, 0)
            self.prev_done &= ~mask
            return self._obs(), {}
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        if seed is not None:
            self._generator.manual_seed(int(seed))
        self.state = self._draw().clone()
        self.steps.zero_()
        self.prev_done.zero_()
        return self._obs(), {}

    def step(self, action):
        """Gymnasium's ``CartPoleVectorEnv.step``, in torch (see the module
        docstring): ``(obs, reward, terminated, truncated, info)``."""
        if self.state is None:
            raise RuntimeError("call reset() before step()")
        action = torch.as_tensor(action, device=self.device)
        x, x_dot, theta, theta_dot = self.state
        force = self._push[(action == 1).long()]
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        # Gymnasium's equations, in its order of operations
        temp = (force + self.polemass_length * torch.square(theta_dot)
                * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole
                           * torch.square(costheta) / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta \
            / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        state = torch.stack((x, x_dot, theta, theta_dot))
        terminated = (x < -self.x_threshold) | (x > self.x_threshold) | (
            theta < -self.theta_threshold_radians) | (
            theta > self.theta_threshold_radians)
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        reward = torch.ones(self.num_envs, dtype=torch.float32,
                            device=self.device)
        block, info = self._draw(), {}
        if self.mode is AutoresetMode.NEXT_STEP:
            # the envs that ended last step are reset now, the action lost
            done = self.prev_done
            state = torch.where(done, block, state)
            self.steps.masked_fill_(done, 0)
            reward.masked_fill_(done, 0.0)
            terminated &= ~done
            truncated &= ~done
            self.prev_done = terminated | truncated
        elif self.mode is AutoresetMode.SAME_STEP:
            ended = terminated | truncated
            info = {"final_obs": state.T.to(torch.float32),
                    "_final_obs": ended}
            state = torch.where(ended, block, state)
            self.steps.masked_fill_(ended, 0)
        self.state = state
        return self._obs(), reward, terminated, truncated, info

    def close(self, **kwargs):
        self.state = None
