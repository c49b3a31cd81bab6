"""The env-batch interface, and its first implementation: a list of single
Gymnasium envs.

Gymnasium 1.x: ``reset(seed=...)`` returns ``(obs, info)`` and
``step(act)`` returns ``(obs, reward, terminated, truncated, info)``. These
calls, their results and the automatic reset of an env whose episode ended
live here and nowhere else: the core loops (:mod:`rlplay.engine.core`)
step an :class:`EnvBatch`, one call per row for all its columns, and read
what it wrote into the row and what it says happened.

An :class:`EnvBatch` of ``B`` env columns offers:

- ``reset(obs_out, seeds=None, at=None) -> casts``: reset the columns
  ``at`` (all by default), writing their observations into ``obs_out[j]``;
- ``step(act, out, live=None) -> Stepped``: step the ``live`` columns
  (all by default) with their actions of ``act`` and write the row
  ``out`` (a :class:`RowOut`): observations, the rewards as the envs gave
  them, which columns ended an episode and how, their true last
  observations and the env info; an ended column is reset at once
  (``autoreset=True``) and ``out.obs`` gets its reset observation. It
  returns what happened (a :class:`Stepped`): the columns that ended, the
  lost calls, and what recording the observations lost (:class:`Cast`
  records, where asked);
- ``call(name, args, kwargs)``: call a method of every env (:mod:`.control`);
- ``close()``.

The interface reports; it keeps no accounts: running returns, lengths
and step counts are the core's (:mod:`rlplay.engine.core.accounting`).

Seeding (the tree is in :mod:`rlplay.engine.seeds`): each env is made
(with ``seed=`` when the factory takes it) and first reset with the seed
drawn from its own ``SeedSequence``, and its action and observation spaces
are seeded from the same one, so that sampling from them is reproducible.

Each env gets its own copy of its action (a numpy scalar, or a view of a
fresh copy of the row): an env that edits or keeps its action never
changes what the fragment recorded.
"""
from typing import Any, NamedTuple, Optional

import numpy as np

from ..nested import flatten, suply
from ..seeds import reset_seed
from .control import call_env, call_source
from .making import check_step, close_envs, reset, reward
from .rows import (_ACT_SCALARS, _act_kind, _env_actions, _obs_writer,
                   _write_env_info)
from .spaces import format_value, space_example

__all__ = ["RowOut", "Stepped", "Cast", "EnvBatch", "EnvList",
           "cast_problem", "render_refusal"]


class RowOut(NamedTuple):
    """What one step of ``B`` env columns writes: numpy views,
    the env axis first.

    t : int
        The step, for messages (``env j step t``).
    obs : nested arrays, shape = (B, ...)
        The observations after the step (the reset observation where an
        episode ended and the column was reset).
    rew : ndarray of float64, shape = (B,)
        The rewards of the stepped columns, exactly as their envs gave them
        (0 for a lost call); the caller records them (as the fragment's
        float32 row) and adds them up (a return is the float64 sum of the
        rewards, not of their float32 records). Unstepped columns are not
        written.
    fin, truncated : ndarray of bool, shape = (B,)
        Set where an episode ended, and where that end was a truncation
        (``truncated`` may be ``None``: not recorded). Only ended columns are
        written: the caller clears the row.
    final : nested arrays, shape = (B, ...), or None
        The true last observation of the ended columns.
    info, info_mask : dict
        ``{key: nested arrays (B, ...)}`` and ``{key: bool (B,)}`` of the env
        info keys to record (empty: none); only present keys are written.
    """
    t: Any
    obs: Any
    rew: Any
    fin: Any
    truncated: Any
    final: Any
    info: Any
    info_mask: Any


class Stepped(NamedTuple):
    """What happened in one step of an :class:`EnvBatch`.

    ended : list of int
        The columns whose episode ended, in order.
    lost : list of int
        The columns whose call was lost: the source reset them one call late,
        ignoring their action, and their row holds a reset observation that no
        executed action led to (see :mod:`.vector`); or whose agent was absent
        (a PettingZoo env, see :mod:`.agents`), their row the first
        observation of an agent that appears, else a placeholder.
    casts : list of Cast
        What recording the observations lost, in the order written (empty
        unless ``check_casts``).
    env_ended : list of int
        Every column of the multi-agent envs whose episode ended (their last
        agent left; see :mod:`.agents`), in order, absent agents' included; a
        live agent's end is in ``ended`` as well. A single env's episode is
        its column's, reported in ``ended`` alone.
    """
    ended: Any
    lost: Any
    casts: Any
    env_ended: Any = ()

# a step where nothing ended, no call was lost and nothing was cast
_CALM = Stepped((), (), (), ())


