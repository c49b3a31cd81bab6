"""The benchmark scripts still run, and print what their docstrings say.

Each runs briefly in a process of its own (``--json`` where it has it),
with the smallest sizes it takes (a dry run: the numbers mean nothing),
and its output is checked for shape: the rows and keys it promises. No
timing is asserted: performance is measured by the scripts, never by
tests.
"""
import contextlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bounds import BENCHMARK  # the reason in bounds.py

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks")


def run(script, *args, timeout=BENCHMARK):
    out = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script),
                          *args], capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def json_rows(stdout):
    return {row["name"]: row for row in map(json.loads, (
        line for line in stdout.splitlines() if line.startswith("{")))}


def load_harness():
    spec = importlib.util.spec_from_file_location(
        "harness", os.path.join(BENCHMARKS, "harness.py"))
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    return harness


def test_throughput_prints_floors_ceilings_and_ratios():
    rows = json_rows(run("throughput.py", "--json", "--duration", "0.05",
                         "--warmup", "0.05", "--rounds", "2", "--only",
                         "cartpole/hand,cartpole/same.rollout"))
    kinds = {name: row["kind"] for name, row in rows.items()}
    assert kinds == {
        "cartpole/floor.envs": "floor", "cartpole/floor.actor.8": "floor",
        "cartpole/floor.actor.4": "floor",
        "cartpole/floor.policy_actor.8": "floor",
        "cartpole/ceiling.1x8": "ceiling", "cartpole/ceiling.2x8": "ceiling",
        "cartpole/ceiling.2x4": "ceiling",
        "cartpole/ceiling.async": "ceiling", "cartpole/hand": "row",
        "cartpole/same.rollout": "row",
        "cartpole/same.rollout.check_always": "row",
        "cartpole/same.rollout.alternating": "row"}
    for row in rows.values():
        assert len(row["rounds"]) == 2
        assert row["min"] <= row["steps_per_s"] <= row["max"]
    # the ceilings are computed per round from that round's floors
    envs, actor = (rows[f"cartpole/floor.{name}"]["rounds"]
                   for name in ("envs", "actor.8"))
    for r, value in enumerate(rows["cartpole/ceiling.1x8"]["rounds"]):
        assert value == pytest.approx(1 / (1 / envs[r] + 1 / actor[r]),
                                      rel=1e-3)
    hand, same = rows["cartpole/hand"], rows["cartpole/same.rollout"]
    assert hand["ratio"] == 1.0 and same["ratio_same"] == 1.0
    for row in (hand, same):
        # a percentage of a ceiling measured in the same round, not bounded
        # by 100: on a busy machine the floors may be timed at a slow moment
        assert row["ceiling"] == "1x8" and row["pct_ceiling"] > 0
        assert row["efficiency"] is None and row["learner_cpu"] > 0
    # timed beside the hand loop in one window: a ratio of its own
    alternating = rows["cartpole/same.rollout.alternating"]
    assert alternating["ratio"] > 0 and alternating["ceiling"] == "1x8"


