"""The fragment loop: :func:`prepare` allocates a fragment buffer,
:func:`startup` resets the envs and returns the :class:`~.context.Context`
of an ongoing collection, and :func:`collect` fills a buffer with the next
fragment in place, as laid out in :mod:`.layout`. It steps the envs
through the env adapter's :class:`~rlplay.engine.envs.EnvBatch` and calls
the actor through a policy (:mod:`rlplay.engine.policy`).

An env batch of kind ``"torch"`` (a torch-native source) is stepped by
the torch loop of :mod:`.torch_loop` instead, with the same layout,
checks and policy seam: :func:`startup` and :func:`collect` choose it here
by :func:`_torch`, the one test of the kind (which
:func:`~.episodes.evaluate` also asks, to choose the episode loop of
:mod:`.torch_episodes`).
"""
import numpy as np
import torch

from .. import envs as _envs
from ..envs import as_batch
from ..envs.rows import put_at
from ..nested import flatten, getitem, suply
from ..shared import Aliased, aliased, copy_, torchify
from .checks import (_CHECK_HINT, _final_label, _raise_cast, _reset_label,
                     _step_label)
from .context import Context
from .finals import fill_final, fill_final_from_obs
from .layout import (EpisodeStats, Fragment, Meta, _check_counts,
                     _row_fields, _state_example, check_spaces_mode,
                     check_sticky)
from ..policy import as_policy, copier, fill_lookahead
from . import torch_loop

__all__ = ["prepare", "startup", "collect", "fragment_device"]


def _torch(envs):
    """Whether the torch loops step ``envs`` (its kind): the one place
    that chooses the loops."""
    return getattr(envs, "kind", "numpy") == "torch"


def fragment_device(envs):
    """Where the fragments of ``envs`` are written: a torch source's device
    (:func:`prepare` with ``device=`` allocates a buffer there), else
    ``None`` (the host)."""
    return envs.device if _torch(envs) else None


def prepare(env, actor, n_steps, n_envs, *, env_info=None, final=True,
            shared=False, pinned=False, device=None):
    """Allocate a fragment buffer laid out for ``env`` and ``actor``.

    The actor is called once, virtually, on a zero state to learn the
    structure of its actions, ``hx`` and ``info``; these are checked against
    the spaces of ``env``.

    Parameters
    ----------
    env : gymnasium.Env or EnvBatch
        Any one of the envs, or the env batch (only the spaces are used).
    actor : BaseActorModule
    n_steps, n_envs : int
        ``T`` and ``B``, at least 1.
    env_info : dict or None
        ``{key: example}``: env info keys to record
        (see :func:`rlplay.engine.envs.info_example`).
    final : bool
        Record final observations.
    shared, pinned : bool
        Allocate in shared or page-locked memory.
    device : torch.device or str, optional
        Allocate on this device (:func:`fragment_device`: where a torch
        source writes); not with ``shared`` or ``pinned`` (host memory).

    Returns
    -------
    buffer : Aliased(npy, pyt)
        Two :class:`~.layout.Fragment` views of one zero-filled memory
        (``npy`` ``None`` on a device other than the CPU).

    Raises
    ------
    TypeError, ValueError
        Not an actor (:func:`~rlplay.engine.actor.check_actor`), bad
        counts, unsupported spaces, or an actor whose action, ``hx`` or
        ``info`` do not fit.
    """
    policy = as_policy(actor)
    _check_counts(n_steps, n_envs)
    example = _state_example(env)
    row = torchify(example, 1, n_envs)
    _, _, info = policy.probe(row, env.observation_space)
    hx0 = policy.initial_hx(row)

    device = None if device is None else torch.device(device)
    if device is not None and device.type != "cpu" and (shared or pinned):
        raise ValueError(f"a buffer on device={str(device)!r} cannot be "
                         f"shared={shared} or pinned={pinned} (host memory)")
    on_device = device is not None and device.type != "cpu"

    def alloc(tree, *leading):
        if on_device:
            return suply(lambda x: torch.zeros(
                (*leading, *x.shape), device=device, dtype=x.dtype
                if isinstance(x, torch.Tensor) else torchify(x).dtype), tree)
        return aliased(tree, *leading, shared=shared, pinned=pinned).pyt

    T1 = n_steps + 1
    info_ex = _envs.info_example(env_info)
    pyt = Fragment(
        state=alloc(example, T1, n_envs),
        truncated=alloc(np.zeros((), bool), T1, n_envs),
        final=alloc(example.obs, T1, n_envs) if final else None,
        actor=alloc(suply(lambda x: x[0, 0], info), T1, n_envs),
        env=alloc(info_ex, n_steps, n_envs),
        env_mask=alloc({k: np.zeros((), bool) for k in info_ex},
                       n_steps, n_envs),
        hx=alloc(hx0),
        stats=alloc(EpisodeStats(np.zeros((), np.float64),
                                 np.zeros((), np.int64)), T1, n_envs),
        meta=alloc(Meta(*[np.zeros((), np.int64)] * len(Meta._fields)),
                   n_envs),
        acted=alloc(np.zeros((), bool), T1, n_envs),
    )
    if on_device:
        return Aliased(None, pyt)
    return Aliased(suply(torch.Tensor.numpy, pyt), pyt)



