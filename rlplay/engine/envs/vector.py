"""Batched env sources: a Gymnasium ``VectorEnv`` or an EnvPool env as an
:class:`~.batch.EnvBatch`, one call per row for all its columns.

A source of ``k`` envs gives ``k`` columns; its spaces are its single-env
spaces. Its outputs are written into the row with array operations (slices
of the columns, never a per-env Python loop but where an episode ended).

Autoreset modes (Gymnasium's ``AutoresetMode``), and what rlplay does with
each, so that the fragment's layout is what a list of the same envs gives:

- ``SAME_STEP``: the source resets an ended env within the step; the true
  last observation comes in ``info["final_obs"]`` (and the step's info in
  ``info["final_info"]``). Exact.
- ``DISABLED``: rlplay resets the ended envs itself, at once, with
  ``reset(options={"reset_mask": ...})``. Exact.
- ``NEXT_STEP`` (the default of ``make_vec``; the only mode of the native
  vector envs and of EnvPool): the step returns the true last observation and
  the source resets the env on its *next* call, ignoring the action there.
  Where the source honours a partial reset (``SyncVectorEnv``,
  ``AsyncVectorEnv`` with shared memory, EnvPool's ``reset(env_id)``), rlplay
  resets the ended envs at once, and the mapping is exact. Where it does not
  (``CartPoleVectorEnv`` and other native vector envs; ALE's
  ``AtariVectorEnv``, whose ``reset_mask`` could hang in ale-py before
  2026, is not asked), the column *loses a call* at every episode end,
  and the layout says so (see :mod:`rlplay.engine.core.layout`): the row
  where the episode ended holds its true last observation (in ``obs`` as
  in ``final``), and the next row, the lost call, holds the reset
  observation with ``fin`` set, no reward, ``stepno = 0`` and no episode
  statistics, a row that no executed action led to
  (:func:`rlplay.engine.core.acted` is false there), as sticky's frozen
  rows are. Its env info is not recorded.

Seeding: where the source takes a list of seeds (``SyncVectorEnv``,
``AsyncVectorEnv``), every column is reset with the seed of its own child
of the run's ``SeedSequence``; a source that takes one seed for all its
envs (the native vector envs, ALE's ``AtariVectorEnv``) is reset with the
seed of its first column's child, taken modulo ``2**31 - num_envs`` (ALE
seeds its envs with that seed and the next ones, as 32-bit signed ints);
an EnvPool env is seeded when it is made (a factory that takes
``seed=`` gets its first column's seed). A run is reproducible from
``entropy`` either way.

A source steps all its columns at every call: it cannot leave one
unstepped, so ``sticky=True`` is refused with it (:attr:`can_freeze`).

Actions: a source gets a copy of the row's actions, as it may keep or edit
them, but for the sources known to read them only
(:data:`READS_ACTIONS_ONLY`: Gymnasium's ``CartPoleVectorEnv`` and ALE's
``AtariVectorEnv``; EnvPool), which get the row itself.
"""
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space

from ..nested import StructureError, flatten, suply
from ..seeds import reset_seed, source_reset_seed
from .batch import _CALM, SourceBatch, Stepped, _check_cast
from .making import check_step, reward
from .rows import _obs_writer, copy_at, lose_at
from .spaces import space_example

__all__ = ["VectorSource"]

# the vector envs known to read the actions they are given, keeping no
# reference to them: they get the row's actions without a copy
READS_ACTIONS_ONLY = {
    ("gymnasium.envs.classic_control.cartpole", "CartPoleVectorEnv"),
    ("ale_py.vector_env", "AtariVectorEnv")}

BOOL = np.dtype(bool)


