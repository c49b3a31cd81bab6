"""PettingZoo parallel envs as columns, against a brute-force reference.

The reference steps :class:`envs.AgentsEnv` by hand, one agent at a time,
and writes each column's rows as the layout table of
:mod:`rlplay.engine.core.layout` says (present agents act; absent ones are
rows no action led to, with ``fin``, ``stepno = 0``, no reward and the
placeholder observation; the env resets when no agent is left), with
:class:`generators.CountingActor`'s policy in numpy. Every generator, the
episodes, the replay buffer and the returns must agree with it exactly.
"""
import functools
import itertools
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from bounds import RAY_STEADY, STEADY  # noqa: E402
from envs import (AbsentAgentEnv, AgentsEnv, BuggyAgentsEnv,  # noqa: E402
                  absent_agent_factory, agents_factory)
from generators import RAY_STARTED_BOUND, CountingActor, make  # noqa: E402
from rlplay.engine.core import acted, evaluate  # noqa: E402
from rlplay.engine.envs import RowOut, make_batch  # noqa: E402
from rlplay.engine.norm import RunningNorm  # noqa: E402
from rlplay.engine.replay import Replay  # noqa: E402
from rlplay.engine.returns import gae, returns  # noqa: E402
from rlplay.engine.rollout import Evaluator, episodic  # noqa: E402
from rlplay.engine.seeds import (EVAL_COLLECTOR, env_seed_sequences,  # noqa: E402
                                 reset_seed, seed_sequence)

A, T, N_ENVS, ENTROPY, COUNT = 3, 4, 2, 11, 8
B = A * N_ENVS  # columns per worker
ENV_INFO = {"t": 0.0}


# ------------------------------------------------------------- reference --

def env_seeds(worker, n_envs=N_ENVS):
    """The reset seed of each env of ``worker``: its first column's."""
    seqs = env_seed_sequences(ENTROPY, A * n_envs, worker)
    return [reset_seed(seqs[e * A]) for e in range(n_envs)]


