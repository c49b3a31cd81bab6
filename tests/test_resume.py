"""Checkpoint and resume: a stopped run goes on as the same run.

For every generator: a run stopped after ``K`` batches and resumed from
its ``state_dict()`` (through ``torch.save``/``torch.load``) goes on with
each worker's ``meta.seq`` without gap or duplicate, with the next
generation, with versions and counters from where they were, from env
resets seeded by the resume's branch of the seeding tree (none of the
first run's seeds); two resumes from one state agree; a resume that
would shape the batch otherwise is refused, naming what differs.
"""
import copy
import functools
import io
import itertools
import os
import signal
from contextlib import closing

import gymnasium
import numpy as np
import pytest
import torch

from envs import CountingEnv, counting_factory
from generators import CountingActor, assert_fragments_equal, make, slot
from rlplay.engine.errors import WorkerDied
from rlplay.engine.nested import suply
from rlplay.engine.rollout import episodic
from rlplay.engine.seeds import (PROBE_COLLECTOR, env_seed_sequences,
                                 reset_seed, resume_root)

T, B, K = 4, 2, 3
KINDS = ["same", "single", "multi", "cluster"]
FACTORY = functools.partial(counting_factory, term_every=3)


@pytest.fixture(params=KINDS)
def kind(request):
    if request.param == "cluster":
        request.getfixturevalue("ray_cluster")
    return request.param


