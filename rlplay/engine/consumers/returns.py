"""Discounted returns and GAE computed exactly from a fragment.

Notation follows :mod:`rlplay.engine.core.layout`: row ``t + 1`` of a
fragment holds the reward ``rew[t+1]`` of the action taken at row ``t`` and
whether that transition ended an episode (``fin[t+1]``), by termination or
by truncation (``truncated[t+1]``). Results are indexed by the row of the
action, ``t = 0 .. T-1``, shape ``(T, B)``.

- A termination cuts the return: nothing is bootstrapped after it.
- A truncation cuts the episode but not the value: the return bootstraps
  from ``value_final[t+1]``, the value of the true final observation.
- At the end of the fragment the return bootstraps from ``value[T]``, the
  value of the observation in row ``T`` (or from ``value_final[T]`` when the
  last transition was truncated).

Sticky fragments (``sticky=True``): after env ``j``'s episode ended at row
``t >= 1``, its rows ``t+1 .. T`` are frozen copies (``fin = True``,
``rew = 0``): they look like episodes of length one that end at once, so
without a mask the return of an action in row ``t .. T-1`` would be 0 and its
advantage ``-value``. Those actions were never executed: ``mask=`` of
:func:`returns` and :func:`gae` zeroes their results. The rows an executed
action led to are defined once, by :func:`rlplay.engine.core.acted` (``mask
= ~acted(fragment)``, for any fragment); :func:`frozen` finds the same rows
of a sticky fragment from ``fin`` alone. Leave the same rows out of a loss,
e.g. with ``live = acted(fragment)[1:]``, shape ``(T, B)``.

Off-policy fragments: :func:`vtrace` corrects the targets of fragments
collected by older parameters (the lag of ``meta.version``) with clipped
importance weights, on the same rows and with the same cuts, bootstraps
and mask as :func:`gae`.
"""
from typing import Any, NamedTuple

import numpy as np
import torch

from ..core.layout import terminated

__all__ = ["returns", "gae", "n_step", "terminated", "frozen", "VTrace",
           "vtrace"]


def frozen(fin):
    """The frozen rows of a sticky fragment.

    Parameters
    ----------
    fin : bool tensor or array, shape = (1 + T, B)
        ``state.fin`` of a fragment collected with ``sticky=True``.

    Returns
    -------
    mask : bool tensor, shape = (1 + T, B)
        ``True`` at the rows after the first episode end in rows ``1 .. T``
        of each env: rows that repeat the reset row and that no executed
        action led to. Row 0 (the previous fragment's row ``T``) and the row
        of the end itself are never frozen. ``mask[1:]`` marks the actions
        (rows ``0 .. T-1``) that were never executed.

    Raises
    ------
    ValueError
        ``fin`` is not 2-d, or is ``False`` somewhere after an episode end
        (not a sticky fragment: its envs went on after an end).

    Examples
    --------
    >>> fin = torch.tensor([[1, 1], [0, 0], [1, 0], [1, 1], [1, 1]]).bool()
    >>> frozen(fin).int().T.tolist()
    [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]]
    """
    fin = torch.as_tensor(fin)
    if fin.dim() != 2 or fin.dtype != torch.bool:
        raise ValueError(f"fin must be a bool tensor of shape (1 + T, B), "
                         f"got {fin.dtype} of shape {tuple(fin.shape)}")
    mask = torch.zeros_like(fin)
    # row t is frozen iff an episode ended at some row 1 .. t-1
    mask[2:] = fin[1:-1].long().cumsum(0) > 0
    if not bool(fin[mask].all()):
        t, j = (mask & ~fin).nonzero()[0].tolist()
        raise ValueError(f"not a sticky fragment: env {j} goes on at row "
                         f"{t} (fin is False) after an episode end at an "
                         f"earlier row")
    return mask


def _apply_mask(result, mask, fin):
    """Zero ``result`` (T, B) where ``mask[1:]``."""
    if mask is None:
        return result
    mask = torch.as_tensor(mask, device=result.device)
    if mask.shape != fin.shape or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor shaped as fin "
                         f"{tuple(fin.shape)}, got {mask.dtype} of shape "
                         f"{tuple(mask.shape)}")
    return result.masked_fill(mask[1:], 0)


def _check_unit(**values):
    """Raise ValueError naming a discount or lambda outside ``[0, 1]``
    (NaN included)."""
    for name, x in values.items():
        if not 0 <= float(x) <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {x!r}")