class Hand:
    """Rows ``0 .. n_rows - 1`` of every column of ``len(seeds)``
    AgentsEnv, stepped by hand: ``rows[field]`` of shape ``(n_rows, B)``
    (``h``, ``hx``: ``(n_rows, B, 2)``; ``info_t``, ``info_mask``: row
    ``t`` for the step into row ``t + 1``), and ``episodes``, each agent's
    complete episodes."""

    FIELDS = ("obs act rew final ret length stepno info_t".split(),
              "fin truncated acted info_mask".split())

    def __init__(self, seeds, n_rows):
        self.envs = [AgentsEnv() for _ in seeds]
        self.B, self.n_rows = A * len(seeds), n_rows
        floats, flags = self.FIELDS
        rows = {k: np.zeros((n_rows, self.B)) for k in floats}
        rows.update({k: np.zeros((n_rows, self.B), bool) for k in flags})
        rows["h"] = np.zeros((n_rows, self.B, 2), np.float32)
        rows["hx"] = np.zeros((n_rows, self.B, 2), np.float32)
        self.rows, self.episodes = rows, []
        self.present = np.zeros(self.B, bool)
        self.open = {}  # column -> its agent-episode under way
        for e, (env, seed) in enumerate(zip(self.envs, seeds)):
            obs, _ = env.reset(seed=seed)
            self._appear(0, e, obs)
        rows["fin"][0] = True
        rows["final"][0] = rows["obs"][0]
        hx = np.zeros((self.B, 2), np.float32)
        for t in range(n_rows):
            rows["hx"][t] = hx
            hx = hx + np.stack([rows["obs"][t], rows["stepno"][t]],
                               -1).astype(np.float32)
            rows["h"][t] = hx
            if t + 1 < n_rows:
                self._step(t)
                hx[rows["fin"][t + 1]] = 0

    def _appear(self, t, e, obs):
        """The agents of ``obs`` (a reset's or a spawn's) appear in row
        ``t``: their first observation, an agent-episode starts."""
        for a, agent in enumerate(self.envs[e].possible_agents):
            j = e * A + a
            if agent in obs:
                self.rows["obs"][t, j] = obs[agent][0]
                self.present[j] = True
                self.open[j] = dict(column=j, obs=[obs[agent][0]], act=[],
                                    rew=[])

    def _step(self, t):
        rows = self.rows
        act = (rows["obs"][t].astype(np.int64)
               + rows["stepno"][t].astype(np.int64)) % 5
        rows["act"][t + 1] = act
        for e, env in enumerate(self.envs):
            names = env.possible_agents
            was = self.present[e * A:(e + 1) * A].copy()
            actions = {names[a]: int(act[e * A + a]) for a in range(A)
                       if was[a]}
            obs, rew, term, trunc, info = env.step(actions)
            spawned = {}
            for a, agent in enumerate(names):
                j = e * A + a
                if was[a]:
                    self._acted(t, j, agent, obs, rew, term, trunc, info)
                else:  # no action of its led here
                    rows["fin"][t + 1, j] = True
                    if agent in env.agents:
                        spawned[agent] = obs[agent]
            self._appear(t + 1, e, spawned)
            if not env.agents:
                obs, _ = env.reset()
                self._appear(t + 1, e, obs)
        ended = rows["acted"][t + 1] & rows["fin"][t + 1]
        rows["final"][t + 1] = np.where(ended, rows["final"][t + 1],
                                        rows["obs"][t + 1])

    def _acted(self, t, j, agent, obs, rew, term, trunc, info):
        rows, ep = self.rows, self.open[j]
        rows["acted"][t + 1, j] = True
        rows["rew"][t + 1, j] = rew[agent]
        rows["info_t"][t, j] = info[agent]["t"]
        rows["info_mask"][t, j] = True
        rows["obs"][t + 1, j] = rows["final"][t + 1, j] = obs[agent][0]
        ep["act"].append(rows["act"][t + 1, j])
        ep["rew"].append(rew[agent])
        ep["obs"].append(obs[agent][0])
        if not (term[agent] or trunc[agent]):
            rows["stepno"][t + 1, j] = rows["stepno"][t, j] + 1
            return
        rows["fin"][t + 1, j] = True
        rows["truncated"][t + 1, j] = trunc[agent] and not term[agent]
        rows["ret"][t + 1, j] = sum(ep["rew"])
        rows["length"][t + 1, j] = len(ep["rew"])
        self.present[j] = False
        ep.update(terminated=bool(term[agent]),
                  truncated=rows["truncated"][t + 1, j], end=t + 1)
        self.episodes.append(self.open.pop(j))

    def fragment(self, k):
        """Rows ``k * T .. (k + 1) * T``."""
        return {name: x[k * T:(k + 1) * T + (name != "info_t"
                                              and name != "info_mask")]
                for name, x in self.rows.items()}


@functools.lru_cache(maxsize=None)
def hand(worker=0):
    return Hand(env_seeds(worker), COUNT * T + 1)


def check_fragment(batch, want, worker=0):
    """Every field of ``batch`` (one worker's fragment) equals the
    reference rows ``want``."""
    close = functools.partial(np.testing.assert_array_equal)
    state = batch.state
    close(state.obs[..., 0].numpy(), want["obs"])
    close(state.act.numpy(), want["act"])
    close(state.rew.numpy(), want["rew"].astype(np.float32))
    close(state.fin.numpy(), want["fin"])
    close(state.stepno.numpy(), want["stepno"])
    close(batch.truncated.numpy(), want["truncated"])
    close(batch.acted.numpy()[1:], want["acted"][1:])
    assert not batch.acted[0].any()
    close(batch.final[..., 0].numpy(), want["final"])
    close(batch.stats.ret.numpy()[1:], want["ret"][1:])
    close(batch.stats.length.numpy()[1:], want["length"][1:])
    close(batch.actor["value"].numpy(),
          (want["obs"] * 0.5).astype(np.float32))
    close(batch.actor["h"].numpy(), want["h"])
    close(batch.hx.numpy(), want["hx"][0])
    close(batch.env["t"].numpy(), want["info_t"].astype(np.float32))
    close(batch.env_mask["t"].numpy(), want["info_mask"])
    close(batch.meta.agent.numpy(), np.arange(B) % A)
    close(batch.meta.env.numpy(), worker * B + np.arange(B))
    close(batch.meta.worker.numpy(), np.full(B, worker))


# ------------------------------------------------------ the reference env --

