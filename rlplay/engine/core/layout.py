"""The layout of a fragment: its types, the env axis of each field, which
rows are transitions, where episodes start and end, and the validators of
the arguments that size it. Every other module of :mod:`rlplay.engine.core`
(and every consumer of fragments) reads these facts here instead of
re-deriving them: :func:`env_axes` (which axis of each field is the env
axis), :func:`columns` (selecting env columns), :func:`acted` (the
``acted`` field: which rows an executed action led to, which
:func:`episode_stats` and the masks of :mod:`rlplay.engine.returns`
follow), :func:`episode_edges` (where episodes start and end, and whether
an end was a termination or a truncation: what the episodes of
:mod:`rlplay.engine.episodic`, the nodes of :mod:`rlplay.engine.replay` and
:func:`rlplay.engine.returns.terminated` read).

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
``acted``                (1 + T, B) bool  an executed action led to row
                                          ``t`` (a transition): false at
                                          row 0, at frozen rows, at lost
                                          calls and after an absent agent
                                          (:func:`acted`)
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
``meta.control``         (B,) int64       the number of ``call_envs``
                                          calls applied to the worker's
                                          envs before the fragment's first
                                          step: every step into rows
                                          ``1..T`` ran under the first
                                          ``meta.control`` calls (row 0,
                                          row ``T`` of the fragment
                                          before, may precede the last)
``meta.agent``           (B,) int64       the column's agent: its index in
                                          ``possible_agents`` of a
                                          PettingZoo env (0 for every
                                          other source)
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
space) reaches the env clipped into its bounds, whatever ``check_spaces``
says, and ``state.act`` records the action the actor chose, the one whose
log-probability it computed (:func:`rlplay.engine.envs.box_clipper`; as
Stable-Baselines3 and CleanRL store the sampled action and clip the env's
copy): a Gaussian policy samples outside its ``Box``, and not every env
clips (MuJoCo's HalfCheetah charges its control cost on the action as
given). The env executed ``clip(act, low, high)``, a function of the
recorded action; an actor that wants the recorded action to be the
executed one keeps it inside the ``Box`` (squashing with ``tanh``, say).
NaN is not clipped: the space checks report it.

Space checks (``check_spaces``, see :func:`~rlplay.engine.core.collect`):
the actor's actions are checked against the action space before the envs
get them, and the observations from ``reset`` and ``step`` against the
observation space, as a vectorised ``space.contains``
(:func:`rlplay.engine.envs.space_checker`): ``Discrete``/``MultiDiscrete``
ranges (with ``start``), ``MultiBinary`` 0/1, ``Box`` NaN and bounds,
integral values for integer spaces; and the rewards, for NaN (a NaN reward
poisons every return and advantage of its column). By default this covers
every step of the first fragment that each
:class:`~rlplay.engine.core.Context` collects, as Gymnasium's passive env
checker covers an env's first steps; later fragments pay nothing. A failure
is a ``ValueError`` naming the env column ``j``, the step ``t`` within the
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
no transition: ``acted`` is false there, and
:func:`episode_stats`, ``mask=~acted(fragment)`` of the returns, and
every consumer of fragments leave it out. Every other source (single
envs, same-step or disabled autoreset, a source that resets an env alone)
gives exactly the layout of a list of single envs.

Many agents. A PettingZoo parallel env gives one column per agent of its
``possible_agents`` (``meta.agent`` its index; see
:mod:`rlplay.engine.envs.agents`), and each column is laid out as a single
env whose episodes are the agent's lives. An agent that is *absent* at row
``t`` (not spawned yet, or gone while the others play on) is sent no
action, so row ``t + 1`` is no transition: ``acted`` false, ``fin =
True``, ``rew = 0``, ``stepno = 0``, ``truncated = False``, no episode
statistics, no env info, and ``obs`` (and ``final``) the observation
space's placeholder, until the row where the agent appears (spawned by a
step, or in a reset): that row holds its first observation, still with
``acted`` false, ``fin = True`` and ``stepno = 0``, and its agent-episode
starts there. The row where an agent leaves (its termination or
truncation) is a transition with ``fin``, its ``truncated`` flag, its
return and length in ``stats``, and its true last observation in
``final`` and, as for a lost call, in ``obs`` (no next observation is
known); where the env resets in that row (no agent left) and the agent is
in the reset, ``obs`` holds its first observation of the next episode, as
after any reset. ``act`` at a row no action led to holds what the actor
chose at the row before (the actor is called on every column at every
row, and its ``hx`` is reset at every ``fin``). So an absent agent's rows
are, like frozen rows and lost calls, rows that are not transitions: the
episode edges, the statistics, the masks of the returns, the episodes,
the replay buffer and :class:`~rlplay.engine.norm.RunningNorm` leave them
out, and an agent-episode never spans an absence. Row ``T`` is row 0 of
the next fragment here too.
"""
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import envs as _envs
from ..nested import getitem, suply