def test_throughput_runs_the_real_workloads_where_named():
    """``--only`` that names a real section (Atari's Pong, MuJoCo's
    HalfCheetah: slow, none of the default run) runs its rows and floors,
    each row with its bytes per env step and shared memory per worker; a
    dry run, one short row of two sections."""
    pytest.importorskip("ale_py", reason="needs rlplay[atari]")
    pytest.importorskip("mujoco", reason="needs rlplay[mujoco]")
    rows = json_rows(run("throughput.py", "--json", "--duration", "0.05",
                         "--rounds", "1", "--only",
                         "atari/hand,mujoco/single.rollout"))
    floors = ["floor.envs", "floor.actor.8", "floor.actor.4",
              "ceiling.1x8", "ceiling.2x8", "ceiling.2x4", "ceiling.async"]
    assert sorted(rows) == sorted(
        [f"{section}/{name}" for section in ("atari", "mujoco")
         for name in floors] + ["atari/hand", "mujoco/single.rollout",
                                "atari/hand.parallel.2x4",
                                "atari/hand.parallel.2x8"])
    # the hand loop in 2 processes at once (over the vector env of 4, of
    # 8): the measured ceiling of the multi rows
    for n in (4, 8):
        par = rows[f"atari/hand.parallel.2x{n}"]
        assert par["ceiling"] == f"2x{n}" and par["ratio_parallel"] == 1.0
    # the hand loop's arrays: a (4, 84, 84) uint8 frame a step and the
    # lookahead row of 8 envs (32-step fragments), an int64 action, a
    # float32 reward and a done flag; no worker
    hand = rows["atari/hand"]
    frame = 4 * 84 * 84
    assert hand["bytes_per_step"] == pytest.approx(
        frame * 33 / 32 + 8 + 4 + 1, abs=1e-3)
    assert hand["shm_per_worker"] is None and hand["ratio"] == 1.0
    # rlplay's batch: obs and final (float64), and the rest; its worker
    # fills two buffers of a fragment of 8 envs (the batch is one, its
    # fields laid out at aligned offsets)
    single = rows["mujoco/single.rollout"]
    assert 2 * 17 * 8 < single["bytes_per_step"] < 3 * 17 * 8
    assert single["shm_per_worker"] == pytest.approx(
        2 * 128 * 8 * single["bytes_per_step"], rel=0.01)
    assert single["ceiling"] == "1x8" and single["pct_ceiling"] > 0


@contextlib.contextmanager
def benchmark_modules(monkeypatch):
    """Import the benchmarks' modules within; they go at the end (they are
    not the suite's)."""
    monkeypatch.syspath_prepend(BENCHMARKS)
    before = set(sys.modules)
    try:
        yield importlib.import_module
    finally:
        for name in set(sys.modules) - before:
            if os.path.dirname(getattr(sys.modules[name], "__file__", None)
                               or "") == BENCHMARKS:
                del sys.modules[name]


def test_the_real_workloads_are_no_part_of_the_default_run(monkeypatch):
    """The sections that ``--only`` patterns may select: the default
    ones always, a real one where a pattern names it."""
    with benchmark_modules(monkeypatch) as load:
        sections = load("throughput").sections
        default = ["cartpole", "busy", "vector"]
        assert sections([""]) == default
        assert sections(["hand", "same.rollout"]) == default
        assert sections(["atari"]) == default + ["atari", "atari_gym"]
        assert sections(["atari/hand"]) == default + ["atari"]
        assert sections(["busy", "mujoco/hand"]) == default + ["mujoco"]


def test_the_layout_ceiling_loop_writes_what_same_rollout_delivers(
        monkeypatch):
    """The vector section's ceiling, a hand-written loop that writes
    rlplay's layout, holds what ``same.rollout`` delivers, field by field,
    fragment after fragment (episode ends, lost calls and returns among
    them), over the same envs reset alike and a greedy actor."""
    import gymnasium
    import torch

    from rlplay.engine.rollout import same

    class FirstSeed(gymnasium.vector.VectorWrapper):
        # reset with seed 0 the first time, whatever the loop asks
        def reset(self, *, seed=None, options=None):
            seed, self.reset = 0, self.env.reset
            return self.env.reset(seed=seed, options=options)

    with benchmark_modules(monkeypatch) as load:
        workloads = load("workloads")

        class Greedy(workloads.MLPActor):
            def sample(self, obs):
                return self.mlp(obs).argmax(-1)

        torch.manual_seed(0)
        actor, T, B = Greedy(), 24, 6

        def make():
            return FirstSeed(workloads.make_cartpole_vec(B))

        fragment, close = workloads.hand_layout_loop(make(), actor, T, B)
        want = fragment.arrays
        feed = same.rollout(make, actor, T, B, entropy=0)
        try:
            n_ends = 0
            for _ in range(4):
                with torch.no_grad():
                    fragment()
                got = next(feed)
                n_ends += int(got.stats.length[1:].gt(0).sum())
                for key, value in [*got.state._asdict().items(),
                                   ("truncated", got.truncated),
                                   ("final", got.final),
                                   ("acted", got.acted),
                                   ("ret", got.stats.ret),
                                   ("length", got.stats.length)]:
                    # row 0 of the loop's arrays is already the next one's
                    row0 = value[:1].numpy() if key != "acted" else \
                        np.zeros((1, B), bool)
                    assert np.array_equal(
                        np.concatenate([row0, want[key][1:]]),
                        value.numpy()), key
        finally:
            feed.close()
            close()
        assert n_ends >= 4  # a test that sees episodes end


