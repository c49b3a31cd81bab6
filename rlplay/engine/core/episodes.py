"""The episode loop: :func:`evaluate` plays whole episodes with an actor
in this process, :func:`episode` one. It steps the envs through the env
adapter's :class:`~rlplay.engine.envs.EnvBatch`, calls the actor through a
policy (:mod:`rlplay.engine.policy`) and checks spaces as the fragment
loop does.

An env batch of kind ``"torch"`` (a torch-native source) is played by the
episode loop of :mod:`.torch_episodes` instead, with the same results;
:func:`evaluate` chooses it by the kind (:func:`~.fragments._torch`).
"""
import numpy as np
import torch

from .. import envs as _envs
from ..envs import RowOut, as_batch
from ..nested import getitem, suply
from ..seeds import seed_sequence
from ..shared import aliased, copy_
from .accounting import Accounts
from .checks import (_SpaceChecks, _final_label, _raise_cast, _reset_label,
                     _step_label)
from .fragments import _torch, fragment_device
from .layout import (_check_counts, _state_example, check_count,
                     check_spaces_mode)
from ..policy import as_policy
from . import torch_episodes

__all__ = ["evaluate", "episode"]


@torch.no_grad()
def evaluate(envs, actor, n_episodes, *, seed_sequences=None,
             max_steps=None, check_spaces="first", on_frame=None):
    """Play ``n_episodes`` whole episodes with ``actor``, in this process.

    Each of the ``B`` env columns plays ``ceil(n_episodes / B)`` episodes
    (so that short episodes are not favoured); the first ``n_episodes``
    results, in column order, are returned. The actor is used as it is
    (call ``eval()`` first for greedy actions). Its actions, ``hx`` and
    ``info`` are checked at every step as :func:`~.fragments.collect`
    checks them once per fragment.

    A column of a PettingZoo env (see :mod:`rlplay.engine.envs.agents`)
    plays its agent's lives in its env's first ``ceil(n_episodes / B)``
    episodes: one in each episode where the agent appears (it cannot come
    back within one), none in an episode where it does not. An agent that
    does not appear in every one of them gives fewer results, one that
    never appears none: the call ends when the envs have played their
    episodes, rather than wait for an agent that may never come.

    A torch-native source (an env batch of kind ``"torch"``, a
    :class:`~rlplay.engine.envs.TorchSource`) is played where it lives, by
    the episode loop of :mod:`.torch_episodes`: the returns and lengths
    are those that this loop gives over the same envs in numpy, in each
    autoreset mode.

    Parameters
    ----------
    envs : EnvBatch or list of gymnasium.Env
    actor : BaseActorModule or LocalPolicy
        Called where its parameters live: where that is another device
        than the rows' (the host, or a torch source's device), each row is
        moved there (:mod:`rlplay.engine.policy.device`); a policy
        (:mod:`rlplay.engine.policy`) is used as it is.
    n_episodes : int
    seed_sequences : list of SeedSequence, optional
        Reset seeds for the first episode of each env.
    max_steps : int, optional
        Stop an episode after this many steps (counted as truncated); at
        least 1, or ``None`` for no limit. A column that its source cannot
        reset alone (some vector envs', a next-step torch source's, a
        PettingZoo env's agent) plays on uncounted until its episode ends
        on its own: such envs must end their episodes themselves (a time
        limit, PettingZoo's ``max_cycles``).
    check_spaces : {'first', 'always', 'never'}
        Check actions and observations against the env's spaces, as
        :func:`~.fragments.collect` does: ``'first'``, until every env has
        finished its first episode of this call (the reset observations
        included); ``'always'``, at every step; ``'never'``.
    on_frame : callable, optional
        ``on_frame(frame)`` gets env 0's rendered frames of its first
        episode: at its reset, then after each step up to the last one
        (``1 + length`` frames, RGB arrays ``(H, W, 3)`` of an env made
        with ``render_mode="rgb_array"``). ``None``: nothing is rendered.
        A batched source (a vector env, a torch source) cannot render one
        env column: a ``TypeError``.

    Returns
    -------
    returns : ndarray of float64, shape = (n,)
    lengths : ndarray of int64, shape = (n,)
        ``n = n_episodes``, or fewer where agents of a PettingZoo env did
        not appear in every episode of their env (see above).

    Raises
    ------
    TypeError, ValueError
        Not an actor, bad counts, ``max_steps`` or ``check_spaces``; an
        action, ``hx`` or ``info`` that does not fit; an action or
        observation outside its space (naming the env ``j`` and the step
        ``t``, counted from the start of the call); a reward that is not a
        number; a same-step source that ended an episode without its true
        last observation (a torch source's: once all are played).
    """
    envs = as_batch(envs)
    # the actor called where the rows live (see .devices)
    policy = as_policy(actor, rows=fragment_device(envs))
    _check_counts(1, envs.n_envs)
    check_count("n_episodes", n_episodes)
    if max_steps is not None:
        check_count("max_steps", max_steps)
    mode = check_spaces_mode(check_spaces)
    quota = -(-n_episodes // envs.n_envs)
    if _torch(envs):
        returns, lengths = torch_episodes.play(
            envs, policy, quota, seed_sequences=seed_sequences,
            max_steps=max_steps, mode=mode, on_frame=on_frame)
        return returns[:n_episodes], lengths[:n_episodes]
    play = _Play(envs, policy, quota, max_steps, mode, on_frame)
    play.start(seed_sequences)
    while play.active.any():
        play.step()
    flat = [pair for per_env in play.results for pair in per_env]
    returns, lengths = np.array(flat[:n_episodes]).reshape(-1, 2).T
    return returns.astype(np.float64), lengths.astype(np.int64)


class _Play:
    """An evaluation under way (see :func:`evaluate`): ``B`` env columns
    that play episodes until each has played ``quota`` of them, or its
    env has (a PettingZoo env's column), one row of state for all, and
    one episode accounting."""

    def __init__(self, envs, policy, quota, max_steps, mode, on_frame):
        n_envs = envs.n_envs
        self.envs, self.policy, self.quota = envs, policy, quota
        self.max_steps, self.mode, self.on_frame = max_steps, mode, on_frame
        example = _state_example(envs)
        state = aliased(example, 1, n_envs)
        self.row, self.npy = state.pyt, getitem(state.npy, 0)
        # the placeholder, as startup
        suply(np.copyto, self.npy.act, example.act)
        self.checks = None if mode == "never" else _SpaceChecks(envs)
        # the envs get Box actions clipped into their bounds, as collect's
        self.clip = _envs.box_clipper(envs.action_space)
        self.accounts = Accounts(n_envs)
        # a list of single envs is not reset by its step (an env whose
        # quota is played stays as it is), so the last observations are in
        # `obs`
        self.autoreset = not envs.can_freeze
        self.out = RowOut(
            t=0, obs=self.npy.obs, rew=self.accounts.rew, fin=self.npy.fin,
            truncated=None, final=aliased(example.obs, n_envs).npy
            if self.autoreset else None, info={}, info_mask={})
        # where the last observations are (a source that resets late
        # leaves them in obs: final_is_obs)
        self.last = self.out.final if self.autoreset and \
            not envs.final_is_obs else self.npy.obs
        self.results = [[] for _ in range(n_envs)]
        # the episodes of each column's env that ended (a PettingZoo env's,
        # Stepped.env_ended): its agent's column is done after `quota` of
        # them, whether its agent appeared in them or not
        self.env_episodes = np.zeros(n_envs, np.int64)
        self.active = np.ones(n_envs, bool)
        # cut at max_steps where the column cannot be reset alone: its
        # steps count for nothing until its episode ends on its own
        self.draining = np.zeros(n_envs, bool)
        # the columns whose first episode (or their env's) is over
        self.first_over = np.zeros(n_envs, bool)
        self.t, self.hx = 0, None

    def start(self, seed_sequences):
        """Reset every env column; the actor's first ``hx``."""
        npy, checks = self.npy, self.checks
        casts = self.envs.reset(npy.obs, seed_sequences,
                                check_casts=checks is not None)
        if casts:
            _raise_cast(casts[0])
        if checks is not None:
            checks.observation(npy.obs, _reset_label)
        npy.fin[:] = True
        if self.on_frame is not None:
            self.on_frame(_frame(self.envs, 0))
        self.hx = self.policy.initial_hx(self.row)

    def step(self):
        """One step of the columns that play on: the actor's actions, the
        envs' step, the episodes that ended or were cut, ``hx``."""
        t, npy, checks = self.t, self.npy, self.checks
        checking = checks is not None and (
            self.mode == "always" or not self.first_over.all())
        # every call checked, before copy_ could broadcast a wrong shape
        act, self.hx, _ = self.policy.checked_step(self.row, self.hx,
                                                   self.row.act)
        copy_(self.row.act, act)
        live = np.flatnonzero(self.active)
        if checking:
            checks.action(getitem(npy.act, live), t, live)
        npy.fin[live] = False
        ended, env_ended, counted = self._step_envs(live, checking)
        cut = self._settle(ended, env_ended, counted, live, checking)
        npy.fin[cut] = True
        npy.stepno[live] += 1
        npy.stepno[npy.fin] = 0
        if checking:
            live = np.flatnonzero(self.active)
            checks.observation(getitem(npy.obs, live),
                               _step_label(t, npy.fin), live)
        if npy.fin.any():
            self.hx = self.policy.reset(self.hx,
                                        torch.from_numpy(npy.fin.copy()))
        self.t += 1

    def _step_envs(self, live, checking):
        """Step the envs and count the step; returns the active columns
        whose episode ended, those whose env's episode ended, and the mask
        of the columns counted."""
        envs, npy, accounts, t = self.envs, self.npy, self.accounts, self.t
        # single envs are stepped where they play on, and reset here where
        # they play another episode; a batched source steps (and resets)
        # all its columns, the ended ones are filtered by `active`
        ended, lost, casts, env_ended = envs.step(  # Box actions clipped
            npy.act if self.clip is None else self.clip(npy.act),
            self.out._replace(t=t),
            live.tolist() if envs.can_freeze else None,
            autoreset=self.autoreset, check_casts=checking)
        if casts:
            _raise_cast(casts[0])
        counted = self.active & ~self.draining
        counted[list(lost)] = False  # lost calls are no steps
        accounts.count(counted)
        npy.rew[live] = accounts.rew[live]
        if checking:
            self.checks.reward(accounts.rew[live], t, live)
        ended = [j for j in ended if self.active[j]]
        if checking and ended:  # the last observations
            self.checks.observation(getitem(self.last, ended),
                                    _final_label(t), ended)
        return ended, [j for j in env_ended if self.active[j]], counted

    def _settle(self, ended, env_ended, counted, live, checking):
        """Close the episodes that ended or reached ``max_steps``, count
        the env episodes that ended, and start the next ones where a
        column plays on; returns the columns cut at ``max_steps``."""
        envs, npy, accounts = self.envs, self.npy, self.accounts
        draining, active, results = self.draining, self.active, self.results
        done = [j for j in ended if not draining[j]]
        draining[ended] = False
        cut = [] if self.max_steps is None else np.flatnonzero(
            counted & (accounts.length >= self.max_steps)
            & ~npy.fin).tolist()
        if self.on_frame is not None and live[0] == 0:  # before any reset
            self.on_frame(_frame(envs, 0))
            if 0 in done or 0 in cut or 0 in env_ended:
                self.on_frame = None  # env 0's first episode is over
        for j in done + cut:
            results[j].append(accounts.close(j))
        # after its agent's end in the same step, if it was live
        self.env_episodes[env_ended] += 1
        for j in done + cut + env_ended:
            self.first_over[j] = True
            active[j] = len(results[j]) < self.quota \
                and self.env_episodes[j] < self.quota
        again = [j for j in (cut if self.autoreset else ended + cut)
                 if active[j]]
        if again and envs.can_reset_columns:
            casts = envs.reset(npy.obs, at=sorted(again), t=self.t,
                               check_casts=checking)
            if casts:
                _raise_cast(casts[0])
        elif again:
            draining[again] = True
        return cut


def _frame(envs, j):
    frame = envs.render(j)
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 \
            or frame.shape[-1] != 3:
        raise TypeError(
            f"recording needs envs that render RGB frames (made with "
            f"render_mode='rgb_array'): env {j} rendered "
            + (f"an array of shape {frame.shape}"
               if isinstance(frame, np.ndarray) else repr(type(frame))))
    return frame


def episode(env, actor, *, seed=None, max_steps=None, check_spaces="first"):
    """Play one episode; return its ``(return, length)``.

    The keywords are as in :func:`evaluate`.
    """
    seeds = None if seed is None else [seed_sequence(seed)]
    returns, lengths = evaluate([env], actor, 1, seed_sequences=seeds,
                                max_steps=max_steps,
                                check_spaces=check_spaces)
    return float(returns[0]), int(lengths[0])
