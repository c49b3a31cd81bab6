"""Batched env sources: a factory that returns a Gymnasium vector env (or
EnvPool) under every generator.

- Same-step and disabled autoreset, and next-step autoreset with a partial
  reset (``SyncVectorEnv``, ``AsyncVectorEnv`` with shared memory): the
  fragments equal, field for field, those of the same envs given one by
  one (same seeds), in same, single and multi.
- Next-step autoreset without a partial reset (a native vector env): every
  invariant of the layout on thousands of steps (row ``T`` is the next row
  0, ``final`` the true last observation, the lost calls marked), and the
  transitions, returns and GAE equal those of the source's own step
  records, the ignored calls left out.
- Seeding, the Evaluator, EnvPool (when installed), bad inputs, sticky,
  ``cpu_affinity``.
"""
import functools
import itertools
import os

import gymnasium
import numpy as np
import pytest
import torch

from envs import ENV_INFO, EndsEnv, LateVectorEnv, ends_vector, late_vector
from generators import (CountingActor, assert_fragments_equal, make,
                        without_version)
from rlplay.engine import acted, episode_stats
from rlplay.engine.core import episode_edges
from rlplay.engine.nested import suply
from rlplay.engine.returns import gae, returns
from rlplay.engine.seeds import env_seed_sequences, reset_seed, shared_seed
from rlplay.engine.rollout import Evaluator, multi, same, single

from bounds import STEADY as BOUND, START  # the reasons in bounds.py
T = 6


def copies(feed, n):
    return [suply(torch.clone, batch) for batch in itertools.islice(feed, n)]


def run(kind, factory, n_envs, n=6, **kwargs):
    """``n`` fragments (copies) of ``kind`` over ``n_envs`` columns: one
    worker of ``n_envs`` for single and multi, one fragment a batch."""
    args = dict(entropy=7, env_info=ENV_INFO)
    if kind != "same":
        args.update(timeout=BOUND, start_timeout=START)
    args.update(kwargs)
    feed = make(kind, factory, CountingActor(), T, n_envs, n_actors=1,
                **args)
    with feed:
        return copies(feed, n)


# ---------------------------------------------------------- exact sources --

EXACT = [dict(mode="same_step"), dict(mode="disabled"),
         dict(mode="next_step"),
         dict(mode="same_step", asynchronous=True),
         dict(mode="next_step", asynchronous=True)]


@pytest.mark.parametrize("kind", ["same", "single", "multi"])
@pytest.mark.parametrize("source", EXACT, ids=lambda s: "-".join(
    str(v) for v in s.values()))
def test_exact_sources_equal_a_list_of_the_same_envs(kind, source):
    """Two sources of 4 envs (8 columns) against 8 single envs: every
    field of every fragment, env info included, terminations and
    truncations on different rows of the columns."""
    want = run(kind, EndsEnv, 8)
    got = run(kind, functools.partial(ends_vector, 4, **source), 8)
    ends = 0
    for x, y in zip(got, want):
        assert_fragments_equal(without_version(x), without_version(y))
        ends += int(x.state.fin[1:].sum())
    assert ends > 10 and any(bool(f.truncated.any()) for f in got)


def test_one_multi_worker_with_two_sources_and_two_workers():
    """multi, 2 workers x 8 columns of two sources each, 2 fragments a
    batch: each worker's slot equals the list version's."""
    def feed(factory):
        return multi.rollout(factory, CountingActor(), T, 2, 8, 4, 2,
                             entropy=3, env_info=ENV_INFO, timeout=BOUND,
                             start_timeout=START)

    # fragments 0-2 of both workers, read on (bounded) until each run has
    # them: which worker fills the first batches is the scheduler's (one
    # that starts late on a busy machine may deliver nothing for a while)
    wanted = {(w, s) for w in range(2) for s in range(3)}
    with feed(EndsEnv) as a, feed(functools.partial(ends_vector, 4)) as b:
        want, got = {}, {}
        for batches, out in ((a, want), (b, got)):
            for batch in itertools.islice(batches, 2000):
                for s in range(2):
                    cols = slice(8 * s, 8 * s + 8)
                    key = (int(batch.meta.worker[cols][0]),
                           int(batch.meta.seq[cols][0]))
                    out[key] = suply(torch.clone, batch.state.obs[:, cols])
                if wanted <= set(out):
                    break
    assert wanted <= set(want) and wanted <= set(got)
    for key in set(want) & set(got):
        assert torch.equal(got[key], want[key]), key