def test_the_reference_covers_every_case():
    """The cases the tests are for happen in the reference's fragments:
    ends by termination and by truncation, and appearances, at row T (the
    fragment's last step) and at row 1 (the next fragment's first step);
    absent agents at row T; an agent leaving while others of its env play
    on; the env reset as the last one leaves."""
    rows = hand().rows
    ends = rows["acted"] & rows["fin"]
    absent = ~rows["acted"] & (rows["obs"] == 0)
    appear = ~rows["acted"] & rows["fin"] & (rows["obs"] != 0)
    r = np.arange(len(ends))
    for where in ((r % T == 0) & (r > 0), r % T == 1):
        assert (ends & rows["truncated"])[where].any()
        assert (ends & ~rows["truncated"])[where].any()
        assert appear[where].any()
        assert absent[where].any()
    # an agent leaves while another of its env plays on
    left = ends[1:].reshape(-1, N_ENVS, A)
    on = (rows["acted"][1:] & ~rows["fin"][1:]).reshape(-1, N_ENVS, A)
    assert (left.any(-1) & on.any(-1)).any()
    # the env resets where the last leaves: a reset observation at an end
    assert (ends & (rows["obs"] != rows["final"])).any()
    assert len({ep["column"] for ep in hand().episodes}) == B


@pytest.mark.parametrize("env_class", [AgentsEnv, AbsentAgentEnv])
def test_parallel_api_test_passes(env_class):
    with warnings.catch_warnings():  # importing it imports every env
        warnings.simplefilter("ignore", DeprecationWarning)
        from pettingzoo.test import parallel_api_test
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if env_class is AbsentAgentEnv:  # a warning, not a failure, there
            warnings.filterwarnings(
                "ignore", "No agents present but not all possible_agents")
        parallel_api_test(env_class(), num_cycles=200)


# ------------------------------------------------------------ generators --

@pytest.mark.parametrize("kind", ["same", "single", "multi", "cluster"])
def test_every_column_equals_the_hand_stepped_reference(kind, request):
    bounds = {"same": {}, "cluster": {"timeout": RAY_STEADY,
                                      "start_timeout": RAY_STARTED_BOUND}}
    if kind == "cluster":  # Ray actors, the workers of multi's protocol
        request.getfixturevalue("ray_cluster")
    feed = make(kind, agents_factory, CountingActor(), T, B, n_actors=2,
                entropy=ENTROPY, env_info=ENV_INFO,
                **bounds.get(kind, {"timeout": STEADY}))
    seen = {0: 0, 1: 0}
    with feed:
        for batch in feed:
            worker = int(batch.meta.worker[0])
            k = seen[worker]
            if k < COUNT:
                check_fragment(batch, hand(worker).fragment(k), worker)
                assert int(batch.meta.seq[0]) == k
                seen[worker] += 1
            if min(seen.values()) == COUNT or (
                    kind not in ("multi", "cluster") and seen[0] == COUNT):
                break


def test_multi_under_spawn_equals_the_reference():
    feed = make("multi", agents_factory, CountingActor(), T, B, n_actors=1,
                entropy=ENTROPY, start_method="spawn", timeout=STEADY,
                env_info=ENV_INFO)
    with feed:
        for k, batch in zip(range(2), feed):
            check_fragment(batch, hand(0).fragment(k))


def collected(count=COUNT, worker=0):
    """``count`` fragments of ``same`` (copies)."""
    feed = make("same", agents_factory, CountingActor(), T, B,
                entropy=ENTROPY, env_info=ENV_INFO)
    with feed:
        return [batch for _, batch in zip(range(count), feed)]


# -------------------------------------------------------------- consumers --