class Cast(NamedTuple):
    """An observation that recording changed (see :func:`cast_problem`).

    column : int
    t : int or None
        The step it came from; ``None``: the first reset.
    reset : bool
        It came from ``reset()`` (after step ``t``, when ``t`` is given).
    problem : str
        What was given and what was recorded.
    """
    column: int
    t: Optional[int]
    reset: bool
    problem: str

    @property
    def label(self):
        """Where it came from: ``env j reset()``, ``env j step t`` or
        ``env j step t, reset()``."""
        if self.t is None:
            return f"env {self.column} reset()"
        return f"env {self.column} step {self.t}" + (
            ", reset()" if self.reset else "")


class EnvBatch:
    """``n_envs`` env columns stepped together (see the module docstring).

    Attributes
    ----------
    n_envs : int
    observation_space, action_space : gymnasium.Space
        The spaces of one column.
    can_freeze : bool
        Whether ``step`` can leave some columns unstepped (``live``).
    can_reset_columns : bool
        Whether ``reset`` can reset some columns alone (``at``).
    call_refusal : str or None
        Why ``call`` is refused (EnvPool), or ``None``.
    renders_columns : bool
        Whether ``render(column)`` gives one column's frame (single envs,
        PettingZoo envs); else it raises ``TypeError``
        (:func:`render_refusal` says why).
    column_agents : ndarray of int64, shape = (n_envs,)
        The agent of each column (its index in a PettingZoo env's
        ``possible_agents``; 0 for a single-agent source), recorded in
        ``meta.agent``.
    kind : str
        The fragment loop that steps it: ``"numpy"``, or ``"torch"``
        (:class:`~.torch_source.TorchSource`).
    final_is_obs : bool
        Whether the step that ends an episode writes its true last
        observation into ``out.obs`` (the column is reset at its next
        call, a lost one): ``out.final`` is then left to the loops, which
        copy it from the observations.
    """

    n_envs = 0
    observation_space = action_space = None
    # whether a column can be left unstepped (sticky freezes columns), and
    # reset alone (evaluate cuts episodes at max_steps)
    can_freeze = can_reset_columns = True
    call_refusal = None
    renders_columns = False
    final_is_obs = False

    @property
    def column_agents(self):
        return np.zeros(self.n_envs, np.int64)
    kind = "numpy"

    def reset(self, obs_out, seeds=None, at=None, *, t=None,
              check_casts=False):
        """Reset the columns ``at`` (all by default) and write their
        observations into ``obs_out[j]``.

        Parameters
        ----------
        obs_out : nested arrays, shape = (n_envs, ...)
        seeds : list of SeedSequence, optional
            One per column reset (in the order of ``at``): its reset seed.
        at : list of int, optional
        t : int, optional
            The step this reset follows, for messages.
        check_casts : bool
            Report where recording an observation lost something (an
            integer leaf that does not hold the value given, see
            :func:`cast_problem`).

        Returns
        -------
        casts : list of Cast
        """
        raise NotImplementedError

    def step(self, act, out, live=None, *, autoreset=True,
             check_casts=False):
        """Step the ``live`` columns (all by default) once.

        Parameters
        ----------
        act : nested arrays, shape = (n_envs, ...)
            Every column's action (a row of the fragment: never handed to
            an env as it is).
        out : RowOut
        live : list of int, optional
        autoreset : bool
            Reset a column whose episode ended (``out.obs`` gets the reset
            observation, ``out.final`` the last one, but where
            :attr:`final_is_obs`); without, ``out.obs`` gets the last
            observation and the column is left as it is.
        check_casts : bool
            As for :meth:`reset`.

        Returns
        -------
        stepped : Stepped
        """
        raise NotImplementedError

    def call(self, name, args, kwargs, *, first=0):
        """Call the method ``name(*args, **kwargs)`` of every env, in
        column order (``first``: the number of the first column, for
        messages; see :mod:`.control`); an ``EnvCallError`` if it fails."""
        raise NotImplementedError

    def render(self, column):
        """The frame of column ``column`` (its env's ``render()``: an RGB
        array for envs made with ``render_mode="rgb_array"``).

        Raises
        ------
        TypeError
            The batch cannot render one column (a vector source renders
            all its envs at once).
        """
        raise TypeError(render_refusal(self))

    def close(self, quiet=False):
        """Close every env; with ``quiet``, errors are swallowed."""
        raise NotImplementedError


def render_refusal(batch):
    """Why ``batch`` cannot render one env column (a vector source renders
    all its envs at once)."""
    name = getattr(batch, "name", None) or type(batch).__name__
    return (f"{name} cannot render one env column: recording needs single "
            f"envs (or PettingZoo envs)")


