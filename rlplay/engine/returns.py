"""Discounted returns and GAE computed exactly from a fragment.

Notation follows :mod:`rlplay.engine.core`: row ``t + 1`` of a fragment holds
the reward ``rew[t+1]`` of the action taken at row ``t`` and whether that
transition ended an episode (``fin[t+1]``), by termination or by truncation
(``truncated[t+1]``). Results are indexed by the row of the action, ``t = 0
.. T-1``, shape ``(T, B)``.

- A termination cuts the return: nothing is bootstrapped after it.
- A truncation cuts the episode but not the value: the return bootstraps
  from ``value_final[t+1]``, the value of the true final observation.
- At the end of the fragment the return bootstraps from ``value[T]``, the
  value of the observation in row ``T`` (or from ``value_final[T]`` when the
  last transition was truncated).
"""
import torch

__all__ = ["returns", "gae", "terminated"]


def terminated(fin, truncated):
    """Rows whose transition ended an episode by termination."""
    return fin & ~truncated


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
    return torch.where(fin & ~truncated, torch.zeros_like(next_value),
                       next_value)


def returns(rew, fin, truncated, value, value_final=None, *, gamma,
            n=None):
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
        return G
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    G = torch.empty_like(boot)
    for t in range(T):
        stop = min(t + n, T) - 1
        acc = rew[stop] + gamma * boot[stop]
        for k in range(stop - 1, t - 1, -1):
            acc = rew[k] + gamma * torch.where(ended[k], boot[k], acc)
        G[t] = acc
    return G


def gae(rew, fin, truncated, value, value_final=None, *, gamma, lam):
    """Generalised advantage estimates of the actions in rows ``0..T-1``.

    Parameters are as in :func:`returns`; ``lam`` is GAE's lambda.

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
    return adv