def startup(envs, actor, buffer, seed_sequences=None, *, worker=0,
            env_ids=None, generation=0, seq=0):
    """Reset the envs and return the :class:`~.context.Context` of a
    collection.

    Row 0 of the first fragment (``ctx.last``) gets the reset observations,
    ``fin = True`` and the action space's placeholder as ``act`` (see
    :mod:`.layout`). The reset observations are space-checked by the
    first :func:`collect` that checks spaces.

    Parameters
    ----------
    envs : EnvBatch or list of gymnasium.Env
        ``B`` env columns laid out as ``buffer``.
    actor : BaseActorModule
    buffer : Aliased
        From :func:`prepare`.
    seed_sequences : list of numpy.random.SeedSequence, optional
        One per env: each is reset with ``seed=`` drawn from its sequence.
    worker, generation : int
        Recorded in ``meta.worker`` and ``meta.generation``.
    env_ids : array of int, optional
        Global env indices recorded in ``meta.env`` (``0..B-1`` by default).
    seq : int
        The ``meta.seq`` of the first fragment.

    Raises
    ------
    TypeError
        ``actor`` is not an actor
        (:func:`~rlplay.engine.actor.check_actor`).
    ValueError
        As many envs as the buffer has columns are needed.
    """
    envs = as_batch(envs)
    if _torch(envs):
        return torch_loop.startup(
            envs, actor, buffer, seed_sequences, worker=worker,
            env_ids=env_ids, generation=generation, seq=seq)
    policy = as_policy(actor)
    if envs.n_envs != buffer.npy.state.fin.shape[1]:
        raise ValueError(f"{envs.n_envs} envs for a buffer of "
                         f"{buffer.npy.state.fin.shape[1]}")
    ctx = Context(envs, buffer, worker, env_ids, generation, seq)
    state, truncated, final, stats = ctx.last
    casts = envs.reset(state.obs, seed_sequences, check_casts=True)
    if casts:  # raised by the first fragment that checks spaces
        ctx._reset_problem = f"{casts[0].label}: {casts[0].problem}"
    ctx._fresh = True
    suply(np.copyto, state.act,
          _envs.space_placeholder(envs.action_space))
    state.fin[:] = True
    if final is not None:
        suply(np.copyto, final, state.obs)
    row = torchify(getitem(ctx.last[0], slice(None)), copy=False)
    row = suply(lambda x: x.unsqueeze(0), row)
    ctx.hx = policy.initial_hx(row)
    ctx.policy, ctx.actor = policy, actor
    return ctx


