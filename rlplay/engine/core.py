"""Core loops: the only code that calls ``env.step`` and ``actor.step``.

:func:`prepare` allocates a fragment buffer, :func:`startup` resets the envs
and returns the :class:`Context` of an ongoing collection, :func:`collect`
fills a buffer with the next fragment in place, and :func:`evaluate` plays
whole episodes. Every generator in :mod:`rlplay.engine.rollout` is a thin
driver around these.

The layout of a fragment of ``T = n_steps`` steps of ``B`` envs
(time-major; row ``t`` of ``state`` holds ``x_t`` and what led to it):

=======================  ===============  ===================================
field                    shape            row ``t`` holds
=======================  ===============  ===================================
``state.stepno``         (1 + T, B) int64  steps since the episode started
``state.obs``            (1 + T, B, ...)  ``x_t`` (after an episode ended at
                                          ``t``: the first observation of
                                          the next one)
``state.act``            (1 + T, B, ...)  ``a_{t-1}``, the action that led
                                          here
``state.rew``            (1 + T, B) f32   ``r_t``, that transition's reward
``state.fin``            (1 + T, B) bool  the transition into row ``t``
                                          ended an episode
``truncated``            (1 + T, B) bool  that end was a truncation (time
                                          limit), not a termination
``final``                (1 + T, B, ...)  the observation the transition
                                          into row ``t`` produced, before
                                          any reset: the true last
                                          observation where ``fin``, else a
                                          copy of ``obs[t]`` (``None`` when
                                          disabled)
``actor``                (1 + T, B, ...)  the actor's info at row ``t``; row
                                          ``T`` from a virtual lookahead
``env``                  (T, B, ...)      numeric env info of step ``t``
                                          (the step into row ``t + 1``);
                                          zero where the key was absent
``env_mask``             (T, B) bool      per info key: present at step
                                          ``t``
``hx``                   actor layout     the actor's state at row 0
``stats.ret``            (1 + T, B) f64   where an episode ended at row
                                          ``t``: its return, else 0
``stats.length``         (1 + T, B) int64 where an episode ended at row
                                          ``t``: its length, else 0
``meta.version`` etc.    (B,) int64       parameter version, worker, global
                                          env index and sequence number of
                                          the fragment per env column
=======================  ===============  ===================================

Row ``T`` of one fragment equals row 0 of the next one from the same envs
(``actor`` excepted: row 0 comes from the real step, row ``T`` from the
lookahead). Row 0 of the very first fragment holds the reset observation
with ``fin = True``, ``act`` and ``rew`` zero. Episode statistics count rows
``1..T`` only (row 0 repeats the previous fragment's row ``T``).

With ``sticky=True`` an env whose episode ends at row ``t`` is not stepped
again in this fragment: every later row ``t' > t`` of that env repeats row
``t`` (the reset observation, ``stepno = 0``, the same ``act`` and
``final``, ``fin = True``) with ``rew = 0``, ``truncated = False``, zero
statistics and no env info (mask ``False``, values zero); ``actor`` holds
what the actor computed there, and its ``hx`` is reset at every such row.
The next fragment carries on from the reset observation.
"""
from collections import namedtuple

import numpy as np
import torch

from . import envs as _envs
from .seeds import reset_seed, seed_sequence
from .nested import (StructureError, check_structure, flatten, getitem,
                     suply)
from .shared import Aliased, aliased, copy_, torchify

__all__ = [
    "check_count",
    "State",
    "Fragment",
    "Stats",
    "Meta",
    "Context",
    "prepare",
    "startup",
    "collect",
    "evaluate",
    "episode",
    "episode_stats",
]

State = namedtuple("State", "stepno obs act rew fin")
Stats = namedtuple("Stats", "ret length")
Meta = namedtuple("Meta", "version worker env seq")
Fragment = namedtuple(
    "Fragment", "state truncated final actor env env_mask hx stats meta")
Fragment.__doc__ = """A fragment of ``T`` steps of ``B`` envs; see :mod:`rlplay.engine.core`."""