def test_throughput_prints_the_peers_vector_env_rows():
    """SB3's ``SubprocVecEnv`` (CartPole) and PufferLib's ``Serial`` and
    ``Multiprocessing`` (one worker process of 8 envs; CartPole and the
    busy env) as rows of their sections, each with its rounds, spread and
    ceiling; where pufferlib-core is not installed, its rows say so."""
    rows = json_rows(run("throughput.py", "--json", "--duration", "0.05",
                         "--warmup", "0.05", "--rounds", "2", "--only",
                         "cartpole/sb3,cartpole/pufferlib,busy/pufferlib"))
    peers = {name: row for name, row in rows.items() if row["kind"] == "row"}
    ceilings = {"cartpole/sb3.SubprocVecEnv": "async"} | {
        f"{section}/pufferlib.{backend}": "1x8"
        for section in ("cartpole", "busy")
        for backend in ("serial.8", "multiprocessing.1x8")}
    assert sorted(peers) == sorted(ceilings)
    missing = {"sb3": importlib.util.find_spec("stable_baselines3") is None,
               "pufferlib": importlib.util.find_spec("pufferlib") is None}
    for name, row in peers.items():
        peer = name.split("/")[1].split(".")[0]
        if missing[peer]:
            assert row["skipped"].startswith(
                "PufferLib is not installed" if peer == "pufferlib" else
                "Stable-Baselines3 is not installed"), row
            continue
        assert len(row["rounds"]) == 2, row
        assert row["min"] <= row["steps_per_s"] <= row["max"]
        assert row["ceiling"] == ceilings[name] and row["pct_ceiling"] > 0


@pytest.mark.parametrize("backend", ["Serial", "Multiprocessing"])
def test_the_pufferlib_loop_collects_what_a_next_step_vector_env_gives(
        monkeypatch, backend):
    """The PufferLib rows' loop writes, fragment after fragment, what the
    same greedy actor gets from Gymnasium's ``SyncVectorEnv`` with
    next-step autoreset over the same envs reset with the same seeds
    (PufferLib resets an env on the step after its episode ended, as that
    one does): observations, actions, rewards and done flags, episode ends
    among them; ``Multiprocessing`` from its worker's shared memory."""
    pytest.importorskip("pufferlib.vector",
                        reason="needs pufferlib-core (make test)")
    import torch
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    with benchmark_modules(monkeypatch) as load:
        workloads, peers = load("workloads"), load("peers")

        class Greedy(workloads.MLPActor):
            def sample(self, obs):
                return self.mlp(obs).argmax(-1)

        torch.manual_seed(0)
        actor, T, B = Greedy(), 24, 6
        fragment, close = peers.puffer_loop(
            backend, workloads.make_cartpole, actor, T, B)
        got = fragment.arrays
        venv = SyncVectorEnv([workloads.make_cartpole] * B,
                             autoreset_mode=AutoresetMode.NEXT_STEP)
        try:
            obs, _ = venv.reset(seed=0)
            n_ends = 0
            for _ in range(4):
                assert np.array_equal(got.obs[0], obs)
                with torch.no_grad():
                    fragment()
                    for t in range(T):
                        act = actor.sample(torch.from_numpy(obs)).numpy()
                        obs, rew, terminated, truncated, _ = venv.step(act)
                        assert np.array_equal(got.act[t], act), t
                        assert np.array_equal(got.obs[t + 1], obs), t
                        assert np.array_equal(got.rew[t], rew), t
                        assert np.array_equal(got.done[t],
                                              terminated | truncated), t
                n_ends += int(got.done.sum())
        finally:
            venv.close()
            close()
        assert n_ends >= 4  # a test that sees episodes end


