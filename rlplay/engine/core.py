"""Core loops and the layout of a fragment: the only code that calls
``actor.step``, and that steps envs (through the env adapter's
:class:`~rlplay.engine.envs.EnvBatch`, the only code that calls
``env.step``).

:func:`prepare` allocates a fragment buffer, :func:`startup` resets the envs
and returns the :class:`Context` of an ongoing collection, :func:`collect`
fills a buffer with the next fragment in place, and :func:`evaluate` plays
whole episodes. Every generator in :mod:`rlplay.engine.rollout` is a thin
driver around these. The facts of the layout are defined here once:
which axis of each field is the env axis (:func:`env_axes`), selecting
env columns (:func:`columns`), and which rows an executed action led to
(:func:`acted`, which :func:`episode_stats` and the masks of
:mod:`rlplay.engine.returns` follow).

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
``meta.version``         (B,) int64       the parameter version that
                                          collected the fragment: the
                                          number of publications (the
                                          generator's ``next()`` calls)
                                          before it, whether or not the
                                          parameters changed
``meta.worker``          (B,) int64       the worker that collected it
``meta.env``             (B,) int64       the global index of the env
                                          column
``meta.seq``             (B,) int64       the worker's fragment number:
                                          0, 1, 2, ... (a replacement goes
                                          on from the last one received)
``meta.generation``      (B,) int64       0 for a worker's first envs,
                                          raised whenever its envs start
                                          again from resets (a restart)
=======================  ===============  ===================================

Every generator delivers a worker's fragments in ``meta.seq`` order; row 0
of a fragment continues row ``T`` of the worker's previous one unless
``meta.generation`` changed (the new generation's row 0 is a reset) or a
number is missing (a fragment dropped by ``max_lag``).

Row ``T`` of one fragment equals row 0 of the next one from the same envs
(``actor`` excepted: row 0 comes from the real step, row ``T`` from the
lookahead). Row 0 of the very first fragment holds the reset observation
with ``fin = True``, ``rew`` zero and, as ``act``, the action space's
placeholder: the valid action nearest zero, leaf by leaf (zero where zero
is valid; ``start`` for ``Discrete(n, start=1)``, ``low`` for ``Box(1,
2)``; see :func:`rlplay.engine.envs.space_placeholder`). Episode statistics
count rows ``1..T`` only (row 0 repeats the previous fragment's row ``T``).

The env gets its own copy of each action (see :mod:`rlplay.engine.envs`):
an env that edits or keeps its action never changes ``state.act``.

Out-of-bound continuous actions. Every ``Box`` action (a leaf of the action
space) is clipped into its bounds before the env gets it, whatever
``check_spaces`` says, and ``state.act`` records the clipped action, the
one the env executed (:func:`rlplay.engine.envs.box_clipper`): a Gaussian
policy samples outside its ``Box``, and not every env clips (MuJoCo's
HalfCheetah charges its control cost on the action as given). The actor's
``info`` (a ``logp``) was computed for the action it chose: where that
action was clipped, a learner that needs the ``logp`` of the recorded
action recomputes it, or the actor keeps its actions inside the ``Box``
(squashing with ``tanh``, say). NaN is not clipped: the space checks
report it.

Space checks (``check_spaces``, see :func:`collect`): the actor's actions
are checked against the action space before the envs get them, and the
observations from ``reset`` and ``step`` against the observation space, as
a vectorised ``space.contains`` (:func:`rlplay.engine.envs.space_checker`):
``Discrete``/``MultiDiscrete`` ranges (with ``start``), ``MultiBinary``
0/1, ``Box`` NaN and bounds, integral values for integer spaces; and the
rewards, for NaN (a NaN reward poisons every return and advantage of its
column). By default this covers every step of the first fragment that each
:class:`Context` collects, as Gymnasium's passive env checker covers an
env's first steps; later fragments pay nothing. A failure is a
``ValueError`` naming the env column ``j``, the step ``t`` within the
fragment and the value, e.g. ``env 3 step 5: the actor's action 7 is
outside the action space Discrete(3)``.

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

Lost calls. A batched source with next-step autoreset that cannot reset
one of its envs alone (a native vector env such as Gymnasium's
``CartPoleVectorEnv``; see :mod:`rlplay.engine.envs.vector`) resets an
ended env at its next call and ignores the action there. Where env ``j``'s
episode ended at row ``t``, row ``t`` then holds its true last observation
in ``obs`` (as in ``final``: the reset observation is not known yet), and
row ``t + 1``, the lost call, holds the reset observation with ``fin =
True``, ``rew = 0``, ``stepno = 0``, ``truncated = False``, ``final``
a copy of that ``obs`` (no episode ended there), no episode statistics and
no env info: ``fin[t + 1]`` still means that ``obs[t + 1]``
starts the next episode, and the action recorded there (``act[t + 1]``,
chosen at row ``t``) was never executed. Such a row, as a frozen one, is
no transition: :func:`acted` is false there, and
:func:`episode_stats`, ``mask=~acted(fragment)`` of the returns, and
every consumer of fragments leave it out. Every other source (single
envs, same-step or disabled autoreset, a source that resets an env alone)
gives exactly the layout of a list of single envs.
"""
from collections import namedtuple