def check_count(name, value, minimum=1):
    """Check that argument ``name`` is an int (numpy ints too, never a
    bool) of at least ``minimum``.

    Raises
    ------
    TypeError
        Not an int.
    ValueError
        Too small; the message says what was given.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def _check_counts(n_steps, n_envs):
    check_count("n_steps", n_steps)
    check_count("n_envs", n_envs)


def _state_example(env):
    return State(stepno=np.zeros((), np.int64),
                 obs=_envs.space_example(env.observation_space),
                 act=_envs.space_example(env.action_space),
                 rew=np.zeros((), np.float32),
                 fin=np.ones((), bool))


def _same_kind(a, b):
    def kind(dtype):
        if dtype == torch.bool:
            return "b"
        return "f" if dtype.is_floating_point else (
            "c" if dtype.is_complex else "i")
    return kind(a) == kind(b) or {kind(a), kind(b)} == {"b", "i"}


def _check_action(act, expected):
    """The actor's action against the action space's layout.

    Structure mismatches name the space first, the action second (so that
    "missing keys" are keys the action lacks).
    """
    def check(want, got):
        if not isinstance(got, torch.Tensor):
            raise TypeError(f"the actor must return actions as tensors, got "
                            f"{type(got).__name__}")
        if got.shape != want.shape:
            raise ValueError(f"the actor returned an action of shape "
                             f"{tuple(got.shape)}, expected "
                             f"{tuple(want.shape)} (1, n_envs, *space.shape)")
        if not _same_kind(got.dtype, want.dtype):
            raise TypeError(f"the actor returned an action of dtype "
                            f"{got.dtype} for an action space of dtype "
                            f"{want.dtype}")

    try:
        check_structure(expected, act)
    except (StructureError, TypeError) as exc:
        raise type(exc)(f"the actor's action (second) does not match the "
                        f"action space (first): {exc}") from None
    suply(check, expected, act)


def _check_info(info, n_envs):
    for leaf in flatten(info):
        if not isinstance(leaf, torch.Tensor) or leaf.dim() < 2 \
                or leaf.shape[:2] != (1, n_envs):
            shape = tuple(leaf.shape) if isinstance(
                leaf, torch.Tensor) else type(leaf).__name__
            raise ValueError(f"the actor's info must hold tensors of shape "
                             f"(1, n_envs={n_envs}, ...), got {shape}")


def _describe_tensor(x):
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {x.dtype}"
    return f"a {type(x).__name__}"


def _check_hx(hx, expected, what, against):
    """``hx`` (returned by ``what``) against the ``expected`` layout.

    Structure mismatches name ``expected`` first, ``hx`` second.
    """
    def check(want, got):
        if not isinstance(got, torch.Tensor) or not isinstance(
                want, torch.Tensor) or got.shape != want.shape \
                or got.dtype != want.dtype:
            raise ValueError(f"the actor's hx from {what} holds "
                             f"{_describe_tensor(got)}, but {against} holds "
                             f"{_describe_tensor(want)}")

    try:
        suply(check, expected, hx)
    except (StructureError, TypeError) as exc:
        raise type(exc)(f"the actor's hx from {what} (second) does not "
                        f"match {against} (first): {exc}") from None


@torch.no_grad()
def _initial_hx(actor, row):
    """``actor.reset`` of the hx a virtual step returns, for all envs."""
    _, hx, _ = actor.step(*row, hx=None, virtual=True)
    n_envs = row.fin.shape[1]
    hx0 = actor.reset(hx, torch.ones(n_envs, dtype=torch.bool))
    _check_hx(hx, hx0, "step()", "the hx that reset() makes of it")
    return hx0


def prepare(env, actor, n_steps, n_envs, *, env_info=None, final=True,
            shared=False, pinned=False):
    """Allocate a fragment buffer laid out for ``env`` and ``actor``.

    The actor is called once, virtually, on a zero state to learn the
    structure of its actions, ``hx`` and ``info``; these are checked against
    the spaces of ``env``.

    Parameters
    ----------
    env : gymnasium.Env
        Any one of the envs (only its spaces are used).
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

    Returns
    -------
    buffer : Aliased(npy, pyt)
        Two :class:`Fragment` views of one zero-filled memory.

    Raises
    ------
    TypeError, ValueError
        Bad counts, unsupported spaces, or an actor whose action, ``hx`` or
        ``info`` do not fit.
    """
    _check_counts(n_steps, n_envs)
    example = _state_example(env)
    row = torchify(example, 1, n_envs)
    with torch.no_grad():
        act, hx, info = actor.step(*row, hx=None, virtual=True)
    _check_action(act, row.act)
    _check_info(info, n_envs)
    hx0 = _initial_hx(actor, row)

    def alloc(tree, *leading):
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
        stats=alloc(Stats(np.zeros((), np.float64), np.zeros((), np.int64)),
                    T1, n_envs),
        meta=alloc(Meta(*[np.zeros((), np.int64)] * 4), n_envs),
    )
    return Aliased(suply(torch.Tensor.numpy, pyt), pyt)


def _row_fields(fragment, t):
    # the fields that row T hands on to row 0 of the next fragment
    return (getitem(fragment.state, t), fragment.truncated[t],
            getitem(fragment.final, t), getitem(fragment.stats, t))


class _Views:
    """Per-row views of one buffer, made once so the loop only indexes."""

    def __init__(self, buffer):
        npy, pyt = buffer
        T1 = npy.state.fin.shape[0]
        self.buffer = buffer
        self.rows = [getitem(pyt.state, slice(t, t + 1)) for t in range(T1)]
        self.actor = [getitem(pyt.actor, slice(t, t + 1)) for t in range(T1)]
        self.state = [getitem(npy.state, t) for t in range(T1)]
        self.truncated = [npy.truncated[t] for t in range(T1)]
        self.final = [getitem(npy.final, t) for t in range(T1)]
        self.ret = [npy.stats.ret[t] for t in range(T1)]
        self.length = [npy.stats.length[t] for t in range(T1)]
        self.env = [getitem(npy.env, t) for t in range(T1 - 1)]
        self.env_mask = [getitem(npy.env_mask, t) for t in range(T1 - 1)]
        # (obs leaf, final leaf) pairs of each row, for the vectorised copy
        # of the observations into `final` where no episode ended
        self.obs_final = [list(zip(flatten(self.state[t].obs),
                                   flatten(self.final[t])))
                          for t in range(T1)]
        # a (B,) bool scratch row, and views of it shaped to broadcast
        # against every obs leaf (np.copyto's `where`)
        self.not_fin = np.empty(npy.state.fin.shape[1], bool)
        self.not_fin_like = [
            self.not_fin.reshape(-1, *[1] * (leaf.ndim - 2))
            for leaf in flatten(npy.state.obs)]
        # the shape of a single-array observation of one env, for the
        # inlined write in the loop (None for nested observations)
        obs = npy.state.obs
        self.obs_shape = obs.shape[2:] if isinstance(obs, np.ndarray) \
            else None


def _copier(dst):
    """``copy(dst_row, src)``: ``copy_`` specialised to ``dst``'s layout.

    A single tensor or a flat dict of tensors (the usual action and info)
    is copied without walking the structure each step; the walk, with its
    structure checks, stays for anything else. Once per fragment the loop
    still checks the real structures (``_check_action``).
    """
    if isinstance(dst, torch.Tensor):
        return lambda d, s: d.copy_(s)
    if type(dst) is dict and not dst:
        return _copy_nothing
    if type(dst) is dict and all(isinstance(v, torch.Tensor)
                                 for v in dst.values()):
        return _copy_flat_dict
    return copy_


def _copy_nothing(dst, src):
    if src:  # the actor's info grew a key
        _check_structure_of("info", src, dst)


def _check_structure_of(what, got, expected):
    try:
        check_structure(got, expected)
    except (StructureError, TypeError) as exc:
        raise type(exc)(f"the actor's {what} changed its structure since "
                        f"the first call (now vs then): {exc}") from None


def _copy_flat_dict(dst, src):
    if src.keys() != dst.keys():
        _check_structure_of("info", src, dst)
    for key, leaf in dst.items():
        leaf.copy_(src[key])


class Context:
    """The state of an ongoing collection, carried from fragment to fragment.

    Attributes
    ----------
    envs : list of gymnasium.Env
    last : tuple
        Row ``T`` of the last fragment (``state``, ``truncated``, ``final``,
        ``stats``), numpy arrays of shape ``(B, ...)``.
    hx : nested tensors
        The actor's state for ``last``.
    ep_return, ep_length : ndarray, shape = (B,)
        The running return and length of each env's current episode.
    seq : int
        Fragments collected so far.
    worker : int
        Worker index recorded in ``meta.worker``.
    env_ids : ndarray, shape = (B,)
        Global env indices recorded in ``meta.env``.
    """

    def __init__(self, envs, buffer, worker=0, env_ids=None):
        npy = buffer.npy
        self.envs = envs
        self.last = suply(lambda a: np.zeros_like(a), _row_fields(npy, 0))
        self.hx = None
        self.ep_return = np.zeros(len(envs), np.float64)
        self.ep_length = np.zeros(len(envs), np.int64)
        self.seq = 0
        self.worker = worker
        self.env_ids = (np.arange(len(envs)) if env_ids is None
                        else np.asarray(env_ids, np.int64))
        self.env_keys = tuple(npy.env_mask)
        self._views = {}

    def views(self, buffer):
        views = self._views.get(id(buffer))
        if views is None or views.buffer is not buffer:
            views = self._views[id(buffer)] = _Views(buffer)
        return views


def _write_obs(tree, j, value, what):
    """``tree[j] = value`` leaf by leaf, checking structure and shape; the
    messages name env ``j`` and ``what`` returned ``value``."""
    try:
        suply(_write_leaf_obs, tree, value, j=j, what=what)
    except (StructureError, TypeError) as exc:
        raise type(exc)(f"env {j} {what}: the observation does not match "
                        f"the observation space: {exc}") from None


def _write_leaf_obs(leaf, obs, j, what):
    _write_array_obs(leaf, j, obs, what)


def _write_array_obs(leaf, j, obs, what):
    # _write_obs for a single-array observation, without the walk
    if type(obs) is not np.ndarray:
        obs = np.asarray(obs)
    if obs.shape != leaf.shape[1:]:
        raise ValueError(f"env {j} {what}: the observation has shape "
                         f"{obs.shape}, its space says {leaf.shape[1:]}")
    leaf[j] = obs


def _obs_writer(obs_tree):
    """``write(tree, j, obs, what)`` for trees laid out as ``obs_tree``."""
    if isinstance(obs_tree, np.ndarray):
        return _write_array_obs
    return _write_obs


def startup(envs, actor, buffer, seed_sequences=None, *, worker=0,
            env_ids=None):
    """Reset the envs and return the :class:`Context` of a collection.

    Parameters
    ----------
    envs : list of gymnasium.Env
        ``B`` envs laid out as ``buffer``.
    actor : BaseActorModule
    buffer : Aliased
        From :func:`prepare`.
    seed_sequences : list of numpy.random.SeedSequence, optional
        One per env: each is reset with ``seed=`` drawn from its sequence.
    worker : int
        Recorded in ``meta.worker``.
    env_ids : array of int, optional
        Global env indices recorded in ``meta.env`` (``0..B-1`` by default).
    """
    if len(envs) != buffer.npy.state.fin.shape[1]:
        raise ValueError(f"{len(envs)} envs for a buffer of "
                         f"{buffer.npy.state.fin.shape[1]}")
    ctx = Context(envs, buffer, worker, env_ids)
    state, truncated, final, stats = ctx.last
    write = _obs_writer(state.obs)
    for j, env in enumerate(envs):
        seed = reset_seed(None if seed_sequences is None
                          else seed_sequences[j])
        obs, _ = _envs.reset(env, seed=seed)
        write(state.obs, j, obs, "reset()")
    state.fin[:] = True
    if final is not None:
        suply(np.copyto, final, state.obs)
    row = torchify(getitem(ctx.last[0], slice(None)), copy=False)
    row = suply(lambda x: x.unsqueeze(0), row)
    ctx.hx = _initial_hx(actor, row)
    return ctx


@torch.no_grad()
def collect(actor, buffer, ctx, *, sticky=False, version=0):
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
        ended (see the module docstring for what the frozen rows hold).
    version : int
        The parameter version recorded in ``meta.version``.

    Returns
    -------
    buffer : Aliased
        The same buffer.
    """
    npy, pyt = buffer
    views = ctx.views(buffer)
    envs, T = ctx.envs, len(views.rows) - 1
    # rows whose env goes on hold fin = truncated = False and no episode
    # statistics: clear those fields once for the fragment (row 0 comes
    # from the previous one next); the loop writes only where episodes end
    npy.state.fin.fill(False)
    npy.truncated.fill(False)
    npy.stats.ret.fill(0)
    npy.stats.length.fill(0)
    suply(np.copyto, _row_fields(npy, 0), ctx.last)
    hx = ctx.hx
    copy_(pyt.hx, hx)
    write_obs = _obs_writer(npy.state.obs)
    act_is_array = isinstance(npy.state.act, np.ndarray)
    has_final = npy.final is not None
    keys = ctx.env_keys
    # env info is written only where present: clear the whole fragment once
    # so that absent keys read zero, not what the reused buffer held before
    for leaf in flatten(npy.env):
        leaf.fill(0)
    for leaf in npy.env_mask.values():
        leaf.fill(False)
    # per-env running statistics as Python numbers (cheaper to update than
    # numpy scalars), written back to `ctx` at the end
    ep_return, ep_length = ctx.ep_return.tolist(), ctx.ep_length.tolist()
    frozen = [False] * len(envs)
    fin_at = torch.zeros(len(envs), dtype=torch.bool)
    fin_np = fin_at.numpy()
    not_fin, not_fin_like = views.not_fin, views.not_fin_like
    copy_info, copy_act = _copier(pyt.actor), _copier(pyt.state.act)
    obs_shape = views.obs_shape
    # a feed-forward actor's hx is (): nothing to reset
    stateless = type(hx) is tuple and not hx

    for t in range(T):
        act, hx_next, info = actor.step(*views.rows[t], hx=hx, virtual=False)
        if t == 0:
            # prepare() checked a virtual call; check a real one too, once
            # per fragment, before copy_ could broadcast a wrong shape
            _check_action(act, views.rows[t + 1].act)
            _check_hx(hx_next, hx, "step()", "the hx it was given")
            _check_info(info, len(envs))
        copy_info(views.actor[t], info)
        row, row_next = views.state[t], views.state[t + 1]
        copy_act(views.rows[t + 1].act, act)
        stepno, stepno_next = row.stepno, row_next.stepno
        obs_next, act_next = row_next.obs, row_next.act
        rew_next, fin_next = row_next.rew, row_next.fin
        truncated_next = views.truncated[t + 1]
        final_next = views.final[t + 1]
        ret_next, length_next = views.ret[t + 1], views.length[t + 1]
        env_info, env_mask = views.env[t], views.env_mask[t]
        # the step count of an env whose episode goes on, for the whole row
        # at once; the loop below overwrites the envs that end or are frozen
        np.add(stepno, 1, out=stepno_next)
        ended = False

        for j, env in enumerate(envs):
            if frozen[j]:
                _freeze(row, row_next, views.final[t], final_next, j)
                ended = True
                continue

            result = env.step(act_next[j] if act_is_array
                              else getitem(act_next, j))
            try:
                obs, rew, terminated, truncated, info = result
            except (TypeError, ValueError):
                _envs.check_step(env, result)  # raises a clear TypeError
                raise
            ep_return[j] += float(rew)
            ep_length[j] += 1
            rew_next[j] = rew
            for key in keys:
                if key in info:
                    _write_info(env_info[key], j, info[key], key)
                    env_mask[key][j] = True

            if terminated or truncated:
                if has_final:
                    write_obs(final_next, j, obs, "step()")
                ret_next[j], length_next[j] = ep_return[j], ep_length[j]
                ep_return[j], ep_length[j] = 0.0, 0
                obs, _ = _envs.reset(env)
                truncated_next[j] = truncated and not terminated
                fin_next[j] = True
                stepno_next[j] = 0
                frozen[j] = sticky
                ended = True
            # the common case inlined: an array of the declared shape
            if type(obs) is np.ndarray and obs.shape == obs_shape:
                obs_next[j] = obs
            else:
                write_obs(obs_next, j, obs, "step()")

        if has_final:
            # `final` is the observation itself where no episode ended
            if ended:
                np.logical_not(fin_next, out=not_fin)
                for (obs_leaf, final_leaf), where in zip(
                        views.obs_final[t + 1], not_fin_like):
                    np.copyto(final_leaf, obs_leaf, where=where)
            else:
                for obs_leaf, final_leaf in views.obs_final[t + 1]:
                    np.copyto(final_leaf, obs_leaf)
        hx = hx_next
        if ended and not stateless:
            np.copyto(fin_np, fin_next)
            hx = actor.reset(hx, fin_at.clone())

    _, _, info = actor.step(*views.rows[T], hx=hx, virtual=True)
    copy_(views.actor[T], info)
    npy.meta.version[:] = version
    npy.meta.worker[:] = ctx.worker
    npy.meta.env[:] = ctx.env_ids
    npy.meta.seq[:] = ctx.seq
    ctx.ep_return[:] = ep_return
    ctx.ep_length[:] = ep_length
    ctx.hx = hx
    ctx.seq += 1
    suply(np.copyto, ctx.last, _row_fields(npy, T))
    return buffer


