"""Making an env batch from a factory: single envs, Gymnasium vector envs
and EnvPool envs, side by side.

``factory()`` may return a single ``gymnasium.Env``, a
``gymnasium.vector.VectorEnv`` (``make_vec`` in any mode, ``SyncVectorEnv``,
``AsyncVectorEnv``, a native vector env such as ``CartPoleVectorEnv``) or
an EnvPool env, or a torch-native source (:mod:`.torch_source`); a
source of ``k`` envs gives ``k`` columns. It may also return a PettingZoo
``ParallelEnv`` (or an AEC env that PettingZoo can convert), whose ``A``
possible agents give ``A`` columns (see :mod:`.agents`, imported only
then).
:func:`make_batch` calls the factory until the columns add up (a count
that is not a whole number of sources is refused) and returns one
:class:`~.batch.EnvBatch`: an :class:`~.batch.EnvList` of single envs, a
:class:`~.vector.VectorSource`, an :class:`~.agents.AgentEnvs` of
PettingZoo envs, or, for several sources, an
:class:`EnvConcat` of them.
"""
import gymnasium
import numpy as np

from ..seeds import reset_seed
from .batch import EnvBatch, EnvList, RowOut, Stepped
from .making import _accepts_seed, _check_env, check_factory, close_envs
from .envpool import EnvPoolSource, is_envpool
from .torch_source import TorchSource, source_device
from .vector import VectorSource

__all__ = ["EnvConcat", "make_batch", "as_batch", "check_columns"]


class EnvConcat(EnvBatch):
    """Env batches side by side: ``parts[i]`` holds the columns from the
    sum of the sizes before it on. Each part is stepped with its own slice
    of the row (views, made once per row)."""

    def __init__(self, parts):
        self.parts = list(parts)
        first = self.parts[0]
        self.observation_space = first.observation_space
        self.action_space = first.action_space
        for part in self.parts[1:]:
            if part.observation_space != self.observation_space or \
                    part.action_space != self.action_space:
                raise TypeError(
                    f"the factory's envs have different spaces: "
                    f"{part.observation_space!r} and {part.action_space!r} "
                    f"vs {self.observation_space!r} and "
                    f"{self.action_space!r}")
        self.bounds, start = [], 0
        for part in self.parts:
            self.bounds.append((start, start + part.n_envs))
            start += part.n_envs
        self.n_envs = start
        self.can_freeze = all(part.can_freeze for part in self.parts)
        self.can_reset_columns = all(part.can_reset_columns
                                     for part in self.parts)
        self.call_refusal = next((part.call_refusal for part in self.parts
                                  if part.call_refusal is not None), None)
        self.renders_columns = all(part.renders_columns
                                   for part in self.parts)
        # the loops copy `final` from the observations where every part
        # leaves it to them; else each part writes its own
        self.final_is_obs = all(part.final_is_obs for part in self.parts)
        if not self.final_is_obs:
            for part in self.parts:
                part.final_is_obs = False
        # id(out.obs) -> (out.obs, out.rew, [each part's RowOut])
        self._rows = {}

    def _split(self, out):
        cached = self._rows.get(id(out.obs))
        if cached is None or cached[0] is not out.obs or \
                cached[1] is not out.rew:
            cached = (out.obs, out.rew, [_slice_row(out, lo, hi)
                                         for lo, hi in self.bounds])
            self._rows[id(out.obs)] = cached
        outs = cached[2]
        if outs[0].t != out.t:
            outs = [o._replace(t=out.t) for o in outs]
        return outs

    def reset(self, obs_out, seeds=None, at=None, *, t=None,
              check_casts=False):
        casts = []
        for part, (lo, hi) in zip(self.parts, self.bounds):
            cols = None if at is None else [j - lo for j in at
                                            if lo <= j < hi]
            if cols is not None and not cols:
                continue
            if seeds is None:
                part_seeds = None
            elif at is None:
                part_seeds = seeds[lo:hi]
            else:
                part_seeds = [ss for j, ss in zip(at, seeds) if lo <= j < hi]
            casts += _shifted(part.reset(
                _slice(obs_out, lo, hi), part_seeds, cols, t=t,
                check_casts=check_casts), lo)
        return casts

    def step(self, act, out, live=None, *, autoreset=True,
             check_casts=False):
        ended, lost, casts, env_ended = [], [], [], []
        for part, (lo, hi), part_out in zip(self.parts, self.bounds,
                                            self._split(out)):
            cols = None if live is None else [j - lo for j in live
                                              if lo <= j < hi]
            if cols is not None and not cols:
                continue
            stepped = part.step(_slice(act, lo, hi), part_out, cols,
                                autoreset=autoreset, check_casts=check_casts)
            ended += [lo + j for j in stepped.ended]
            lost += [lo + j for j in stepped.lost]
            casts += _shifted(stepped.casts, lo)
            env_ended += [lo + j for j in stepped.env_ended]
        return Stepped(ended, lost, casts, env_ended)

    def call(self, name, args, kwargs, *, first=0):
        for part, (lo, _) in zip(self.parts, self.bounds):
            part.call(name, args, kwargs, first=first + lo)
    @property
    def column_agents(self):
        return np.concatenate([part.column_agents for part in self.parts])

    def render(self, column):
        for part, (lo, hi) in zip(self.parts, self.bounds):
            if lo <= column < hi:
                return part.render(column - lo)
        raise IndexError(f"no env column {column} of {self.n_envs}")

    def close(self, quiet=False):
        error = None
        for part in self.parts:
            try:
                part.close(quiet=quiet)
            except Exception as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error


