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
"""
import numpy as np
import torch

from .core.layout import terminated

__all__ = ["returns", "gae", "n_step", "terminated", "frozen"]


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
