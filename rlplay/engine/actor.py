"""The actor API: what collection calls, and an adapter for plain policies.

An actor is a :class:`torch.nn.Module` with two methods::

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return act, hx, info

    def reset(self, hx, at):
        return hx

Inputs are time-major, ``(1, B, ...)`` during collection and ``(1 + T, B,
...)`` when a learner replays a fragment. ``fin[t]`` means that ``obs[t]``
starts a new episode (``act[t]`` and ``rew[t]`` then belong to the episode
that ended: they are not inputs of the new one).
``hx`` is the recurrent state (``()`` for a feed-forward actor); ``None``
asks the actor to initialise it. ``virtual=True`` marks a lookahead call
whose action is never executed. ``info`` is a nested structure of tensors
``(1, B, ...)`` recorded alongside the state.

Collection calls ``reset(hx, at)`` right after the envs in the bool mask
``at`` (shape ``(B,)``) ended an episode, so the next ``step`` sees fresh
state for them; ``reset`` returns a new ``hx`` and never mutates its input.
"""
import inspect

import torch
from torch import nn

from .nested import suply

__all__ = ["BaseActorModule", "PolicyActor"]

_STEP_POSITIONAL = ("stepno", "obs", "act", "rew", "fin")
_STEP_KEYWORD = ("hx", "virtual")


def _step_problem(params):
    """What is wrong with ``step``'s parameters (``self`` excluded), or
    ``None``."""
    kinds = {p.name: p.kind for p in params}
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return "it must not take *args or **kwargs"
    positional = [p.name for p in params if p.name not in _STEP_KEYWORD
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if tuple(positional) != _STEP_POSITIONAL:
        return (f"its positional inputs are ({', '.join(positional)}), "
                f"expected ({', '.join(_STEP_POSITIONAL)}) in this order")
    if any(kinds[name] is not inspect.Parameter.POSITIONAL_ONLY
           for name in positional):
        return "the five inputs must be positional-only: add '/' after fin"
    keyword = [p.name for p in params if p.name not in positional]
    missing = [name for name in _STEP_KEYWORD if name not in keyword]
    extra = [name for name in keyword if name not in _STEP_KEYWORD]
    if missing or extra:
        return (f"its keyword parameters are ({', '.join(keyword)}), "
                f"expected (hx, virtual)")
    if any(kinds[name] is not inspect.Parameter.KEYWORD_ONLY
           for name in _STEP_KEYWORD):
        return "hx and virtual must be keyword-only: add '*' before hx"
    return None


def _check_step_signature(cls, fn):
    signature = inspect.signature(fn)
    problem = _step_problem(list(signature.parameters.values())[1:])
    if problem is not None:
        raise TypeError(
            f"{cls.__name__}.step has signature step{signature}; the actor "
            f"API expects step(self, stepno, obs, act, rew, fin, /, *, hx, "
            f"virtual): {problem}")


def _check_reset_signature(cls, fn):
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if names != ["hx", "at"] or len(params) != 2:
        raise TypeError(
            f"{cls.__name__}.reset has signature reset{signature}; the actor "
            f"API expects reset(self, hx, at): two positional inputs, the "
            f"state and the bool mask of envs to reset")


class BaseActorModule(nn.Module):
    """Base class of actors; checks the signatures of a subclass at
    definition time.

    Subclasses implement :meth:`step`. The default :meth:`reset` returns
    ``()`` for a feed-forward actor's ``hx == ()``, and otherwise zeroes
    every ``hx`` leaf along dimension 1 at the envs in ``at``, the layout of
    :class:`torch.nn.GRU` and :class:`torch.nn.LSTM` states
    ``(layers, B, H)``; override it for another layout.

    Attributes
    ----------
    hx_dim : int
        The env dimension of every ``hx`` leaf (used to collate fragments
        from several workers), 1 by default.
    """

    hx_dim = 1

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            _check_step_signature(cls, cls.__dict__["step"])
        if "reset" in cls.__dict__:
            _check_reset_signature(cls, cls.__dict__["reset"])

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        """One decision for every env.

        Parameters
        ----------
        stepno : tensor, int64, shape = (1, B)
            Steps since the episode started.
        obs : nested tensors, shape = (1, B, ...)
            Current observation ``x_t``.
        act : nested tensors, shape = (1, B, ...)
            The action that led to ``x_t``.
        rew : tensor, float32, shape = (1, B)
            The reward of that transition.
        fin : tensor, bool, shape = (1, B)
            ``obs`` starts a new episode.
        hx : nested tensors or None
            Recurrent state, ``()`` for none, ``None`` to initialise.
        virtual : bool
            The action will not be executed (a lookahead).

        Returns
        -------
        act : nested tensors, shape = (1, B, ...)
        hx : nested tensors
        info : nested tensors, shape = (1, B, ...)
        """
        raise NotImplementedError

    def reset(self, hx, at):
        """A new ``hx`` with the envs in ``at`` (bool, shape = (B,)) reset."""
        return suply(lambda h: h.masked_fill(_expand(at, h, self.hx_dim), 0),
                     hx)


def _expand(at, h, dim):
    shape = [1] * h.dim()
    shape[dim] = -1
    return at.view(shape).to(h.device)


class PolicyActor(BaseActorModule):
    """Make a plain feed-forward policy usable as an actor.

    Parameters
    ----------
    policy : nn.Module
        Maps an observation batch to action logits for a ``Discrete`` action
        space, to a :class:`torch.distributions.Distribution`, or to a tuple
        ``(logits or distribution, value)``.
    greedy_in_eval : bool
        In eval mode (``actor.eval()``) take the most likely action instead
        of sampling.

    Notes
    -----
    ``info`` holds ``logp`` (the log-probability of the chosen action) and
    ``value`` when the policy returns one, each of shape ``(1, B)``; for a
    distribution with a batch of per-dimension probabilities (a plain
    ``Normal`` over a ``Box``) ``logp`` keeps those dimensions: wrap it in
    :class:`torch.distributions.Independent` for one joint ``logp``.

    Examples
    --------
    >>> actor = PolicyActor(nn.Sequential(nn.Linear(4, 32), nn.Tanh(),
    ...                                   nn.Linear(32, 2)))
    """

    def __init__(self, policy, greedy_in_eval=True):
        super().__init__()
        self.policy = policy
        self.greedy_in_eval = greedy_in_eval

    def forward(self, obs):
        """Distribution and (possibly ``None``) value of observations."""
        out = self.policy(obs)
        value = None
        if isinstance(out, tuple):
            out, value = out
            value = value.squeeze(-1) if value.dim() == obs.dim() else value
        if not isinstance(out, torch.distributions.Distribution):
            # argument validation costs a third of a small policy's step;
            # invalid (NaN) logits still fail, in sample()
            out = torch.distributions.Categorical(logits=out,
                                                  validate_args=False)
        return out, value

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        dist, value = self(obs)
        if not self.training and self.greedy_in_eval:
            action = _mode(dist)
        else:
            action = dist.sample()
        info = {"logp": dist.log_prob(action)}
        if value is not None:
            info["value"] = value
        return action, (), info

    def reset(self, hx, at):
        return ()


def _mode(dist):
    if isinstance(dist, torch.distributions.Categorical):
        return dist.probs.argmax(-1)
    return dist.mode