class EnvList(EnvBatch):
    """An :class:`EnvBatch` of single envs, stepped one after the other.

    Parameters
    ----------
    envs : list of gymnasium.Env
        Envs with the same spaces (those of the first are the batch's).
    """

    def __init__(self, envs):
        self.envs = list(envs)
        if not self.envs:
            raise ValueError("n_envs must be at least 1, got 0: an EnvList "
                             "needs at least one env")
        self.n_envs = len(self.envs)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        example = space_example(self.observation_space)
        self._write = _obs_writer(example)
        # the common case written inline: one array of the declared shape;
        # integer leaves take the checked path when casts are checked
        self._obs_shape = example.shape if isinstance(example, np.ndarray) \
            else None
        self._integral = any(leaf.dtype.kind in "biu"
                             for leaf in flatten(example))
        self._act_kind = _act_kind(space_example(self.action_space), 0)
        # (column, env) of every column, the loop of a step that steps all
        self._columns = list(enumerate(self.envs))

    def __len__(self):
        return self.n_envs

    def __iter__(self):
        return iter(self.envs)

    def __getitem__(self, j):
        return self.envs[j]

    def reset(self, obs_out, seeds=None, at=None, *, t=None,
              check_casts=False):
        at = range(self.n_envs) if at is None else at
        write, casts = self._write, []
        for k, j in enumerate(at):
            seed = None if seeds is None else reset_seed(seeds[k])
            obs, _ = reset(self.envs[j], seed=seed)
            write(obs_out, j, obs, "reset()")
            if check_casts:
                _check_cast(casts, obs_out, j, obs, t, True)
        return casts

    def step(self, act, out, live=None, *, autoreset=True,
             check_casts=False):
        (t, obs_next, rew_next, fin_next, truncated_next, final_next,
         info_next, info_mask) = out  # one unpack: cheaper per row
        kind = self._act_kind
        acts = act if kind == _ACT_SCALARS else _env_actions(act, kind,
                                                            self.n_envs)
        keys = tuple(info_mask) if info_mask else ()
        write = self._write
        obs_shape = self._obs_shape if not check_casts or \
            not self._integral else None
        ended, casts = [], []
        for j, env in self._columns if live is None else [
                (j, self.envs[j]) for j in live]:
            result = env.step(acts[j])
            try:
                obs, rew, terminated, truncated, info = result
            except (TypeError, ValueError):
                check_step(env, result)  # raises a clear TypeError
                raise
            rew_next[j] = rew if type(rew) is float else reward(rew, j, t)
            if keys:
                _write_env_info(keys, info, info_next, info_mask, j)
            reset_now = False
            if terminated or truncated:
                ended.append(j)
                fin_next[j] = True
                if truncated_next is not None:
                    truncated_next[j] = truncated and not terminated
                if autoreset:
                    if final_next is not None:
                        write(final_next, j, obs, "step()")
                        if check_casts:
                            _check_cast(casts, final_next, j, obs, t, False)
                    obs, _ = reset(env)
                    reset_now = True
            # the common case inlined: an array of the declared shape
            if type(obs) is np.ndarray and obs.shape == obs_shape:
                obs_next[j] = obs
            else:
                write(obs_next, j, obs, "step()")
                if check_casts:
                    _check_cast(casts, obs_next, j, obs, t, reset_now)
        if ended or casts:
            return Stepped(ended, (), casts)
        return _CALM

    def call(self, name, args, kwargs, *, first=0):
        for j, env in self._columns:
            call_env(env, name, args, kwargs, first + j)

    renders_columns = True

    def render(self, column):
        return self.envs[column].render()

    def close(self, quiet=False):
        close_envs(self.envs, quiet=quiet)


class SourceBatch(EnvBatch):
    """An env batch over one source object, ``self.source`` (a vector
    env, EnvPool's, a torch-native source): an env call goes to it as to
    a vector source (:func:`~.control.call_source`), and closing the batch
    closes it."""

    source = None

    def call(self, name, args, kwargs, *, first=0):
        call_source(self, name, args, kwargs, first)

    def close(self, quiet=False):
        try:
            self.source.close()
        except Exception:  # noqa: BLE001 - re-raised unless quiet
            if not quiet:
                raise


def _check_cast(casts, tree, j, obs, t, reset):
    """Append to ``casts`` what recording ``obs`` in row ``j`` of ``tree``
    lost, if anything."""
    problem = cast_problem(tree, j, obs)
    if problem is not None:
        casts.append(Cast(j, t, reset, problem))


def cast_problem(tree, j, obs):
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
                    f"the observation {format_value(value)} does not "
                    f"fit its space's dtype {leaf.dtype} (recorded as "
                    f"{format_value(recorded)})")
            else:  # the first element that changed
                index = tuple(np.argwhere(recorded != value)[0].tolist())
                problems.append(
                    f"the observation holds {value[index].item()!r} at "
                    f"{list(index)}, which its space's dtype {leaf.dtype} "
                    f"records as {recorded[index].item()!r}")

    suply(check, tree, obs)
    return problems[0] if problems else None
