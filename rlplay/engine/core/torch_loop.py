"""The torch fragment loop: :func:`startup` and :func:`collect` for an env
batch of kind ``"torch"`` (a :class:`~rlplay.engine.envs.TorchSource`),
chosen by :func:`~.fragments.startup` and :func:`~.fragments.collect`
(:func:`~.fragments._torch`, the one test of the kind). It fills the
layout of :mod:`.layout`, exactly as the numpy loop would for the same
envs, with torch operations on the source's device, calling the actor
through the policy seam (:mod:`.policy`).

A fragment is written where the source lives: in the buffer itself when
it lives there (``same.rollout`` allocates it there,
:func:`~.fragments.prepare` with ``device=``), else in a fragment of the
context's own on the source's device, copied into the buffer once it is
collected (a worker's shared host buffer).

No step reads a value of the device back to the host: the source reports
what happened as tensors (:class:`~rlplay.engine.envs.TorchStepped`),
episode ends are written with masked operations whatever happened, the
running returns live on the device (a float64 sum of the rewards as the
source gave them, as :mod:`.accounting` keeps them), a stateful actor's
``hx`` is reset at every step with the (mostly all-false) mask of the
row's ``fin``, and the episode lengths of the whole fragment are
computed at its end, at once. Once per
fragment the source is asked whether an episode ended without its true
last observation (:meth:`~rlplay.engine.envs.TorchSource.finish`).

Space checks (``check_spaces``): a checked fragment is checked as a
whole once it is collected, from one host copy of it, with the messages
of the numpy loop (``env j step t: ...``); the actions were executed by
then (the numpy loop checks each one before the env gets it).
"""
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces

from .. import envs as _envs
from ..envs import TorchRow
from ..nested import getitem, suply
from ..shared import copy_
from .checks import _SpaceChecks, _final_label, _reset_label, _step_label
from .layout import (EpisodeStats, _row_fields, check_spaces_mode,
                     check_sticky)
from ..policy import as_policy, copier, fill_lookahead

__all__ = ["TorchContext", "startup", "collect"]


class _Step(NamedTuple):
    """What step ``t`` reads and writes, views made once: the actor's
    input (row ``t``), where its action and info go, the action the source
    gets (row ``t + 1``'s, ``(B, ...)``), the row the source writes (a
    :class:`~rlplay.engine.envs.TorchRow`), and rows ``t`` and ``t + 1`` of
    ``fin``, ``stepno``, ``rew``, the running returns and ``acted``."""
    row: Any
    act_out: Any
    info_out: Any
    act_env: Any
    out: Any
    fin: Any
    stepno: Any
    stepno_next: Any
    rew_next: Any
    running: Any
    running_next: Any
    acted_next: Any


class _Views:
    """The fragment a context writes for ``buffer`` (the buffer itself
    where it lives on the device, else one of its own there) and its
    per-row views, made once so that the loop only indexes."""

    def __init__(self, buffer, device):
        pyt = buffer.pyt
        self.buffer = buffer
        work = pyt if pyt.state.fin.device == device else suply(
            lambda x: torch.zeros_like(x, device=device), pyt)
        self.work = work
        T1 = work.state.fin.shape[0]
        self.rows = [getitem(work.state, slice(t, t + 1)) for t in range(T1)]
        self.actor = [getitem(work.actor, slice(t, t + 1)) for t in range(T1)]
        # the running return of each column's episode at each row: the
        # sum of its rewards as given (float64, see .accounting)
        self.running = running = torch.zeros_like(work.stats.ret)
        state = work.state
        self.steps = [_Step(
            row=self.rows[t], act_out=self.rows[t + 1].act,
            info_out=self.actor[t], act_env=getitem(state.act, t + 1),
            out=TorchRow(obs=getitem(state.obs, t + 1), fin=state.fin[t + 1],
                         truncated=work.truncated[t + 1],
                         final=getitem(work.final, t + 1),
                         info=getitem(work.env, t),
                         info_mask=getitem(work.env_mask, t)),
            fin=state.fin[t], stepno=state.stepno[t],
            stepno_next=state.stepno[t + 1], rew_next=state.rew[t + 1],
            running=running[t], running_next=running[t + 1],
            acted_next=work.acted[t + 1]) for t in range(T1 - 1)]
        # zeros of the statistics' dtypes (torch.where takes tensors)
        self.zeros = EpisodeStats(*[torch.zeros((), dtype=x.dtype,
                                                device=device)
                                    for x in work.stats])