def _bootstrap(fin, truncated, value, value_final):
    """Per row t+1: the value to bootstrap from after that transition, or
    0 after a termination; ``(T, B)``."""
    fin, truncated = fin[1:], truncated[1:]
    next_value = value[1:]
    if value_final is not None:
        next_value = torch.where(truncated, value_final[1:], next_value)
    elif bool((truncated).any()):
        raise ValueError("the fragment has truncations: pass value_final, "
                         "the values of the final observations")
    return torch.where(terminated(fin, truncated),
                       torch.zeros_like(next_value),
                       next_value)


def returns(rew, fin, truncated, value, value_final=None, *, gamma,
            n=None, mask=None):
    """Discounted n-step returns of the actions in rows ``0..T-1``.

    Parameters
    ----------
    rew : tensor, shape = (1 + T, B)
    fin, truncated : bool tensors, shape = (1 + T, B)
    value : tensor, shape = (1 + T, B)
        State values ``V(obs[t])``.
    value_final : tensor, shape = (1 + T, B), optional
        ``V(final[t])``; needed where ``truncated``.
    gamma : float
        The discount, in ``[0, 1]`` (else ``ValueError``; ``lam`` of
        :func:`gae` too).
    n : int, optional
        Look ahead at most ``n`` steps and bootstrap from the value there;
        ``None`` looks ahead to the end of the fragment.
    mask : bool tensor, shape = (1 + T, B), optional
        Rows that no executed action led to, e.g. :func:`frozen` of a sticky
        fragment: ``G[t]`` is 0 wherever ``mask[t+1]``. (A frozen row ends
        with ``rew = 0`` and no bootstrap, so its ``G`` is 0 either way; it
        follows an episode end, where the sum is cut, so no other ``G[t]``
        depends on it. The mask matters for :func:`gae` and for losses.)

    Returns
    -------
    G : tensor, shape = (T, B)
        ``G[t] = rew[t+1] + gamma * G[t+1]`` within an episode, cut at a
        termination, bootstrapped at truncations, at the ``n``-th step and at
        row ``T``.
    """
    _check_unit(gamma=gamma)
    T = rew.shape[0] - 1
    boot = _bootstrap(fin, truncated, value, value_final)
    ended = fin[1:]
    rew = rew[1:]
    if n is None or n >= T:
        G = torch.empty_like(boot)
        acc = boot[T - 1]
        for t in range(T - 1, -1, -1):
            acc = rew[t] + gamma * torch.where(ended[t], boot[t], acc) \
                if t < T - 1 else rew[t] + gamma * boot[t]
            G[t] = acc
        return _apply_mask(G, mask, fin)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    # the window of row t is rows t+1 .. t+n, cut at an episode end and at
    # row T (the last row of `ended` is set: nothing is known after it)
    B = rew.shape[1:]
    stops = torch.cat([ended[:T - 1], ended.new_ones((n, *B))])
    rews = torch.cat([rew, rew.new_zeros((n - 1, *B))])
    windows = torch.stack([rews[k:k + T] for k in range(n)])
    cuts = torch.stack([stops[k:k + T] for k in range(n)])
    G, discount, last = n_step(windows, cuts, gamma)
    rows = torch.arange(T, device=last.device).reshape(T, *[1] * len(B))
    G = G + discount * boot.gather(0, rows + last)
    return _apply_mask(G, mask, fin)