def _copy_into(dst, value, *, j):
    dst[j] = value


def _copy_at(dst, src, *, j):
    dst[j] = src[j]


def _freeze(row, row_next, final, final_next, j):
    # a frozen (sticky) env repeats its row, with no reward
    row_next.stepno[j] = row.stepno[j]
    suply(_copy_at, row_next.obs, row.obs, j=j)
    suply(_copy_at, row_next.act, row.act, j=j)
    row_next.rew[j] = 0.0
    row_next.fin[j] = True
    if final is not None:
        suply(_copy_at, final_next, final, j=j)


def _write_info(leaf_tree, j, value, key):
    try:
        if isinstance(leaf_tree, np.ndarray):
            leaf_tree[j] = value
        else:
            suply(_copy_into, leaf_tree, value, j=j)
    except (StructureError, TypeError, ValueError) as exc:
        raise type(exc)(f"env info [{key!r}] does not match its spec: "
                        f"{exc}") from None


def episode_stats(fragment):
    """Returns and lengths of the episodes that ended in a fragment.

    Parameters
    ----------
    fragment : Fragment
        numpy or torch views (any number of env columns).

    Returns
    -------
    returns : ndarray of float64
    lengths : ndarray of int64
        One entry per episode that ended at rows ``1..T`` (row 0 repeats the
        previous fragment and is not counted), in row-major order.
    """
    ret, length = fragment.stats
    ret, length = np.asarray(ret[1:]), np.asarray(length[1:])
    ended = length > 0
    return ret[ended], length[ended]