class VectorSource(SourceBatch):
    """A Gymnasium ``VectorEnv`` of ``k = num_envs`` envs as an
    :class:`~.batch.EnvBatch` of ``k`` columns (see the module docstring).

    Parameters
    ----------
    source : gymnasium.vector.VectorEnv
    name : str
        How messages call it (e.g. the factory that made it).

    Raises
    ------
    TypeError
        Its spaces are not its single-env spaces batched ``num_envs``
        times.
    """

    can_freeze = False

    def __init__(self, source, name="the vector env"):
        base = source.unwrapped
        self._set_up(
            source, name, source.num_envs, source.single_observation_space,
            source.single_action_space, source.metadata.get(
                "autoreset_mode", AutoresetMode.NEXT_STEP),
            # a list of seeds, one per env; a partial reset (reset_mask)
            seeds_each=isinstance(base, (SyncVectorEnv, AsyncVectorEnv)),
            partial=isinstance(base, SyncVectorEnv) or (
                isinstance(base, AsyncVectorEnv) and bool(base.shared_memory)),
            copy_actions=_names(type(source)) not in READS_ACTIONS_ONLY)
        self._check_batched()

    def _set_up(self, source, name, n_envs, observation_space, action_space,
                mode, *, seeds_each, partial, copy_actions=True):
        self.source, self.name = source, name
        self.copy_actions = copy_actions
        self.n_envs = int(n_envs)
        self._k = (self.n_envs,)
        self.observation_space, self.action_space = (observation_space,
                                                     action_space)
        self.mode = AutoresetMode(mode)
        self.seeds_each, self.partial = seeds_each, partial
        self.can_reset_columns = partial or self.mode is not \
            AutoresetMode.NEXT_STEP
        # the lost-call sources: an ended column's observation is its true
        # last one (the loop copies it into final)
        self.final_is_obs = not self.can_reset_columns
        # next-step autoreset without a partial reset: the columns whose
        # next call is lost (the source resets them then)
        self.pending = []
        example = space_example(observation_space)
        # the shape of batched observations of one array (else None)
        self._batch_shape = (self.n_envs, *example.shape) \
            if isinstance(example, np.ndarray) else None
        self._write = _obs_writer(example)
        self._integral = any(leaf.dtype.kind in "biu"
                             for leaf in flatten(example))

    def _check_batched(self):
        for what in ("observation", "action"):
            single = getattr(self.source, f"single_{what}_space")
            batched = getattr(self.source, f"{what}_space")
            if batch_space(single, self.n_envs) != batched:
                raise TypeError(
                    f"{self.name}'s {what}_space {batched!r} is not its "
                    f"single_{what}_space {single!r} batched num_envs="
                    f"{self.n_envs} times")

    # ------------------------------------------------------------ reset --
    def reset(self, obs_out, seeds=None, at=None, *, t=None,
              check_casts=False):
        casts = [] if check_casts else None
        if at is None:
            obs, _ = self._reset_all(seeds)
            self.pending = []
            self._write_all(obs_out, obs, "reset()", casts, None, None)
            return casts or []
        at = list(at)
        if not at:
            return []
        if not self.can_reset_columns:
            raise ValueError(f"{self.name} cannot reset some of its envs "
                             f"alone (next-step autoreset, no reset_mask)")
        obs = self._reset_columns(at, seeds)
        self._write_columns(obs_out, at, obs, casts, t)
        return casts or []

    def _reset_all(self, seeds):
        # one seed for all: ALE's AtariVectorEnv seeds its envs with seed,
        # seed + 1, ... as 32-bit signed ints (a TypeError beyond), so the
        # seed leaves room below 2**31 for every env's (as a torch
        # source's: one rule, in seeds)
        seed = source_reset_seed(seeds, self.n_envs, self.seeds_each)
        return _pair(self.source.reset(seed=seed), self.name, "reset()")

    def _reset_columns(self, at, seeds=None):
        """Reset the columns ``at``; returns the source's observations of
        every column (those of ``at`` are the new ones)."""
        mask = np.zeros(self.n_envs, bool)
        mask[at] = True
        seed = None
        if seeds is not None and self.seeds_each:
            seed = [None] * self.n_envs
            for j, ss in zip(at, seeds):
                seed[j] = reset_seed(ss)
        obs, _ = _pair(self.source.reset(seed=seed,
                                         options={"reset_mask": mask}),
                       self.name, "reset()")
        self._forget_pending(at)
        return _take(obs, at, self.n_envs, self.name)

    # ------------------------------------------------------------- step --
    def step(self, act, out, live=None, *, autoreset=True,
             check_casts=False):
        k, t = self.n_envs, out.t
        # the source gets a copy (it may keep or edit its actions), but
        # where it is known to read them only
        if self.copy_actions:
            act = act.copy() if type(act) is np.ndarray else \
                suply(np.array, act)
        result = self.source.step(act)
        try:
            obs, rew, terminated, truncated, info = result
        except (TypeError, ValueError):
            check_step(self.source, result)  # raises a clear TypeError
            raise
        # the common case in one test: bool flags and numeric rewards, k of
        # each; the rewards as the source gave them (float64) into the row
        if type(terminated) is np.ndarray and type(truncated) is np.ndarray \
                and type(rew) is np.ndarray and terminated.dtype is BOOL \
                and truncated.dtype is BOOL and rew.dtype.kind in "biuf" \
                and terminated.shape == truncated.shape == rew.shape \
                == self._k:
            out.rew[...] = rew  # cast as np.copyto(casting="unsafe") would
        else:
            terminated = _flags(terminated, k, self.name, "terminated")
            truncated = _flags(truncated, k, self.name, "truncated")
            _rewards(rew, out.rew, k, self.name, t)
        # the columns that ended: the row's fin, until the lost calls join
        # them below (nonzero(): a fifth of flatnonzero's cost)
        ends = np.logical_or(terminated, truncated, out=out.fin)
        ended = ends.nonzero()[0].tolist()
        casts = [] if check_casts else None
        # the common case inlined: one array of the declared batch shape
        if type(obs) is np.ndarray and obs.shape == self._batch_shape and (
                not check_casts or not self._integral):
            out.obs[...] = obs
        else:
            self._write_all(out.obs, obs, "step()", casts, ends, t)
        lost = self.pending
        if out.info_mask:
            self._write_info(info, out, ends, lost)
        if lost:  # reset observations no action led to, and no reward
            self.pending = []
            lose_at(out.fin, out.rew, lost)
        if ended:
            if out.truncated is not None:  # truncated, not terminated
                np.greater(truncated, terminated, out=out.truncated)
            if not self.final_is_obs:
                self._end(ended, obs, info, out, autoreset, casts)
            elif autoreset:  # _end's case of no final to write, inlined
                self.pending = list(ended)
        if ended or lost or casts:
            return Stepped(ended, lost, casts or ())
        return _CALM

    def _end(self, ended, obs, info, out, autoreset, casts):
        """The columns ``ended``: their true last observations into
        ``out.final`` and, where the source lets rlplay reset them now, the
        reset observations into ``out.obs``; else their next calls are
        lost. (Where the loop copies ``final`` from the observations,
        :attr:`final_is_obs`, :meth:`step` marks the lost calls itself.)"""
        t, final = out.t, out.final
        if self.mode is AutoresetMode.SAME_STEP:
            if final is not None:
                finals = _final_obs(info, ended, self.name)
                for j, value in zip(ended, finals):
                    self._write(final, j, value, "step()")
                    if casts is not None:
                        _check_cast(casts, final, j, value, t, False)
            return
        # the step's observations are the true last ones (written already)
        if final is not None:
            if type(final) is np.ndarray:
                copy_at(final, out.obs, ended)
            else:
                suply(copy_at, final, out.obs, cols=ended)
        if not autoreset:
            return
        if self.can_reset_columns:
            reset = self._reset_columns(ended)
            self._write_columns(out.obs, ended, reset, casts, t)
        else:  # the next call is lost: the source resets them then
            self.pending = list(ended)

    def _forget_pending(self, at):
        """The columns ``at`` were reset: no call of theirs is lost."""
        if self.pending:
            at = set(at)
            self.pending = [j for j in self.pending if j not in at]

    # ----------------------------------------------------------- writes --
    def _write_all(self, obs_out, obs, what, casts, reset, t):
        """Every column's observation ``obs`` (batched) into ``obs_out``;
        ``reset``: where the source reset the column within the step;
        what recording them lost appended to ``casts`` (unless ``None``).
        """
        try:
            suply(_copy_rows, obs_out, obs, n=self.n_envs)
        except (StructureError, TypeError, ValueError) as exc:
            raise type(exc)(f"{self.name} {what}: the observations do not "
                            f"match the observation space batched "
                            f"num_envs={self.n_envs} times: {exc}") from None
        if casts is None or not self._integral:
            return
        same_step = self.mode is AutoresetMode.SAME_STEP
        for j in range(self.n_envs):
            # a reset within the step (same-step autoreset); t is None
            # for the first reset
            was_reset = t is None or (reset is not None and bool(reset[j])
                                      and same_step)
            _check_cast(casts, obs_out, j, _row(obs, j), t, was_reset)

    def _write_columns(self, obs_out, at, obs, casts, t):
        """The reset observations ``obs`` (one row per column of ``at``)
        into ``obs_out[at]``; what recording them lost appended to
        ``casts`` (unless ``None``)."""
        suply(_put_columns, obs_out, obs, cols=at)
        if casts is not None and self._integral:
            for i, j in enumerate(at):
                _check_cast(casts, obs_out, j, _row(obs, i), t, True)

    def _write_info(self, info, out, ends, lost):
        """The env info keys of ``out`` from the batched ``info``: from
        ``info["final_info"]`` for the columns that ended (same-step
        autoreset: the top level holds their reset info), none for lost
        calls (the columns ``lost``)."""
        final_info = info.get("final_info") \
            if self.mode is AutoresetMode.SAME_STEP else None
        for key, dst in out.info.items():
            mask = _present(info, key, self.n_envs)
            if final_info is not None and ends.any():
                mask = mask & ~ends
                _write_key(dst, out.info_mask[key], final_info, key,
                           _present(final_info, key, self.n_envs) & ends)
            if lost:
                mask = mask.copy()
                mask[lost] = False
            _write_key(dst, out.info_mask[key], info, key, mask)


