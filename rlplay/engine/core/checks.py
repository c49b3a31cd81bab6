"""Space checks of the core loops (``check_spaces``, see
:mod:`.layout`): the actor's actions against the action space, the
observations against the observation space, the rewards for NaN, and the
labels that name where a value came from (``env j step t``).
"""
import numpy as np

from .. import envs as _envs

# the end of every space-check message: how to turn the checks off
_CHECK_HINT = " (check_spaces='never' turns these checks off)"


class _SpaceChecks:
    """The space checkers of one env's spaces (see
    :func:`~.fragments.collect`)."""

    def __init__(self, env):
        # ``env``: an env or an env batch (only its spaces are used)
        self.act = _envs.space_checker(
            env.action_space, "the actor's action", "the action space",
            box_bounds=False)
        self.obs = _envs.space_checker(
            env.observation_space, "the observation",
            "the observation space")

    def action(self, act_row, t, envs_at=None):
        """Raise for the first action of ``act_row`` (B, ...) outside the
        action space; ``envs_at`` maps its rows to env columns."""
        problem = self.act(act_row)
        if problem is not None:
            j, message = problem
            j = j if envs_at is None else int(envs_at[j])
            raise ValueError(f"env {j} step {t}: {message}{_CHECK_HINT}")

    def observation(self, obs_row, label, envs_at=None):
        """Raise for the first observation of ``obs_row`` outside the
        observation space; ``label(j)`` says where it came from."""
        problem = self.obs(obs_row)
        if problem is not None:
            j, message = problem
            j = j if envs_at is None else int(envs_at[j])
            raise ValueError(f"{label(j)}: {message}{_CHECK_HINT}")

    @staticmethod
    def reward(rew_row, t, envs_at=None):
        """Raise for the first NaN reward of ``rew_row`` (B,): it would
        poison every return and advantage of its column."""
        nan = np.isnan(rew_row)
        if nan.any():
            j = int(np.flatnonzero(nan)[0])
            j = j if envs_at is None else int(envs_at[j])
            raise ValueError(f"env {j} step {t}: the reward is NaN, which "
                             f"would poison every return and advantage of "
                             f"its column{_CHECK_HINT}")

def _raise_cast(cast):
    # an observation that recording changed (an envs.Cast record)
    raise ValueError(f"{cast.label}: {cast.problem}{_CHECK_HINT}")



def _reset_label(j):
    return f"env {j} reset()"


def _step_label(t, fin_next):
    """``label(j)``: where the observation of env ``j`` at step ``t`` came
    from (``reset()`` where the episode ended)."""
    def label(j):
        return f"env {j} step {t}" + (", reset()" if fin_next[j] else "")
    return label


def _final_label(t):
    """``label(j)`` of the true last observation of env ``j``'s episode,
    which ended at step ``t``."""
    def label(j):
        return f"env {j} step {t}"
    return label