def test_a_dead_pufferlib_worker_is_an_error_not_a_hang(monkeypatch):
    """PufferLib's ``Multiprocessing`` waits on its worker without a
    bound; the rows' loop watches the worker: one that exits is a
    ``RuntimeError`` with its exit code, and closing leaves no process
    behind (the suite's fixture checks)."""
    pytest.importorskip("pufferlib.vector",
                        reason="needs pufferlib-core (make test)")
    import gymnasium
    import torch

    class ExitsOnStep(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,),
                                                 np.float32)
        action_space = gymnasium.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(4, np.float32), {}

        def step(self, action):
            self.t += 1
            if self.t == 3:  # in the worker process
                os._exit(3)
            return np.zeros(4, np.float32), 1.0, False, False, {}

    with benchmark_modules(monkeypatch) as load:
        workloads, peers = load("workloads"), load("peers")
        fragment, close = peers.puffer_loop(
            "Multiprocessing", ExitsOnStep, workloads.MLPActor(), 8, 2)
        try:
            with torch.no_grad(), pytest.raises(RuntimeError,
                                                match="exit code 3"):
                fragment()
        finally:
            close()


def test_alternated_sums_each_loop_over_its_own_calls(monkeypatch):
    """Two loops on a clock of their own, one taking 1/64 s a call and the
    other 3/64 s (exact in binary): each is timed over its own calls only,
    one of each per turn, the first of a turn rotating, until each has had
    ``seconds``."""
    harness = load_harness()
    clock, calls = [0.0], []
    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])

    def loop(name, seconds):
        def fragment():
            calls.append(name)
            clock[0] += seconds
        return fragment

    rates = harness.alternated({"fast": loop("fast", 1 / 64),
                                "slow": loop("slow", 3 / 64)}, 100, 1.0)
    assert harness.WARMUP_SECONDS == 0.5
    # the warm-up, each loop on its own: 32 x 1/64 s, 11 x 3/64 s
    assert calls[:43] == ["fast"] * 32 + ["slow"] * 11
    timed = calls[43:]
    assert timed[:6] == ["fast", "slow", "slow", "fast", "fast", "slow"]
    # 64 turns: the fast loop has had its second by then
    assert timed.count("fast") == timed.count("slow") == 64
    assert rates["fast"]["steps"] == rates["slow"]["steps"] == 6400
    assert rates["fast"]["steps_per_s"] == 6400.0
    assert rates["slow"]["steps_per_s"] == pytest.approx(6400 / 3)


def test_warm_workers_waits_for_every_worker_and_names_a_late_one(
        monkeypatch):
    """A generator whose first batches all come from its first worker:
    batches are taken until each worker has delivered two fragments, none
    from a generator without workers (or without their stats), and a
    worker that delivers nothing within the bound is named in the error
    (a clock of its own: one second a batch)."""
    harness = load_harness()
    clock = [0.0]
    monkeypatch.setattr(harness.time, "monotonic", lambda: clock[0])

    class Feed:
        def __init__(self, arrivals, n_workers=2):
            self.arrivals = iter(arrivals)
            self.stats = {"workers": [{"delivered": 0}
                                      for _ in range(n_workers)]}
            self.batches = 0

        def __next__(self):
            for worker in next(self.arrivals):
                self.stats["workers"][worker]["delivered"] += 1
            self.batches += 1
            clock[0] += 1.0

    feed = Feed([(0, 0), (0, 0), (0, 1), (0, 1), (0, 1)])
    harness.warm_workers(feed)
    assert feed.batches == 4
    assert [w["delivered"] for w in feed.stats["workers"]] == [6, 2]

    for idle in (Feed([], n_workers=0), object()):  # same.rollout, older
        harness.warm_workers(idle)
    assert clock[0] == 4.0

    late = Feed([(0, 0)] * 10)
    with pytest.raises(RuntimeError, match=r"delivered \[6, 0\] fragments"):
        harness.warm_workers(late, seconds=2.5)
    assert late.batches == 3


