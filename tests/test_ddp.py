"""Many learners (``torch.distributed``): one generator per rank.

The seeding tree of a rank (:func:`rlplay.engine.seeds.rank_root`): rank
0 is the run of one process as it was, every other rank draws from a tree
of its own, whatever the world size; a checkpoint records its rank and is
resumed by that rank only. The cores of ``cpu_affinity="auto"``: each
local rank gets its own share (:func:`rlplay.engine.utils.rank_cores`),
read in the learner. And the example of the how-to page
(examples/ddp_cartpole.py), run by ``torch.distributed.run`` with two
ranks: their data differ, their workers' cores too, their parameters stay
equal.
"""
import copy
import functools
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch

from envs import CountingEnv, EndsEnv, counting_factory
from generators import CountingActor, assert_fragments_equal, make
from rlplay.engine import PolicyActor
from rlplay.engine import seeds as S
from rlplay.engine.rollout import multi, same, single
from rlplay.engine.utils import (AutoAffinity, local_rank, rank_cores,
                                 worker_cpu_affinity)

T, B = 4, 2
FACTORY = functools.partial(counting_factory, term_every=3)
from bounds import SCRIPT, STEADY, START  # noqa: E402 (bounds.py says why)


def states(sequences):
    return [tuple(ss.generate_state(4)) for ss in sequences]


@pytest.fixture
def world(monkeypatch):
    """``world(rank, size)`` sets this process's rank as ``torchrun`` does
    (``RANK``, ``WORLD_SIZE``); ``world()`` drops them."""
    def set_world(rank=None, size=None):
        for name, value in (("RANK", rank), ("WORLD_SIZE", size)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(value))
    set_world()
    return set_world


# ------------------------------------------------------------- the seeds --

def test_rank_0_is_the_run_of_one_process():
    for entropy in (7, [1, 2], np.random.SeedSequence(3, spawn_key=(5,))):
        root = S.seed_sequence(entropy)
        rank0 = S.rank_root(entropy, 0)
        assert rank0.entropy == root.entropy
        assert rank0.spawn_key == root.spawn_key
        assert states(S.env_seed_sequences(rank0, 3)) == states(
            S.env_seed_sequences(entropy, 3))


def test_the_ranks_draw_disjoint_streams():
    # every stream of a rank's tree (collectors, their generations, the
    # probe, the evaluator, a resume) is apart from every other rank's
    def streams(rank):
        root = S.rank_root(11, rank)
        out = []
        for base in (root, S.resume_root(root, 1)):
            for collector in (0, 1, S.PROBE_COLLECTOR, S.EVAL_COLLECTOR):
                for generation in (0, 1):
                    out += states(S.env_seed_sequences(base, 3, collector,
                                                       generation))
                    out.append(tuple(S.collector_seed_sequence(
                        base, collector, generation).generate_state(4)))
        return out

    ranks = [streams(rank) for rank in range(4)]
    for k, mine in enumerate(ranks):
        assert len(set(mine)) == len(mine)
        for other in ranks[k + 1:]:
            assert set(mine).isdisjoint(other)
    assert S.rank_root(11, 2).spawn_key == (S.RANK_BRANCH, 2)


def test_rank_root_checks_the_rank():
    with pytest.raises(TypeError, match="rank must be an int, got 1.0"):
        S.rank_root(1, 1.0)
    with pytest.raises(TypeError, match="rank must be an int, got True"):
        S.rank_root(1, True)
    with pytest.raises(ValueError, match="rank must be at least 0, got -1"):
        S.rank_root(1, -1)


def test_the_rank_comes_from_the_environment(world):
    assert S.current_rank() == (0, 1)
    world(3, 4)
    assert S.current_rank() == (3, 4)
    assert S.rank_root(5).spawn_key == (S.RANK_BRANCH, 3)
    world(3)  # RANK alone: not a distributed run
    assert S.current_rank() == (0, 1)
    for rank, size, match in [("x", 2, "RANK must be an int, got 'x'"),
                              (1, 0, "WORLD_SIZE must be at least 1"),
                              (-1, 2, "RANK must be at least 0"),
                              (2, 2, "RANK=2 must be below its WORLD_SIZE=2")]:
        world(rank, size)
        with pytest.raises(ValueError, match=match):
            S.current_rank()


def test_torch_distributed_has_the_last_word(world, tmp_path):
    # an initialised process group gives the rank, whatever the
    # environment says (a group of one here: one process)
    import torch.distributed as dist
    world(1, 2)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store",
                            rank=0, world_size=1)
    try:
        assert S.current_rank() == (0, 1)
        assert S.rank_root(5).spawn_key == ()
    finally:
        dist.destroy_process_group()
    assert S.current_rank() == (1, 2)


# ----------------------------------------------------- one run, per rank --

def _initial_offset(seed):
    obs, _ = CountingEnv().reset(seed=seed)
    return float(obs[0])