def n_step(rew, cut, gamma):
    """Discounted sums over windows of up to ``n`` steps: the n-step
    arithmetic of :func:`returns` and of :class:`rlplay.engine.replay.Replay`.

    Parameters
    ----------
    rew : tensor or ndarray, shape = (n, ...)
        ``rew[k]``: the reward of step ``k + 1`` of each window.
    cut : bool tensor or ndarray, shape = (n, ...)
        The window stops after step ``k + 1`` (an episode end, or nothing
        known after it); it stops after step ``n`` in any case.
    gamma : float

    Returns
    -------
    G : tensor, shape = (...)
        ``sum(gamma**k * rew[k])`` over the steps ``k = 0 .. m - 1`` of the
        window, ``m`` its steps taken.
    discount : tensor, shape = (...)
        ``gamma**m``: the weight of what the window bootstraps from (the
        caller zeroes it after a termination).
    last : int64 tensor, shape = (...)
        ``m - 1``, the index of the window's last step.

    Examples
    --------
    >>> rew = torch.tensor([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
    >>> cut = torch.tensor([[False, False], [False, True], [False, False]])
    >>> n_step(rew, cut, 0.5)
    (tensor([3., 2.]), tensor([0.1250, 0.2500]), tensor([2, 1]))
    """
    n = rew.shape[0]
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    # the same arithmetic on numpy arrays (the replay buffer's gather)
    if isinstance(rew, np.ndarray):
        where, G = np.where, rew[0].copy()
        discount = np.full_like(G, gamma)
        last = np.zeros(G.shape, np.int64)
    else:
        where, G = torch.where, rew[0].clone()
        discount = torch.full_like(G, gamma)
        last = torch.zeros(G.shape, dtype=torch.int64, device=G.device)
    going = ~cut[0]
    for k in range(1, n):
        G = where(going, G + discount * rew[k], G)
        discount = where(going, discount * gamma, discount)
        last = where(going, k, last)
        going = going & ~cut[k]
    return G, discount, last


def gae(rew, fin, truncated, value, value_final=None, *, gamma, lam,
        mask=None):
    """Generalised advantage estimates of the actions in rows ``0..T-1``.

    Parameters are as in :func:`returns`; ``lam`` is GAE's lambda. With
    ``mask`` (e.g. :func:`frozen` of a sticky fragment), ``adv[t]`` is 0
    wherever ``mask[t+1]``, instead of ``-value[t]``.

    Examples
    --------
    A sticky fragment of one env whose episode ends at row 2 (rows 3 and 4
    are frozen, so the actions in rows 2 and 3 were never executed):

    >>> rew = torch.tensor([[0.0], [1.0], [1.0], [0.0], [0.0]])
    >>> fin = torch.tensor([[True], [False], [True], [True], [True]])
    >>> value = torch.full((5, 1), 0.5)
    >>> no = torch.zeros_like(fin)
    >>> gae(rew, fin, no, value, gamma=0.5, lam=1.0).T
    tensor([[ 1.0000,  0.5000, -0.5000, -0.5000]])
    >>> gae(rew, fin, no, value, gamma=0.5, lam=1.0, mask=frozen(fin)).T
    tensor([[1.0000, 0.5000, 0.0000, 0.0000]])

    Returns
    -------
    adv : tensor, shape = (T, B)
        ``delta[t] + gamma * lam * adv[t+1]`` within an episode, where
        ``delta[t] = rew[t+1] + gamma * boot[t+1] - value[t]``; the sum is
        cut at any episode end (the bootstrap value carries truncations).
        ``adv + value[:-1]`` are the lambda-returns.
    """
    _check_unit(gamma=gamma, lam=lam)
    T = rew.shape[0] - 1
    boot = _bootstrap(fin, truncated, value, value_final)
    delta = rew[1:] + gamma * boot - value[:-1]
    ended = fin[1:]
    adv = torch.empty_like(delta)
    acc = torch.zeros_like(delta[0])
    for t in range(T - 1, -1, -1):
        acc = delta[t] + gamma * lam * torch.where(
            ended[t], torch.zeros_like(acc), acc)
        adv[t] = acc
    return _apply_mask(adv, mask, fin)


class VTrace(NamedTuple):
    """The V-trace results of :func:`vtrace`, four tensors of shape
    ``(T, B)`` indexed by the row of the action, ``t = 0 .. T-1``, each 0
    wherever ``mask[t+1]``:

    - ``vs``: the V-trace targets ``v_t`` of ``value[t]`` (a value loss
      regresses ``value[:-1]`` on them);
    - ``advantages``: the policy-gradient advantages ``rho[t] * (rew[t+1] +
      gamma * v_{t+1} - value[t])``, ``v_{t+1}`` the target of the next
      observation (see :func:`vtrace`);
    - ``rho``: the clipped importance weights ``min(rho_bar, pi / mu)`` of
      the actions;
    - ``c``: the trace coefficients ``lam * min(c_bar, pi / mu)``.
    """
    vs: Any
    advantages: Any
    rho: Any
    c: Any