def test_timed_in_processes_sums_its_copies_and_names_a_failure():
    """Each copy runs its own loop in a process of its own (each built
    there: a process id of its own) and the rates add up; a copy whose
    build fails stops the others, and its error is the one raised."""
    harness = load_harness()
    harness.WARMUP_SECONDS = 0.0
    parent = os.getpid()

    def build():
        calls = []

        def fragment():
            calls.append(os.getpid())
            assert os.getpid() != parent

        return fragment, lambda: None

    result = harness.timed_in_processes(build, 10, 0.05, 3)
    assert result["steps"] > 0 and result["steps"] % 10 == 0
    assert result["steps_per_s"] > 0 and result["learner_cpu"] == 0.0

    ctx = harness.multiprocessing.get_context("fork")
    built = ctx.Value("i", 0)

    def failing():  # the second copy built fails; the others wait for it
        with built.get_lock():
            built.value += 1
            if built.value == 2:
                raise ValueError("no env for this copy")
        return build()

    with pytest.raises(RuntimeError, match="ValueError: no env for this"):
        harness.timed_in_processes(failing, 10, 0.05, 3)


def test_throughput_parallel_hand_is_the_ratio_of_its_multi_rows():
    """``hand.parallel.2x64``: the hand loop in 2 processes; ``x par`` of
    the rows with its ceiling (``2x64``) is their ratio to it."""
    rows = json_rows(run("throughput.py", "--json", "--duration", "0.05",
                         "--warmup", "0.05", "--rounds", "2", "--only",
                         "vector/hand.parallel,vector/multi.rollout.2x64"))
    par, multi = (rows[f"vector/{name}"] for name in (
        "hand.parallel.2x64", "multi.rollout.2x64"))
    assert par["ceiling"] == multi["ceiling"] == "2x64"
    assert par["ratio_parallel"] == 1.0 and par["learner_cpu"] == 0.0
    ratios = [a / b for a, b in zip(multi["rounds"], par["rounds"])]
    assert multi["ratio_parallel"] == pytest.approx(
        float(np.median(ratios)), abs=2e-3)


def test_throughput_profile_prints_its_parts():
    out = run("throughput.py", "--profile", "--duration", "0.05",
              "--warmup", "0.05", "--rounds", "1", "--only",
              "cartpole/profile")
    section = out[out.index("cartpole/profile: us per env step"):]
    for part in ("actor call", "env step + reset", "rest", "as in hand",
                 "rlplay's extra", "whole", "plain row", "instrumentation"):
        assert f"\n  {part}" in section or f"\n    {part}" in section, part


def test_overlap_prints_both_rows_with_their_spread():
    rows = json_rows(run("overlap.py", "--json", "--seconds", "0.05",
                         "--rounds", "2"))
    assert list(rows) == ["cartpole/same.rollout", "cartpole/single.rollout"]
    for row in rows.values():
        assert row["rounds"] == 2
        for key in ("overlap", "x_seq"):
            assert row[key + "_min"] <= row[key] <= row[key + "_max"]
        assert row["t_wall"] > 0 and row["steps_per_s"] > 0
    assert rows["cartpole/same.rollout"]["x_seq"] == 1.0


def test_prefetch_prints_its_rows_with_their_spread():
    rows = json_rows(run("prefetch.py", "--json", "--seconds", "0.05",
                         "--rounds", "2", "--only", "cartpole"))
    assert list(rows) == [f"cartpole/{training}/prefetch={prefetch}"
                          for training in ("slow", "fast")
                          for prefetch in (0, 1)]
    for row in rows.values():
        assert row["rounds"] == 2
        for key in ("wait", "idle", "x"):
            assert row[key + "_min"] <= row[key] <= row[key + "_max"]
        assert 0 <= row["wait"] <= 1 and row["idle"] >= 0
        assert row["t_train"] > 0 and row["steps_per_s"] > 0
    assert rows["cartpole/slow/prefetch=0"]["x"] == 1.0
    assert rows["cartpole/fast/prefetch=0"]["x"] == 1.0