def _slice(tree, lo, hi):
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {key: _slice(value, lo, hi) for key, value in tree.items()}
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return tuple(_slice(value, lo, hi) for value in tree)
    return tree[lo:hi]


def _slice_row(out, lo, hi):
    return RowOut(t=out.t, obs=_slice(out.obs, lo, hi), rew=out.rew[lo:hi],
                  fin=out.fin[lo:hi], truncated=_slice(out.truncated, lo, hi),
                  final=_slice(out.final, lo, hi),
                  info=_slice(out.info, lo, hi),
                  info_mask=_slice(out.info_mask, lo, hi))


def _shifted(casts, lo):
    """The :class:`~.batch.Cast` records of a part whose column 0 is
    column ``lo``, naming the batch's columns."""
    if not lo:
        return list(casts)
    return [cast._replace(column=cast.column + lo) for cast in casts]


def _source(made, factory, seed):
    """What the factory made, as a source: an EnvPool env or a vector env
    as an EnvBatch, a PettingZoo env as a parallel env (an AEC one
    converted), a single env as it is (checked, its spaces seeded)."""
    name = f"the {type(made).__name__} made by factory {factory!r}"
    if is_envpool(made):
        return EnvPoolSource(made, name)
    device = source_device(made)
    if device is not None:
        return TorchSource(made, device, name)
    if isinstance(made, gymnasium.vector.VectorEnv):
        source = VectorSource(made, name)
        source.action_space.seed(seed)
        source.observation_space.seed(seed)
        return source
    if _is_multi_agent(made):
        from .agents import as_parallel  # PettingZoo's: imported when used
        return as_parallel(made, name)
    _check_env(made, factory)
    made.action_space.seed(seed)
    made.observation_space.seed(seed)
    return made


def _is_multi_agent(made):
    # PettingZoo's envs, told apart without importing .agents: a
    # possible_agents list and per-agent space methods
    return hasattr(made, "possible_agents") and callable(
        getattr(made, "observation_space", None))


class _Group:
    """Consecutive sources of one kind that make one part of the batch:
    single envs (an :class:`~.batch.EnvList`) or PettingZoo envs (an
    :class:`~.agents.AgentEnvs`)."""

    def __init__(self, parts, name):
        self.parts, self.name = parts, name
        self.kind, self.members, self.seeds = None, [], []

    def add(self, source, kind, seeds):
        if kind != self.kind:
            self.flush()
            self.kind = kind
        self.members.append(source)
        self.seeds += seeds

    def flush(self):
        if self.members:
            if self.kind == "agents":
                from .agents import AgentEnvs
                part = AgentEnvs(self.members, self.name)
                part.seed_spaces(self.seeds)
            else:
                part = EnvList(self.members)
            self.parts.append(part)
        self.kind, self.members, self.seeds = None, [], []


def _width(source):
    """The columns of a source that is no EnvBatch, and its kind."""
    if _is_multi_agent(source):
        return len(source.possible_agents), "agents"
    return 1, "single"


