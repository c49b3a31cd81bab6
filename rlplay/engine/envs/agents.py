"""PettingZoo parallel envs as an :class:`~.batch.EnvBatch`: one column per
(env, agent).

A factory may return a PettingZoo ``ParallelEnv`` (``rlplay[pettingzoo]``;
this module is imported only when one is made, and PettingZoo itself only
to convert an AEC env). Each agent of its ``possible_agents`` is a column,
in that order: column ``e * A + a`` is agent ``a`` of env ``e`` (``A``
agents per env), and ``meta.agent`` records ``a``. Every agent must have
the same observation and action spaces (parameter sharing: one layout for
all columns).

PettingZoo's contract (``possible_agents`` fixed; ``agents`` the live ones;
``step`` takes actions of the live agents and returns dicts that hold every
agent live before it, a departing agent's last observation, reward and
flags included, and those spawned by it; no agent comes back within an env
episode; an empty ``agents`` ends the episode) maps onto the layout of
:mod:`rlplay.engine.core.layout` exactly, per column:

- a *present* agent (in ``agents``) acts: its action of the row is sent,
  and the next row holds its observation and reward; where the env reports
  its termination or truncation, that row ends its episode (``fin``, the
  ``truncated`` flag, the true last observation in ``obs`` and ``final``,
  as for a lost call: no next observation is known yet);
- an *absent* agent (not spawned yet, or gone while others play on) is sent
  no action; the row after it is no transition (a *lost call*,
  :attr:`~.batch.Stepped.lost`: ``acted`` false), with ``fin`` set, no
  reward, and the observation space's placeholder as ``obs`` (see
  :func:`~.spaces.space_placeholder`): the core writes ``stepno = 0`` and
  no statistics there, and resets the actor's ``hx``;
- an agent that appears (spawned by a step, or in a reset) holds its first
  observation in that row, with ``fin`` set and ``stepno = 0``; its
  agent-episode starts there (a reward reported for it at that step is
  dropped: no action of its led there);
- when no agent is left after a step, the env's episode is over (the step
  reports all its columns in :attr:`~.batch.Stepped.env_ended`: the
  evaluator counts episodes per env); the env is reset in the same row
  (its first reset is seeded from its first column's ``SeedSequence``,
  later ones are not, as for single envs) and the agents of the reset hold
  their first observations in that row, as after an autoreset.

A live agent missing from a step's dicts, an agent that leaves ``agents``
without a termination or truncation flag, or one still in ``agents`` after
its end are env bugs (PettingZoo's ``parallel_api_test`` fails them): a
``ValueError`` names the agent. An env steps all its agents at once: it
cannot leave a column unstepped (``sticky=True`` is refused) nor reset one
alone.
"""
import gymnasium
import numpy as np

from ..seeds import reset_seed
from .batch import _CALM, EnvBatch, Stepped, _check_cast
from .control import call_parallel
from .making import close_envs, reward
from .rows import (_ACT_SCALARS, _act_kind, _env_actions, _obs_writer,
                   _write_env_info)
from .spaces import space_example, space_placeholder

__all__ = ["AgentEnvs", "as_parallel"]


def _is_aec(env):
    return all(hasattr(env, name) for name in
               ("agent_iter", "last", "possible_agents"))


def as_parallel(env, name="the env"):
    """``env`` as a parallel env: itself, or an AEC env converted by
    PettingZoo's ``aec_to_parallel`` where its metadata allows it.

    Raises
    ------
    TypeError
        An AEC env that does not declare ``is_parallelizable``.
    """
    if not _is_aec(env):
        return env
    metadata = getattr(env, "metadata", None) or {}
    if not metadata.get("is_parallelizable", False):
        raise TypeError(
            f"{name} is a PettingZoo AEC env (its agents act in turn) whose "
            f"metadata does not declare is_parallelizable: rlplay steps "
            f"parallel envs, where every live agent acts at each step; "
            f"make the factory return the env's parallel_env() where it "
            f"has one")
    from pettingzoo.utils.conversions import aec_to_parallel
    return aec_to_parallel(env)


def _shared_spaces(env, agents, name):
    """The observation and action space of every agent (identical), or a
    ``TypeError`` that says what to do."""
    found = []
    for what in ("observation", "action"):
        get = getattr(env, f"{what}_space")
        first = get(agents[0])
        if not isinstance(first, gymnasium.Space):
            raise TypeError(f"{name}.{what}_space({agents[0]!r}) is "
                            f"{type(first).__name__}, not a Gymnasium space")
        for agent in agents[1:]:
            other = get(agent)
            if other != first:
                raise TypeError(
                    f"{name}'s agents have different {what} spaces: "
                    f"{agents[0]!r} {first!r}, {agent!r} {other!r}; rlplay "
                    f"lays every agent out as a column of one fragment, so "
                    f"they must be the same: pad them to one (SuperSuit's "
                    f"pad_observations_v0 and pad_action_space_v0), or "
                    f"give each group of alike agents a factory (and a "
                    f"generator) of its own")
        found.append(first)
    return found