def test_episodes_prints_its_rows_and_ratios():
    rows = json_rows(run("episodes.py", "--json", "--seconds", "0.05",
                         "--warmup", "0.05", "--rounds", "2", "--episodes",
                         "5"))
    names = ["multi/multi.rollout.2x8", "multi/episodes.multi.2x8",
             "record/episodic.record.multi.2x8",
             "record/minari.DataCollector", "record/ceiling.minari_write"]
    assert sorted(rows) == sorted(names)
    cost = rows["multi/episodes.multi.2x8"]
    assert cost["cost_min"] <= cost["cost"] <= cost["cost_max"]
    for name in names:
        row = rows[name]
        if "skipped" in row:  # a package the row needs is missing
            assert name.startswith("record/"), row
            continue
        assert row["min"] <= row["steps_per_s"] <= row["max"]
    record = rows["record/episodic.record.multi.2x8"]
    if "skipped" not in record:
        assert record["of_ceiling_min"] <= record["of_ceiling"]


def test_replay_prints_every_library_and_operation():
    rows = json_rows(run("replay.py", "--json", "--seconds", "0.02",
                         "--rounds", "2", "--capacity", "3000",
                         "--capacity-atari", "1200"))
    ops = ["extend", "sample.uniform", "sample.uniform.n3", "memory",
           "sample_update.prioritized"]
    for shape in ("cartpole", "atari"):
        for op in ops:
            row = rows[f"rlplay/{op}.{shape}"]
            assert row["min"] <= row["per_s"] <= row["max"], row
            for peer in ("torchrl", "sb3"):
                other = rows.get(f"{peer}/{op}.{shape}")
                if other is not None and "skipped" not in other:
                    assert row[f"x_{peer}_min"] <= row[f"x_{peer}"]
    # each observation once: rlplay's bytes per image transition are
    # about half of a buffer that stores next_obs too
    memory = rows["rlplay/memory.atari"]
    assert 84 * 84 * 4 <= memory["per_s"] < 1.1 * 84 * 84 * 4
    assert all(name.split("/")[0] in ("rlplay", "torchrl", "sb3")
               for name in rows)


def test_finals_times_the_dense_and_the_sparse_copies():
    """Both rows, with the ratio to the dense one (the script checks that
    the two make the same batch before it times them)."""
    rows = json_rows(run("finals.py", "--json", "--rounds", "1",
                         "--repeats", "1"))
    assert set(rows) == {"finals/dense", "finals/sparse"}
    assert rows["finals/dense"]["x_dense"] == 1.0
    assert all(row["ms_min"] <= row["ms"] <= row["ms_max"]
               for row in rows.values())


def test_nested_runs():
    assert json_rows(run("nested.py", "--json"))


@pytest.mark.parametrize("start_method", ["fork"])
def test_soak_restarts_runs_and_reports(start_method):
    out = run("soak_restarts.py", "--batches", "60", "--crash-rate", "0.1",
              "--start-method", start_method)
    assert f"{start_method}: 60 batches" in out
    assert "restarts:" in out and "descriptors" in out
    assert "growth is judged over 200 batches" in out  # too short here