# ------------------------------------------------------------------ helpers

def _pair(result, name, what):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"{name}.{what} must return (obs, info) as in "
                        f"Gymnasium 1.x, got {type(result).__name__}")
    return result


def _names(cls):
    return cls.__module__, cls.__qualname__


def _flags(value, k, name, what):
    if type(value) is np.ndarray and value.dtype is BOOL and \
            value.shape == (k,):
        return value
    value = np.asarray(value)
    if value.shape != (k,):
        raise ValueError(f"{name}.step() returned {what} of shape "
                         f"{value.shape} for its num_envs={k} envs")
    return value.astype(bool, copy=False)


def _rewards(value, out, k, name, t):
    """The ``k`` rewards of a step into ``out`` (float64)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        if value.shape != (k,):
            raise ValueError(f"{name}.step() returned rewards of shape "
                             f"{value.shape} for its num_envs={k} envs")
        out[...] = value  # cast as np.copyto(casting="unsafe") would
        return
    value = np.asarray(value, dtype=object).reshape(-1)
    if value.shape != (k,):
        raise ValueError(f"{name}.step() returned {value.size} rewards for "
                         f"its num_envs={k} envs")
    for j, r in enumerate(value.tolist()):
        out[j] = reward(r, j, t)


def _copy_rows(dst, src, n):
    src = np.asarray(src)
    if src.shape[:1] != (n,) or src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"got shape {src.shape}, expected "
                         f"({n}, *{tuple(dst.shape[1:])})")
    dst[...] = src


def _put_columns(dst, src, cols):
    dst[cols] = src


def _row(obs, j):
    return suply(lambda leaf: np.asarray(leaf)[j], obs)


def _take(obs, at, k, name):
    """The rows ``at`` of batched observations (checked to hold ``k``)."""
    def take(leaf):
        leaf = np.asarray(leaf)
        if leaf.shape[:1] != (k,):
            raise ValueError(f"{name}.reset() returned observations of "
                             f"shape {leaf.shape} for {k} envs")
        return leaf[at]
    return suply(take, obs)


def _final_obs(info, ended, name):
    finals, mask = info.get("final_obs"), info.get("_final_obs")
    if finals is None or mask is None or not np.all(mask[ended]):
        raise ValueError(f"{name} (same-step autoreset) ended envs {ended} "
                         f"without their info['final_obs']")
    return [finals[j] for j in ended]


def _present(info, key, k):
    """Where ``info`` holds ``key``: its ``_key`` mask (every env where
    there is none, as EnvPool's info)."""
    if key not in info:
        return np.zeros(k, bool)
    mask = info.get(f"_{key}")
    return np.ones(k, bool) if mask is None else np.asarray(mask, bool)


def _write_key(dst, dst_mask, info, key, mask):
    if not mask.any():
        return
    value = _plain(info[key])
    try:
        if isinstance(dst, np.ndarray):
            dst[mask] = np.asarray(value)[mask]
        else:
            suply(lambda d, v: d.__setitem__(mask, np.asarray(v)[mask]),
                  dst, _like(dst, value))
    except (StructureError, TypeError, ValueError) as exc:
        raise type(exc)(f"env info [{key!r}] does not match its spec: "
                        f"{exc}") from None
    dst_mask[mask] = True


def _plain(value):
    # a vector info dict without its "_key" masks
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()
                if not (isinstance(k, str) and k.startswith("_"))}
    return value


def _like(spec, value):
    # the keys of ``value`` that ``spec`` records (numbers pass through)
    if isinstance(spec, dict) and isinstance(value, dict):
        return {k: _like(spec[k], value[k]) if k in value else value.get(k)
                for k in spec}
    return value
