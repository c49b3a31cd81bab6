"""The env-batch interface, and its first implementation: a list of single
Gymnasium envs.

Gymnasium 1.x: ``reset(seed=...)`` returns ``(obs, info)`` and
``step(act)`` returns ``(obs, reward, terminated, truncated, info)``. These
calls, their results and the automatic reset of an env whose episode ended
live here and nowhere else: the core loops (:mod:`rlplay.engine.core`)
step an :class:`EnvBatch`, one call per row for all its columns, and read
what it wrote into the row.

An :class:`EnvBatch` of ``B`` env columns offers:

- ``reset(obs_out, seeds=None, at=None)``: reset the columns ``at`` (all
  by default), writing their observations into ``obs_out[j]``;
- ``step(act, out, live=None) -> ended``: step the ``live`` columns (all
  by default) with their actions of ``act`` and write the row ``out``
  (a :class:`RowOut`): observations, rewards, which columns ended an
  episode and how, their true last observations and the env info, and add
  each reward to its column's running return (``out.ret``); an ended
  column is reset at once (``autoreset=True``) and ``out.obs`` gets its
  reset observation. Returns the columns that ended, in order;
- ``running_returns()``: the zeroed running returns that ``step`` adds to
  (a list of Python floats for single envs, a float64 array for a
  batched source: the cheaper to add to, per reward or per row);
- ``close()``.

Seeding (the tree is in :mod:`rlplay.engine.seeds`): each env is made
(with ``seed=`` when the factory takes it) and first reset with the seed
drawn from its own ``SeedSequence``, and its action and observation spaces
are seeded from the same one, so that sampling from them is reproducible.

Each env gets its own copy of its action (a numpy scalar, or a view of a
fresh copy of the row): an env that edits or keeps its action never
changes what the fragment recorded.
"""
import inspect
import numbers
from collections import namedtuple

import gymnasium
import numpy as np

from ..nested import StructureError, flatten, getitem, suply
from ..seeds import reset_seed
from .spaces import format_value, space_example

__all__ = [
    "RowOut",
    "EnvBatch",
    "EnvList",
    "make_envs",
    "check_factory",
    "close_envs",
    "reset",
    "check_step",
    "reward",
    "cast_problem",
]

RowOut = namedtuple(
    "RowOut", "t obs rew fin truncated final info info_mask ret",
    defaults=(None,))
