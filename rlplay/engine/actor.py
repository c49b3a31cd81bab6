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
whose action is never executed (made once a fragment, for row ``T``'s
``info``, only for an actor that returns one). ``info`` is a nested
structure of tensors ``(1, B, ...)`` recorded alongside the state.

Collection calls ``reset(hx, at)`` right after the envs in the bool mask
``at`` (shape ``(B,)``) ended an episode, so the next ``step`` sees fresh
state for them; ``reset`` returns a new ``hx`` and never mutates its input.

:func:`check_actor` tells up front (in the core loops) whether an object is
an actor at all.
"""
import inspect

import torch
from torch import nn

from .nested import suply

__all__ = ["BaseActorModule", "PolicyActor", "check_actor",
           "squashed_normal"]

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
    if _reset_problem(params):
        raise TypeError(
            f"{cls.__name__}.reset has signature reset{signature}; the actor "
            f"API expects reset(self, hx, at): two positional inputs, the "
            f"state and the bool mask of envs to reset")


def _reset_problem(params):
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names != ["hx", "at"] or len(params) != 2


def check_actor(actor):
    """Check that ``actor`` is an actor: a :class:`torch.nn.Module` with the
    actor API ``step`` and ``reset``.

    A :class:`BaseActorModule` had its signatures checked when its class was
    defined; any other module with ``step`` and ``reset`` methods has them
    checked here, with the same messages.

    Parameters
    ----------
    actor : object

    Returns
    -------
    actor : torch.nn.Module
        The same object.

    Raises
    ------
    TypeError
        ``actor`` is not a module, lacks ``step`` or ``reset``, does not
        implement ``step`` (a bare :class:`BaseActorModule`), or has
        signatures other than the actor API's.

    Examples
    --------
    >>> check_actor(None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: actor must be a torch.nn.Module with the actor API ... got NoneType
    """
    if not isinstance(actor, nn.Module) or not callable(
            getattr(actor, "step", None)) or not callable(
            getattr(actor, "reset", None)):
        hint = ""
        if isinstance(actor, nn.Module):
            # a plain policy: the adapter is the fix nine times out of ten
            hint = (f": a plain policy (observations in, logits or a "
                    f"distribution out) becomes an actor as "
                    f"PolicyActor({type(actor).__name__}(...))")
        raise TypeError(f"actor must be a torch.nn.Module with the actor "
                        f"API step(...)/reset(...) (see BaseActorModule), "
                        f"got {type(actor).__name__}{hint}")
    if isinstance(actor, BaseActorModule):
        if type(actor).step is BaseActorModule.step:
            raise TypeError(f"actor {type(actor).__name__} does not "
                            f"implement step(): subclass BaseActorModule "
                            f"and define step(self, stepno, obs, act, rew, "
                            f"fin, /, *, hx, virtual)")
        return actor
    # a module that follows the API without the base class: its bound
    # methods' signatures (no `self`) as __init_subclass__ checks a subclass
    name = type(actor).__name__
    for method, problem_of, expected in (
            ("step", _step_problem, "step(self, stepno, obs, act, rew, fin, "
                                    "/, *, hx, virtual)"),
            ("reset", _reset_problem, "reset(self, hx, at)")):
        try:
            signature = inspect.signature(getattr(actor, method))
        except (TypeError, ValueError):
            continue  # a builtin or C method: nothing to inspect
        problem = problem_of(list(signature.parameters.values()))
        if problem:
            detail = f": {problem}" if isinstance(problem, str) else ""
            raise TypeError(f"{name}.{method} has signature "
                            f"{method}{signature}; the actor API expects "
                            f"{expected}{detail}")
    return actor


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

    Continuous actions (a ``Box``). A Gaussian policy returns
    ``Independent(Normal(mean, std), 1)``; its samples fall outside the
    ``Box`` now and then. The row records the sampled action and ``logp``
    is its log-probability; the env executes it clipped into the bounds
    (see :mod:`rlplay.engine.core.layout`, "Out-of-bound continuous
    actions"), as Stable-Baselines3 and CleanRL do: ``logp`` is exact for
    the recorded action, of which the executed one is a function. Where
    the executed action must be the recorded one, squash the Gaussian into
    the ``Box`` with :func:`squashed_normal`: every sample lies inside,
    nothing is clipped, and ``logp`` (the tanh's change of variables
    included) is that of the executed action. In eval mode (greedy) a
    squashed Gaussian takes the squashed mean, ``tanh`` of the Gaussian's
    mean scaled into the ``Box``.

    Floating observations are cast to the dtype of the policy's
    (first floating) parameters before the policy sees them, as
    Stable-Baselines3 and CleanRL cast for their users: a ``float64``
    ``Box`` (MuJoCo's) reaches a ``float32`` policy as ``float32``, and a
    policy made ``double()`` gets ``float64``. Where the dtypes agree (a
    ``float32`` ``Box`` and a ``float32`` policy) nothing is cast; integer
    and bool observations (pixels, ``Discrete``) are left as they are, and
    a policy without floating parameters gets the observations unchanged.
    The recorded ``state.obs`` keeps the env's dtype.

    For logits, :meth:`step` samples with the operations of
    :class:`torch.distributions.Categorical` without building one (the
    object costs more than a small policy): the actions and ``logp`` are
    identical to ``Categorical(logits=...)``'s for the same generator
    state. :meth:`forward` still returns the distribution, and a subclass
    that overrides it is called as before.

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
        out, value = self._policy(obs)
        if not isinstance(out, torch.distributions.Distribution):
            # argument validation costs a third of a small policy's step;
            # invalid (NaN) logits still fail, in sample()
            out = torch.distributions.Categorical(logits=out,
                                                  validate_args=False)
        return out, value

    def _policy(self, obs):
        out = self.policy(self._cast(obs))
        value = None
        if isinstance(out, tuple):
            out, value = out
            value = value.squeeze(-1) if value.dim() == obs.dim() else value
        return out, value

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        greedy = not self.training and self.greedy_in_eval
        if type(self).forward is PolicyActor.forward and not (
                self._forward_hooks or self._forward_pre_hooks
                or "forward" in self.__dict__):
            out, value = self._policy(obs)
            if isinstance(out, torch.Tensor):
                # logits: sample without building a Categorical (which
                # costs more than a small policy's forward pass)
                action, logp = _sample_logits(out, greedy)
                info = {"logp": logp}
                if value is not None:
                    info["value"] = value
                return action, (), info
            dist = out
        else:  # another forward, or hooks on this module: call it
            dist, value = self(obs)
        action = _mode(dist) if greedy else dist.sample()
        info = {"logp": dist.log_prob(action)}
        if value is not None:
            info["value"] = value
        return action, (), info

    def reset(self, hx, at):
        return ()

    def _cast(self, obs):
        """``obs`` with its floating leaves in the dtype of the policy's
        parameters (see the Notes)."""
        dtype = next((p.dtype for p in self.policy.parameters()
                      if p.is_floating_point()), None)
        if dtype is None:
            return obs
        if isinstance(obs, torch.Tensor):  # the common case, no walk
            return obs.to(dtype) if obs.is_floating_point() \
                and obs.dtype != dtype else obs
        return suply(lambda x: x.to(dtype) if isinstance(x, torch.Tensor)
                     and x.is_floating_point() and x.dtype != dtype else x,
                     obs)


def _sample_logits(logits, greedy=False):
    """``Categorical(logits=logits)``'s ``sample()`` (or ``mode``) and its
    ``log_prob``, without the distribution object.

    The same operations as ``torch.distributions.Categorical`` (torch 2.x):
    the logits are normalised by ``logsumexp``, the probabilities are their
    ``softmax``, and a sample is ``torch.multinomial(probs_2d, 1, True)``,
    so that for the same generator state the actions and log-probabilities
    are identical to the distribution's.
    """
    logits = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1)
    if greedy:
        action = probs.argmax(dim=-1)
    else:
        n_events = probs.shape[-1]
        action = torch.multinomial(probs.reshape(-1, n_events), 1, True)
        action = action.reshape(probs.shape[:-1])
    logp = logits.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    return action, logp


def _mode(dist):
    if isinstance(dist, torch.distributions.Categorical):
        return dist.probs.argmax(-1)
    if isinstance(dist, torch.distributions.TransformedDistribution):
        # the transformed mode of the base (tanh of a Gaussian's mean, for
        # a squashed Gaussian), not the mode of the transformed density
        x = _mode(dist.base_dist)
        for transform in dist.transforms:
            x = transform(x)
        return x
    return dist.mode


def squashed_normal(mean, std, low, high):
    """A Gaussian squashed into the box ``[low, high]``: ``tanh`` of
    ``Independent(Normal(mean, std), 1)``, scaled and shifted onto the box.

    For :class:`PolicyActor` over a ``Box`` action space: every sample lies
    strictly inside the box, so the env executes exactly the recorded
    action, and ``log_prob`` of a sample is exact for it (the inverse of
    the tanh is cached for the value just sampled, so a sample close to
    the bounds does not lose precision; the log-determinant of the squash
    is included).

    Parameters
    ----------
    mean, std : tensor, shape = (..., D)
        Of the Gaussian before the squash.
    low, high : array-like, shape = (D,)
        The bounds (``space.low``, ``space.high``), finite.

    Returns
    -------
    torch.distributions.TransformedDistribution
        Over ``(..., D)``, one joint ``log_prob`` per action.

    Raises
    ------
    ValueError
        Bounds that are not finite, or not ``low < high``.

    Examples
    --------
    >>> dist = squashed_normal(torch.zeros(3, 2), torch.ones(3, 2),
    ...                        [-1.0, 0.0], [1.0, 4.0])
    >>> act = dist.sample()
    >>> bool(((act > torch.tensor([-1.0, 0.0]))
    ...       & (act < torch.tensor([1.0, 4.0]))).all())
    True
    >>> dist.log_prob(act).shape
    torch.Size([3])
    """
    D = torch.distributions
    low = torch.as_tensor(low, dtype=mean.dtype, device=mean.device)
    high = torch.as_tensor(high, dtype=mean.dtype, device=mean.device)
    if not bool(torch.isfinite(low).all() and torch.isfinite(high).all()
                and (low < high).all()):
        raise ValueError(f"squashed_normal needs finite bounds with low < "
                         f"high, got low={low.tolist()} and "
                         f"high={high.tolist()}")
    base = D.Independent(D.Normal(mean, std), 1)
    return D.TransformedDistribution(base, [
        D.TanhTransform(cache_size=1),
        D.AffineTransform((high + low) / 2, (high - low) / 2, event_dim=1)])