# ------------------------------------------------ next-step, lost calls --

def transitions(fragments):
    """Per column, the transitions the fragments hold: ``(obs, act, rew,
    terminated, truncated, next obs)`` at every row an executed action led
    to, ``next obs`` the true last observation where the episode ended."""
    per = {}
    for f in fragments:
        mask = acted(f)
        T1, B = f.state.fin.shape
        for j in range(B):
            for t in range(1, T1):
                if not mask[t, j]:
                    continue
                fin, trunc = bool(f.state.fin[t, j]), bool(f.truncated[t, j])
                nxt = f.final[t, j] if fin else f.state.obs[t, j]
                per.setdefault(j, []).append((
                    float(f.state.obs[t - 1, j, 0]), int(f.state.act[t, j]),
                    float(f.state.rew[t, j]), fin and not trunc, trunc,
                    float(nxt[0])))
    return per


def records(calls, first):
    """The same transitions from the source's own log (``first``: the
    reset observations), ignored calls (the resets of next-step autoreset)
    left out."""
    n_envs = len(first)
    per, last = {}, dict(enumerate(first))
    for call in calls:
        for j in range(n_envs):
            obs = float(call["obs"][j, 0])
            if call["reset"][j]:
                last[j] = obs
                continue
            # an end by termination and truncation at once is a termination
            term, trunc = bool(call["terminated"][j]), bool(
                call["truncated"][j])
            per.setdefault(j, []).append((
                last[j], int(call["actions"][j]), float(call["rew"][j]),
                term, trunc and not term, obs))
            last[j] = obs
    return per


def test_lost_calls_keep_every_invariant():
    """A native next-step source (no partial reset), 1000 steps of 4
    columns: row T is the next row 0; an episode's end row holds its true
    last observation (obs equals final) and the next row, the lost call,
    its reset observation, fin set, no reward, no statistics, no env info;
    the transitions are the source's own, none invented, none missing."""
    feed = same.rollout(late_vector, CountingActor(), 10, 4, entropy=1,
                        env_info=ENV_INFO)
    source = feed.envs.source
    assert isinstance(source, LateVectorEnv)
    first_obs = feed.session.ctx.last[0].obs[:, 0].tolist()
    with feed:
        fragments = copies(feed, 100)
    previous = None
    n_lost = 0
    for f in fragments:
        mask = acted(f)
        if previous is not None:
            for field in ("state", "truncated", "final", "stats"):
                suply(lambda x, y: np.testing.assert_array_equal(
                    x[0], y[-1]), getattr(f, field), getattr(previous, field))
        previous = f
        for t in range(1, 11):
            for j in range(4):
                if mask[t, j]:
                    continue
                n_lost += 1
                # the lost call follows an end in the row before
                assert f.state.fin[t, j] and f.state.fin[t - 1, j]
                assert f.stats.length[t, j] == 0 and f.state.rew[t, j] == 0
                assert f.state.stepno[t, j] == 0
                assert not f.env_mask["t"][t - 1, j]
                # the end row holds the true last observation
                assert torch.equal(f.state.obs[t - 1, j], f.final[t - 1, j])
    assert n_lost > 50
    got = transitions(fragments)
    want = records(source.calls, first_obs)
    for j in range(4):
        n = len(got[j])
        assert n > 200 and got[j] == want[j][:n]
    # episode statistics: one per end, with the length of real steps
    lengths = np.concatenate([episode_stats(f)[1] for f in fragments])
    ends = sum(int((f.state.fin[1:] & (f.stats.length[1:] > 0)).sum())
               for f in fragments)
    assert len(lengths) == ends and lengths.min() >= 1