@torch.no_grad()
def collect(actor, buffer, ctx, *, sticky=False, version=0,
            check_spaces="first", sparse_final=False):
    """Fill ``buffer`` in place with the next fragment of ``ctx``'s envs.

    Parameters
    ----------
    actor : BaseActorModule
    buffer : Aliased
        From :func:`prepare` for ``ctx``'s envs.
    ctx : Context
        From :func:`startup`; advanced in place.
    sticky : bool
        Stop stepping an env for the rest of the fragment once its episode
        ended (see :mod:`.layout` for what the frozen rows hold, and
        :func:`~.layout.acted` to leave them out).
    version : int
        The parameter version recorded in ``meta.version``.
    check_spaces : {'first', 'always', 'never'}
        When to check actions and observations against the env's spaces,
        and rewards for NaN (see :mod:`.layout`): ``'first'``, every step
        of the first fragment collected with ``ctx`` (with the reset
        observations of :func:`startup` in its row 0); ``'always'``, every
        step of every fragment; ``'never'``.
    sparse_final : bool
        Write ``final`` only where an episode ended (and in row ``T``),
        not the copies of the observation elsewhere: for a fragment that
        its consumer completes as it copies it
        (:mod:`~rlplay.engine.core.finals`); ignored by torch-native
        sources.

    Returns
    -------
    buffer : Aliased
        The same buffer.

    Raises
    ------
    ValueError
        A bad ``check_spaces``; an action or observation outside its space,
        a NaN reward (the message names the env column ``j`` and the step
        ``t``).
    TypeError, ValueError, StructureError
        An action, ``hx``, ``info``, observation or reward that does not
        fit the buffer's layout.
    """
    if _torch(ctx.envs):
        return torch_loop.collect(actor, buffer, ctx, sticky=sticky,
                                  version=version, check_spaces=check_spaces)
    # one function on purpose: the step loop below is the hot path of
    # every generator, its names bound once per fragment; a call more per
    # row is a measurable share of a small env's step
    mode = check_spaces_mode(check_spaces)
    checking = mode == "always" or (mode == "first"
                                    and not ctx.spaces_checked)
    policy = _policy_of(ctx, actor)
    policy_step = policy.step
    npy, pyt = buffer
    views = ctx.views(buffer)
    envs, T = ctx.envs, len(views.steps)
    n_envs = envs.n_envs
    if sticky:
        check_sticky(envs)
    _begin_fragment(npy, ctx)
    hx = ctx.hx
    copy_(pyt.hx, hx)
    accounts = ctx.accounts
    # the columns stepped in this fragment (None: all), and those frozen
    # (sticky)
    live, frozen = None, []
    fin_at = torch.zeros(n_envs, dtype=torch.bool)
    fin_np = fin_at.numpy()
    copy_info, copy_act = copier(pyt.actor), copier(pyt.state.act)
    # the actor records an info (else an empty one is not copied, and one
    # that grew a key is still caught by copy_info)
    recorded = bool(flatten(pyt.actor))
    clip = ctx.clip_actions
    checks = _begin_checks(ctx, views) if checking else None
    # a feed-forward actor's hx is (): nothing to reset
    stateless = type(hx) is tuple and not hx

    for t in range(T):
        step = views.steps[t]
        row_next = step.row_next
        # checked at t = 0 (policy.step_at), inlined: a call less a row
        act, hx_next, info = policy_step(step.actor_in, hx) if t else \
            policy.checked_step(step.actor_in, hx, step.act_out)
        if recorded or info:
            copy_info(step.info_out, info)
        copy_act(step.act_out, act)
        if checking:
            checks.action(row_next.act, t)
        for j in frozen:
            _freeze(step.row, row_next, views.final[t], step.out.final, j)
            step.acted[j] = False
        # the envs get Box actions clipped into their bounds; the row keeps
        # the actor's (see .layout)
        # (an env's episode ending, env_ended, matters to evaluate alone:
        # its columns' rows are those of its agents' ends and absences)
        ended, lost, casts, _ = envs.step(
            row_next.act if clip is None else clip(row_next.act), step.out,
            live, check_casts=checking)
        if casts:
            _raise_cast(casts[0])
        if sticky:
            accounts.add(step.out.rew, row_next.rew, step.row.stepno,
                         row_next.stepno, live)
        else:  # the returns and statistics after the rows (settle)
            accounts.record(step.out.rew, row_next.rew, step.row.stepno,
                            row_next.stepno)
        if ended:
            if sticky:
                accounts.end(ended, step.row.stepno, row_next.stepno,
                             step.ret, step.length)
            else:  # the new episodes count from 0
                put_at(row_next.stepno, ended, 0)
            if checking and step.out.final is not None and \
                    not envs.final_is_obs:  # else checked as obs below
                checks.observation(getitem(step.out.final, ended),
                                   _final_label(t), ended)
        if lost:  # the new episodes start here (see .layout)
            accounts.lose(lost, row_next.stepno)
            put_at(step.acted, lost, False)
        if checking:
            checks.observation(row_next.obs, _step_label(t, row_next.fin))
            checks.reward(row_next.rew, t)
        hx = hx_next
        if ended or frozen or lost:
            if sticky:  # every env whose episode ended is frozen
                frozen = np.flatnonzero(row_next.fin).tolist()
                live = np.flatnonzero(~row_next.fin).tolist()
            if not stateless:
                np.copyto(fin_np, row_next.fin)
                hx = policy.reset(hx, fin_at.clone())

    if not sticky:
        accounts.settle(views.rew, npy.acted[1:] & npy.state.fin[1:],
                        npy.stats.ret[1:], npy.stats.length[1:],
                        npy.state.stepno[:-1])
    _end_fragment(policy, npy, views, ctx, hx, version, sticky,
                  sparse_final)
    if checking:
        ctx.spaces_checked = True
    return buffer