class TorchContext:
    """The state of an ongoing collection from a torch source, carried from
    fragment to fragment (the :class:`~.context.Context` of the torch
    loop: the same attributes, ``last`` and ``hx`` tensors on the source's
    device; ``ret``, the running returns, float64 ``(B,)`` there too)."""

    def __init__(self, envs, buffer, worker=0, env_ids=None, generation=0,
                 seq=0):
        self.envs, self.device = envs, envs.device
        n_envs = envs.n_envs
        self.last = suply(lambda x: torch.zeros_like(x, device=self.device),
                          _row_fields(buffer.pyt, 0))
        self.hx = None
        self.policy = self.actor = None
        # the running returns as of ``last``
        self.ret = torch.zeros(n_envs, dtype=torch.float64,
                               device=self.device)
        self.seq, self.worker, self.generation = seq, worker, generation
        self.env_ids = torch.as_tensor(
            np.arange(n_envs) if env_ids is None
            else np.asarray(env_ids, np.int64), device=self.device)
        # call_envs calls applied (see .context), and the agent of each
        # column (0: a torch source has no agents)
        self.control = 0
        self.agent_ids = torch.as_tensor(envs.column_agents,
                                         device=self.device)
        self.spaces_checked = False
        self._fresh = False
        self._views, self._checks = {}, None
        # what the source gets: a copy of the actions, Box leaves clipped
        # into their bounds (see .layout)
        self.clip_actions = _torch_clipper(envs.action_space, self.device)

    def views(self, buffer):
        views = self._views.get(id(buffer))
        if views is None or views.buffer is not buffer:
            views = self._views[id(buffer)] = _Views(buffer, self.device)
        return views

    def space_checks(self):
        if self._checks is None:
            self._checks = _SpaceChecks(self.envs)
        return self._checks


def startup(envs, actor, buffer, seed_sequences=None, *, worker=0,
            env_ids=None, generation=0, seq=0):
    """:func:`~.fragments.startup` for a torch source (documented there):
    its :class:`TorchContext`."""
    if envs.n_envs != buffer.pyt.state.fin.shape[1]:
        raise ValueError(f"{envs.n_envs} envs for a buffer of "
                         f"{buffer.pyt.state.fin.shape[1]}")
    ctx = TorchContext(envs, buffer, worker, env_ids, generation, seq)
    policy = as_policy(actor, rows=ctx.device)
    state, truncated, final, stats = ctx.last
    envs.start(state.obs, seed_sequences)
    ctx._fresh = True
    suply(lambda leaf, value: leaf.copy_(torch.as_tensor(value)), state.act,
          _envs.space_placeholder(envs.action_space))
    state.fin.fill_(True)
    if final is not None:
        copy_(final, state.obs)
    ctx.hx = policy.initial_hx(suply(lambda x: x.unsqueeze(0), state))
    ctx.policy, ctx.actor = policy, actor
    return ctx


@torch.no_grad()
def collect(actor, buffer, ctx, *, sticky=False, version=0,
            check_spaces="first"):
    """:func:`~.fragments.collect` for a torch source (documented there;
    the checks of a checked fragment come once it is collected, see the
    module docstring)."""
    mode = check_spaces_mode(check_spaces)
    checking = mode == "always" or (mode == "first"
                                    and not ctx.spaces_checked)
    envs = ctx.envs
    if sticky:
        check_sticky(envs)
    if ctx.actor is not actor:
        ctx.policy, ctx.actor = as_policy(actor, rows=ctx.device), actor
    policy = ctx.policy
    views = ctx.views(buffer)
    work, fresh = views.work, ctx._fresh
    _begin_fragment(work, ctx)
    hx = ctx.hx
    copy_(work.hx, hx)
    copy_info, copy_act = copier(work.actor), copier(work.state.act)
    clip, advance, step_at = ctx.clip_actions, envs.advance, policy.step_at
    views.running[0].copy_(ctx.ret)
    # a feed-forward actor's hx is (): nothing to reset
    stateless = type(hx) is tuple and not hx
    for t, step in enumerate(views.steps):
        act, hx_next, info = step_at(t, step.row, hx, step.act_out)
        copy_info(step.info_out, info)
        copy_act(step.act_out, act)
        rew, _, lost = advance(clip(step.act_env), step.out)
        fin = step.out.fin
        # the step count the actor reads next: 0 where an episode starts
        torch.add(step.stepno, 1, out=step.stepno_next)
        step.stepno_next.masked_fill_(fin, 0)
        step.rew_next.copy_(rew)
        # the running returns, from 0 after every fin (an end, a lost call)
        torch.add(step.running, rew, out=step.running_next)
        torch.where(step.fin, rew, step.running_next, out=step.running_next)
        if lost is not None:
            torch.logical_not(lost, out=step.acted_next)
        hx = hx_next
        if not stateless:
            hx = policy.reset(hx, fin.clone())
    _end_fragment(policy, work, views, ctx, hx, version)
    envs.finish()
    if checking:
        _check_fragment(ctx, work, fresh)
        ctx.spaces_checked = True
    if work is not buffer.pyt:
        copy_(buffer.pyt, work)
    return buffer


