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
with ``fin = True``, ``rew`` zero and, as ``act``, the action space's
placeholder: the valid action nearest zero, leaf by leaf (zero where zero
is valid; ``start`` for ``Discrete(n, start=1)``, ``low`` for ``Box(1,
2)``; see :func:`rlplay.engine.envs.space_placeholder`). Episode statistics
count rows ``1..T`` only (row 0 repeats the previous fragment's row ``T``).

The env gets its own copy of each action (a numpy scalar, or a view of a
fresh copy of the step's action row): an env that edits or keeps its
action never changes ``state.act``.

Space checks (``check_spaces``, see :func:`collect`): the actor's actions
are checked against the action space before the envs get them, and the
observations from ``reset`` and ``step`` against the observation space, as
a vectorised ``space.contains`` (:func:`rlplay.engine.envs.space_checker`):
``Discrete``/``MultiDiscrete`` ranges (with ``start``), ``MultiBinary`` 0/1,
``Box`` NaN and bounds (bounds for observations only: policies sample
outside a ``Box`` of actions and Gymnasium's envs clip them), integral
values for integer spaces. By default this covers every step of the first
fragment that each :class:`Context` collects, as Gymnasium's passive env
checker covers an env's first steps; later fragments pay nothing. A
failure is a ``ValueError`` naming the env column ``j``, the step ``t``
within the fragment and the value, e.g. ``env 3 step 5: the actor's action
7 is outside the action space Discrete(3)``.

With ``sticky=True`` an env whose episode ends at row ``t`` is not stepped
again in this fragment: every later row ``t' > t`` of that env repeats row
``t`` (the reset observation, ``stepno = 0``, the same ``act`` and
``final``, ``fin = True``) with ``rew = 0``, ``truncated = False``, zero
statistics and no env info (mask ``False``, values zero); ``actor`` holds
what the actor computed there, and its ``hx`` is reset at every such row.
The next fragment carries on from the reset observation. These frozen rows
look like episodes that end at once: :func:`rlplay.engine.returns.frozen`
finds them (rows after the first end in rows ``1..T``), and the ``mask=``
of :func:`~rlplay.engine.returns.returns` and
:func:`~rlplay.engine.returns.gae` zeroes their results.
"""
from collections import namedtuple

import numpy as np
import torch

from . import envs as _envs
from .actor import check_actor
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
    "CHECK_SPACES",
]

# the values of collect()'s and evaluate()'s check_spaces=
CHECK_SPACES = ("first", "always", "never")
# the end of every space-check message: how to turn the checks off
_CHECK_HINT = " (check_spaces='never' turns these checks off)"

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
        raise TypeError(f"{name} must be an int, got {type(value).__name__} "
                        f"{value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def _check_counts(n_steps, n_envs):
    check_count("n_steps", n_steps)
    check_count("n_envs", n_envs)


def _check_spaces_mode(check_spaces):
    if not isinstance(check_spaces, str) or check_spaces not in CHECK_SPACES:
        raise ValueError(f"check_spaces must be one of 'first', 'always' "
                         f"or 'never', got {check_spaces!r}")
    return check_spaces


def _state_example(env):
    """One row laid out for ``env``: placeholders (valid elements) of its
    spaces, so that the actor's probe sees valid values."""
    return State(stepno=np.zeros((), np.int64),
                 obs=_envs.space_placeholder(env.observation_space),
                 act=_envs.space_placeholder(env.action_space),
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
        Not an actor (:func:`~rlplay.engine.actor.check_actor`), bad
        counts, unsupported spaces, or an actor whose action, ``hx`` or
        ``info`` do not fit.
    """
    check_actor(actor)
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
        rows = [getitem(pyt.state, slice(t, t + 1)) for t in range(T1)]
        self.rows = rows
        self.actor = [getitem(pyt.actor, slice(t, t + 1)) for t in range(T1)]
        state = [getitem(npy.state, t) for t in range(T1)]
        final = [getitem(npy.final, t) for t in range(T1)]
        self.state, self.final = state, final
        self.ramp = np.arange(T1, dtype=np.int64)
        # what step t reads and writes, in one tuple per step: the loop
        # unpacks it instead of indexing a dozen lists
        self.steps = [
            (rows[t], rows[t + 1].act, self.actor[t], state[t],
             state[t + 1], npy.truncated[t + 1], final[t + 1],
             npy.stats.ret[t + 1], npy.stats.length[t + 1],
             getitem(npy.env, t), getitem(npy.env_mask, t))
            for t in range(T1 - 1)]
        # (obs leaf, final leaf) pairs over rows 1..T and a (T, B) bool
        # scratch with views of it shaped to broadcast against every obs
        # leaf: `final` is the observation itself where no episode ended,
        # copied once per fragment (np.copyto's `where`)
        self.obs_final = [(obs_leaf[1:], final_leaf[1:])
                          for obs_leaf, final_leaf in zip(
                              flatten(npy.state.obs), flatten(npy.final))]
        self.not_fin = np.empty((T1 - 1, npy.state.fin.shape[1]), bool)
        self.not_fin_like = [
            self.not_fin.reshape(*self.not_fin.shape, *[1] * (leaf.ndim - 2))
            for leaf in flatten(npy.state.obs)]
        # the shape of a single-array observation of one env, for the
        # inlined write in the loop (None for nested observations)
        obs = npy.state.obs
        self.obs_shape = obs.shape[2:] if isinstance(obs, np.ndarray) \
            else None
        # do integer observation leaves need the cast check of _check_cast?
        self.obs_integral = any(leaf.dtype.kind in "biu"
                                for leaf in flatten(obs))
        # how the env gets its action (see _env_actions)
        self.act_kind = _act_kind(npy.state.act, 2)


# how _env_actions hands one env its action: items of a (B,) row are numpy
# scalars, copies already; a (B, ...) row is copied once per step and each
# env gets a view of that fresh copy; a nested row is walked
_ACT_SCALARS, _ACT_ARRAYS, _ACT_NESTED = range(3)


def _act_kind(act, n_leading):
    """The ``_ACT_*`` kind of actions laid out as ``act``, whose leaves have
    ``n_leading`` dimensions before the action space's shape."""
    if not isinstance(act, np.ndarray):
        return _ACT_NESTED
    return _ACT_SCALARS if act.ndim == n_leading else _ACT_ARRAYS


def _env_actions(act_row, kind, n_envs):
    """Per-env actions (``[j]``) that are not views of the buffer row, so
    that an env that edits its action in place (``np.clip(a, -1, 1,
    out=a)``) or keeps it does not change what was recorded."""
    if kind == _ACT_SCALARS:
        return act_row
    if kind == _ACT_ARRAYS:
        return act_row.copy()
    fresh = suply(_fresh_rows, act_row)
    return [getitem(fresh, j) for j in range(n_envs)]


def _fresh_rows(leaf):
    return leaf if leaf.ndim == 1 else leaf.copy()


def _copier(dst):
    """``copy(dst_row, src)``: ``copy_`` specialised to ``dst``'s layout.

    A single tensor or a flat dict of tensors (the usual action and info)
    is copied without walking the structure each step; the walk, with its
    structure checks, stays for anything else. Once per fragment the loop
    still checks the real structures (``_check_action``).
    """
    if isinstance(dst, torch.Tensor):
        return torch.Tensor.copy_
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


class _SpaceChecks:
    """The space checkers of one env's spaces (see :func:`collect`)."""

    def __init__(self, env):
        self.act = _envs.space_checker(
            env.action_space, "the actor's action", "the action space",
            box_bounds=False)
        self.obs = _envs.space_checker(
            env.observation_space, "the observation",
            "the observation space")

    def action(self, act_row, t, envs_at=None):
        """Raise for the first action of ``act_row`` (B, ...) outside the
        action space; ``envs_at`` maps its rows to env columns."""
        problem = self.act(act_row)
        if problem is not None:
            j, message = problem
            j = j if envs_at is None else int(envs_at[j])
            raise ValueError(f"env {j} step {t}: {message}{_CHECK_HINT}")

    def observation(self, obs_row, label, envs_at=None):
        """Raise for the first observation of ``obs_row`` outside the
        observation space; ``label(j)`` says where it came from."""
        problem = self.obs(obs_row)
        if problem is not None:
            j, message = problem
            j = j if envs_at is None else int(envs_at[j])
            raise ValueError(f"{label(j)}: {message}{_CHECK_HINT}")


def _cast_problem(tree, j, obs):
    """What recording ``obs`` in row ``j`` of ``tree`` lost, or ``None``:
    an integer or bool leaf that does not hold the value given (2.7 in an
    int64 leaf records 2, -1 in a uint8 one 255)."""
    problems = []

    def check(leaf, value):
        if leaf.dtype.kind in "biu" and not problems:
            value, recorded = np.asarray(value), leaf[j]
            if np.array_equal(recorded, value):
                return
            if value.size <= 8:
                problems.append(
                    f"the observation {_envs._format_value(value)} does not "
                    f"fit its space's dtype {leaf.dtype} (recorded as "
                    f"{_envs._format_value(recorded)})")
            else:  # the first element that changed
                index = tuple(np.argwhere(recorded != value)[0].tolist())
                problems.append(
                    f"the observation holds {value[index].item()!r} at "
                    f"{list(index)}, which its space's dtype {leaf.dtype} "
                    f"records as {recorded[index].item()!r}")

    suply(check, tree, obs)
    return problems[0] if problems else None


def _check_cast(tree, j, obs, label):
    problem = _cast_problem(tree, j, obs)
    if problem is not None:
        raise ValueError(f"{label}: {problem}{_CHECK_HINT}")


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
    spaces_checked : bool
        A fragment was collected with space checks (so
        ``check_spaces='first'`` checks no more).
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
        self.spaces_checked = False
        # `last` holds the reset observations (row 0 of the first fragment)
        # and what recording them lost, for the first checked fragment
        self._fresh, self._reset_problem = False, None
        self._checks = None
        self._views = {}

    def views(self, buffer):
        views = self._views.get(id(buffer))
        if views is None or views.buffer is not buffer:
            views = self._views[id(buffer)] = _Views(buffer)
        return views

    def space_checks(self):
        if self._checks is None:
            self._checks = _SpaceChecks(self.envs[0])
        return self._checks


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

    Row 0 of the first fragment (``ctx.last``) gets the reset observations,
    ``fin = True`` and the action space's placeholder as ``act`` (see the
    module docstring). The reset observations are space-checked by the
    first :func:`collect` that checks spaces.

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

    Raises
    ------
    TypeError
        ``actor`` is not an actor
        (:func:`~rlplay.engine.actor.check_actor`).
    ValueError
        As many envs as the buffer has columns are needed.
    """
    check_actor(actor)
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
        if ctx._reset_problem is None:
            problem = _cast_problem(state.obs, j, obs)
            if problem is not None:
                ctx._reset_problem = f"env {j} reset(): {problem}"
    ctx._fresh = True
    suply(np.copyto, state.act,
          _envs.space_placeholder(envs[0].action_space))
    state.fin[:] = True
    if final is not None:
        suply(np.copyto, final, state.obs)
    row = torchify(getitem(ctx.last[0], slice(None)), copy=False)
    row = suply(lambda x: x.unsqueeze(0), row)
    ctx.hx = _initial_hx(actor, row)
    return ctx


def _reset_label(j):
    return f"env {j} reset()"


@torch.no_grad()
def collect(actor, buffer, ctx, *, sticky=False, version=0,
            check_spaces="first"):
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
        ended (see the module docstring for what the frozen rows hold, and
        :func:`rlplay.engine.returns.frozen` to mask them).
    version : int
        The parameter version recorded in ``meta.version``.
    check_spaces : {'first', 'always', 'never'}
        When to check actions and observations against the env's spaces
        (see the module docstring): ``'first'``, every step of the first
        fragment collected with ``ctx`` (with the reset observations of
        :func:`startup` in its row 0); ``'always'``, every step of every
        fragment; ``'never'``. The spaces are those of ``ctx.envs[0]``.

    Returns
    -------
    buffer : Aliased
        The same buffer.

    Raises
    ------
    ValueError
        A bad ``check_spaces``; an action or observation outside its space
        (the message names the env column ``j`` and the step ``t``).
    TypeError, ValueError, StructureError
        An action, ``hx``, ``info`` or observation that does not fit the
        buffer's layout.
    """
    mode = _check_spaces_mode(check_spaces)
    checking = mode == "always" or (mode == "first"
                                    and not ctx.spaces_checked)
    npy, pyt = buffer
    views = ctx.views(buffer)
    envs, T = ctx.envs, len(views.steps)
    n_envs = len(envs)
    _begin_fragment(npy, ctx)
    hx = ctx.hx
    copy_(pyt.hx, hx)
    write_obs = _obs_writer(npy.state.obs)
    act_kind = views.act_kind
    has_final = npy.final is not None
    keys = ctx.env_keys
    # per-env running returns as Python numbers (cheaper to update than
    # numpy scalars), written back to `ctx` at the end
    ep_return = ctx.ep_return.tolist()
    # the (j, env) stepped in this fragment, and the columns frozen (sticky)
    live, frozen = list(enumerate(envs)), []
    fin_at = torch.zeros(n_envs, dtype=torch.bool)
    fin_np = fin_at.numpy()
    copy_info, copy_act = _copier(pyt.actor), _copier(pyt.state.act)
    checks, obs_shape = _begin_checks(ctx, views) if checking \
        else (None, views.obs_shape)
    # the step counts of episodes that go on, for the whole fragment at
    # once; the loop rewrites an env's column from where its episode ends
    stepno, ramp = npy.state.stepno, views.ramp
    np.add(stepno[0], ramp[:, None], out=stepno)
    pass_ = _Pass(T, ep_return, keys, has_final, write_obs, checks,
                  obs_shape, stepno, ramp)
    # a feed-forward actor's hx is (): nothing to reset
    stateless = type(hx) is tuple and not hx

    for t in range(T):
        step = views.steps[t]
        row_pyt, act_dst, info_dst, row, row_next, _, final_next, *_ = step
        act, hx_next, info = actor.step(*row_pyt, hx=hx, virtual=False)
        if t == 0:
            _check_real_call(act, act_dst, hx_next, hx, info, n_envs)
        copy_info(info_dst, info)
        copy_act(act_dst, act)
        act_next, fin_next = row_next.act, row_next.fin
        if checking:
            checks.action(act_next, t)
        acts = act_next if act_kind == _ACT_SCALARS else _env_actions(
            act_next, act_kind, n_envs)
        for j in frozen:
            _freeze(row, row_next, views.final[t], final_next, j)
        ended = _step_envs(live, acts, t, step, pass_) or bool(frozen)
        if checking:
            checks.observation(row_next.obs, _step_label(t, fin_next))
        if sticky and ended:  # every env whose episode ended is frozen
            live = [(j, env) for j, env in live if not fin_next[j]]
            frozen = np.flatnonzero(fin_next).tolist()
        hx = hx_next
        if ended and not stateless:
            np.copyto(fin_np, fin_next)
            hx = actor.reset(hx, fin_at.clone())

    _end_fragment(actor, npy, views, ctx, hx, version)
    ctx.ep_return[:] = ep_return
    if checking:
        ctx.spaces_checked = True
    return buffer


class _Pass:
    """What the env loop of one fragment needs besides the step's views."""
    __slots__ = ("T", "ep_return", "keys", "has_final", "write_obs",
                 "checks", "obs_shape", "stepno", "ramp")

    def __init__(self, *values):
        for name, value in zip(self.__slots__, values):
            setattr(self, name, value)


def _step_envs(live, acts, t, step, pass_):
    """Step every live env once (step ``t`` of the fragment), writing row
    ``t + 1``; returns whether an episode ended."""
    (_, _, _, row, row_next, truncated_next, final_next, ret_next,
     length_next, env_info, env_mask) = step
    obs_next, rew_next, fin_next = row_next.obs, row_next.rew, row_next.fin
    ep_return, keys, checks = pass_.ep_return, pass_.keys, pass_.checks
    write_obs, obs_shape = pass_.write_obs, pass_.obs_shape
    ended = False
    for j, env in live:
        result = env.step(acts[j])
        try:
            obs, rew, terminated, truncated, info = result
        except (TypeError, ValueError):
            _envs.check_step(env, result)  # raises a clear TypeError
            raise
        rew = rew if type(rew) is float else _envs.reward(rew, j, t)
        ep_return[j] += rew
        rew_next[j] = rew
        if keys:
            _write_env_info(keys, info, env_info, env_mask, j)
        if terminated or truncated:
            if pass_.has_final:
                write_obs(final_next, j, obs, "step()")
                if checks is not None:
                    _check_final(checks, final_next, j, obs, t)
            # an episode's length is its step count plus this step
            ret_next[j], length_next[j] = ep_return[j], row.stepno[j] + 1
            ep_return[j] = 0.0
            obs, _ = _envs.reset(env)
            truncated_next[j] = truncated and not terminated
            fin_next[j] = True
            # the new episode's step counts, down the rest of the column
            pass_.stepno[t + 1:, j] = pass_.ramp[:pass_.T - t]
            ended = True
        # the common case inlined: an array of the declared shape
        if type(obs) is np.ndarray and obs.shape == obs_shape:
            obs_next[j] = obs
        else:
            write_obs(obs_next, j, obs, "step()")
            if checks is not None:
                _check_cast(obs_next, j, obs, _step_label(t, fin_next)(j))
    return ended


def _begin_fragment(npy, ctx):
    """Clear what the loop writes only where episodes end, and copy row 0
    from the end of the previous fragment."""
    # rows whose env goes on hold fin = truncated = False and no episode
    # statistics: clear those fields once for the fragment
    npy.state.fin.fill(False)
    npy.truncated.fill(False)
    npy.stats.ret.fill(0)
    npy.stats.length.fill(0)
    suply(np.copyto, _row_fields(npy, 0), ctx.last)
    # env info is written only where present: clear the whole fragment once
    # so that absent keys read zero, not what the reused buffer held before
    for leaf in flatten(npy.env):
        leaf.fill(0)
    for leaf in npy.env_mask.values():
        leaf.fill(False)


def _begin_checks(ctx, views):
    """The space checks of a fragment that is checked, and the shape of
    observations written without the checked path (``None`` for integer
    observations, which take it)."""
    checks = ctx.space_checks()
    if ctx._fresh:  # row 0 holds the reset observations
        if ctx._reset_problem is not None:
            raise ValueError(ctx._reset_problem + _CHECK_HINT)
        checks.observation(views.state[0].obs, _reset_label)
    return checks, None if views.obs_integral else views.obs_shape


def _check_real_call(act, act_dst, hx_next, hx, info, n_envs):
    # prepare() checked a virtual call; check a real one too, once per
    # fragment, before copy_ could broadcast a wrong shape
    _check_action(act, act_dst)
    _check_hx(hx_next, hx, "step()", "the hx it was given")
    _check_info(info, n_envs)


def _write_env_info(keys, info, env_info, env_mask, j):
    for key in keys:
        if key in info:
            _write_info(env_info[key], j, info[key], key)
            env_mask[key][j] = True


def _end_fragment(actor, npy, views, ctx, hx, version):
    """Fill what is known once the last step is taken: ``final`` where no
    episode ended, the lookahead ``info`` of row ``T``, ``meta``; advance
    ``ctx`` past the fragment."""
    T = len(views.steps)
    if npy.final is not None:
        # `final` is the observation itself where no episode ended: copied
        # once for the fragment (the loop wrote the rest)
        np.logical_not(npy.state.fin[1:], out=views.not_fin)
        for (obs_leaf, final_leaf), where in zip(views.obs_final,
                                                 views.not_fin_like):
            np.copyto(final_leaf, obs_leaf, where=where)
    _, _, info = actor.step(*views.rows[T], hx=hx, virtual=True)
    copy_(views.actor[T], info)
    npy.meta.version[:] = version
    npy.meta.worker[:] = ctx.worker
    npy.meta.env[:] = ctx.env_ids
    npy.meta.seq[:] = ctx.seq
    ctx.ep_length[:] = npy.state.stepno[T]
    ctx.hx = hx
    ctx.seq += 1
    ctx._fresh = False
    suply(np.copyto, ctx.last, _row_fields(npy, T))


def _step_label(t, fin_next):
    """``label(j)``: where the observation of env ``j`` at step ``t`` came
    from (``reset()`` where the episode ended)."""
    def label(j):
        return f"env {j} step {t}" + (", reset()" if fin_next[j] else "")
    return label


def _check_final(checks, final_next, j, obs, t):
    """Check the true last observation of env ``j``'s episode, recorded in
    ``final_next``."""
    def label(_):
        return f"env {j} step {t}"
    _check_cast(final_next, j, obs, label(j))
    checks.observation(getitem(final_next, slice(j, j + 1)), label)


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
             max_steps=None, check_spaces="first"):
    """Play ``n_episodes`` whole episodes with ``actor``, in this process.

    Each of the ``B`` envs plays ``ceil(n_episodes / B)`` episodes (so that
    short episodes are not favoured); the first ``n_episodes`` results, in
    env order, are returned. The actor is used as it is (call ``eval()``
    first for greedy actions). Its actions, ``hx`` and ``info`` are checked
    at every step as :func:`collect` checks them once per fragment.

    Parameters
    ----------
    envs : list of gymnasium.Env
    actor : BaseActorModule
    n_episodes : int
    seed_sequences : list of SeedSequence, optional
        Reset seeds for the first episode of each env.
    max_steps : int, optional
        Stop an episode after this many steps (counted as truncated); at
        least 1, or ``None`` for no limit.
    check_spaces : {'first', 'always', 'never'}
        Check actions and observations against the env's spaces, as
        :func:`collect` does: ``'first'``, until every env has finished its
        first episode of this call (the reset observations included);
        ``'always'``, at every step; ``'never'``.

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
        ``t``, counted from the start of the call).
    """
    check_actor(actor)
    _check_counts(1, len(envs))
    check_count("n_episodes", n_episodes)
    if max_steps is not None:
        check_count("max_steps", max_steps)
    mode = _check_spaces_mode(check_spaces)
    n_envs = len(envs)
    quota = -(-n_episodes // n_envs)
    example = _state_example(envs[0])
    state = aliased(example, 1, n_envs)
    row, npy = state.pyt, getitem(state.npy, 0)
    obs_npy = npy.obs
    suply(np.copyto, npy.act, example.act)  # the placeholder, as startup
    write = _obs_writer(obs_npy)
    checks = None if mode == "never" else _SpaceChecks(envs[0])
    _reset_all(envs, seed_sequences, obs_npy, write, checks)
    npy.fin[:] = True
    hx = _initial_hx(actor, row)
    results = [[] for _ in envs]
    running = np.zeros((n_envs, 2))
    active = np.ones(n_envs, bool)
    act_kind = _act_kind(npy.act, 1)
    n_first = 0  # envs that finished their first episode
    t = 0
    while active.any():
        checking = checks is not None and (mode == "always"
                                           or n_first < n_envs)
        act, hx_next, info = actor.step(*row, hx=hx, virtual=False)
        # every call, before copy_ could broadcast a wrong shape
        _check_real_call(act, row.act, hx_next, hx, info, n_envs)
        hx = hx_next
        copy_(row.act, act)
        if checking:
            live = np.flatnonzero(active)
            checks.action(getitem(npy.act, live), t, live)
        acts = _env_actions(npy.act, act_kind, n_envs)
        for j, env in enumerate(envs):
            if not active[j]:
                continue
            obs, rew, terminated, truncated, _ = env.step(acts[j])
            rew = rew if type(rew) is float else _envs.reward(rew, j, t)
            running[j] += (rew, 1)
            npy.rew[j] = rew
            done = terminated or truncated or (
                max_steps is not None and running[j, 1] >= max_steps)
            if done:
                if checking:  # the last observation, never written else
                    write(obs_npy, j, obs, "step()")
                    _check_final(checks, obs_npy, j, obs, t)
                results[j].append(tuple(running[j]))
                n_first += len(results[j]) == 1
                running[j] = 0
                active[j] = len(results[j]) < quota
                if active[j]:
                    obs, _ = _envs.reset(env)
            npy.fin[j] = done
            npy.stepno[j] = 0 if done else npy.stepno[j] + 1
            write(obs_npy, j, obs, "step()")
            if checking:
                _check_cast(obs_npy, j, obs, _step_label(t, npy.fin)(j))
        if checking:
            live = np.flatnonzero(active)
            checks.observation(getitem(obs_npy, live),
                               _step_label(t, npy.fin), live)
        if npy.fin.any():
            hx = actor.reset(hx, torch.from_numpy(npy.fin.copy()))
        t += 1
    flat = [pair for per_env in results for pair in per_env][:n_episodes]
    returns, lengths = np.array(flat).T
    return returns.astype(np.float64), lengths.astype(np.int64)


def _reset_all(envs, seed_sequences, obs_npy, write, checks):
    """Reset every env into ``obs_npy`` (row 0 of :func:`evaluate`)."""
    for j, env in enumerate(envs):
        seed = reset_seed(None if seed_sequences is None
                          else seed_sequences[j])
        obs, _ = _envs.reset(env, seed=seed)
        write(obs_npy, j, obs, "reset()")
        if checks is not None:
            _check_cast(obs_npy, j, obs, _reset_label(j))
    if checks is not None:
        checks.observation(obs_npy, _reset_label)


def episode(env, actor, *, seed=None, max_steps=None, check_spaces="first"):
    """Play one episode; return its ``(return, length)``.

    The keywords are as in :func:`evaluate`.
    """
    seeds = None if seed is None else [seed_sequence(seed)]
    returns, lengths = evaluate([env], actor, 1, seed_sequences=seeds,
                                max_steps=max_steps,
                                check_spaces=check_spaces)
    return float(returns[0]), int(lengths[0])