import numpy as np
import torch

from . import envs as _envs
from .actor import check_actor
from .envs import RowOut, as_batch
from .seeds import seed_sequence
from .nested import (StructureError, check_structure, flatten, getitem,
                     suply)
from .shared import Aliased, aliased, copy_, torchify

__all__ = [
    "check_count",
    "check_spaces_mode",
    "check_sticky",
    "State",
    "Fragment",
    "EpisodeStats",
    "Meta",
    "env_axes",
    "columns",
    "acted",
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
EpisodeStats = namedtuple("EpisodeStats", "ret length")
Meta = namedtuple("Meta", "version worker env seq generation")
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


def check_spaces_mode(check_spaces):
    """Check a ``check_spaces=`` argument (one of :data:`CHECK_SPACES`);
    returns it.

    Raises
    ------
    ValueError
        Naming what was given.
    """
    if not isinstance(check_spaces, str) or check_spaces not in CHECK_SPACES:
        raise ValueError(f"check_spaces must be one of 'first', 'always' "
                         f"or 'never', got {check_spaces!r}")
    return check_spaces


def env_axes(hx_dim=1):
    """The env axis of each field of a fragment, as a :class:`Fragment` of
    ints: 1 for the time-major fields, ``hx_dim`` (the actor's) for
    ``hx``, 0 for ``meta``."""
    return Fragment(state=1, truncated=1, final=1, actor=1, env=1,
                    env_mask=1, hx=hx_dim, stats=1, meta=0)


def columns(fragment, index, hx_dim=1):
    """The env columns ``index`` (a slice, or an int array or list) of a
    fragment (numpy or torch; views for a slice), every field along its
    env axis (:func:`env_axes`).
    """
    def select(leaf, axis):
        return leaf[(slice(None),) * axis + (index,)]

    return Fragment(*[None if field is None else suply(
        lambda leaf, axis=axis: select(leaf, axis), field)
        for field, axis in zip(fragment, env_axes(hx_dim))])


def acted(fragment):
    """The rows of a fragment that an executed action led to.

    Rows ``1 .. T`` but the frozen rows of a sticky fragment (those after
    an env's episode ended) and the lost calls of a next-step source: rows
    with ``fin`` set and no episode statistics (see the module docstring);
    row 0 repeats the previous fragment's row ``T`` and is never counted. Episode statistics, and the masks of
    :func:`rlplay.engine.returns.returns` and
    :func:`~rlplay.engine.returns.gae` (``mask=~acted(fragment)``), follow
    it.

    Parameters
    ----------
    fragment : Fragment
        numpy or torch views (any number of env columns).

    Returns
    -------
    mask : bool array or tensor (as ``fragment``), shape = (1 + T, B)
    """
    fin, length = fragment.state.fin, fragment.stats.length
    mask = ~(fin & (length == 0))
    mask[0] = False
    return mask


def _state_example(env):
    """One row laid out for ``env`` (an env or an env batch: only its
    spaces are used): placeholders (valid elements) of its spaces, so that
    the actor's probe sees valid values."""
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
    try:
        with torch.no_grad():
            act, hx, info = actor.step(*row, hx=None, virtual=True)
    except Exception as exc:
        _add_note(exc, _probe_note(actor, row.obs, env.observation_space))
        raise
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
        stats=alloc(EpisodeStats(np.zeros((), np.float64),
                                 np.zeros((), np.int64)), T1, n_envs),
        meta=alloc(Meta(*[np.zeros((), np.int64)] * len(Meta._fields)),
                   n_envs),
    )
    return Aliased(suply(torch.Tensor.numpy, pyt), pyt)