def _entry(result, agent, what, name, t):
    try:
        return result[agent]
    except (KeyError, TypeError):
        raise ValueError(f"{name} step {t}: the {what} of live agent "
                         f"{agent!r} is missing from what step() returned"
                         ) from None


class AgentEnvs(EnvBatch):
    """PettingZoo parallel envs as an :class:`~.batch.EnvBatch` of one
    column per (env, agent) (see the module docstring).

    Parameters
    ----------
    envs : list of pettingzoo.ParallelEnv
        With the same ``possible_agents`` (``A`` of them): ``A * len(envs)``
        columns.
    name : str
        How messages call them (e.g. the factory that made them).

    Attributes
    ----------
    possible_agents : list
        The agents of each env, in column order.
    present : ndarray of bool, shape = (n_envs,)
        The columns whose agent is live (in its env's ``agents``) at the
        last row written.

    Raises
    ------
    TypeError
        Envs with different ``possible_agents``, or agents with different
        spaces.
    ValueError
        No agents.
    """

    can_freeze = can_reset_columns = False

    def __init__(self, envs, name="the PettingZoo env"):
        self.envs, self.name = list(envs), name
        first = self.envs[0]
        self.possible_agents = list(first.possible_agents)
        A = self.n_agents = len(self.possible_agents)
        if not A:
            raise ValueError(f"{name} has no possible_agents")
        for env in self.envs[1:]:
            if list(env.possible_agents) != self.possible_agents:
                raise TypeError(
                    f"the factory's PettingZoo envs have different "
                    f"possible_agents: {list(env.possible_agents)} and "
                    f"{self.possible_agents}")
        self.n_envs = A * len(self.envs)
        self.observation_space, self.action_space = _shared_spaces(
            first, self.possible_agents, name)
        self._write = _obs_writer(space_example(self.observation_space))
        self._placeholder = space_placeholder(self.observation_space)
        self._act_kind = _act_kind(space_example(self.action_space), 0)
        self.present = np.zeros(self.n_envs, bool)
        # how write messages name what returned an agent's observation
        self._what = [f"step() (agent {agent!r})"
                      for agent in self.possible_agents]
        self._agents = np.tile(np.arange(A, dtype=np.int64), len(self.envs))

    @property
    def column_agents(self):
        return self._agents

    def seed_spaces(self, seeds):
        """Seed the spaces of each agent of each env with its column's
        ``seeds[j]`` (``SeedSequence``; as many as there are)."""
        A = self.n_agents
        for j, ss in enumerate(seeds[:self.n_envs]):
            env, agent = self.envs[j // A], self.possible_agents[j % A]
            seed = reset_seed(ss)
            env.action_space(agent).seed(seed)
            env.observation_space(agent).seed(seed)

    # ------------------------------------------------------------ reset --
    def reset(self, obs_out, seeds=None, at=None, *, t=None,
              check_casts=False):
        if at is not None and sorted(at) != list(range(self.n_envs)):
            raise ValueError(f"{self.name} cannot reset some of its agents "
                             f"alone: a PettingZoo env resets all of them")
        casts, A = [], self.n_agents
        for e, env in enumerate(self.envs):
            seed = None if seeds is None else reset_seed(seeds[e * A])
            self._reset_env(e, obs_out, seed, casts if check_casts else None,
                            t)
        return casts

    def _reset_env(self, e, obs_out, seed, casts, t, fill=True):
        """Reset env ``e``; its agents' observations into ``obs_out``: the
        first observation of those in its ``agents``, and with ``fill``
        the placeholder for the others (a step wrote theirs: the true last
        observation of an agent that left, the placeholder of one
        absent)."""
        env, A = self.envs[e], self.n_agents
        result = env.reset(seed=seed)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(f"{self.name}.reset() must return (observations,"
                            f" infos), got {type(result).__name__}")
        obs = result[0]
        live = set(env.agents)
        if not live:
            raise ValueError(f"{self.name}.reset() left no agent in agents")
        for a, agent in enumerate(self.possible_agents):
            j = e * A + a
            self.present[j] = agent in live
            if agent in live:
                value = obs.get(agent) if isinstance(obs, dict) else None
                if value is None:
                    raise ValueError(f"{self.name}.reset(): no observation "
                                     f"for live agent {agent!r}")
                self._write(obs_out, j, value, f"reset() (agent {agent!r})")
                if casts is not None:
                    _check_cast(casts, obs_out, j, value, t, True)
            elif fill:
                self._write(obs_out, j, self._placeholder, "placeholder")

    # ------------------------------------------------------------- step --
    def step(self, act, out, live=None, *, autoreset=True,
             check_casts=False):
        if live is not None:
            raise ValueError(f"{self.name} cannot leave an agent unstepped "
                             f"(sticky=True): its env steps all its agents")
        kind = self._act_kind
        acts = act if kind == _ACT_SCALARS else _env_actions(act, kind,
                                                            self.n_envs)
        ended, lost, env_ended = [], [], []
        casts = [] if check_casts else None
        for e in range(len(self.envs)):
            if self._step_env(e, acts, out, ended, lost, casts, autoreset):
                env_ended += range(e * self.n_agents,
                                   (e + 1) * self.n_agents)
        if ended or lost or casts or env_ended:
            return Stepped(ended, lost, casts or (), env_ended)
        return _CALM

    def _step_env(self, e, acts, out, ended, lost, casts, autoreset):
        """Step env ``e`` with the actions of its present agents and write
        its columns of ``out`` (see the module docstring); returns whether
        its episode ended (its last agent left)."""
        env, A, agents = self.envs[e], self.n_agents, self.possible_agents
        present, base = self.present, e * A
        actions = {agents[a]: acts[base + a] for a in range(A)
                   if present[base + a]}
        if actions:
            result = env.step(actions)
            if not (isinstance(result, tuple) and len(result) == 5):
                raise TypeError(
                    f"{self.name}.step() must return (observations, "
                    f"rewards, terminations, truncations, infos), got "
                    f"{type(result).__name__}")
            now = set(env.agents)
        else:  # every agent gone and no reset (autoreset=False)
            result, now = ({}, {}, {}, {}, {}), set()
        for a, agent in enumerate(agents):
            j = base + a
            if present[j]:
                self._played(j, a, result, now, out, ended, casts)
                continue
            # absent at the last row: no action of its led here
            out.rew[j] = 0.0
            out.fin[j] = True
            lost.append(j)
            if agent in now:  # spawned by this step
                value = _entry(result[0], agent, "observation", self.name,
                               out.t)
                self._write(out.obs, j, value, self._what[a])
                if casts is not None:
                    _check_cast(casts, out.obs, j, value, out.t, False)
                present[j] = True
            else:
                self._write(out.obs, j, self._placeholder, "placeholder")
        over = bool(actions) and not now
        if over and autoreset:
            self._reset_env(e, out.obs, None, casts, out.t, fill=False)
        return over

    def _played(self, j, a, result, now, out, ended, casts):
        """Column ``j`` (agent ``a``, present) after the step: its
        observation, reward, env info and, where it ended, its flags and
        true last observation."""
        name, t = self.name, out.t
        agent, what = self.possible_agents[a], self._what[a]
        obs, rew, terminations, truncations, infos = result
        value = _entry(obs, agent, "observation", name, t)
        r = _entry(rew, agent, "reward", name, t)
        out.rew[j] = r if type(r) is float else reward(r, j, t)
        terminated = bool(_entry(terminations, agent, "termination", name, t))
        truncated = bool(_entry(truncations, agent, "truncation", name, t))
        if out.info_mask:
            info = infos.get(agent) if isinstance(infos, dict) else None
            _write_env_info(tuple(out.info_mask), info or {}, out.info,
                            out.info_mask, j)
        self._write(out.obs, j, value, what)
        if casts is not None:
            _check_cast(casts, out.obs, j, value, t, False)
        if not (terminated or truncated):
            if agent not in now:
                raise ValueError(
                    f"{name} step {t}: agent {agent!r} left agents without "
                    f"a termination or truncation flag")
            return
        if agent in now:
            raise ValueError(f"{name} step {t}: agent {agent!r} ended "
                             f"(terminated or truncated) but is still in "
                             f"agents")
        ended.append(j)
        out.fin[j] = True
        if out.truncated is not None:
            out.truncated[j] = truncated and not terminated
        if out.final is not None:
            self._write(out.final, j, value, what)
        self.present[j] = False

    renders_columns = True

    def render(self, column):
        return self.envs[column // self.n_agents].render()

    def call(self, name, args, kwargs, *, first=0):
        A = self.n_agents
        for e, env in enumerate(self.envs):
            call_parallel(env, name, args, kwargs, first + e * A, A)

    def close(self, quiet=False):
        close_envs(self.envs, quiet=quiet)