def test_episodes_yields_each_agent_episode_exactly():
    want = hand().episodes
    got = next(iter(episodic.episodes(iter(collected()), len(want))))
    assert got.n_episodes == len(want)
    got_eps = []
    for i in range(got.n_episodes):
        lo, hi = int(got.offsets[i]), int(got.offsets[i + 1])
        got_eps.append(dict(
            column=int(got.meta.env[i]),
            obs=got.obs[lo + i:hi + i + 1, 0].tolist(),
            act=got.act[lo:hi].tolist(), rew=got.rew[lo:hi].tolist(),
            terminated=bool(got.terminated[i]),
            truncated=bool(got.truncated[i]), ret=float(got.ret[i])))
    key = lambda ep: (ep["column"], ep["obs"][0])  # noqa: E731
    for ep, mine in zip(sorted(want, key=key), sorted(got_eps, key=key)):
        assert mine["column"] == ep["column"]
        assert mine["obs"] == ep["obs"]
        assert mine["act"] == ep["act"]
        assert mine["rew"] == pytest.approx(ep["rew"])
        assert (mine["terminated"], mine["truncated"]) == (
            ep["terminated"], ep["truncated"])
        assert mine["ret"] == sum(ep["rew"])


def test_replay_never_links_across_an_absence_or_a_reset():
    gamma, n = 0.5, 3
    replay = Replay(1000)
    batches = collected()
    for batch in batches:
        replay.extend(batch)
    index = replay.indices()
    assert len(index) == sum(int(acted(b)[1:].sum()) for b in batches)
    got = replay.transitions(index, n_step=n, gamma=gamma)
    # where each observation is in the reference's agent-episodes
    rows = hand().rows
    where = {}
    for ep in hand().episodes:
        for k, x in enumerate(ep["obs"][:-1]):
            where[x] = (ep, k)
    for i in range(len(index)):
        x = float(got.obs[i, 0])
        assert x != 0, "a transition from an absent row"
        if x not in where:  # an episode still under way at the end
            j = int(np.flatnonzero((rows["obs"] == x).any(0))[0])
            assert not any(ep["column"] == j and x in ep["obs"]
                           for ep in hand().episodes)
            continue
        ep, k = where[x]
        m = min(n, len(ep["rew"]) - k)
        G = sum(gamma ** i * r for i, r in enumerate(ep["rew"][k:k + m]))
        assert float(got.rew[i]) == pytest.approx(G, rel=1e-6)
        assert int(got.act[i]) == ep["act"][k]
        assert float(got.next_obs[i, 0]) == ep["obs"][k + m]
        ends = k + m == len(ep["rew"]) and ep["terminated"]
        assert float(got.discount[i]) == pytest.approx(
            0.0 if ends else gamma ** m)


def test_running_norm_sees_what_agents_observed_after_acting():
    norm = RunningNorm((1,))
    for batch in collected():
        norm.update_from(batch)
    rows = hand().rows
    seen = rows["obs"][1:][rows["acted"][1:]]
    assert int(norm.count) == len(seen)
    np.testing.assert_allclose(norm.mean.numpy(), [seen.mean()])
    np.testing.assert_allclose(norm.var.numpy(), [seen.var()], rtol=1e-9)


def brute_gae(rew, fin, truncated, moved, value, value_final, gamma, lam):
    """GAE of each column's transitions, one agent-episode at a time."""
    T1, n = rew.shape
    adv = np.zeros((T1 - 1, n))
    for j in range(n):
        acc = 0.0
        for t in range(T1 - 2, -1, -1):
            if not moved[t + 1, j]:  # no action of the agent led there
                adv[t, j], acc = 0.0, 0.0
                continue
            if fin[t + 1, j]:
                boot = value_final[t + 1, j] if truncated[t + 1, j] else 0.0
                acc = 0.0
            else:
                boot = value[t + 1, j]
            acc = rew[t + 1, j] + gamma * boot - value[t, j] + \
                gamma * lam * acc
            adv[t, j] = acc
    return adv


def test_returns_and_gae_are_exact_per_agent():
    gamma, lam = 0.5, 0.75
    for k, batch in enumerate(collected(3)):
        want = hand().fragment(k)
        value = torch.from_numpy(want["obs"] / 1e6)
        value_final = torch.from_numpy(want["final"] / 1e6)
        args = (batch.state.rew.double(), batch.state.fin, batch.truncated,
                value, value_final)
        mask = ~acted(batch)
        adv = gae(*args, gamma=gamma, lam=lam, mask=mask)
        brute = brute_gae(want["rew"], want["fin"], want["truncated"],
                          want["acted"], want["obs"] / 1e6,
                          want["final"] / 1e6, gamma, lam)
        np.testing.assert_allclose(adv.numpy(), brute, rtol=1e-12)
        G = returns(*args, gamma=gamma, mask=mask)
        np.testing.assert_allclose(
            G.numpy(), brute_gae(want["rew"], want["fin"], want["truncated"],
                                 want["acted"], want["obs"] / 1e6,
                                 want["final"] / 1e6, gamma, 1.0)
            + np.where(want["acted"][1:], want["obs"][:-1] / 1e6, 0),
            rtol=1e-12)