RowOut.__doc__ = """What one step of ``B`` env columns writes: numpy views,
the env axis first.

t : int
    The step, for messages (``env j step t``).
obs : nested arrays, shape = (B, ...)
    The observations after the step (the reset observation where an
    episode ended and the column was reset).
rew : ndarray, shape = (B,)
    The rewards (:func:`~rlplay.engine.core.collect` gives the fragment's
    float32 row, which the actor reads at the next step).
fin, truncated : ndarray of bool, shape = (B,)
    Set where an episode ended, and where that end was a truncation
    (``truncated`` may be ``None``: not recorded). Only ended columns are
    written: the caller clears the row.
final : nested arrays, shape = (B, ...), or None
    The true last observation of the ended columns.
info, info_mask : dict
    ``{key: nested arrays (B, ...)}`` and ``{key: bool (B,)}`` of the env
    info keys to record (empty: none); only present keys are written.
ret : list of float, or ndarray of float64, or None
    The running returns of the columns' episodes (made by the batch's
    :meth:`EnvBatch.running_returns`: an :class:`~.sources.EnvConcat`
    gives each part a view of its array), owned by the caller, which reads
    and clears an entry where an episode ends: each stepped column's
    reward, exactly as its env returned it, is added to its entry, so
    that a return is the float64 sum of the rewards, not of their float32
    records.
"""


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
    lost : list of int
        After ``step``: the columns whose call was lost (their row holds
        the reset observation of a source that resets one call late).
    """

    n_envs = 0
    observation_space = action_space = None
    # whether a column can be left unstepped (sticky freezes columns), and
    # reset alone (evaluate cuts episodes at max_steps)
    can_freeze = can_reset_columns = True
    # the columns whose last step was a lost call (see envs.vector): their
    # row holds a reset observation that no executed action led to
    lost = ()

    def running_returns(self):
        """The zeroed running returns of the columns, for ``RowOut.ret``:
        a float64 array here (a batched source adds a row at once); a list
        of Python floats for an :class:`EnvList`, whose envs give one
        reward at a time as Python floats (no numpy call per row)."""
        return np.zeros(self.n_envs, np.float64)

    def reset(self, obs_out, seeds=None, at=None, *, t=None, on_cast=None):
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
        on_cast : callable, optional
            ``on_cast(label, problem)`` is called where recording an
            observation lost something (an integer leaf that does not hold
            the value given, see :func:`cast_problem`).
        """
        raise NotImplementedError

    def step(self, act, out, live=None, *, autoreset=True, on_cast=None):
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
            observation, ``out.final`` the last one); without, ``out.obs``
            gets the last observation and the column is left as it is.
        on_cast : callable, optional
            As for :meth:`reset`.

        Returns
        -------
        ended : list of int
            The columns whose episode ended, in order.
        """
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
        raise TypeError(f"{type(self).__name__} cannot render one env "
                        f"column: recording needs single envs")

    def close(self, quiet=False):
        """Close every env; with ``quiet``, errors are swallowed."""
        raise NotImplementedError


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

    def running_returns(self):
        return [0.0] * self.n_envs

    def __iter__(self):
        return iter(self.envs)

    def __getitem__(self, j):
        return self.envs[j]

    def reset(self, obs_out, seeds=None, at=None, *, t=None, on_cast=None):
        at = range(self.n_envs) if at is None else at
        write = self._write
        for k, j in enumerate(at):
            seed = None if seeds is None else reset_seed(seeds[k])
            obs, _ = reset(self.envs[j], seed=seed)
            write(obs_out, j, obs, "reset()")
            if on_cast is not None:
                _report_cast(on_cast, obs_out, j, obs, _reset_label(j, t))

    def step(self, act, out, live=None, *, autoreset=True, on_cast=None):
        (t, obs_next, rew_next, fin_next, truncated_next, final_next,
         info_next, info_mask, ret) = out  # one unpack: cheaper per row
        kind = self._act_kind
        acts = act if kind == _ACT_SCALARS else _env_actions(act, kind,
                                                            self.n_envs)
        # without the caller's returns, the rewards are added to a list
        # that is dropped (cheaper than a test per column)
        ret = ret if ret is not None else [0.0] * self.n_envs
        keys = tuple(info_mask) if info_mask else ()
        write = self._write
        obs_shape = self._obs_shape if on_cast is None or \
            not self._integral else None
        ended = []
        for j, env in self._columns if live is None else [
                (j, self.envs[j]) for j in live]:
            result = env.step(acts[j])
            try:
                obs, rew, terminated, truncated, info = result
            except (TypeError, ValueError):
                check_step(env, result)  # raises a clear TypeError
                raise
            rew = rew if type(rew) is float else reward(rew, j, t)
            rew_next[j] = rew
            ret[j] += rew
            if keys:
                _write_env_info(keys, info, info_next, info_mask, j)
            if terminated or truncated:
                ended.append(j)
                fin_next[j] = True
                if truncated_next is not None:
                    truncated_next[j] = truncated and not terminated
                if autoreset:
                    if final_next is not None:
                        write(final_next, j, obs, "step()")
                        if on_cast is not None:
                            _report_cast(on_cast, final_next, j, obs,
                                         f"env {j} step {t}")
                    obs, _ = reset(env)
            # the common case inlined: an array of the declared shape
            if type(obs) is np.ndarray and obs.shape == obs_shape:
                obs_next[j] = obs
            else:
                write(obs_next, j, obs, "step()")
                if on_cast is not None:
                    _report_cast(on_cast, obs_next, j, obs, _step_label(
                        j, t, autoreset and (terminated or truncated)))
        return ended

    def render(self, column):
        return self.envs[column].render()

    def close(self, quiet=False):
        close_envs(self.envs, quiet=quiet)


def _reset_label(j, t=None):
    return f"env {j} reset()" if t is None else f"env {j} step {t}, reset()"


def _step_label(j, t, reset):
    return f"env {j} step {t}" + (", reset()" if reset else "")


def _report_cast(on_cast, tree, j, obs, label):
    problem = cast_problem(tree, j, obs)
    if problem is not None:
        on_cast(label, problem)


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


# ------------------------------------------------------ observation writes

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


def _obs_writer(example):
    """``write(tree, j, obs, what)`` for observations laid out as
    ``example``."""
    if isinstance(example, np.ndarray):
        return _write_array_obs
    return _write_obs


# ---------------------------------------------------------------- env info

def _write_env_info(keys, info, env_info, env_mask, j):
    for key in keys:
        if key in info:
            _write_info(env_info[key], j, info[key], key)
            env_mask[key][j] = True


def _copy_into(dst, value, *, j):
    dst[j] = value


def _write_info(leaf_tree, j, value, key):
    try:
        if isinstance(leaf_tree, np.ndarray):
            leaf_tree[j] = value
        else:
            suply(_copy_into, leaf_tree, value, j=j)
    except (StructureError, TypeError, ValueError) as exc:
        raise type(exc)(f"env info [{key!r}] does not match its spec: "
                        f"{exc}") from None


# ----------------------------------------------------------------- actions

# how _env_actions hands one env its action: items of a (B,) row are numpy
# scalars, copies already; a (B, ...) row is copied once per step and each
# env gets a view of that fresh copy; a nested row is walked
_ACT_SCALARS, _ACT_ARRAYS, _ACT_NESTED = range(3)


def _act_kind(example, n_leading):
    """The ``_ACT_*`` kind of actions laid out as ``example`` with
    ``n_leading`` more dimensions before the action space's shape."""
    if not isinstance(example, np.ndarray):
        return _ACT_NESTED
    return _ACT_SCALARS if example.ndim == n_leading else _ACT_ARRAYS