def make_batch(factory, seed_sequences, *, max_sources=None, name="n_envs"):
    """An :class:`~.batch.EnvBatch` of ``len(seed_sequences)`` columns,
    each with its ``SeedSequence``, made by calling ``factory`` until the
    columns add up (see the module docstring).

    A factory with an explicit ``seed`` parameter receives the integer
    seed of each source's first column. ``max_sources`` stops after that
    many sources (a probe), whatever the columns.

    Raises
    ------
    TypeError
        ``factory`` is not callable, or returns something that is not an
        env; sources of different spaces; a vector env whose spaces are
        not batched as declared; PettingZoo agents of different spaces, an
        AEC env that cannot run in parallel.
    ValueError
        The columns are not a whole number of the factory's sources; a
        source of no columns (a PettingZoo env with no agents, a vector
        env with ``num_envs=0``).
    Exception
        Whatever ``factory`` raises, as it is. What was made is closed
        first.
    """
    check_factory(factory)
    pass_seed = _accepts_seed(factory)
    n, col, made, parts = len(seed_sequences), 0, [], []
    group = _Group(parts, f"the PettingZoo envs made by factory {factory!r}")
    try:
        while col < n and (max_sources is None or len(made) < max_sources):
            seed = reset_seed(seed_sequences[col])
            raw = factory(seed=seed) if pass_seed else factory()
            made.append(raw)
            if not pass_seed and is_envpool(raw):
                raise ValueError(
                    f"factory {factory!r} made an EnvPool env without a "
                    f"seed: EnvPool seeds its envs when it is made, so "
                    f"every worker would step the same envs; give the "
                    f"factory a seed parameter and pass it on within the "
                    f"int32 range that EnvPool takes for its k envs (seed, "
                    f"seed + 1, ...): lambda seed: envpool.make_gymnasium("
                    f"..., num_envs=k, seed=shared_seed(seed, k)), with "
                    f"shared_seed from rlplay.engine.seeds (seed % (2**31 "
                    f"- k))")
            source = _source(raw, factory, seed)
            width, kind = (source.n_envs, None) if isinstance(
                source, EnvBatch) else _width(source)
            if width < 1:
                # else no count of such sources adds up: the loop would
                # call the factory forever
                raise ValueError(_empty(name, n, raw, source, factory))
            if getattr(source, "kind", "numpy") == "torch" and (
                    made[1:] or (max_sources is None and width != n)):
                raise ValueError(
                    f"{name}={n} columns from a torch source of num_envs="
                    f"{width} ({type(raw).__name__}): a torch source gives "
                    f"every column of a worker, alone; make it with "
                    f"num_envs={n}")
            if max_sources is None and col + width > n:
                raise ValueError(_not_whole(name, n, width, raw, source))
            if kind is None:
                group.flush()
                parts.append(source)
            else:
                group.add(source, kind, seed_sequences[col:col + width])
            col += width
        group.flush()
    except BaseException:
        # what was made would leak otherwise; the original error wins
        try:
            close_envs(made)
        except Exception:  # noqa: BLE001
            pass
        raise
    return parts[0] if len(parts) == 1 else EnvConcat(parts)


def _empty(name, n, raw, source, factory):
    """The message for a source of no columns."""
    agents = getattr(source, "possible_agents", None)
    what = f"a PettingZoo env with no agents (possible_agents " \
        f"{list(agents)})" if agents is not None else \
        f"a source of no envs ({type(raw).__name__} with num_envs=0)"
    return (f"factory {factory!r} made {what}: {name}={n} columns need "
            f"sources of at least one column each")


def _not_whole(name, n, width, raw, source):
    """The message for ``name=n`` columns that are not a whole number of
    sources of ``width`` columns."""
    agents = getattr(source, "possible_agents", None)
    if agents is not None:
        return (f"{name}={n} is not a multiple of {width}, the agents of "
                f"each PettingZoo env the factory returns "
                f"(possible_agents {list(agents)}): each (env, agent) is "
                f"a column")
    return (f"{name}={n} is not a whole number of the factory's sources "
            f"({type(raw).__name__} with num_envs={width})")


def check_columns(batch, n_envs, name="n_envs"):
    """Check, up front, that ``n_envs`` columns are a whole number of
    sources like ``batch`` (one source, a probe).

    Raises
    ------
    ValueError
        Naming ``name``, ``n_envs`` and the source's envs (or agents).
    """
    k = batch.n_envs
    if batch.kind == "torch" and n_envs != k:
        raise ValueError(
            f"{name}={n_envs} columns from a torch source of num_envs={k}: "
            f"a torch source gives every column of a worker, alone; make "
            f"it with num_envs={n_envs}")
    if n_envs % k:
        if getattr(batch, "possible_agents", None) is not None:
            raise ValueError(_not_whole(name, n_envs, k, None, batch))
        raise ValueError(
            f"{name}={n_envs} is not a multiple of {k}, the envs of each "
            f"source the factory returns: a worker calls the factory until "
            f"its {name} columns add up")


def as_batch(envs):
    """``envs`` as an :class:`~.batch.EnvBatch`: itself, or a list of envs
    in an :class:`~.batch.EnvList`."""
    if isinstance(envs, EnvBatch):
        return envs
    return EnvList(envs)