def _probe_note(actor, obs, space):
    """What a failure of the probe call was doing (see :func:`prepare`)."""
    shapes = suply(lambda x: f"{tuple(x.shape)} {x.dtype}", obs)
    return (f"(raised while rlplay probed the actor {type(actor).__name__} "
            f"on one row of observations laid out as the env's first "
            f"observation, {shapes} for the observation space {space!r}, to "
            f"size the buffers: does the policy take inputs of that size "
            f"and dtype?)")


def _add_note(exc, note):
    # the exception is raised as it is, with a note where Python has them
    # (PEP 678, 3.11) and else with the note in its message when it has
    # one plain string argument
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    elif len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} {note}",)


def _row_fields(fragment, t):
    # the fields that row T hands on to row 0 of the next fragment
    return (getitem(fragment.state, t), fragment.truncated[t],
            getitem(fragment.final, t), getitem(fragment.stats, t))


_Step = namedtuple("_Step", "actor_in act_out info_out row row_next out "
                            "ret length")
_Step.__doc__ = """What step ``t`` of a fragment reads and writes: the
actor's input (torch row ``t``) and where its action and info go (torch),
the numpy state rows ``t`` and ``t + 1``, the :class:`RowOut` the env batch
writes (with the context's running returns), and the episode statistics of
row ``t + 1``."""


class _Views:
    """Per-row views of one buffer, made once so the loop only indexes;
    ``ep_return`` is the running returns the env batch adds to."""

    def __init__(self, buffer, ep_return):
        npy, pyt = buffer
        T1, B = npy.state.fin.shape
        self.buffer = buffer
        rows = [getitem(pyt.state, slice(t, t + 1)) for t in range(T1)]
        self.rows = rows
        self.actor = [getitem(pyt.actor, slice(t, t + 1)) for t in range(T1)]
        state = [getitem(npy.state, t) for t in range(T1)]
        final = [getitem(npy.final, t) for t in range(T1)]
        self.state, self.final = state, final
        self.ramp = np.arange(T1, dtype=np.int64)
        # the env batch writes the fragment's float32 rewards and adds them,
        # exactly as the envs gave them, to the running returns
        self.steps = [
            _Step(actor_in=rows[t], act_out=rows[t + 1].act,
                  info_out=self.actor[t], row=state[t], row_next=state[t + 1],
                  out=RowOut(t=t, obs=state[t + 1].obs, rew=state[t + 1].rew,
                             fin=state[t + 1].fin,
                             truncated=npy.truncated[t + 1],
                             final=final[t + 1], info=getitem(npy.env, t),
                             info_mask=getitem(npy.env_mask, t),
                             ret=ep_return),
                  ret=npy.stats.ret[t + 1], length=npy.stats.length[t + 1])
            for t in range(T1 - 1)]
        # (obs leaf, final leaf) pairs over rows 1..T and a (T, B) bool
        # scratch with views of it shaped to broadcast against every obs
        # leaf: `final` is the observation itself where no episode ended,
        # copied once per fragment (np.copyto's `where`)
        self.obs_final = [(obs_leaf[1:], final_leaf[1:])
                          for obs_leaf, final_leaf in zip(
                              flatten(npy.state.obs), flatten(npy.final))]
        self.not_fin = np.empty((T1 - 1, B), bool)
        self.not_fin_like = [
            self.not_fin.reshape(*self.not_fin.shape, *[1] * (leaf.ndim - 2))
            for leaf in flatten(npy.state.obs)]


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
        # ``env``: an env or an env batch (only its spaces are used)
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


    @staticmethod
    def reward(rew_row, t, envs_at=None):
        """Raise for the first NaN reward of ``rew_row`` (B,): it would
        poison every return and advantage of its column."""
        nan = np.isnan(rew_row)
        if nan.any():
            j = int(np.flatnonzero(nan)[0])
            j = j if envs_at is None else int(envs_at[j])
            raise ValueError(f"env {j} step {t}: the reward is NaN, which "
                             f"would poison every return and advantage of "
                             f"its column{_CHECK_HINT}")