def test_evaluate_returns_each_agents_episodes():
    seqs = env_seed_sequences(ENTROPY, B, 0)
    envs = make_batch(agents_factory, seqs)
    try:
        ret, length = evaluate(envs, CountingActor(), 2 * B,
                               seed_sequences=seqs)
    finally:
        envs.close()
    want = {j: [ep for ep in hand().episodes if ep["column"] == j][:2]
            for j in range(B)}
    assert ret.tolist() == [sum(ep["rew"]) for j in range(B)
                            for ep in want[j]]
    assert length.tolist() == [len(ep["rew"]) for j in range(B)
                               for ep in want[j]]


def test_the_evaluator_plays_each_agents_episodes():
    actor = CountingActor()
    with Evaluator(agents_factory, actor, n_envs=B, n_episodes=2 * B,
                   entropy=ENTROPY, start_method="fork") as evaluator:
        evaluator.submit(actor)
        result = evaluator.result()
    seeds = env_seed_sequences(seed_sequence(ENTROPY), B, EVAL_COLLECTOR)
    envs = make_batch(agents_factory, seeds)
    try:
        ret, length = evaluate(envs, actor, 2 * B, seed_sequences=[
            ss.spawn(1)[0] for ss in seeds])
    finally:
        envs.close()
    assert np.array_equal(result.returns, ret)
    assert np.array_equal(result.lengths, length)
    # per column: "a" lives 3 and 4 steps, "b" 4 and 4, "c" 6 and 7
    assert length.tolist() == [3, 4, 4, 4, 6, 7] * 2


def test_a_step_reports_every_column_of_an_env_whose_episode_ended():
    """``env_ended``: all ``A`` columns of each env at the step where its
    last agent leaves (episode ``k``: step ``6 + k % 3``), an absent
    agent's column included, and nothing else."""
    envs = make_batch(absent_agent_factory,
                      env_seed_sequences(ENTROPY, B, 0))
    obs = np.zeros((B, 1), np.float32)
    out = RowOut(t=0, obs=obs, rew=np.zeros(B), fin=np.zeros(B, bool),
                 truncated=None, final=None, info={}, info_mask={})
    try:
        envs.reset(obs)
        ends = []
        for t in range(6 + 7 + 8):
            out.fin[:] = False
            stepped = envs.step(np.zeros(B, np.int64), out._replace(t=t))
            if stepped.env_ended:
                ends.append((t + 1, list(stepped.env_ended)))
            # "b" is absent at every step: its column is a lost call
            assert [1, 4] == [j for j in stepped.lost if j % A == 1]
    finally:
        envs.close()
    assert ends == [(6, list(range(B))), (13, list(range(B))),
                    (21, list(range(B)))]


def _absent_agent_want(n_per_column):
    """The reference's first episodes of the columns whose agent lives:
    those of AgentsEnv's "a" and "c" (an AbsentAgentEnv's "b" never
    spawns, and no other column depends on it)."""
    return [ep for j in range(B) if j % A != 1
            for ep in [ep for ep in hand().episodes
                       if ep["column"] == j][:n_per_column]]


def test_evaluate_ends_where_an_agent_never_spawns():
    """Each column plays its agent's lives in its env's first two
    episodes: "a" and "c" two each, "b" none (it is not waited for)."""
    seqs = env_seed_sequences(ENTROPY, B, 0)
    envs = make_batch(absent_agent_factory, seqs)
    try:
        ret, length = evaluate(envs, CountingActor(), 2 * B,
                               seed_sequences=seqs)
        # cut at max_steps: the lives "a" and "c" end on their own later
        ret_cut, length_cut = evaluate(envs, CountingActor(), 2 * B,
                                       seed_sequences=seqs, max_steps=2)
    finally:
        envs.close()
    want = _absent_agent_want(2)
    assert len(want) == 2 * 2 * N_ENVS
    assert ret.tolist() == [sum(ep["rew"]) for ep in want]
    assert length.tolist() == [len(ep["rew"]) for ep in want]
    assert ret_cut.tolist() == [sum(ep["rew"][:2]) for ep in want]
    assert length_cut.tolist() == [2] * len(want)