@torch.no_grad()
def evaluate(envs, actor, n_episodes, *, seed_sequences=None,
             max_steps=None):
    """Play ``n_episodes`` whole episodes with ``actor``, in this process.

    Each of the ``B`` envs plays ``ceil(n_episodes / B)`` episodes (so that
    short episodes are not favoured); the first ``n_episodes`` results, in
    env order, are returned. The actor is used as it is (call ``eval()``
    first for greedy actions).

    Parameters
    ----------
    envs : list of gymnasium.Env
    actor : BaseActorModule
    n_episodes : int
    seed_sequences : list of SeedSequence, optional
        Reset seeds for the first episode of each env.
    max_steps : int, optional
        Stop an episode after this many steps (counted as truncated).

    Returns
    -------
    returns : ndarray of float64, shape = (n_episodes,)
    lengths : ndarray of int64, shape = (n_episodes,)
    """
    _check_counts(1, len(envs))
    check_count("n_episodes", n_episodes)
    n_envs = len(envs)
    quota = -(-n_episodes // n_envs)
    example = _state_example(envs[0])
    state = aliased(example, 1, n_envs)
    row, obs_npy = state.pyt, getitem(state.npy.obs, 0)
    write = _obs_writer(obs_npy)
    for j, env in enumerate(envs):
        seed = reset_seed(None if seed_sequences is None
                          else seed_sequences[j])
        obs, _ = _envs.reset(env, seed=seed)
        write(obs_npy, j, obs, "reset()")
    state.npy.fin[:] = True
    hx = _initial_hx(actor, row)
    results = [[] for _ in envs]
    running = np.zeros((n_envs, 2))
    active = np.ones(n_envs, bool)
    npy = getitem(state.npy, 0)
    while active.any():
        act, hx, _ = actor.step(*row, hx=hx, virtual=False)
        copy_(row.act, act)
        for j, env in enumerate(envs):
            if not active[j]:
                continue
            obs, rew, terminated, truncated, _ = env.step(
                getitem(npy.act, j))
            running[j] += (rew, 1)
            npy.rew[j] = rew
            done = terminated or truncated or (
                max_steps is not None and running[j, 1] >= max_steps)
            if done:
                results[j].append(tuple(running[j]))
                running[j] = 0
                active[j] = len(results[j]) < quota
                if active[j]:
                    obs, _ = _envs.reset(env)
            npy.fin[j] = done
            npy.stepno[j] = 0 if done else npy.stepno[j] + 1
            write(obs_npy, j, obs, "step()")
        if npy.fin.any():
            hx = actor.reset(hx, torch.from_numpy(npy.fin.copy()))
    flat = [pair for per_env in results for pair in per_env][:n_episodes]
    returns, lengths = np.array(flat).T
    return returns.astype(np.float64), lengths.astype(np.int64)


def episode(env, actor, *, seed=None, max_steps=None):
    """Play one episode; return its ``(return, length)``."""
    seeds = None if seed is None else [seed_sequence(seed)]
    returns, lengths = evaluate([env], actor, 1, seed_sequences=seeds,
                                max_steps=max_steps)
    return float(returns[0]), int(lengths[0])