def _policy_of(ctx, actor):
    """The policy that :func:`startup` made of ``actor``, or a new one
    (kept) if ``collect`` gets another actor."""
    if ctx.actor is not actor:
        ctx.policy, ctx.actor = as_policy(actor), actor
    return ctx.policy


def _begin_fragment(npy, ctx):
    """Clear what the loop writes only where episodes end, and copy row 0
    from the end of the previous fragment."""
    # rows whose env goes on hold fin = truncated = False and no episode
    # statistics: clear those fields once for the fragment
    npy.state.fin.fill(False)
    npy.truncated.fill(False)
    npy.stats.ret.fill(0)
    npy.stats.length.fill(0)
    # every row but 0 is a transition unless the loop says otherwise
    npy.acted.fill(True)
    npy.acted[0] = False
    suply(np.copyto, _row_fields(npy, 0), ctx.last)
    # env info is written only where present: clear the whole fragment once
    # so that absent keys read zero, not what the reused buffer held before
    for leaf in flatten(npy.env):
        leaf.fill(0)
    for leaf in npy.env_mask.values():
        leaf.fill(False)


def _begin_checks(ctx, views):
    """The space checks of a fragment that is checked (its row 0 too, when
    it holds the reset observations)."""
    checks = ctx.space_checks()
    if ctx._fresh:  # row 0 holds the reset observations
        if ctx._reset_problem is not None:
            raise ValueError(ctx._reset_problem + _CHECK_HINT)
        checks.observation(views.state[0].obs, _reset_label)
    return checks


def _end_fragment(policy, npy, views, ctx, hx, version, sticky,
                  sparse_final):
    """Fill what is known once the last step is taken: ``final`` where no
    episode ended (in row ``T`` alone with ``sparse_final``), the
    lookahead ``info`` of row ``T``, ``meta``; advance ``ctx`` past the
    fragment."""
    T = len(views.steps)
    if npy.final is not None and ctx.envs.final_is_obs:
        # the source left `final` to the loop: the observation everywhere
        fill_final_from_obs(npy, sparse_final, out=views.keep)
    elif npy.final is not None:
        # the loop wrote `final` where an episode ended; the observation
        # itself elsewhere, copied once for the fragment (row T at least:
        # the next fragment's row 0 repeats it)
        rows = slice(T - 1 if sparse_final else 0, T)
        fill_final(npy, sticky, rows, out=views.keep[rows])
    fill_lookahead(policy, views.actor[T], views.rows[T], hx)
    meta = npy.meta
    meta.version[:] = version
    meta.worker[:] = ctx.worker
    meta.env[:] = ctx.env_ids
    meta.seq[:] = ctx.seq
    meta.generation[:] = ctx.generation
    meta.control[:] = ctx.control
    meta.agent[:] = ctx.agent_ids
    ctx.accounts.finish(npy.state.stepno[T])
    ctx.hx = hx
    ctx.seq += 1
    ctx._fresh = False
    suply(np.copyto, ctx.last, _row_fields(npy, T))


def _copy_at(dst, src, *, j):
    dst[j] = src[j]  # `j` a column or a list of them


def _freeze(row, row_next, final, final_next, j):
    # a frozen (sticky) env repeats its row, with no reward
    row_next.stepno[j] = row.stepno[j]
    suply(_copy_at, row_next.obs, row.obs, j=j)
    suply(_copy_at, row_next.act, row.act, j=j)
    row_next.rew[j] = 0.0
    row_next.fin[j] = True
    if final is not None:
        suply(_copy_at, final_next, final, j=j)