def _raise_cast(label, problem):
    # an observation that recording changed (see envs.cast_problem)
    raise ValueError(f"{label}: {problem}{_CHECK_HINT}")


class Context:
    """The state of an ongoing collection, carried from fragment to fragment.

    Attributes
    ----------
    envs : EnvBatch
    last : tuple
        Row ``T`` of the last fragment (``state``, ``truncated``, ``final``,
        ``stats``), numpy arrays of shape ``(B, ...)``.
    hx : nested tensors
        The actor's state for ``last``.
    ep_return : list of float, or ndarray of float64
        The running return of each env's current episode, from
        ``envs.running_returns()``: the env batch adds the rewards to it
        (see ``RowOut.ret``).
    ep_length : ndarray, shape = (B,)
        The length of each env's current episode.
    seq : int
        The ``meta.seq`` of the next fragment.
    worker, generation : int
        Recorded in ``meta.worker`` and ``meta.generation``.
    env_ids : ndarray, shape = (B,)
        Global env indices recorded in ``meta.env``.
    spaces_checked : bool
        A fragment was collected with space checks (so
        ``check_spaces='first'`` checks no more).
    """

    def __init__(self, envs, buffer, worker=0, env_ids=None, generation=0,
                 seq=0):
        npy = buffer.npy
        self.envs = envs
        B = envs.n_envs
        self.last = suply(lambda a: np.zeros_like(a), _row_fields(npy, 0))
        self.hx = None
        self.ep_return = envs.running_returns()
        self.ep_length = np.zeros(B, np.int64)
        self.seq, self.worker, self.generation = seq, worker, generation
        self.env_ids = (np.arange(B) if env_ids is None
                        else np.asarray(env_ids, np.int64))
        self.spaces_checked = False
        # `last` holds the reset observations (row 0 of the first fragment)
        # and what recording them lost, for the first checked fragment
        self._fresh, self._reset_problem = False, None
        self._checks = None
        self._views = {}
        # Box actions are clipped into their bounds before the env steps
        self.clip_actions = _envs.box_clipper(envs.action_space)

    def views(self, buffer):
        views = self._views.get(id(buffer))
        if views is None or views.buffer is not buffer:
            views = _Views(buffer, self.ep_return)
            self._views[id(buffer)] = views
        return views

    def space_checks(self):
        if self._checks is None:
            self._checks = _SpaceChecks(self.envs)
        return self._checks