def _begin_fragment(work, ctx):
    """Clear what the loop does not write at every row, and copy row 0
    from the end of the previous fragment."""
    work.acted.fill_(True)
    work.acted[0] = False
    copy_(_row_fields(work, 0), ctx.last)
    # env info is written where present: absent keys read zero
    suply(torch.Tensor.zero_, work.env)
    suply(torch.Tensor.zero_, work.env_mask)


def _end_fragment(policy, work, views, ctx, hx, version):
    """The episode statistics of the whole fragment (and ``final`` where
    the source leaves it to the loop), the lookahead ``info`` of row
    ``T``, ``meta``; advance ``ctx``."""
    T = len(views.steps)
    state = work.state
    if work.final is not None and ctx.envs.final_is_obs:
        copy_(getitem(work.final, slice(1, None)),
              getitem(state.obs, slice(1, None)))
    # where an executed action ended an episode (not a lost call): its
    # return, and its length, its last step count plus the step that
    # ended it
    ends = state.fin[1:] & work.acted[1:]
    zeros = views.zeros
    torch.where(ends, views.running[1:], zeros.ret, out=work.stats.ret[1:])
    torch.where(ends, state.stepno[:-1] + 1, zeros.length,
                out=work.stats.length[1:])
    ctx.ret.copy_(views.running[T])
    fill_lookahead(policy, views.actor[T], views.rows[T], hx)
    meta = work.meta
    meta.version.fill_(version)
    meta.worker.fill_(ctx.worker)
    meta.env.copy_(ctx.env_ids)
    meta.seq.fill_(ctx.seq)
    meta.generation.fill_(ctx.generation)
    meta.control.fill_(ctx.control)
    meta.agent.copy_(ctx.agent_ids)
    ctx.hx = hx
    ctx.seq += 1
    ctx._fresh = False
    copy_(ctx.last, _row_fields(work, T))


def _check_fragment(ctx, work, fresh):
    """The space checks of a collected fragment, from one host copy."""
    checks = ctx.space_checks()
    state, final, acted = suply(lambda x: x.cpu().numpy(),
                                (work.state, work.final, work.acted))
    if fresh:  # row 0 holds the reset observations
        checks.observation(getitem(state.obs, 0), _reset_label)
    for t in range(len(state.fin) - 1):
        checks.action(getitem(state.act, t + 1), t)
        checks.observation(getitem(state.obs, t + 1),
                           _step_label(t, state.fin[t + 1]))
        checks.reward(state.rew[t + 1], t)
        ended = np.flatnonzero(state.fin[t + 1] & acted[t + 1])
        if final is not None and ended.size:
            checks.observation(getitem(getitem(final, t + 1), ended),
                               _final_label(t), ended)


class _Bounds:
    """The bounds of a ``Box`` leaf, tensors on a device."""

    def __init__(self, space, device):
        self.low = torch.as_tensor(space.low, device=device)
        self.high = torch.as_tensor(space.high, device=device)


_UNBOUNDED = object()


def _bounds(space, device):
    if isinstance(space, spaces.Box):
        return _Bounds(space, device)
    if isinstance(space, spaces.Dict):
        return {key: _bounds(sub, device) for key, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_bounds(sub, device) for sub in space)
    return _UNBOUNDED


def _clip_leaf(act, bounds):
    if bounds is _UNBOUNDED:
        return act.clone()
    return torch.clamp(act, bounds.low, bounds.high)


def _torch_clipper(space, device):
    """``clip(act)``: the actions the source gets, new tensors (the source
    may keep them): ``Box`` leaves clipped into their bounds (NaN stays),
    the others copied."""
    bounds = _bounds(space, device)
    if bounds is _UNBOUNDED:
        return torch.clone
    return lambda act: suply(_clip_leaf, act, bounds)