__all__ = [
    "CHECK_SPACES", "State", "EpisodeStats", "Meta", "Fragment",
    "check_count", "check_spaces_mode", "check_sticky", "env_axes",
    "columns", "acted", "EpisodeEdges", "episode_edges", "terminated",
    "episode_stats",
]

# the values of collect()'s and evaluate()'s check_spaces=
CHECK_SPACES = ("first", "always", "never")

_CHECK_HINT = " (check_spaces='never' turns these checks off)"

class State(NamedTuple):
    """The rows of a fragment's state, each ``(1 + T, B, ...)``:
    ``stepno`` (steps since the episode started), ``obs`` (``x_t``),
    ``act`` (``a_{t-1}``, the action that led to row ``t``), ``rew``
    (``r_t``) and ``fin`` (the step into row ``t`` ended an episode); see
    :mod:`rlplay.engine.core.layout`."""
    stepno: Any
    obs: Any
    act: Any
    rew: Any
    fin: Any


class EpisodeStats(NamedTuple):
    """Where an episode ended at row ``t``: its return ``ret`` (float64)
    and its ``length`` (int64), each ``(1 + T, B)``, zero elsewhere; see
    :func:`episode_stats`."""
    ret: Any
    length: Any


class Meta(NamedTuple):
    """Where each env column of a fragment comes from, each ``(B,)``
    int64: the parameter ``version``, the ``worker``, the global ``env``
    column, the worker's fragment number ``seq``, its envs'
    ``generation``, the ``control`` number of ``call_envs`` calls applied
    and the column's ``agent``; see :mod:`rlplay.engine.core.layout`."""
    version: Any
    worker: Any
    env: Any
    seq: Any
    generation: Any
    # control and agent default to None (empty leaves) for a Meta made by
    # hand
    control: Any = None
    agent: Any = None


class Fragment(NamedTuple):
    """A fragment of ``T`` steps of ``B`` envs; see
    :mod:`rlplay.engine.core.layout`."""
    state: State
    truncated: Any
    final: Any
    actor: Any
    env: Any
    env_mask: Any
    hx: Any
    stats: EpisodeStats
    meta: Meta
    acted: Any = None


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