def startup(envs, actor, buffer, seed_sequences=None, *, worker=0,
            env_ids=None, generation=0, seq=0):
    """Reset the envs and return the :class:`Context` of a collection.

    Row 0 of the first fragment (``ctx.last``) gets the reset observations,
    ``fin = True`` and the action space's placeholder as ``act`` (see the
    module docstring). The reset observations are space-checked by the
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
    check_actor(actor)
    envs = as_batch(envs)
    if envs.n_envs != buffer.npy.state.fin.shape[1]:
        raise ValueError(f"{envs.n_envs} envs for a buffer of "
                         f"{buffer.npy.state.fin.shape[1]}")
    ctx = Context(envs, buffer, worker, env_ids, generation, seq)
    state, truncated, final, stats = ctx.last

    def first_problem(label, problem):
        if ctx._reset_problem is None:
            ctx._reset_problem = f"{label}: {problem}"

    envs.reset(state.obs, seed_sequences, on_cast=first_problem)
    ctx._fresh = True
    suply(np.copyto, state.act,
          _envs.space_placeholder(envs.action_space))
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
        :func:`acted` to leave them out).
    version : int
        The parameter version recorded in ``meta.version``.
    check_spaces : {'first', 'always', 'never'}
        When to check actions and observations against the env's spaces,
        and rewards for NaN (see the module docstring): ``'first'``, every step of the first
        fragment collected with ``ctx`` (with the reset observations of
        :func:`startup` in its row 0); ``'always'``, every step of every
        fragment; ``'never'``.

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
    mode = check_spaces_mode(check_spaces)
    checking = mode == "always" or (mode == "first"
                                    and not ctx.spaces_checked)
    npy, pyt = buffer
    views = ctx.views(buffer)
    envs, T = ctx.envs, len(views.steps)
    n_envs = envs.n_envs
    if sticky:
        check_sticky(envs)
    _begin_fragment(npy, ctx)
    hx = ctx.hx
    copy_(pyt.hx, hx)
    ep_return = ctx.ep_return
    # the columns stepped in this fragment (None: all), and those frozen
    # (sticky)
    live, frozen = None, []
    fin_at = torch.zeros(n_envs, dtype=torch.bool)
    fin_np = fin_at.numpy()
    copy_info, copy_act = _copier(pyt.actor), _copier(pyt.state.act)
    clip = ctx.clip_actions
    checks = _begin_checks(ctx, views) if checking else None
    on_cast = _raise_cast if checking else None
    # the step counts of episodes that go on, for the whole fragment at
    # once; an env's column is rewritten from where its episode ends
    stepno, ramp = npy.state.stepno, views.ramp
    np.add(stepno[0], ramp[:, None], out=stepno)
    # a feed-forward actor's hx is (): nothing to reset
    stateless = type(hx) is tuple and not hx

    for t in range(T):
        step = views.steps[t]
        row_next = step.row_next
        act, hx_next, info = actor.step(*step.actor_in, hx=hx, virtual=False)
        if t == 0:
            _check_real_call(act, step.act_out, hx_next, hx, info, n_envs)
        copy_info(step.info_out, info)
        copy_act(step.act_out, act)
        if clip is not None:  # recorded as the env executes it
            clip(row_next.act)
        if checking:
            checks.action(row_next.act, t)
        for j in frozen:
            _freeze(step.row, row_next, views.final[t], step.out.final, j)
        ended = envs.step(row_next.act, step.out, live, on_cast=on_cast)
        if ended:
            _end_episodes(ended, step, ep_return, stepno, ramp, t)
            if checking and step.out.final is not None:
                checks.observation(getitem(step.out.final, ended),
                                   _final_label(t), ended)
        lost = envs.lost
        if lost:  # the new episodes start here (see the module docstring)
            stepno[t + 1:, lost] = ramp[:T - t, None]
            if step.out.final is not None:
                # no episode ended here: `final` is the observation itself,
                # not what the reused buffer held (the end of fragment
                # copies it only where `fin` is unset)
                suply(_copy_at, step.out.final, row_next.obs, j=lost)
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
                hx = actor.reset(hx, fin_at.clone())

    _end_fragment(actor, npy, views, ctx, hx, version)
    if checking:
        ctx.spaces_checked = True
    return buffer


def check_sticky(envs):
    """Refuse ``sticky=True`` for an env batch that cannot leave some of
    its columns unstepped (a vector source steps them all).

    Raises
    ------
    ValueError
    """
    if not envs.can_freeze:
        raise ValueError(
            "sticky=True freezes an env once its episode ended, but the "
            "factory's source steps all its envs at every call (a vector "
            "env or EnvPool): use sticky=False, or a factory of single envs")


def _end_episodes(ended, step, ep_return, stepno, ramp, t):
    """Episode statistics of the columns ``ended`` at row ``t + 1``, and
    their new episodes' step counts down the rest of the fragment."""
    T = len(ramp) - 1
    if len(ended) == 1:  # the common case, without fancy indexing
        j, = ended
        # an episode's length is its step count plus this step
        step.ret[j], step.length[j] = ep_return[j], step.row.stepno[j] + 1
        ep_return[j] = 0.0
        stepno[t + 1:, j] = ramp[:T - t]
        return
    # the running returns are a list or an array (running_returns)
    step.ret[ended] = [ep_return[j] for j in ended]
    for j in ended:
        ep_return[j] = 0.0
    ended = np.array(ended)  # indexing by an array is cheaper than a list
    step.length[ended] = step.row.stepno[ended] + 1
    stepno[t + 1:, ended] = ramp[:T - t, None]


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
    """The space checks of a fragment that is checked (its row 0 too, when
    it holds the reset observations)."""
    checks = ctx.space_checks()
    if ctx._fresh:  # row 0 holds the reset observations
        if ctx._reset_problem is not None:
            raise ValueError(ctx._reset_problem + _CHECK_HINT)
        checks.observation(views.state[0].obs, _reset_label)
    return checks