def test_the_evaluator_ends_where_an_agent_never_spawns():
    actor = CountingActor()
    with Evaluator(absent_agent_factory, actor, n_envs=B, n_episodes=B,
                   entropy=ENTROPY, start_method="fork") as evaluator:
        evaluator.submit(actor)
        result = evaluator.result()
    # per env: "a" lives 3 steps, "c" 6, in its first episode
    assert result.lengths.tolist() == [3, 6] * N_ENVS
    assert np.isfinite(result.returns).all()


def test_a_resumed_run_starts_its_agents_from_resets():
    feed = make("same", agents_factory, CountingActor(), T, B,
                entropy=ENTROPY)
    with feed:
        for _ in zip(range(3), feed):
            pass
        state = feed.state_dict()
    feed = make("same", agents_factory, CountingActor(), T, B,
                resume=state)
    with feed:
        batches = [batch for _, batch in zip(range(3), feed)]
    assert batches[0].meta.seq.eq(3).all()
    assert batches[0].meta.generation.eq(1).all()
    first = batches[0].state
    assert first.fin[0].all() and not first.stepno[0].any()
    # "b" spawns after the reset: a placeholder at row 0
    assert first.obs[0, :, 0].eq(0).tolist() == [False, True, False] * 2
    check_invariants(batches, A)


# ---------------------------------------------------------------- refusals --

def test_a_count_that_is_no_multiple_of_the_agents_is_refused():
    with pytest.raises(ValueError, match=r"n_envs=4 is not a multiple of 3"
                       r".*possible_agents \['a', 'b', 'c'\]"):
        make("same", agents_factory, CountingActor(), T, 4)
    with pytest.raises(ValueError, match=r"n_per_actor=5 is not a multiple"
                       r" of 3"):
        make("multi", agents_factory, CountingActor(), T, 5)
    # the evaluator too, when it is made (not at its first result)
    with pytest.raises(ValueError, match=r"n_envs=4 is not a multiple of 3"):
        make("evaluator", agents_factory, CountingActor(), n_envs=4)


def test_agents_of_different_spaces_are_refused_with_what_to_do():
    with pytest.raises(TypeError, match=r"different action spaces: 'a' "
                       r"Discrete\(5\), 'c' Discrete\(3\).*pad"):
        make("same", functools.partial(agents_factory, spaces_differ=True),
             CountingActor(), T, 3)


@pytest.mark.parametrize("bug, message", [
    ("missing", "step 2: the observation of live agent 'c' is missing"),
    ("unflagged", "step 2: agent 'a' left agents without a termination"),
    ("lingering", "step 2: agent 'a' ended .* but is still in agents")])
def test_an_env_that_breaks_the_contract_is_named(bug, message):
    feed = make("same", functools.partial(BuggyAgentsEnv, bug),
                CountingActor(), T, A)
    with feed, pytest.raises(ValueError, match=message):
        next(iter(feed))


def test_sticky_is_refused():
    with pytest.raises(ValueError, match="sticky=True"):
        make("same", agents_factory, CountingActor(), T, 3, sticky=True)


def test_aec_envs_run_where_parallelizable_else_are_refused():
    from pettingzoo.utils.conversions import parallel_to_aec

    def aec_factory():
        return parallel_to_aec(AgentsEnv())
    feed = make("same", aec_factory, CountingActor(), T, B,
                entropy=ENTROPY, env_info=ENV_INFO)
    with feed:
        check_fragment(next(iter(feed)), hand().fragment(0))

    class TurnBased:
        possible_agents = ["a", "b"]
        metadata = {}

        def observation_space(self, agent):
            return AgentsEnv().observation_space(agent)

        def agent_iter(self):
            return iter(())

        def last(self):
            return None

        def close(self):
            pass
    with pytest.raises(TypeError, match="AEC env .* is_parallelizable"):
        make("same", TurnBased, CountingActor(), T, 2)


# -------------------------------------------------------------- real envs --