class Mixed:
    """A factory of a lost-call source (its ``final`` left to the loop)
    and a same-step one (it writes its own), in turn."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls % 2:
            return late_vector(4)
        return ends_vector(4, mode="same_step")


@pytest.mark.parametrize("kind", ["same", "single", "multi"])
@pytest.mark.parametrize("factory", [late_vector, Mixed],
                         ids=["late", "mixed"])
def test_final_holds_the_true_last_observations(kind, factory):
    """The sources whose ``final`` the loop copies from the observations,
    alone and beside one that writes its own: at every end, ``final`` is
    the observation after the last one (the envs count up by one a step),
    elsewhere the observation itself."""
    n_envs = 4 if factory is late_vector else 8
    fragments = run(kind, factory() if factory is Mixed else factory,
                    n_envs, n=5)
    n_ends = 0
    for f in fragments:
        # rows 1..T (row 0 repeats the last fragment's row T)
        ends = (acted(f) & f.state.fin)[1:]
        obs, final = f.state.obs[..., 0], f.final[1:, ..., 0]
        assert torch.equal(final[~ends], obs[1:][~ends])
        for t, j in ends.nonzero().tolist():
            assert final[t, j] == obs[t, j] + 1  # rows t + 1 and t
            n_ends += 1
    assert n_ends > 10


class EditingVectorEnv(LateVectorEnv):
    """A :class:`LateVectorEnv` that writes over the actions it gets."""

    def step(self, actions):
        result = super().step(actions)  # logs a copy of them
        actions[...] = 7
        return result


def test_a_source_that_edits_its_actions_leaves_the_rows_alone():
    feed = same.rollout(EditingVectorEnv, CountingActor(), 10, 4, entropy=1)
    with feed:
        assert feed.envs.copy_actions
        batch = next(feed)
    calls = feed.envs.source.calls
    assert len(calls) == 10
    for t, call in enumerate(calls):  # every column gets an action
        np.testing.assert_array_equal(batch.state.act[t + 1],
                                      call["actions"])
    assert (batch.state.act != 7).all()


def test_actions_go_uncopied_only_to_the_sources_known_to_read_them():
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
    from rlplay.engine.envs.vector import VectorSource
    assert not VectorSource(CartPoleVectorEnv(num_envs=2)).copy_actions
    assert VectorSource(late_vector()).copy_actions
    assert VectorSource(EditingVectorEnv()).copy_actions  # a subclass
    assert VectorSource(ends_vector(mode="next_step")).copy_actions


def test_same_and_single_agree_on_lost_calls_and_final_is_obs_there():
    """A native next-step source: same and single with one entropy give
    equal fragments, every field, over several batches (single fills two
    buffers in turn, same one), and ``final`` at a lost call is a copy of
    ``obs`` there (no episode ended: the layout's "else a copy of
    ``obs[t]``"), not what the reused buffer held."""
    got = {kind: run(kind, late_vector, 4, n=8) for kind in ("same",
                                                            "single")}
    n_lost = 0
    for x, y in zip(got["single"], got["same"]):
        assert_fragments_equal(without_version(x), without_version(y))
        lost = (~acted(y)).clone()
        lost[0] = False
        n_lost += int(lost.sum())
        assert torch.equal(y.final[lost], y.state.obs[lost])
        # a lost call starts the next episode and ends none
        edges = episode_edges(y)
        assert bool(edges.starts[lost].all())
        assert not bool(edges.ends[lost].any())
    assert n_lost > 4

class TenthEnv(EndsEnv):
    """EndsEnv rewarding 0.1 a step: a float64 that float32 does not hold,
    so that a return summed from the fragment's float32 rewards differs
    from the sum of the rewards as the env gave them."""

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, 0.1, terminated, truncated, info


class LateTenthVectorEnv(LateVectorEnv):
    def __init__(self, k=4):
        super().__init__(k)
        self.envs = [TenthEnv() for _ in range(k)]


def tenth_vector(k=4, mode="same_step"):
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    return SyncVectorEnv([TenthEnv] * k,
                         autoreset_mode=AutoresetMode[mode.upper()])


@pytest.mark.parametrize("factory", [
    TenthEnv, tenth_vector, functools.partial(tenth_vector, 8),
    functools.partial(tenth_vector, mode="next_step"), LateTenthVectorEnv],
    ids=["single-envs", "two-vector-sources", "one-vector-source",
         "next-step", "lost-calls"])
def test_a_return_is_the_float64_sum_of_the_rewards(factory):
    """Every episode's return is 0.1 added up, in float64 and in order,
    as many times as the episode has steps (episodes cut by fragment
    boundaries, lost calls adding nothing), whatever the source."""
    feed = same.rollout(factory, CountingActor(), 3, 8, entropy=5)
    with feed:
        fragments = copies(feed, 40)
    n_episodes = 0
    for f in fragments:
        for ret, length in zip(*episode_stats(f)):
            total = 0.0
            for _ in range(int(length)):
                total += 0.1
            assert float(ret) == total, (ret, length)
            # summing the float32 records would give another number
            assert float(np.float32(0.1)) * length != total
            n_episodes += 1
    assert n_episodes > 30


def reference_returns(f, value, value_final, gamma, lam):
    """Per column, returns and GAE of the acted rows of fragment ``f``,
    from its real transitions alone: a lost row is skipped (its action was
    never executed), so the recursion jumps over it."""
    T1, B = f.state.fin.shape
    mask = acted(f)
    G = torch.zeros(T1 - 1, B, dtype=torch.float64)
    A = torch.zeros(T1 - 1, B, dtype=torch.float64)
    for j in range(B):
        g = float(value[T1 - 1, j])
        a = 0.0
        for t in range(T1 - 1, 0, -1):
            if not mask[t, j]:
                continue
            fin, trunc = bool(f.state.fin[t, j]), bool(f.truncated[t, j])
            boot = float(value_final[t, j]) if trunc else (
                0.0 if fin else float(value[t, j]))
            nxt_g = boot if fin else g
            g = float(f.state.rew[t, j]) + gamma * nxt_g
            delta = float(f.state.rew[t, j]) + gamma * boot \
                - float(value[t - 1, j])
            a = delta + gamma * lam * (0.0 if fin else a)
            G[t - 1, j], A[t - 1, j] = g, a
    return G, A


def test_returns_and_gae_with_lost_calls_equal_the_reference():
    feed = same.rollout(late_vector, CountingActor(), 12, 4, entropy=2)
    with feed:
        fragments = copies(feed, 30)
    gamma, lam = 0.9, 0.8
    for f in fragments:
        value = 0.01 * f.state.obs[..., 0].double()
        value_final = 0.01 * f.final[..., 0].double()
        mask = ~acted(f)
        got_g = returns(f.state.rew.double(), f.state.fin, f.truncated,
                        value, value_final, gamma=gamma, mask=mask)
        got_a = gae(f.state.rew.double(), f.state.fin, f.truncated, value,
                    value_final, gamma=gamma, lam=lam, mask=mask)
        want_g, want_a = reference_returns(f, value, value_final, gamma, lam)
        torch.testing.assert_close(got_g, want_g)
        torch.testing.assert_close(got_a, want_a)


def test_cartpole_vector_env_under_single_and_multi():
    """Gymnasium's native CartPole vector env: the columns are laid out as
    a list's (obs is (1 + T, B, 4)), every end has its statistics, and the
    episode lengths count real steps only."""
    factory = functools.partial(gymnasium.make_vec, "CartPole-v1", 4,
                                vectorization_mode="vector_entry_point")
    for kind in ("single", "multi"):
        feed = make(kind, factory, CountingActorCartPole(), 32, 8,
                    n_actors=1 if kind == "single" else 2, entropy=0,
                    timeout=BOUND, start_timeout=START)
        with feed:
            fragments = copies(feed, 10)
        B = fragments[0].state.obs.shape[1]
        assert fragments[0].state.obs.shape == (33, B, 4)
        lengths = np.concatenate([episode_stats(f)[1] for f in fragments])
        assert len(lengths) and lengths.min() >= 8  # CartPole's shortest
        for f in fragments:  # a lost call follows an episode's end
            lost = (~acted(f))[1:].nonzero().tolist()
            assert all(bool(f.state.fin[t, j]) for t, j in lost)


class CountingActorCartPole(CountingActor):
    """CountingActor's actions for CartPole's two."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        act, hx, info = super().step(stepno, obs, act, rew, fin, hx=hx,
                                     virtual=virtual)
        return act % 2, hx, info


# --------------------------------------------------------------- seeding --

def test_seeding_is_reproducible_and_per_column():
    """A source that takes one seed (native): the run repeats from
    ``entropy``; another ``entropy`` gives other observations; multi's two
    workers step envs of their own seeds."""
    def obs(entropy):
        with same.rollout(late_vector, CountingActor(), 4, 8,
                          entropy=entropy) as feed:
            return torch.cat([b.state.obs.clone() for b in
                              itertools.islice(feed, 3)])

    assert torch.equal(obs(5), obs(5))
    assert not torch.equal(obs(5), obs(6))
    # the list source: every column its own seed, as single envs get
    with same.rollout(functools.partial(ends_vector, 4), CountingActor(), 4,
                      8, entropy=5) as a, \
            same.rollout(EndsEnv, CountingActor(), 4, 8, entropy=5) as b:
        assert torch.equal(next(a).state.obs, next(b).state.obs)
    with multi.rollout(late_vector, CountingActor(), 4, 2, 4, 2, 2,
                       entropy=5, timeout=BOUND,
                       start_timeout=START) as feed:
        batch = next(feed)
        assert not torch.equal(batch.state.obs[0, :4], batch.state.obs[0, 4:])


# -------------------------------------------------------------- evaluator --

@pytest.mark.parametrize("factory", [
    functools.partial(ends_vector, 4), late_vector], ids=["sync", "native"])
def test_evaluator_and_core_evaluate_with_vector_sources(factory):
    from rlplay.engine import evaluate
    from rlplay.engine.envs import make_batch
    from rlplay.engine.seeds import env_seed_sequences
    actor = CountingActor()
    envs = make_batch(factory, env_seed_sequences(0, 4))
    returns_, lengths = evaluate(envs, actor, 9)
    assert returns_.shape == lengths.shape == (9,)
    assert lengths.min() >= 1 and lengths.max() <= 5
    # a cut at max_steps: a native source cannot reset one env alone
    returns_, lengths = evaluate(envs, actor, 6, max_steps=2)
    assert np.all(lengths <= 2)
    envs.close()
    with Evaluator(factory, actor, n_envs=8, n_episodes=10,
                   start_method="fork") as evaluator:
        evaluator.submit(actor)
        result = evaluator.result(timeout=START)
    assert result.lengths.shape == (10,) and result.lengths.min() >= 1


# -------------------------------------------------------------- bad input --

@pytest.mark.parametrize("kind, name", [("same", "n_envs"),
                                        ("single", "n_envs"),
                                        ("multi", "n_per_actor")])
def test_a_count_that_is_not_a_multiple_of_the_source(kind, name):
    bound = {} if kind == "same" else dict(timeout=BOUND)
    with pytest.raises(ValueError, match=rf"{name}=6 is not a .*4"):
        make(kind, late_vector, CountingActor(), T, 6, n_actors=1, **bound)


@pytest.mark.parametrize("kind", ["same", "single", "multi"])
def test_sticky_is_refused_up_front_with_a_vector_source(kind):
    bound = {} if kind == "same" else dict(timeout=BOUND)
    with pytest.raises(ValueError, match="sticky=True.*steps all its envs"):
        make(kind, late_vector, CountingActor(), T, 4, n_actors=1,
             sticky=True, **bound)


class Unbatched(LateVectorEnv):
    """Declares a batched observation space of the wrong size."""

    def __init__(self):
        super().__init__(4)
        from gymnasium.vector.utils import batch_space
        self.observation_space = batch_space(self.single_observation_space,
                                             3)


class WrongSize(LateVectorEnv):
    """Returns observations of 3 envs from 4."""

    def step(self, actions):
        obs, rew, term, trunc, info = super().step(actions)
        return obs[:3], rew, term, trunc, info


def test_spaces_not_batched_as_declared():
    with pytest.raises(TypeError, match=r"observation_space .* is not its "
                                        r"single_observation_space .* "
                                        r"batched num_envs=4 times"):
        same.rollout(Unbatched, CountingActor(), T, 4)


def test_a_vector_env_that_returns_the_wrong_batch_size():
    with same.rollout(WrongSize, CountingActor(), T, 4) as feed:
        with pytest.raises(ValueError, match=r"WrongSize.* step\(\): the "
                                             r"observations do not match.*"
                                             r"num_envs=4"):
            next(feed)


def test_a_wrong_count_of_rewards():
    class FewRewards(LateVectorEnv):
        def step(self, actions):
            obs, rew, term, trunc, info = super().step(actions)
            return obs, rew[:2], term, trunc, info

    with same.rollout(FewRewards, CountingActor(), T, 4) as feed:
        with pytest.raises(ValueError, match=r"rewards of shape \(2,\) for "
                                             r"its num_envs=4"):
            next(feed)


# ---------------------------------------------------------------- EnvPool --

def envpool_cartpole(seed=None, num_envs=4):
    envpool = pytest.importorskip("envpool")
    return envpool.make_gymnasium("CartPole-v1", num_envs=num_envs,
                                  seed=0 if seed is None else seed % 2**31)


@pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning")
def test_envpool_source_keeps_every_invariant():
    pytest.importorskip("envpool")
    feed = same.rollout(envpool_cartpole, CountingActorCartPole(), 50, 8,
                        entropy=4)
    with feed:
        fragments = copies(feed, 20)
    previous = None
    for f in fragments:
        assert bool(acted(f)[1:].all())  # a partial reset: no lost call
        if previous is not None:
            suply(lambda x, y: np.testing.assert_array_equal(x[0], y[-1]),
                  f.state, previous.state)
        previous = f
    lengths = np.concatenate([episode_stats(f)[1] for f in fragments])
    assert len(lengths) > 5 and lengths.min() >= 8


def test_envpool_without_a_seed_is_refused():
    envpool = pytest.importorskip("envpool")
    factory = functools.partial(envpool.make_gymnasium, "CartPole-v1",
                                num_envs=4)
    with pytest.raises(ValueError, match="EnvPool env without a seed") \
            as info:
        same.rollout(factory, CountingActorCartPole(), T, 4)
    # the advice holds for every seed rlplay gives a factory (reset seeds
    # reach 2**32 - 1; EnvPool takes int32 seeds for all its envs)
    assert "seed=shared_seed(seed, k)" in str(info.value)

    def advised(seed):
        return envpool.make_gymnasium("CartPole-v1", num_envs=4,
                                      seed=shared_seed(seed, 4))

    seeds = [reset_seed(env_seed_sequences(entropy, 1, 0)[0])
             for entropy in range(8)]
    assert max(seeds) >= 2**31  # what EnvPool refuses as it is
    for entropy in range(8):
        with same.rollout(advised, CountingActorCartPole(), T, 4,
                          entropy=entropy) as feed:
            next(feed)


# ---------------------------------------------------------- cpu_affinity --

class AffinityEnv(EndsEnv):
    """Reports the first core its process may run on (info ``cpu``)."""

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        info["cpu"] = min(os.sched_getaffinity(0))
        return obs, rew, terminated, truncated, info


needs_two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two cores this process may use")


@needs_two_cores
@pytest.mark.parametrize("affinity", ["auto", "sets"])
def test_cpu_affinity_pins_each_worker(affinity):
    cores = sorted(os.sched_getaffinity(0))[:2]
    value = "auto" if affinity == "auto" else [{cores[1]}, {cores[0]}]
    want = {0: cores[0], 1: cores[1]} if affinity == "auto" else \
        {0: cores[1], 1: cores[0]}
    with multi.rollout(AffinityEnv, CountingActor(), T, 2, 1, 2, 2,
                       entropy=0, env_info={"cpu": 0}, cpu_affinity=value,
                       timeout=BOUND, start_timeout=START) as feed:
        batch = next(feed)
        for s in range(2):
            w = int(batch.meta.worker[s])
            assert torch.all(batch.env["cpu"][:, s] == want[w])


@pytest.mark.parametrize("value, error, match", [
    ("x", ValueError, "cpu_affinity must be None, 'auto'"),
    ([{0}], ValueError, r"one set of cores per worker \(2\), got 1"),
    ([{0}, {10**6}], ValueError, "are not among those"),
    ([{0}, set()], TypeError, "non-empty set of ints"),
    (3, TypeError, "cpu_affinity must be None"),
])
def test_bad_cpu_affinity_is_refused_up_front(value, error, match):
    with pytest.raises(error, match=match):
        multi.rollout(EndsEnv, CountingActor(), T, 2, 1, 2, 2,
                      cpu_affinity=value)


def test_cpu_affinity_where_the_platform_has_no_affinity_call(monkeypatch):
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    with pytest.raises(ValueError, match="needs os.sched_setaffinity"):
        single.rollout(EndsEnv, CountingActor(), T, 1, cpu_affinity="auto")