def _check_real_call(act, act_dst, hx_next, hx, info, n_envs):
    # prepare() checked a virtual call; check a real one too, once per
    # fragment, before copy_ could broadcast a wrong shape
    _check_action(act, act_dst)
    _check_hx(hx_next, hx, "step()", "the hx it was given")
    _check_info(info, n_envs)


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
    meta = npy.meta
    meta.version[:] = version
    meta.worker[:] = ctx.worker
    meta.env[:] = ctx.env_ids
    meta.seq[:] = ctx.seq
    meta.generation[:] = ctx.generation
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


def _final_label(t):
    """``label(j)`` of the true last observation of env ``j``'s episode,
    which ended at step ``t``."""
    def label(j):
        return f"env {j} step {t}"
    return label


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
        One entry per episode that ended at a row an executed action led
        to (:func:`acted`: rows ``1..T``, row 0 repeating the previous
        fragment), in row-major order.
    """
    ended = np.asarray(acted(fragment) & fragment.state.fin)
    ret, length = fragment.stats
    return np.asarray(ret)[ended], np.asarray(length)[ended]


@torch.no_grad()
def evaluate(envs, actor, n_episodes, *, seed_sequences=None,
             max_steps=None, check_spaces="first", on_frame=None):
    """Play ``n_episodes`` whole episodes with ``actor``, in this process.

    Each of the ``B`` envs plays ``ceil(n_episodes / B)`` episodes (so that
    short episodes are not favoured); the first ``n_episodes`` results, in
    env order, are returned. The actor is used as it is (call ``eval()``
    first for greedy actions). Its actions, ``hx`` and ``info`` are checked
    at every step as :func:`collect` checks them once per fragment.

    Parameters
    ----------
    envs : EnvBatch or list of gymnasium.Env
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
    on_frame : callable, optional
        ``on_frame(frame)`` gets env 0's rendered frames of its first
        episode: at its reset, then after each step up to the last one
        (``1 + length`` frames, RGB arrays ``(H, W, 3)`` of an env made
        with ``render_mode="rgb_array"``). ``None``: nothing is rendered.

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
        ``t``, counted from the start of the call); a reward that is not a
        number.
    """
    check_actor(actor)
    envs = as_batch(envs)
    _check_counts(1, envs.n_envs)
    check_count("n_episodes", n_episodes)
    if max_steps is not None:
        check_count("max_steps", max_steps)
    mode = check_spaces_mode(check_spaces)
    n_envs = envs.n_envs
    quota = -(-n_episodes // n_envs)
    example = _state_example(envs)
    state = aliased(example, 1, n_envs)
    row, npy = state.pyt, getitem(state.npy, 0)
    suply(np.copyto, npy.act, example.act)  # the placeholder, as startup
    checks = None if mode == "never" else _SpaceChecks(envs)
    clip = _envs.box_clipper(envs.action_space)  # as collect clips
    envs.reset(npy.obs, seed_sequences,
               on_cast=None if checks is None else _raise_cast)
    if checks is not None:
        checks.observation(npy.obs, _reset_label)
    npy.fin[:] = True
    if on_frame is not None:
        on_frame(_frame(envs, 0))
    hx = _initial_hx(actor, row)
    rew = np.zeros(n_envs, np.float64)
    # a list of single envs is not reset by its step (an env whose quota is
    # played stays as it is), so the last observations are in `obs`
    autoreset = not envs.can_freeze
    out = RowOut(t=0, obs=npy.obs, rew=rew, fin=npy.fin, truncated=None,
                 final=aliased(example.obs, n_envs).npy if autoreset
                 else None, info={}, info_mask={})
    last = out.final if autoreset else npy.obs
    results = [[] for _ in range(n_envs)]
    ep_return = np.zeros(n_envs, np.float64)
    ep_length = np.zeros(n_envs, np.int64)
    active = np.ones(n_envs, bool)
    # cut at max_steps where the column cannot be reset alone: its steps
    # count for nothing until its episode ends on its own
    draining = np.zeros(n_envs, bool)
    n_first = 0  # envs that finished their first episode
    t = 0
    while active.any():
        checking = checks is not None and (mode == "always"
                                           or n_first < n_envs)
        on_cast = _raise_cast if checking else None
        act, hx_next, info = actor.step(*row, hx=hx, virtual=False)
        # every call, before copy_ could broadcast a wrong shape
        _check_real_call(act, row.act, hx_next, hx, info, n_envs)
        hx = hx_next
        copy_(row.act, act)
        if clip is not None:
            clip(npy.act)
        live = np.flatnonzero(active)
        if checking:
            checks.action(getitem(npy.act, live), t, live)
        npy.fin[live] = False
        # single envs are stepped where they play on, and reset here where
        # they play another episode; a batched source steps (and resets)
        # all its columns, the ended ones are filtered by `active`
        ended = envs.step(npy.act, out._replace(t=t),
                          live.tolist() if envs.can_freeze else None,
                          autoreset=autoreset, on_cast=on_cast)
        counted = active & ~draining
        counted[list(envs.lost)] = False  # lost calls are no steps
        ep_return[counted] += rew[counted]
        ep_length[counted] += 1
        npy.rew[live] = rew[live]
        if checking:
            checks.reward(rew[live], t, live)
        ended = [j for j in ended if active[j]]
        if checking and ended:  # the last observations
            checks.observation(getitem(last, ended), _final_label(t), ended)
        done = [j for j in ended if not draining[j]]
        draining[ended] = False
        cut = [] if max_steps is None else np.flatnonzero(
            counted & (ep_length >= max_steps) & ~npy.fin).tolist()
        if on_frame is not None and live[0] == 0:  # before any reset
            on_frame(_frame(envs, 0))
            if 0 in done or 0 in cut:
                on_frame = None  # env 0's first episode is over
        for j in done + cut:
            results[j].append((ep_return[j], ep_length[j]))
            n_first += len(results[j]) == 1
            ep_return[j], ep_length[j] = 0.0, 0
            active[j] = len(results[j]) < quota
        again = [j for j in (cut if autoreset else ended + cut) if active[j]]
        if again and envs.can_reset_columns:
            envs.reset(npy.obs, at=sorted(again), t=t, on_cast=on_cast)
        elif again:
            draining[again] = True
        npy.fin[cut] = True
        npy.stepno[live] += 1
        npy.stepno[npy.fin] = 0
        if checking:
            live = np.flatnonzero(active)
            checks.observation(getitem(npy.obs, live),
                               _step_label(t, npy.fin), live)
        if npy.fin.any():
            hx = actor.reset(hx, torch.from_numpy(npy.fin.copy()))
        t += 1
    flat = [pair for per_env in results for pair in per_env][:n_episodes]
    returns, lengths = np.array(flat).T
    return returns.astype(np.float64), lengths.astype(np.int64)


def _frame(envs, j):
    frame = envs.render(j)
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 \
            or frame.shape[-1] != 3:
        raise TypeError(
            f"recording needs envs that render RGB frames (made with "
            f"render_mode='rgb_array'): env {j} rendered "
            + (f"an array of shape {frame.shape}"
               if isinstance(frame, np.ndarray) else repr(type(frame))))
    return frame


def episode(env, actor, *, seed=None, max_steps=None, check_spaces="first"):
    """Play one episode; return its ``(return, length)``.

    The keywords are as in :func:`evaluate`.
    """
    seeds = None if seed is None else [seed_sequence(seed)]
    returns, lengths = evaluate([env], actor, 1, seed_sequences=seeds,
                                max_steps=max_steps,
                                check_spaces=check_spaces)
    return float(returns[0]), int(lengths[0])