def _first(kind, **kwargs):
    """The first batch of a generator of ``kind``, and its state."""
    if kind != "same":
        kwargs.update(timeout=STEADY, start_timeout=START)
    with closing(make(kind, FACTORY, CountingActor(), T, B, entropy=7,
                      **kwargs)) as feed:
        batch = next(feed)
        return batch, _roundtrip(feed.state_dict())


def _roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("kind", ["same", "single"])
def test_the_same_entropy_gives_each_rank_its_own_data(kind, world):
    alone, state = _first(kind)
    assert (state["rank"], state["world_size"]) == (0, 1)
    world(0, 2)
    rank0, state0 = _first(kind)
    assert_fragments_equal(rank0, alone)  # rank 0: the run of one process
    assert (state0["rank"], state0["world_size"]) == (0, 2)
    world(1, 2)
    rank1, state1 = _first(kind)
    assert (state1["rank"], state1["world_size"]) == (1, 2)
    assert state1["seeds"]["spawn_key"] == [S.RANK_BRANCH, 1]
    # rank 1's envs were reset with the seeds of its own tree
    seeds = [S.reset_seed(s) for s in
             S.env_seed_sequences(S.rank_root(7, 1), B, 0)]
    assert rank1.state.obs[0, :, 0].tolist() == [
        _initial_offset(seed) for seed in seeds]
    assert set(rank1.state.obs[0, :, 0].tolist()).isdisjoint(
        rank0.state.obs[0, :, 0].tolist())
    world(1, 4)  # a rank's tree does not depend on the world size
    assert_fragments_equal(_first(kind)[0], rank1)


def test_a_state_is_resumed_by_its_own_rank_only(world):
    world(1, 2)
    batch, state = _first("same")
    world(0, 2)
    with pytest.raises(ValueError, match=r"resume holds the state of rank 1 "
                                         r"\(of a world of 2\), but this "
                                         r"process is rank 0 \(of 2\)"):
        make("same", FACTORY, CountingActor(), T, B, resume=state)
    world()
    with pytest.raises(ValueError, match="state of rank 1"):
        make("same", FACTORY, CountingActor(), T, B, resume=state)
    # its own rank goes on, in a world of another size too (an elastic
    # restart), the entropy given or not
    world(1, 3)
    for entropy in (None, 7):
        with closing(make("same", FACTORY, CountingActor(), T, B,
                          resume=state, entropy=entropy)) as feed:
            again = next(feed)
            assert int(again.meta.seq[0]) == 1
            assert int(again.meta.generation[0]) == 1
            saved = feed.state_dict()
        assert (saved["rank"], saved["world_size"]) == (1, 3)
        assert saved["seeds"]["spawn_key"] == [S.RANK_BRANCH, 1]
        assert saved["seeds"]["resumes"] == 1
    with pytest.raises(ValueError, match="entropy=8"):
        make("same", FACTORY, CountingActor(), T, B, resume=state,
             entropy=8)


def test_a_state_saved_before_the_ranks_is_rank_0s(world):
    _, state = _first("same")
    for key in ("rank", "world_size"):
        del state[key]
    with closing(make("same", FACTORY, CountingActor(), T, B,
                      resume=state)) as feed:
        assert int(next(feed).meta.seq[0]) == 1
    world(1, 2)
    with pytest.raises(ValueError, match="state of rank 0"):
        make("same", FACTORY, CountingActor(), T, B, resume=state)


@pytest.mark.parametrize("key, value, error, match", [
    ("rank", "1", TypeError, r"resume\['rank'\] must be an int, got '1'"),
    ("rank", -1, ValueError, r"resume\['rank'\] must be at least 0"),
    ("world_size", 0, ValueError,
     r"resume\['world_size'\] must be at least 1, got 0"),
])
def test_a_damaged_rank_is_refused(key, value, error, match):
    _, state = _first("same")
    state = copy.deepcopy(state)
    state[key] = value
    with pytest.raises(error, match=match):
        make("same", FACTORY, CountingActor(), T, B, resume=state)


# ----------------------------------------------------------- the cores --

@pytest.mark.parametrize("n_cores", range(1, 10))
@pytest.mark.parametrize("size", range(1, 5))
def test_each_local_rank_gets_its_own_share_of_the_cores(n_cores, size):
    allowed = set(range(10, 10 + 2 * n_cores, 2))  # any numbering
    shares = [rank_cores(allowed, rank, size) for rank in range(size)]
    assert rank_cores(allowed) == tuple(sorted(allowed))  # alone: all
    for share in shares:
        assert share and list(share) == sorted(share)
        assert set(share) <= allowed
    if n_cores >= size:
        # apart, every core used, sizes within one of each other
        assert sum(map(len, shares)) == n_cores
        assert set().union(*map(set, shares)) == allowed
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    else:  # an overlap cannot be avoided: one core each, spread
        assert all(len(share) == 1 for share in shares)
        assert {share[0] for share in shares} == allowed