class RandomActor(CountingActor):
    """Uniform random actions of ``Discrete(n)`` (the worker's torch
    generator), feed-forward."""

    hx_dim = 1

    def __init__(self, n):
        super().__init__()
        self.n = n

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return torch.randint(0, self.n, stepno.shape), (), {}


def check_invariants(batches, n_agents):
    """The layout's invariants over one worker's fragments, in order;
    returns how many agent-episodes ended, and how many agents left while
    others of their env played on."""
    prev, ret = None, None
    n_ends = n_left = 0
    for batch in batches:
        fin, moved, stepno = batch.state.fin, batch.acted, batch.state.stepno
        obs = batch.state.obs.flatten(2)
        B = fin.shape[1]
        assert torch.equal(batch.meta.agent, torch.arange(B) % n_agents)
        if prev is not None:  # row T of one fragment is row 0 of the next
            assert torch.equal(obs[0], prev.state.obs.flatten(2)[-1])
            for x, y in ((fin, prev.state.fin), (stepno, prev.state.stepno),
                         (batch.truncated, prev.truncated)):
                assert torch.equal(x[0], y[-1])
        else:
            ret = torch.zeros(B, dtype=torch.float64)
        assert not moved[0].any()
        absent = ~moved[1:]
        for x in (stepno[1:], batch.state.rew[1:], batch.truncated[1:],
                  batch.stats.length[1:]):
            assert not x[absent].any()
        assert fin[1:][absent].all()
        # absent at a row and the next: the placeholder observation
        assert not obs[1:-1][absent[:-1] & absent[1:]].any()
        goes_on = moved[1:] & ~fin[1:]
        assert torch.equal(stepno[1:][goes_on], stepno[:-1][goes_on] + 1)
        assert torch.equal(batch.final.flatten(2)[1:][goes_on],
                           obs[1:][goes_on])
        ends = moved[1:] & fin[1:]
        assert not stepno[1:][ends].any()
        assert torch.equal(batch.stats.length[1:][ends],
                           stepno[:-1][ends] + 1)
        assert not (batch.truncated[1:] & ~ends).any()
        for t in range(1, fin.shape[0]):
            ret += batch.state.rew[t].double()
            done = ends[t - 1]
            torch.testing.assert_close(batch.stats.ret[t][done], ret[done],
                                       rtol=1e-5, atol=1e-4)
            ret[done | ~moved[t]] = 0
            # an agent left while another of its env acts on
            on = (moved[t] & ~fin[t]).view(-1, n_agents).any(1)
            n_left += int((done.view(-1, n_agents).any(1) & on).sum())
        n_ends += int(ends.sum())
        prev = batch
    return n_ends, n_left


def collect_real(factory, n_actions, n_agents, n_steps, n_batches,
                 n_envs=1):
    feed = make("multi", factory, RandomActor(n_actions), n_steps,
                n_agents * n_envs, n_actors=2, entropy=ENTROPY,
                timeout=STEADY, copy=True)
    per_worker = {0: [], 1: []}
    with feed:
        for batch in itertools.islice(feed, n_batches):
            per_worker[int(batch.meta.worker[0])].append(batch)
    return per_worker


def test_simple_spread_under_multi_keeps_the_layout():
    simple_spread = pytest.importorskip("mpe2.simple_spread_v3")
    per_worker = collect_real(simple_spread.parallel_env, 5, 3, 50, 8,
                              n_envs=2)
    for batches in per_worker.values():
        assert len(batches) >= 2
        n_ends, _ = check_invariants(batches, 3)
        # every agent of both envs truncated at max_cycles=25
        assert n_ends == 6 * (len(batches) * 50 // 25)
        ends = torch.cat([b.acted[1:] & b.state.fin[1:] for b in batches])
        assert torch.equal(ends, torch.cat(
            [b.truncated[1:] for b in batches]))


def test_knights_archers_zombies_agents_leave_while_others_play_on():
    kaz = pytest.importorskip("pettingzoo.butterfly.knights_archers_zombies_v11")
    factory = functools.partial(kaz.parallel_env, spawn_delay=3,
                                max_zombies=20, line_death=True)
    per_worker = collect_real(factory, 6, 4, 100, 8)
    n_left = 0
    for batches in per_worker.values():
        n_left += check_invariants(batches, 4)[1]
    assert n_left > 0
