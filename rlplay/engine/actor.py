"""The actor API: what collection calls, a base class for feed-forward
actors written on batches, and an adapter for plain policies.

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

:class:`FeedForwardActor` is an actor made of ``act(obs)`` on a batch of
observations ``(N, ...)``, the form a feed-forward policy is usually
written in (and the one the fragment loops call fastest);
:class:`PolicyActor` adapts a plain policy.

:func:`check_actor` tells up front (in the core loops) whether an object is
an actor at all.
"""
import inspect

import numpy as np
import torch
from torch import nn

from .distributions import _mode, _sample_logits
from .nested import flatten, suply
from .signatures import (_check_act_signature, _check_reset_signature,
                         _check_step_signature, _reset_problem, _step_problem)

__all__ = ["BaseActorModule", "FeedForwardActor", "PolicyActor",
           "check_actor"]

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
        implement ``step`` (a bare :class:`BaseActorModule`) or ``act`` (a
        bare :class:`FeedForwardActor`), or has
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
        if isinstance(actor, FeedForwardActor) and \
                type(actor).act is FeedForwardActor.act and \
                type(actor).step is FeedForwardActor.step:
            raise TypeError(f"actor {type(actor).__name__} does not "
                            f"implement act(): a FeedForwardActor defines "
                            f"act(self, obs), the actions and info of N "
                            f"envs from their observations (N, ...)")
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