def test_the_local_rank_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert local_rank() == (0, 1)
    assert worker_cpu_affinity("auto") == AutoAffinity(0, 1)
    assert worker_cpu_affinity(None) is None
    assert worker_cpu_affinity(((0,), (1,))) == ((0,), (1,))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_rank() == (1, 4)
    assert worker_cpu_affinity("auto") == AutoAffinity(1, 4)
    for rank, size, match in [
            ("1", None, "LOCAL_RANK='1' but no LOCAL_WORLD_SIZE"),
            (None, "2", "LOCAL_WORLD_SIZE='2' but no LOCAL_RANK"),
            ("a", "2", "must be ints, got 'a' and '2'"),
            ("2", "2", "LOCAL_RANK=2 must be at least 0 and below its "
                       "LOCAL_WORLD_SIZE=2")]:
        for name, value in (("LOCAL_RANK", rank),
                            ("LOCAL_WORLD_SIZE", size)):
            if value is None:
                monkeypatch.delenv(name)
            else:
                monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=match):
            local_rank()
    # refused up front, before a worker starts
    if hasattr(os, "sched_setaffinity"):
        with pytest.raises(ValueError, match="LOCAL_RANK=2 must be"):
            single.rollout(EndsEnv, CountingActor(), T, 1,
                           cpu_affinity="auto")


class AffinityEnv(EndsEnv):
    """Reports the cores its process may run on (info ``cpus``, a bit
    mask)."""

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        info["cpus"] = sum(1 << core for core in os.sched_getaffinity(0))
        return obs, rew, terminated, truncated, info


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
    or max(os.sched_getaffinity(0)) > 52,  # the mask in a float64
    reason="needs two cores this process may use, numbered below 53")
def test_auto_pins_the_workers_on_their_ranks_share(monkeypatch):
    # the learner reads its local rank: the workers pin on its share,
    # even those of a fork server started before the variables were set
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    share = rank_cores(os.sched_getaffinity(0), 1, 2)
    want = [1 << share[w % len(share)] for w in range(2)]
    with multi.rollout(AffinityEnv, CountingActor(), T, 2, 1, 2, 2,
                       entropy=0, env_info={"cpus": 0.0},
                       cpu_affinity="auto", timeout=STEADY,
                       start_timeout=START) as feed:
        batch = next(feed)
        for s in range(2):
            w = int(batch.meta.worker[s])
            assert torch.all(batch.env["cpus"][:, s] == want[w])


# ------------------------------------------------- the how-to's example --

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ddp_cartpole.py"
# batches each rank trains on: enough for a few optimiser steps
N_BATCHES = 6


def _example():
    spec = importlib.util.spec_from_file_location("ddp_cartpole", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _first_obs_alone(module, entropy):
    # the first batch that a process alone (no ranks) collects with the
    # example's network and arguments: same.rollout, seeded as single
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker, the same kernels
    try:
        torch.manual_seed(0)
        net = module.Net()
        with same.rollout(functools.partial(gymnasium.make, "CartPole-v1"),
                          PolicyActor(net), module.N_STEPS, module.N_ENVS,
                          entropy=entropy) as feed:
            return module.digest(next(feed).state.obs)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.timeout(SCRIPT + 60)
def test_the_example_trains_two_ranks_on_disjoint_data(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    # unbuffered, as many CI runners set it: print's text and its newline
    # are then two writes, which two ranks on one pipe could interleave
    env["PYTHONUNBUFFERED"] = "1"
    # --standalone: a rendezvous on a free port of this machine
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(EXAMPLE), str(N_BATCHES)]
    # a session of its own: a timeout ends the launcher and its ranks
    process = subprocess.Popen(command, cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=SCRIPT)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 0, output[-4000:]
    lines = [json.loads(line) for line in output.splitlines()
             if line.startswith("{")]
    ranks = {line["rank"]: line for line in lines}
    assert sorted(ranks) == [0, 1] and len(lines) == 2, output[-4000:]
    for rank, line in ranks.items():
        assert line["world_size"] == 2 and line["state_rank"] == rank
        assert line["steps"] == N_BATCHES * 32 * 4
        assert line["total_steps"] == 2 * line["steps"]
    zero, one = ranks[0], ranks[1]
    # disjoint data: each rank collects from a tree of its own, rank 0
    # from the run's, as a process alone would
    assert zero["seeds"]["spawn_key"] == []
    assert one["seeds"]["spawn_key"] == [S.RANK_BRANCH, 1]
    assert zero["first_obs"] != one["first_obs"]
    module = _example()
    assert zero["first_obs"] == _first_obs_alone(module, module.ENTROPY)
    assert one["first_obs"] == _first_obs_alone(
        module, S.rank_root(module.ENTROPY, 1))
    # the workers on cores apart (where there are two to share)
    allowed = os.sched_getaffinity(0)
    for rank, line in ranks.items():
        assert line["worker_cores"] == [rank_cores(allowed, rank, 2)[0]]
    if len(allowed) >= 2:
        assert not set(zero["worker_cores"]) & set(one["worker_cores"])
    # DDP kept the ranks' parameters equal, step after step
    assert zero["params"] == one["params"]