def _logp_rows(logp, name, rew):
    """The rows ``0 .. T-1`` of a log-probability tensor given with
    ``1 + T`` rows (an actor's info) or ``T`` rows; ``(T, B)``."""
    if not isinstance(logp, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got "
                        f"{type(logp).__name__}")
    T1, B = rew.shape[0], tuple(rew.shape[1:])
    if tuple(logp.shape[1:]) != B or logp.shape[0] not in (T1, T1 - 1):
        raise ValueError(
            f"{name} must be of shape (1 + T, B) = {(T1, *B)} or (T, B) = "
            f"{(T1 - 1, *B)}: one log-probability per action (sum the "
            f"log-probabilities of an action's dimensions), got "
            f"{tuple(logp.shape)}")
    return logp[:T1 - 1]


def _check_vtrace(gamma, lam, rho_bar, c_bar):
    """Raise ValueError for a discount, lambda or threshold out of its
    range."""
    _check_unit(gamma=gamma, lam=lam)
    for name, x in (("rho_bar", rho_bar), ("c_bar", c_bar)):
        if not float(x) > 0:  # NaN fails too
            raise ValueError(f"{name} must be positive (math.inf: no "
                             f"clipping), got {x!r}")


def vtrace(rew, fin, truncated, value, value_final=None, *, target_logp,
           behaviour_logp, gamma, lam=1.0, rho_bar=1.0, c_bar=1.0,
           mask=None):
    """V-trace targets and advantages of the actions in rows ``0..T-1``
    (IMPALA, Espeholt et al. 2018), for fragments collected by parameters
    older than the ones trained.

    Parameters
    ----------
    rew, fin, truncated, value, value_final, gamma, mask
        As in :func:`returns`: rows ``0 .. T``, shape ``(1 + T, B)``.
    target_logp : tensor, shape = (1 + T, B) or (T, B)
        Row ``t``: ``log pi(a_t | x_t)``, the log-probability of the action
        chosen in row ``t`` (recorded in ``state.act[t + 1]``) under the
        policy being trained, e.g.
        ``dist.log_prob(batch.state.act[1:])`` of the policy's distribution
        at ``batch.state.obs[:-1]``. A row ``T`` is ignored.
    behaviour_logp : tensor, shape = (1 + T, B) or (T, B)
        Row ``t``: ``log mu(a_t | x_t)``, the same action's log-probability
        under the policy that acted: what the actor recorded,
        ``batch.actor["logp"]`` (its row ``T``, from the lookahead, is
        ignored).
    lam : float
        The lambda of the traces, ``c[t] = lam * min(c_bar, pi / mu)``;
        1 (IMPALA's V-trace) by default.
    rho_bar, c_bar : float
        The clipping thresholds of the importance weights (IMPALA's
        defaults 1); ``math.inf`` does not clip.

    Returns
    -------
    VTrace
        ``(vs, advantages, rho, c)``, each of shape ``(T, B)``, 0 wherever
        ``mask[t+1]``; with the log-probabilities detached: no gradient
        flows through them (the targets and advantages are constants of
        the losses, as in IMPALA).

    Raises
    ------
    TypeError
        A log-probability is not a tensor.
    ValueError
        A log-probability is not shaped as the rows of ``rew`` (one per
        action), ``gamma`` or ``lam`` is outside ``[0, 1]``, ``rho_bar`` or
        ``c_bar`` is not positive, ``mask`` is not shaped as ``fin``, or the
        fragment has truncations and no ``value_final``.

    Notes
    -----
    With ``ratio[t] = exp(target_logp[t] - behaviour_logp[t])``, ``rho[t] =
    min(rho_bar, ratio[t])``, ``c[t] = lam * min(c_bar, ratio[t])`` and
    ``boot[t+1]`` the value after the transition into row ``t + 1``
    (``value[t+1]``; ``value_final[t+1]`` at a truncation; 0 at a
    termination), the target of ``value[t]`` is the paper's

    ``v_t = value[t] + sum_{k=t}^{e} gamma^(k-t) (c[t] ... c[k-1]) rho[k]
    (rew[k+1] + gamma * boot[k+1] - value[k])``,

    the sum cut, as :func:`gae`'s, at the first episode end ``fin[e+1]``
    from row ``t + 1`` on, or at ``e = T - 1``. The target of the next
    observation in ``advantages`` is ``v_{t+1}`` within an episode,
    ``value[T]`` at row ``T``, and ``boot[t+1]`` after an episode end (the
    true final observation's value at a truncation, 0 at a termination).
    Computed backwards, a loop over time only, on the tensors' device.

    On-policy (``target_logp == behaviour_logp``) with ``rho_bar, c_bar >=
    1`` every ratio is 1: ``vs`` are the lambda-returns, ``gae(...) +
    value[:-1]``, and ``advantages[t] = delta[t] + gamma * adv[t+1]``
    (``adv`` of :func:`gae`, cut at an episode end), which with ``lam = 1``
    is :func:`gae`'s advantage and ``vs`` the full :func:`returns`.

    Rows that no executed action led to (``mask = ~acted(fragment)``: the
    frozen rows of a sticky fragment, lost calls, an absent agent's rows)
    have ``rho = c = 0`` and all four results 0; such a row always ends an
    episode (``fin``), so the sums of the other rows never reach it, and a
    log-probability there (even ``-inf``) changes nothing.

    The lag. A fragment's rows ``0 .. T-1`` were all acted by the
    parameters of its ``meta.version`` (per column, ``(B,)``), which the
    recorded ``behaviour_logp`` carries; ``target_logp`` comes from the
    parameters being trained, ``lag`` versions later. The ratios correct
    each column for its own lag, whatever it is: ``same`` with
    parameters unchanged since the batch (lag 0, before any optimiser step
    on it) gives ratios of 1 and the lambda-returns above; ``single`` lags
    exactly one version, ``multi`` and ``cluster`` mix columns of different
    lags (at most ``max_lag``) in one batch, and the recursion never mixes
    columns. The lag enters nowhere else: it bounds how far the ratios
    drift from 1, so how much ``rho_bar`` and ``c_bar`` clip.

    Examples
    --------
    One env, an episode that terminates at row 2, the target policy twice
    as likely as the behaviour to take the first action, half as likely
    to take the second:

    >>> rew = torch.tensor([[0.0], [1.0], [1.0], [1.0]])
    >>> fin = torch.tensor([[True], [False], [True], [False]])
    >>> no = torch.zeros_like(fin)
    >>> value = torch.full((4, 1), 0.5)
    >>> behaviour = torch.log(torch.tensor([[0.25], [0.5], [0.5]]))
    >>> target = torch.log(torch.tensor([[0.5], [0.25], [0.5]]))
    >>> out = vtrace(rew, fin, no, value, target_logp=target,
    ...              behaviour_logp=behaviour, gamma=0.5)
    >>> out.rho.T, out.c.T
    (tensor([[1.0000, 0.5000, 1.0000]]), tensor([[1.0000, 0.5000, 1.0000]]))
    >>> out.vs.T
    tensor([[1.3750, 0.7500, 1.2500]])
    >>> out.advantages.T
    tensor([[0.8750, 0.2500, 0.7500]])
    """
    T = rew.shape[0] - 1
    target = _logp_rows(target_logp, "target_logp", rew)
    behaviour = _logp_rows(behaviour_logp, "behaviour_logp", rew)
    _check_vtrace(gamma, lam, rho_bar, c_bar)
    with torch.no_grad():
        ratio = torch.exp(target.detach() - behaviour.detach())
        rho = ratio.clamp(max=rho_bar)
        c = lam * ratio.clamp(max=c_bar)
        # a row no executed action led to weighs nothing (masked_fill also
        # replaces the NaN of a -inf - -inf ratio there)
        rho = _apply_mask(rho, mask, fin)
        c = _apply_mask(c, mask, fin)
        boot = _bootstrap(fin, truncated, value, value_final)
        ended = fin[1:]
        delta = rho * (rew[1:] + gamma * boot - value[:-1])
        # corr[t] = v_t - value[t]; after[t] = v_{t+1} - boot[t+1]: the
        # correction of the next observation's target, 0 past an episode
        # end and at row T
        corr = torch.empty_like(delta)
        after = torch.empty_like(delta)
        acc = torch.zeros_like(delta[0])
        for t in range(T - 1, -1, -1):
            acc = torch.where(ended[t], torch.zeros_like(acc), acc)
            after[t] = acc
            acc = delta[t] + gamma * c[t] * acc
            corr[t] = acc
        vs = value[:-1] + corr
        advantages = rho * (rew[1:] + gamma * (boot + after) - value[:-1])
        return VTrace(vs=_apply_mask(vs, mask, fin),
                      advantages=_apply_mask(advantages, mask, fin),
                      rho=rho, c=c)