def test_gpu_runs_dry_on_the_cpu_and_says_when_cuda_is_missing():
    """``gpu.py --device cpu`` runs every section (a dry run: the numbers
    mean nothing there); without ``--device cpu`` and without CUDA it says
    in one line that it needs CUDA."""
    rows = json_rows(run("gpu.py", "--device", "cpu", "--quick", "--json"))
    assert {"bandwidth/pinned", "bandwidth/pageable", "bandwidth/delivery",
            "bandwidth/share", "delivery/host",
            "delivery/device", "train",
            "inference/cnn.8", "inference/cnn.64", "inference/mlp.8",
            "inference/mlp.64"} <= set(rows)
    for name in ("delivery/host", "delivery/device"):
        mid, low, high = rows[name]["steps_per_s"]
        assert 0 < low <= mid <= high
    assert rows["train"]["batches"] >= 3
    if not torch_cuda_available():
        out = run("gpu.py", "--quick")
        assert out.strip().splitlines() == [
            "benchmarks/gpu.py: needs CUDA, and this machine has none "
            "(--device cpu runs it dry on the CPU)"]


def torch_cuda_available():
    import torch
    return torch.cuda.is_available()


def test_agents_prints_rlplay_and_its_peers():
    pytest.importorskip("mpe2")
    rows = json_rows(run("agents.py", "--json", "--seconds", "0.2",
                         "--rounds", "1", "--envs", "2", "--steps", "16"))
    names = ["hand", "same.rollout", "same.rollout.alternating",
             "ceiling.2x1", "multi.rollout.2x1", "supersuit.sync",
             "supersuit.procs", "torchrl.collector", "torchrl.multi.2x1"]
    assert sorted(rows) == sorted(f"spread/{name}" for name in names)
    for name, row in rows.items():
        if "skipped" in row:  # a peer's package is missing
            assert name.split("/")[1].startswith(("supersuit", "torchrl"))
            continue
        assert row["min"] <= row["steps_per_s"] <= row["max"]
        assert "x_hand" in row
    assert "x_peer" in rows["spread/multi.rollout.2x1"] or all(
        "skipped" in rows[f"spread/{name}"] for name in names[5:])
    assert 0 < rows["spread/multi.rollout.2x1"]["of_ceiling"]


def test_torch_envs_prints_its_rows_and_says_without_a_gpu():
    """``torch_envs.py``: the torch rows beside the numpy and the JAX ones
    (skipped, saying why, without gymnax), each with its spread and its
    ratio to its section's hand loop; without CUDA a line says so."""
    out = run("torch_envs.py", "--json", "--rounds", "2", "--duration",
              "0.1", "--sizes", "32", "--steps", "8")
    rows = json_rows(out)
    assert set(rows) == {f"{s}/{r}" for s, r in (
        ("torch.32", "hand"), ("torch.32", "same.rollout"),
        ("torch.32", "same.rollout.alternating"), ("numpy.32", "hand"),
        ("numpy.32", "same.rollout"), ("jax.32", "hand"),
        ("jax.32", "same.rollout"), ("jax.32", "same.rollout.alternating"))}
    have_gymnax = importlib.util.find_spec("gymnax") is not None
    for name, row in rows.items():
        if name.startswith("jax.") and not have_gymnax:
            assert "rlplay[jax]" in row["skipped"]
            continue
        assert row["min"] <= row["steps_per_s"] <= row["max"]
        assert row["x_hand_min"] <= row["x_hand"] <= row["x_hand_max"]
    if not torch_cuda_available():
        assert "no GPU on this machine" in out.splitlines()[0]


def test_torch_envs_brax_rows():
    """``torch_envs.py --brax NAME``: three rows of Brax's env (here its
    ``fast`` test env, quick to compile) beside the others, the
    alternating one with its CPU-time ratio."""
    pytest.importorskip("brax")
    out = run("torch_envs.py", "--json", "--rounds", "2", "--duration",
              "0.1", "--sizes", "8", "--steps", "4", "--brax", "fast")
    rows = json_rows(out)
    names = {f"brax.fast.8/{r}" for r in (
        "hand", "same.rollout", "same.rollout.alternating")}
    assert names <= set(rows)
    for name in names:
        row = rows[name]
        assert row["min"] <= row["steps_per_s"] <= row["max"]
        assert row["x_hand_min"] <= row["x_hand"] <= row["x_hand_max"]
    assert "x_hand_cpu" in rows["brax.fast.8/same.rollout.alternating"]