def check_flag(name, value):
    """Check that argument ``name`` is a bool (``numpy.bool_`` too), not
    a value that Python would read as one (``"no"`` is true, ``None``
    false); returns it as a ``bool``.

    Raises
    ------
    TypeError
        Not a bool; the message says what was given.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got "
                        f"{type(value).__name__} {value!r}")
    return bool(value)


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
            "env, EnvPool or a torch-native source; a PettingZoo env steps "
            "all its agents): use sticky=False, or a factory of single "
            "envs")



def env_axes(hx_dim=1):
    """The env axis of each field of a fragment, as a :class:`Fragment` of
    ints: 1 for the time-major fields, ``hx_dim`` (the actor's) for
    ``hx``, 0 for ``meta``."""
    return Fragment(state=1, truncated=1, final=1, actor=1, env=1,
                    env_mask=1, hx=hx_dim, stats=1, meta=0, acted=1)


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
    """The rows of a fragment that an executed action led to: its
    ``acted`` field (the array itself, not a copy), written by the
    fragment loop.

    Rows ``1 .. T`` but the frozen rows of a sticky fragment (those after
    an env's episode ended), the lost calls of a next-step source and the
    rows after an absent agent of a PettingZoo env (see the module
    docstring); row 0 repeats the previous fragment's row ``T``
    and is never counted. Episode statistics, the episode edges
    (:func:`episode_edges`), and the masks of
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

    Raises
    ------
    ValueError
        A fragment without the field (``acted=None``), e.g. one built by
        hand.
    """
    if fragment.acted is None:
        raise ValueError("the fragment has no acted field (acted=None): "
                         "it says which rows an executed action led to "
                         "(see rlplay.engine.core.layout)")
    return fragment.acted


class EpisodeEdges(NamedTuple):
    """Where episodes start and end in a fragment: four ``(1 + T, B)``
    bool arrays or tensors (see :func:`episode_edges`)."""
    starts: Any
    ends: Any
    terminated: Any
    truncated: Any


def terminated(fin, truncated):
    """The rows whose transition ended an episode by termination (not by
    truncation): ``fin & ~truncated``; arrays or tensors."""
    return fin & ~truncated


def episode_edges(fragment):
    """Where the episodes of a fragment start and end.

    Parameters
    ----------
    fragment : Fragment
        numpy or torch views (any number of env columns).

    Returns
    -------
    EpisodeEdges
        ``(1 + T, B)`` bool arrays or tensors (as ``fragment``):

        - ``starts``: row ``t`` holds the first observation of an episode
          (``fin``) that an executed action continues in this fragment
          (``acted[t + 1]``); at row ``T``, every ``fin`` (whether the
          episode goes on is known in the next fragment). A frozen row,
          a lost call or an absent agent's row starts nothing: the
          episode starts at the last row before its first transition.
        - ``ends``: an executed action ended an episode at row ``t``
          (``acted & fin``): ``final[t]`` holds its last observation,
          ``stats`` its return and length.
        - ``terminated``, ``truncated``: the ends by termination, and by
          truncation (a time limit: bootstrap from ``final``).
    """
    fin, moved = fragment.state.fin, acted(fragment)
    starts = fin.clone() if isinstance(fin, torch.Tensor) else fin.copy()
    starts[:-1] &= moved[1:]
    ends = _ends(fragment)
    return EpisodeEdges(starts=starts, ends=ends,
                        terminated=terminated(ends, fragment.truncated),
                        truncated=ends & fragment.truncated)


def _ends(fragment):
    """Where an executed action ended an episode: ``acted & fin``."""
    return acted(fragment) & fragment.state.fin


def episode_stats(fragment):
    """Returns and lengths of the episodes that ended in a fragment.

    Parameters
    ----------
    fragment : Fragment
        numpy or torch views (any number of env columns, on any device).

    Returns
    -------
    returns : ndarray of float64
    lengths : ndarray of int64
        One entry per episode that ended at a row an executed action led
        to (:func:`acted`: rows ``1..T``, row 0 repeating the previous
        fragment), in row-major order.
    """
    ended = _ends(fragment)
    ret, length = fragment.stats
    if isinstance(ended, torch.Tensor) and ended.device.type != "cpu":
        # selected on the device; only the episodes come over
        return ret[ended].cpu().numpy(), length[ended].cpu().numpy()
    ended = np.asarray(ended)
    return np.asarray(ret)[ended], np.asarray(length)[ended]


def _state_example(env):
    """One row laid out for ``env`` (an env or an env batch: only its
    spaces are used): placeholders (valid elements) of its spaces, so that
    the actor's probe sees valid values."""
    return State(stepno=np.zeros((), np.int64),
                 obs=_envs.space_placeholder(env.observation_space),
                 act=_envs.space_placeholder(env.action_space),
                 rew=np.zeros((), np.float32),
                 fin=np.ones((), bool))



def _row_fields(fragment, t):
    # the fields that row T hands on to row 0 of the next fragment
    return (getitem(fragment.state, t), fragment.truncated[t],
            getitem(fragment.final, t), getitem(fragment.stats, t))

