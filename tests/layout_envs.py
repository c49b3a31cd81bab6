"""More tiny envs for the layout and error tests (see also ``envs.py``)."""
import numpy as np

from envs import CountingEnv, StructuredEnv


class EpisodeInfoEnv(CountingEnv):
    """A CountingEnv whose info has a nested ``episode`` entry at the end of
    an episode only: ``{"r": return, "l": length}`` (as Gymnasium's
    ``RecordEpisodeStatistics`` does)."""

    def reset(self, *, seed=None, options=None):
        self.ret = 0.0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        self.ret += rew
        if terminated or truncated:
            info["episode"] = {"r": self.ret, "l": self.t}
        return obs, rew, terminated, truncated, info


class BadShapeEnv(CountingEnv):
    """A CountingEnv (``Box`` of shape ``(1,)``) whose observation has shape
    ``(2,)`` at reset (``at=0``) or at step ``at`` of its first episode."""

    def __init__(self, at, **kwargs):
        super().__init__(**kwargs)
        self.at = at

    def _obs(self):
        obs = super()._obs()
        if self.n_episodes == 0 and self.t == self.at:
            return np.zeros(2, np.float32)
        return obs


class BadKeyEnv(StructuredEnv):
    """A StructuredEnv whose observation at reset (``at=0``) or at step
    ``at`` has ``"speed"`` instead of ``"flag"`` (or, with ``extra=True``,
    ``"speed"`` as well as ``"flag"``)."""

    def __init__(self, at, extra=False):
        super().__init__(term_every=100)
        self.at, self.extra = at, extra

    def _obs(self):
        obs = super()._obs()
        if self.t == self.at:
            obs["speed"] = 1.0
            if not self.extra:
                del obs["flag"]
        return obs


class OldStepEnv(CountingEnv):
    """``step`` returns Gymnasium's pre-1.0 4-tuple."""

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        return obs, rew, terminated or truncated, info


class CyclingEnv(CountingEnv):
    """A CountingEnv whose episodes terminate after ``lengths[i % n]``
    steps in episode ``i``, so that episode ends fall on different rows
    of successive fragments (truncation at ``trunc_at`` as before)."""

    def __init__(self, lengths, trunc_at=None):
        super().__init__(term_every=None, trunc_at=trunc_at)
        self.lengths = tuple(lengths)

    def step(self, action):
        length = self.lengths[self.n_episodes % len(self.lengths)]
        obs, rew, terminated, truncated, info = super().step(action)
        if self.t == length:
            terminated = True
            info["done"] = 1.0
        return obs, rew, terminated, truncated, info


class BadRewardEnv(CountingEnv):
    """A CountingEnv whose ``at``-th step returns ``reward`` as its reward
    (a string, say)."""

    def __init__(self, reward="1.0", at=2, **kwargs):
        super().__init__(**kwargs)
        self.reward, self.at, self.steps = reward, at, 0

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.steps == self.at:
            rew = self.reward
        return obs, rew, terminated, truncated, info