def _roundtrip(state):
    # what a checkpoint file does to it, loaded the safe way
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _fragments(batch):
    """``{(worker, seq): fragment}`` of a batch (copies)."""
    out = {}
    for s in range(batch.state.fin.shape[1] // B):
        frag = slot(batch, s, B, CountingActor.hx_dim)
        key = (int(frag.meta.worker[0]), int(frag.meta.seq[0]))
        out[key] = suply(torch.clone, frag)
    return out


# a bound on the batches a pool's test reads (see _run)
MAX_BATCHES = 2000


def _run(kind, n_batches, **kwargs):
    """``(fragments, versions, state, stats)``: the fragments of the
    batches read by ``(worker, seq)``, each batch's ``meta.version`` per
    slot, and the state and stats after them.

    ``n_batches`` batches; a pool's run reads on (bounded) until each of
    its two workers delivered ``n_batches`` fragments, so that two runs
    have fragments of both workers in common whichever worker the
    scheduler served first.
    """
    feed = make(kind, FACTORY, CountingActor(), T, B, n_actors=2,
                n_per_batch=2, n_buffers=4, **kwargs)
    fragments, versions = {}, []
    pool = kind in ("multi", "cluster")

    def short():
        return pool and any(sum(w == worker for w, _ in fragments)
                            < n_batches for worker in (0, 1))

    with closing(feed):
        for batch in itertools.islice(feed, MAX_BATCHES):
            got = _fragments(batch)
            assert not fragments.keys() & got.keys()
            fragments.update(got)
            versions.append(sorted({int(v) for v in batch.meta.version}))
            if len(versions) >= n_batches and not short():
                break
        assert not short(), f"a worker delivered too few in {MAX_BATCHES}"
        state = feed.state_dict()
        stats = dict(feed.stats)
    return fragments, versions, _roundtrip(state), stats


def _initial_offset(seed):
    # what CountingEnv observes at a reset with this seed
    env = CountingEnv()
    obs, _ = env.reset(seed=seed)
    return float(obs[0])


def test_a_resumed_run_goes_on_as_the_same_run(kind):
    first, _, state, stats = _run(kind, K, entropy=7)
    assert state["kind"] == kind and state["seeds"]["resumes"] == 0
    assert state["counters"]["batches"] >= K
    n_workers = 1 if kind in ("same", "single") else 2
    assert len(state["workers"]) == n_workers
    # each worker's next seq is the one after its last fragment delivered
    for w, entry in enumerate(state["workers"]):
        seqs = sorted(seq for worker, seq in first if worker == w)
        assert seqs == list(range(len(seqs)))  # in order, no gap
        assert entry["seq"] == len(seqs) and entry["generation"] == 0

    second, versions, state2, stats2 = _run(kind, K, resume=state)
    third, _, _, _ = _run(kind, K, resume=state)
    # no duplicate, no gap: each worker goes on from its saved seq, with
    # the next generation (its row 0 does not continue the row T before)
    assert not first.keys() & second.keys()
    for w, entry in enumerate(state["workers"]):
        seqs = sorted(seq for worker, seq in second if worker == w)
        assert seqs == list(range(entry["seq"], entry["seq"] + len(seqs)))
    assert {int(f.meta.generation[0]) for f in second.values()} == {1}
    # versions and counters go on
    k = stats["batches"]
    assert stats2["batches"] == k + len(versions)
    assert stats2["steps"] == stats["steps"] + len(versions) * stats[
        "steps"] // k
    assert stats2["time_wall"] > stats["time_wall"]
    if kind == "same":
        assert versions == [[K], [K + 1], [K + 2]]
    elif kind == "single":
        assert versions == [[K], [K], [K + 1]]
    else:
        assert min(min(v) for v in versions) >= k
        assert stats2["version"] == stats2["batches"]
    assert state2["seeds"]["resumes"] == 1
    assert [w["generation"] for w in state2["workers"]] == [1] * n_workers
    # the envs were reset from the resume's branch of the tree: none of
    # the first run's seeds (any generation, the probe env)
    root, resumed = resume_root(7, 0), resume_root(7, 1)
    used = {reset_seed(s) for w in range(n_workers) for g in (0, 1)
            for s in env_seed_sequences(root, B, w, g)}
    used |= {reset_seed(s) for s in env_seed_sequences(root, B,
                                                       PROBE_COLLECTOR)}
    for (w, seq), frag in second.items():
        if seq != state["workers"][w]["seq"]:
            continue
        seeds = [reset_seed(s)
                 for s in env_seed_sequences(resumed, B, w, 1)]
        assert not used & set(seeds)
        assert frag.state.obs[0, :, 0].tolist() == [
            _initial_offset(seed) for seed in seeds]
    # two resumes from one state agree (column by column for a pool,
    # whose versions depend on timing)
    assert second.keys() & third.keys()
    for key in second.keys() & third.keys():
        a, b = second[key], third[key]
        if kind not in ("same", "single"):
            a = a._replace(meta=a.meta._replace(version=None))
            b = b._replace(meta=b.meta._replace(version=None))
        assert_fragments_equal(a, b)


def test_a_resume_of_a_resume_draws_from_a_branch_of_its_own():
    _, _, state, _ = _run("same", K, entropy=3)
    second, _, state2, _ = _run("same", K, resume=state)
    third, _, state3, _ = _run("same", K, resume=state2)
    assert state3["seeds"]["resumes"] == 2
    assert sorted(third) == [(0, seq) for seq in range(2 * K, 3 * K)]
    assert {int(f.meta.generation[0]) for f in third.values()} == {2}
    assert not np.allclose(second[(0, K)].state.obs[0],
                           third[(0, 2 * K)].state.obs[0])


def test_entropy_none_is_saved_and_resumed():
    _, _, state, _ = _run("same", 1)
    assert isinstance(state["seeds"]["entropy"], int)
    a, _, _, _ = _run("same", 2, resume=state)
    b, _, _, _ = _run("same", 2, resume=state, entropy=state["seeds"][
        "entropy"])
    for key in a:
        assert_fragments_equal(a[key], b[key])


def test_same_and_single_resume_alike():
    # single is same with a worker: one state, resumed by either, collects
    # the same fragments (the versions follow each protocol)
    _, _, state, _ = _run("same", K, entropy=5)
    a, _, _, _ = _run("same", K, resume=state)
    state_single = dict(state, kind="single")
    b, _, _, _ = _run("single", K, resume=state_single)
    assert a.keys() == b.keys()
    for key in a:
        assert_fragments_equal(a[key]._replace(meta=a[key].meta._replace(
            version=None)), b[key]._replace(meta=b[key].meta._replace(
                version=None)))


@pytest.mark.parametrize("kind", ["same", "single", "multi"])
def test_a_resume_that_shapes_the_batch_otherwise_is_refused(kind):
    _, _, state, _ = _run(kind, 1, entropy=1)
    actor = CountingActor()
    pool = dict(n_actors=2, n_per_batch=2, n_buffers=4)

    def resume(factory=FACTORY, actor=actor, n_steps=T, n_envs=B,
               saved=state, **kw):
        with closing(make(kind, factory, actor, n_steps, n_envs,
                          resume=saved, **{**pool, **kw})):
            pass

    with pytest.raises(ValueError, match="n_steps=5, but the saved run had "
                                         "n_steps=4"):
        resume(n_steps=5)
    name = "n_envs" if kind != "multi" else "n_per_actor"
    with pytest.raises(ValueError, match=f"{name}=3"):
        resume(n_envs=3)
    with pytest.raises(ValueError, match="entropy=2"):
        resume(entropy=2)
    with pytest.raises(ValueError, match="sticky=True"):
        resume(sticky=True)
    if kind == "multi":
        with pytest.raises(ValueError, match="n_actors=3"):
            resume(n_actors=3)
        with pytest.raises(ValueError, match="n_per_batch=1"):
            resume(n_per_batch=1)
    # the spaces, and the actor's outputs, once the probe told them
    with pytest.raises(ValueError, match="observation space"):
        resume(factory=WideCountingEnv)
    with pytest.raises(ValueError, match=r"batch\.actor\['extra'\] is "
                                         r"\(5, 2\) float32, but the saved "
                                         r"run's was absent"):
        resume(actor=ExtraInfoActor())
    with pytest.raises(ValueError, match="final"):
        resume(final=False)
    other = "single" if kind == "same" else "same"
    with pytest.raises(ValueError, match=f"state of a {kind} run, which a "
                                         f"{other} generator"):
        with closing(make(other, FACTORY, actor, T, B, resume=state)):
            pass
    with pytest.raises(TypeError, match="resume must be a generator's "
                                        "state_dict"):
        resume(saved={"seq": 3})


class WideCountingEnv(CountingEnv):
    """:class:`CountingEnv` with other bounds on its observations."""

    def __init__(self):
        super().__init__(term_every=3)
        self.observation_space = gymnasium.spaces.Box(-1e9, 1e9, (1,),
                                                      np.float32)


class SeededRewardEnv(CountingEnv):
    """:class:`CountingEnv` whose offset (and so the counting actor's
    rewards) depends on the reset seed modulo 5."""

    def __init__(self):
        super().__init__(term_every=3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        if seed is not None:
            self.offset /= 1000
        return self._obs(), {}


class ExtraInfoActor(CountingActor):
    """:class:`CountingActor` with one more info leaf."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        act, hx, info = super().step(stepno, obs, act, rew, fin, hx=hx,
                                     virtual=virtual)
        return act, hx, {**info, "extra": torch.zeros(obs.shape[:2])}


def test_the_evaluator_resumes_its_counts_and_seeds():
    def evaluate(**kwargs):
        actor = CountingActor()
        kwargs.setdefault("n_episodes", 2)
        with closing(make("evaluator", SeededRewardEnv, actor, n_envs=2,
                          **kwargs)) as evaluator:
            results = []
            for _ in range(2):
                evaluator.submit(actor)
                results.append(evaluator.result())
            return results, _roundtrip(evaluator.state_dict())

    first, state = evaluate(entropy=4)
    assert [r.version for r in first] == [1, 2]
    assert state["extra"]["requests"] == 2
    second, state2 = evaluate(resume=state)
    third, _ = evaluate(resume=state)
    assert [r.version for r in second] == [3, 4]
    assert state2["counters"]["evaluations"] == 4
    assert state2["workers"][0]["generation"] == 1
    for a, b in zip(second, third):
        np.testing.assert_array_equal(a.returns, b.returns)
    # other seeds: other episodes
    assert not np.array_equal(np.concatenate([r.returns for r in first]),
                              np.concatenate([r.returns for r in second]))
    with pytest.raises(ValueError, match="n_episodes=3"):
        evaluate(resume=state, n_episodes=3)


def test_episodic_counts_go_on():
    actor = CountingActor()
    feed = episodic.rollout(FACTORY, actor, B, 2, n_steps=T, entropy=0)
    with closing(feed):
        first = [next(feed) for _ in range(3)]
        state = _roundtrip(feed.state_dict())
    assert state["stats"]["emitted"] == 6
    feed = episodic.rollout(FACTORY, actor, B, 2, n_steps=T, resume=state)
    with closing(feed):
        episodes = next(feed)
        stats = feed.stats
    assert stats["emitted"] == 8 and stats["generation"] == B
    assert set(episodes.meta.generation.tolist()) == {1}
    assert first[0].n_episodes == 2


def test_a_resume_goes_on_with_the_restarts_of_the_run():
    # restarts= is a budget for the whole run: a worker replaced before
    # the checkpoint counts after it, and the generations go on
    def killed(feed):
        # SIGKILL the worker, read on (bounded) until its replacement
        # delivered; returns the generations seen
        os.kill(feed.pid, signal.SIGKILL)
        seen = []
        for batch in itertools.islice(feed, 50):
            seen.append(int(batch.meta.generation[0]))
            if seen[-1] != seen[0]:
                break
        return seen

    feed = make("single", FACTORY, CountingActor(), T, B, entropy=9,
                restarts=2, restart_delay=0.0)
    with closing(feed):
        list(itertools.islice(feed, 2))
        assert killed(feed)[-1] == 1
        state = _roundtrip(feed.state_dict())
    assert state["workers"][0]["generation"] == 1
    assert state["workers"][0]["restarts"] == 1
    assert state["counters"]["restarts"] == 1
    feed = make("single", FACTORY, CountingActor(), T, B, restarts=1,
                restart_delay=0.0, resume=state)
    with closing(feed):
        batch = next(feed)
        assert int(batch.meta.generation[0]) == 2
        assert feed.stats["restarts"] == 1
        assert feed.stats["workers"][0]["restarts"] == 1
        # the budget of 1 was spent before the checkpoint
        with pytest.raises(WorkerDied, match="after 1 restart$"):
            killed(feed)


def _damaged(state, path, value):
    """A deep copy of ``state`` with the entry at ``path`` (a tuple of
    keys) set to ``value``, or removed where ``value`` is ``_MISSING``."""
    state = copy.deepcopy(state)
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    if value is _MISSING:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return state


_MISSING = object()

# (path, value, error, what the message names)
DAMAGED = [
    *[((key,), _MISSING, ValueError, rf"resume\['{key}'\] is missing")
      for key in ("kind", "settings", "layout", "seeds", "counters",
                  "version", "workers")],
    (("settings",), None, TypeError, r"resume\['settings'\] must be a dict"),
    (("seeds",), None, TypeError, r"resume\['seeds'\] must be a dict"),
    (("workers",), None, TypeError, r"resume\['workers'\] must be a list"),
    (("counters",), [], TypeError, r"resume\['counters'\] must be a dict"),
    (("workers", 0), None, TypeError, r"resume\['workers'\]\[0\] must be"),
    (("layout", "buffer"), None, TypeError,
     r"resume\['layout'\]\['buffer'\] must be"),
    (("version",), "3", TypeError, r"resume\['version'\] must be an int, "
                                   r"got '3'"),
    (("version",), -3, ValueError, r"resume\['version'\] must be at least "
                                   r"0, got -3"),
    (("workers", 0, "seq"), -5, ValueError,
     r"resume\['workers'\]\[0\]\['seq'\] must be at least 0, got -5"),
    (("workers", 0, "seq"), "x", TypeError,
     r"resume\['workers'\]\[0\]\['seq'\] must be an int, got 'x'"),
    (("workers", 0, "generation"), 2.5, TypeError,
     r"resume\['workers'\]\[0\]\['generation'\] must be an int, got 2.5"),
    (("workers", 0, "restarts"), _MISSING, ValueError,
     r"resume\['workers'\]\[0\]\['restarts'\] is missing"),
    (("seeds", "resumes"), -1, ValueError,
     r"resume\['seeds'\]\['resumes'\] must be at least 0, got -1"),
    (("seeds", "entropy"), "abc", TypeError,
     r"resume\['seeds'\]\['entropy'\] must be an int or a list"),
    (("seeds", "spawn_key"), [-1], ValueError,
     r"resume\['seeds'\]\['spawn_key'\]\[0\] must be at least 0"),
    (("seeds", "pool_size"), None, TypeError,
     r"resume\['seeds'\]\['pool_size'\] must be an int, got None"),
    (("counters", "steps"), "many", TypeError,
     r"resume\['counters'\]\['steps'\] must be a finite number"),
    (("counters", "steps"), -1, ValueError,
     r"resume\['counters'\]\['steps'\] must be a finite number"),
    (("layout",), None, ValueError,
     r"resume\['layout'\] is None \(an evaluator's state.*resume it from "
     r"a state of its own kind"),
]


@pytest.mark.parametrize("path, value, error, match", DAMAGED,
                         ids=lambda v: "" if not isinstance(v, tuple) else
                         "-".join(map(str, v)))
def test_a_damaged_state_is_refused_naming_resume(path, value, error, match):
    _, _, state, _ = _run("same", 1, entropy=1)
    with pytest.raises(error, match=match):
        with closing(make("same", FACTORY, CountingActor(), T, B,
                          resume=_damaged(state, path, value))) as feed:
            next(feed)


@pytest.mark.parametrize("kind", ["single", "multi", "evaluator"])
def test_a_damaged_state_is_refused_before_any_worker_starts(kind):
    if kind == "evaluator":
        feed = make(kind, FACTORY, CountingActor(), n_envs=1, n_episodes=1)
    else:
        feed = make(kind, FACTORY, CountingActor(), T, B, n_actors=2,
                    n_per_batch=2, n_buffers=4)
    with closing(feed):
        state = _roundtrip(feed.state_dict())
    for path, value, error, match in [
            (("workers", 0, "seq"), -5, ValueError, r"\['seq'\]"),
            (("version",), -3, ValueError, r"\['version'\]"),
            (("seeds", "resumes"), -1, ValueError, r"\['resumes'\]"),
            (("workers",), None, TypeError, r"\['workers'\]")]:
        with pytest.raises(error, match=r"resume\S*" + match):
            make(kind, FACTORY, CountingActor(), T, B, n_actors=2,
                 n_per_batch=2, n_buffers=4,
                 resume=_damaged(state, path, value)) if kind != "evaluator" \
                else make(kind, FACTORY, CountingActor(), n_envs=1,
                          n_episodes=1, resume=_damaged(state, path, value))


@pytest.mark.parametrize("key, value, error, match", [
    ("feed", _MISSING, ValueError, r"resume\['feed'\] is missing: an "
                                   r"Episodic's state_dict\(\) holds it"),
    ("feed", "x", TypeError, r"resume\['feed'\] must be the generator's "
                             r"state_dict\(\) .*got 'x'"),
    ("stats", "x", TypeError, r"resume\['stats'\] must be a dict of the "
                              r"episode counters, got 'x'"),
    ("stats", {"emitted": "6"}, TypeError,
     r"resume\['stats'\]\['emitted'\] must be an int .*got '6'"),
    ("stats", _MISSING, ValueError, r"resume\['stats'\] is missing"),
    ("lanes", {"keys": [], "last": []}, TypeError,
     r"resume\['lanes'\]\['counts'\] must be a dict, got None"),
])
def test_a_damaged_episodic_state_is_refused_naming_the_key(key, value,
                                                            error, match):
    actor = CountingActor()
    feed = episodic.rollout(FACTORY, actor, B, 2, n_steps=T, entropy=0)
    with closing(feed):
        next(feed)
        state = _roundtrip(feed.state_dict())
    if value is _MISSING:
        del state[key]
    else:
        state[key] = value
    made = []

    def factory():
        made.append(None)
        return FACTORY()

    with pytest.raises(error, match=match):
        episodic.rollout(factory, actor, B, 2, n_steps=T, resume=state)
    assert made == []  # refused before any env was made