class FeedForwardActor(BaseActorModule):
    """Base class of feed-forward actors written on a batch of
    observations: implement :meth:`act`; :meth:`step` is made of it.

    ``act(obs)`` maps the observations of ``N`` envs, ``(N, ...)``, to
    their actions, ``(N, ...)``, and an ``info`` of tensors ``(N, ...)``
    (``{}`` for none), as a policy of Stable-Baselines3 or CleanRL is
    written. The actor keeps no state: its ``hx`` is ``()``.

    :meth:`step` folds the time and env axes of its rows into one batch,
    ``(T * B, ...)``, calls ``act``, and gives its outputs back as rows
    ``(T, B, ...)``: a learner that replays a fragment calls ``step`` as
    it would any actor's. The fragment loops call ``act`` themselves, on
    each row's observations ``(B, ...)`` (views made once per buffer), and
    copy its outputs into the row; the first step of a fragment goes
    through ``step`` and is checked (see :mod:`rlplay.engine.core.policy`).
    A subclass that overrides ``step`` is called through its ``step``.

    Examples
    --------
    >>> class Greedy(FeedForwardActor):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.net = nn.Linear(4, 2)
    ...     def act(self, obs):
    ...         logits = self.net(obs)
    ...         return logits.argmax(-1), {"value": logits.max(-1).values}
    >>> actor = Greedy()
    >>> act, hx, info = actor.step(torch.zeros(1, 3, dtype=torch.long),
    ...                            torch.zeros(1, 3, 4), None, None, None,
    ...                            hx=(), virtual=False)
    >>> act.shape, hx, info["value"].shape
    (torch.Size([1, 3]), (), torch.Size([1, 3]))
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "act" in cls.__dict__:
            _check_act_signature(cls, cls.__dict__["act"])

    def act(self, obs):
        """The actions of ``N`` envs from their observations.

        Parameters
        ----------
        obs : nested tensors, shape = (N, ...)

        Returns
        -------
        act : nested tensors, shape = (N, ...)
        info : nested tensors, shape = (N, ...)
            ``{}`` for none.
        """
        raise NotImplementedError

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        lead = flatten(obs)[0].shape[:2]  # (T, B)
        out = self.act(suply(_fold, obs))
        if not (type(out) is tuple and len(out) == 2):
            raise TypeError(f"{type(self).__name__}.act must return "
                            f"(action, info), got {_describe(out)}")
        action, info = out
        n = lead[0] * lead[1]

        def unfold(x, what):
            if not isinstance(x, torch.Tensor) or x.dim() < 1 or \
                    x.shape[0] != n:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) \
                    else type(x).__name__
                raise ValueError(f"{type(self).__name__}.act returned "
                                 f"{what} {shape} for {n} observations: "
                                 f"act gives one row per observation, "
                                 f"(N, ...)")
            return x.unflatten(0, lead)

        return (suply(lambda x: unfold(x, "an action of shape"), action), (),
                suply(lambda x: unfold(x, "an info leaf of shape"), info))

    def reset(self, hx, at):
        return ()


def _fold(x):
    return x.flatten(0, 1)


def _describe(out):
    if type(out) is tuple:
        return f"a tuple of {len(out)}"
    return type(out).__name__


class PolicyActor(FeedForwardActor):
    """Make a plain feed-forward policy usable as an actor.

    Parameters
    ----------
    policy : nn.Module
        Maps a batch of observations ``(N, ...)`` to action logits ``(N,
        n)`` for a ``Discrete`` action space, to a
        :class:`torch.distributions.Distribution` of batch ``(N,)``, or to a
        tuple ``(logits or distribution, value)``, the value ``(N,)`` or
        ``(N, 1)``.
    greedy_in_eval : bool
        In eval mode (``actor.eval()``) take the most likely action instead
        of sampling.

    Raises
    ------
    TypeError
        ``policy`` not a ``torch.nn.Module``, ``greedy_in_eval`` not a
        bool.

    Notes
    -----
    A :class:`FeedForwardActor`: the policy (and :meth:`forward`) gets one
    batch of observations, the rows of a step folded together, ``(T * B,
    ...)``, so that a convolution over ``(N, C, H, W)`` is used as it is.

    ``info`` holds ``logp`` (the log-probability of the chosen action) and
    ``value`` when the policy returns one, each of shape ``(1, B)`` in a
    step's outputs; for a
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
    the ``Box`` with :func:`~rlplay.engine.distributions.squashed_normal`:
    every sample lies inside, nothing is clipped, and ``logp`` (the tanh's
    change of variables included) is that of the executed action. In eval
    mode (greedy) a squashed Gaussian takes the squashed mean, ``tanh`` of
    the Gaussian's mean scaled into the ``Box``.

    Floating observations are cast to the dtype of the policy's
    (first floating) parameters before the policy sees them, as
    Stable-Baselines3 and CleanRL cast for their users: a ``float64``
    ``Box`` (MuJoCo's) reaches a ``float32`` policy as ``float32``, and a
    policy made ``double()`` gets ``float64``. Where the dtypes agree (a
    ``float32`` ``Box`` and a ``float32`` policy) nothing is cast; integer
    and bool observations (pixels, ``Discrete``) are left as they are, and
    a policy without floating parameters gets the observations unchanged.
    The recorded ``state.obs`` keeps the env's dtype.

    For logits, :meth:`act` samples with the operations of
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
        if not isinstance(policy, nn.Module):
            raise TypeError(f"policy must be a torch.nn.Module (of "
                            f"observations to logits or a distribution), "
                            f"got {type(policy).__name__} {policy!r}")
        if not isinstance(greedy_in_eval, (bool, np.bool_)):
            raise TypeError(f"greedy_in_eval must be True or False, got "
                            f"{type(greedy_in_eval).__name__} "
                            f"{greedy_in_eval!r}")
        greedy_in_eval = bool(greedy_in_eval)
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
            # one value per observation: (N, 1) is read as (N,)
            value = value.squeeze(-1) if value.dim() == 2 \
                and value.shape[-1] == 1 else value
        return out, value

    def act(self, obs):
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
                return action, info
            dist = out
        else:  # another forward, or hooks on this module: call it
            dist, value = self(obs)
        action = _mode(dist) if greedy else dist.sample()
        info = {"logp": dist.log_prob(action)}
        if value is not None:
            info["value"] = value
        return action, info

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