def _env_actions(act_row, kind, n_envs):
    """Per-env actions (``[j]``) that are not views of the buffer row, so
    that an env that edits its action in place (``np.clip(a, -1, 1,
    out=a)``) or keeps it does not change what was recorded. A row of
    scalars needs none (``row[j]`` is a numpy scalar, a copy): the caller
    hands it out as it is, without this call."""
    if kind == _ACT_ARRAYS:
        return act_row.copy()
    fresh = suply(_fresh_rows, act_row)
    return [getitem(fresh, j) for j in range(n_envs)]


def _fresh_rows(leaf):
    return leaf if leaf.ndim == 1 else leaf.copy()


# ------------------------------------------------------- making and closing

def _accepts_seed(factory):
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    # only an explicit `seed` parameter: `gymnasium.make(**kwargs)` would
    # forward it to the env's constructor, which may not take it
    return "seed" in params and params["seed"].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def make_envs(factory, seed_sequences):
    """Build one env per seed sequence with ``factory`` and check each.

    A factory with an explicit ``seed`` parameter receives its env's integer seed too.
    The spaces of each env are seeded from its sequence.

    Raises
    ------
    TypeError
        ``factory`` is not callable or returns something that is not a
        Gymnasium environment (no ``reset``/``step``/spaces).
    Exception
        Whatever ``factory`` raises, as it is. Envs already made are
        closed first.
    """
    check_factory(factory)
    pass_seed = _accepts_seed(factory)
    envs = []
    try:
        for ss in seed_sequences:
            seed = reset_seed(ss)
            env = factory(seed=seed) if pass_seed else factory()
            _check_env(env, factory)
            env.action_space.seed(seed)
            env.observation_space.seed(seed)
            envs.append(env)
    except BaseException:
        # the envs made so far would leak otherwise; the original error wins
        try:
            close_envs(envs)
        except Exception:  # noqa: BLE001
            pass
        raise
    return envs


def close_envs(envs, quiet=False):
    """Close every env, even if some ``close()`` raise: the first error is
    re-raised once all were tried, unless ``quiet`` (a worker that is
    ending: nobody listens any more)."""
    error = None
    for env in envs:
        try:
            env.close()
        except Exception as exc:  # noqa: BLE001 - re-raised below
            error = error or exc
    if error is not None and not quiet:
        raise error


def check_factory(factory):
    """Check that ``factory`` is callable, with a hint for an env made
    already or an env id given in its place.

    Raises
    ------
    TypeError
        Naming what was given and, for an env or an env id, the factory
        to pass instead.

    Examples
    --------
    >>> check_factory("CartPole-v1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: factory must be callable ... functools.partial(gymnasium.make, 'CartPole-v1')
    """
    if callable(factory):
        return
    hint = ""
    if isinstance(factory, str):
        hint = (f": pass a function that makes the env, such as "
                f"functools.partial(gymnasium.make, {factory!r})")
    elif hasattr(factory, "step") and hasattr(factory, "reset"):
        spec = getattr(getattr(factory, "unwrapped", factory), "spec", None)
        name = getattr(spec, "id", None) or "ENV_ID"
        hint = (f" (rlplay makes and seeds its own envs, several of them, "
                f"in each worker): pass a function that makes one instead "
                f"of an env, such as functools.partial(gymnasium.make, "
                f"{name!r})")
    raise TypeError(f"factory must be callable and return a Gymnasium env, "
                    f"got {type(factory).__name__}{hint}")


def _check_env(env, factory):
    missing = [name for name in ("reset", "step", "observation_space",
                                 "action_space") if not hasattr(env, name)]
    if missing or not isinstance(env.observation_space, gymnasium.Space) \
            or not isinstance(env.action_space, gymnasium.Space):
        raise TypeError(f"factory {factory!r} returned {type(env).__name__}, "
                        f"which is not a Gymnasium env (missing or invalid: "
                        f"{missing or 'spaces'})")


def reset(env, seed=None):
    """``env.reset(seed=seed)``, checked to return ``(obs, info)``."""
    result = env.reset(seed=seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"{type(env).__name__}.reset() must return "
                        f"(obs, info) as in Gymnasium 1.x, got "
                        f"{type(result).__name__}")
    return result


def check_step(env, result):
    """Check a ``step`` result is Gymnasium 1.x's 5-tuple; return it."""
    if not (isinstance(result, tuple) and len(result) == 5):
        raise TypeError(f"{type(env).__name__}.step() must return (obs, "
                        f"reward, terminated, truncated, info) as in "
                        f"Gymnasium 1.x, got {type(result).__name__} of "
                        f"length {len(result) if isinstance(result, tuple) else '?'}")
    return result


def reward(value, j, t):
    """``value``, the reward env ``j`` returned at step ``t``, as a Python
    float: a real number (Python's or numpy's, a 0-d or one-element numeric
    array too).

    Raises
    ------
    TypeError
        Anything else (a string, ``None``, an array of several values),
        naming the env column and the step.
    """
    if type(value) is float:
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, np.ndarray):
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 \
            and value.dtype.kind in "biuf":
        return float(value.reshape(()))
    raise TypeError(f"env {j} step {t}: the reward must be a real number, "
                    f"got {type(value).__name__} {value!r}")
