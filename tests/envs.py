"""Tiny deterministic envs whose fragments have exact, predictable values.

They live in an importable module (not conftest) so that worker processes
started with spawn or forkserver can unpickle them by reference.
"""
import os
import signal

import gymnasium
import numpy as np
from gymnasium import spaces


class CountingEnv(gymnasium.Env):
    """Observation = steps since reset + 100 * episode index + offset.

    The reward is the action (Discrete(5)); the episode terminates after
    ``term_every`` steps or is truncated at ``trunc_at`` steps, whichever
    comes first (None: never). ``info`` holds ``t`` (steps) on every step
    and ``done`` only at the end of an episode.
    """

    def __init__(self, term_every=None, trunc_at=None, offset=0.0):
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,),
                                            np.float32)
        self.action_space = spaces.Discrete(5)
        self.term_every, self.trunc_at, self.offset = (
            term_every, trunc_at, offset)
        self.n_episodes, self.t = -1, 0

    def _obs(self):
        return np.array([self.t + 100 * self.n_episodes + self.offset],
                        np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.offset = float(self.np_random.integers(1000)) * 1000
        self.n_episodes += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        terminated = (self.term_every is not None
                      and self.t % self.term_every == 0)
        truncated = self.trunc_at is not None and self.t >= self.trunc_at
        info = {"t": self.t}
        if terminated or truncated:
            info["done"] = 1.0
        return self._obs(), float(action), terminated, truncated, info


class StructuredEnv(gymnasium.Env):
    """Dict observations and Tuple actions, deterministic.

    obs = {"pos": [t, -t] float32, "flag": t % 2 (Discrete(2)),
           "pair": (MultiDiscrete([3, 4]) = [t % 3, t % 4],
                    MultiBinary(3) = bits of t)}
    act = (Discrete(3), Box(-1, 1, (2,))); reward = a0 + sum(a1).
    Terminates every 4 steps.
    """

    def __init__(self, term_every=4):
        self.observation_space = spaces.Dict({
            "pos": spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "flag": spaces.Discrete(2),
            "pair": spaces.Tuple((spaces.MultiDiscrete([3, 4]),
                                  spaces.MultiBinary(3))),
        })
        self.action_space = spaces.Tuple((
            spaces.Discrete(3), spaces.Box(-1.0, 1.0, (2,), np.float32)))
        self.term_every, self.t = term_every, 0

    def _obs(self):
        t = self.t
        return {"pos": np.array([t, -t], np.float32), "flag": t % 2,
                "pair": (np.array([t % 3, t % 4]),
                         np.array([(t >> k) & 1 for k in range(3)],
                                  np.int8))}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        a0, a1 = action
        self.t += 1
        return (self._obs(), float(a0) + float(np.sum(a1)),
                self.t % self.term_every == 0, False, {})


class FaultyEnv(CountingEnv):
    """A CountingEnv that fails on purpose, for the fault matrix.

    ``fault`` is one of ``"reset"`` (raise in reset), ``"step"`` (raise in
    step), ``"exit"`` (``os._exit(3)`` in step), ``"kill"`` (SIGKILL itself
    in step), ``"segfault"``; the fault happens at step ``at`` (for step
    faults) of the first episode.
    """

    def __init__(self, fault, at=3):
        super().__init__(term_every=None, trunc_at=None)
        self.fault, self.at = fault, at

    def reset(self, *, seed=None, options=None):
        if self.fault == "reset":
            raise RuntimeError("reset failed on purpose")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.t + 1 >= self.at:
            if self.fault == "step":
                raise ValueError("step failed on purpose")
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "segfault":
                import ctypes
                import faulthandler
                faulthandler.disable()  # no stack dump in the test log
                ctypes.string_at(0)
        return super().step(action)


def counting_factory(term_every=None, trunc_at=None):
    """A module-level factory (picklable by reference)."""
    return CountingEnv(term_every=term_every, trunc_at=trunc_at)


def failing_factory():
    raise RuntimeError("factory failed on purpose")


class InPlaceEnv(gymnasium.Env):
    """Box(-1, 1, (2,)) actions (or, with ``nested=True``, ``(Discrete(2),
    Box(-1, 1, (2,)))``) that ``step`` clips *in place*
    (``np.clip(a, -1, 1, out=a)``), as some envs and wrappers do (not with
    ``clip=False``), and keeps: ``kept`` holds every action object it was
    given, ``seen`` a copy of each as it arrived. Observation = steps since
    reset; reward = the sum of the (clipped) action; never ends."""

    def __init__(self, nested=False, clip=True):
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,),
                                            np.float32)
        box = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Tuple((spaces.Discrete(2), box)) \
            if nested else box
        self.nested, self.clip = nested, clip
        self.t, self.kept, self.seen = 0, [], []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        box = action[1] if self.nested else action
        self.kept.append(box)
        self.seen.append(np.array(box))
        if self.clip:
            np.clip(box, -1.0, 1.0, out=box)
        self.t += 1
        return (np.array([self.t], np.float32), float(box.sum()), False,
                False, {})


class SpacesEnv(gymnasium.Env):
    """Any spaces, scripted observations: ``obs(episode, t)`` gives the
    observation at step ``t`` of episode ``episode`` (``t = 0`` at reset).
    Reward 1; terminates after ``term_every`` steps (None: never);
    ``actions`` logs what ``step`` got."""

    def __init__(self, observation_space, action_space, obs, term_every=None):
        self.observation_space, self.action_space = (observation_space,
                                                      action_space)
        self.obs, self.term_every = obs, term_every
        self.episode, self.t, self.actions = -1, 0, []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self.obs(self.episode, 0), {}

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        terminated = self.term_every is not None and \
            self.t % self.term_every == 0
        return self.obs(self.episode, self.t), 1.0, terminated, False, {}
