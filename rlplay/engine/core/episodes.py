"""The episode loop: :func:`evaluate` plays whole episodes with an actor
in this process, :func:`episode` one. It steps the envs through the env
adapter's :class:`~rlplay.engine.envs.EnvBatch`, calls the actor through a
policy (:mod:`.policy`) and checks spaces as the fragment loop does.
"""
import numpy as np
import torch

from .. import envs as _envs
from ..envs import RowOut, as_batch
from ..nested import getitem, suply
from ..seeds import seed_sequence
from ..shared import aliased, copy_
from .checks import _SpaceChecks, _final_label, _raise_cast, _reset_label, \
    _step_label
from .layout import _check_counts, _state_example, check_count, \
    check_spaces_mode
from .policy import as_policy

__all__ = ["evaluate", "episode"]


@torch.no_grad()
def evaluate(envs, actor, n_episodes, *, seed_sequences=None,
             max_steps=None, check_spaces="first", on_frame=None):
    """Play ``n_episodes`` whole episodes with ``actor``, in this process.

    Each of the ``B`` envs plays ``ceil(n_episodes / B)`` episodes (so that
    short episodes are not favoured); the first ``n_episodes`` results, in
    env order, are returned. The actor is used as it is (call ``eval()``
    first for greedy actions). Its actions, ``hx`` and ``info`` are checked
    at every step as :func:`~.fragments.collect` checks them once per fragment.

    Parameters
    ----------
    envs : EnvBatch or list of gymnasium.Env
    actor : BaseActorModule
    n_episodes : int
    seed_sequences : list of SeedSequence, optional
        Reset seeds for the first episode of each env.
    max_steps : int, optional
        Stop an episode after this many steps (counted as truncated); at
        least 1, or ``None`` for no limit.
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

    Returns
    -------
    returns : ndarray of float64, shape = (n_episodes,)
    lengths : ndarray of int64, shape = (n_episodes,)

    Raises
    ------
    TypeError, ValueError
        Not an actor, bad counts, ``max_steps`` or ``check_spaces``; an
        action, ``hx`` or ``info`` that does not fit; an action or
        observation outside its space (naming the env ``j`` and the step
        ``t``, counted from the start of the call); a reward that is not a
        number.
    """
    policy = as_policy(actor)
    envs = as_batch(envs)
    _check_counts(1, envs.n_envs)
    check_count("n_episodes", n_episodes)
    if max_steps is not None:
        check_count("max_steps", max_steps)
    mode = check_spaces_mode(check_spaces)
    n_envs = envs.n_envs
    quota = -(-n_episodes // n_envs)
    example = _state_example(envs)
    state = aliased(example, 1, n_envs)
    row, npy = state.pyt, getitem(state.npy, 0)
    suply(np.copyto, npy.act, example.act)  # the placeholder, as startup
    checks = None if mode == "never" else _SpaceChecks(envs)
    clip = _envs.box_clipper(envs.action_space)  # as collect clips
    envs.reset(npy.obs, seed_sequences,
               on_cast=None if checks is None else _raise_cast)
    if checks is not None:
        checks.observation(npy.obs, _reset_label)
    npy.fin[:] = True
    if on_frame is not None:
        on_frame(_frame(envs, 0))
    hx = policy.initial_hx(row)
    rew = np.zeros(n_envs, np.float64)
    # a list of single envs is not reset by its step (an env whose quota is
    # played stays as it is), so the last observations are in `obs`
    autoreset = not envs.can_freeze
    out = RowOut(t=0, obs=npy.obs, rew=rew, fin=npy.fin, truncated=None,
                 final=aliased(example.obs, n_envs).npy if autoreset
                 else None, info={}, info_mask={})
    last = out.final if autoreset else npy.obs
    results = [[] for _ in range(n_envs)]
    ep_return = np.zeros(n_envs, np.float64)
    ep_length = np.zeros(n_envs, np.int64)
    active = np.ones(n_envs, bool)
    # cut at max_steps where the column cannot be reset alone: its steps
    # count for nothing until its episode ends on its own
    draining = np.zeros(n_envs, bool)
    n_first = 0  # envs that finished their first episode
    t = 0
    while active.any():
        checking = checks is not None and (mode == "always"
                                           or n_first < n_envs)
        on_cast = _raise_cast if checking else None
        # every call checked, before copy_ could broadcast a wrong shape
        act, hx_next, info = policy.checked_step(row, hx, row.act)
        hx = hx_next
        copy_(row.act, act)
        if clip is not None:
            clip(npy.act)
        live = np.flatnonzero(active)
        if checking:
            checks.action(getitem(npy.act, live), t, live)
        npy.fin[live] = False
        # single envs are stepped where they play on, and reset here where
        # they play another episode; a batched source steps (and resets)
        # all its columns, the ended ones are filtered by `active`
        ended = envs.step(npy.act, out._replace(t=t),
                          live.tolist() if envs.can_freeze else None,
                          autoreset=autoreset, on_cast=on_cast)
        counted = active & ~draining
        counted[list(envs.lost)] = False  # lost calls are no steps
        ep_return[counted] += rew[counted]
        ep_length[counted] += 1
        npy.rew[live] = rew[live]
        if checking:
            checks.reward(rew[live], t, live)
        ended = [j for j in ended if active[j]]
        if checking and ended:  # the last observations
            checks.observation(getitem(last, ended), _final_label(t), ended)
        done = [j for j in ended if not draining[j]]
        draining[ended] = False
        cut = [] if max_steps is None else np.flatnonzero(
            counted & (ep_length >= max_steps) & ~npy.fin).tolist()
        if on_frame is not None and live[0] == 0:  # before any reset
            on_frame(_frame(envs, 0))
            if 0 in done or 0 in cut:
                on_frame = None  # env 0's first episode is over
        for j in done + cut:
            results[j].append((ep_return[j], ep_length[j]))
            n_first += len(results[j]) == 1
            ep_return[j], ep_length[j] = 0.0, 0
            active[j] = len(results[j]) < quota
        again = [j for j in (cut if autoreset else ended + cut) if active[j]]
        if again and envs.can_reset_columns:
            envs.reset(npy.obs, at=sorted(again), t=t, on_cast=on_cast)
        elif again:
            draining[again] = True
        npy.fin[cut] = True
        npy.stepno[live] += 1
        npy.stepno[npy.fin] = 0
        if checking:
            live = np.flatnonzero(active)
            checks.observation(getitem(npy.obs, live),
                               _step_label(t, npy.fin), live)
        if npy.fin.any():
            hx = policy.reset(hx, torch.from_numpy(npy.fin.copy()))
        t += 1
    flat = [pair for per_env in results for pair in per_env][:n_episodes]
    returns, lengths = np.array(flat).T
    return returns.astype(np.float64), lengths.astype(np.int64)


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
