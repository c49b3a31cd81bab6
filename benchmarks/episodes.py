"""Whole episodes and datasets: what rebuilding episodes costs, and how fast
a Minari dataset is recorded.

Two tables, CartPole-v1 and the benchmarks' 4-64-64-2 MLP actor sampling
from a categorical (untrained: episodes of about 20 steps, the most
episode ends per step, the hardest case for episodes):

``multi``
    ``multi.rollout`` with 2 workers x 8 envs, fragments of 128 steps, one
    fragment per batch (4 buffers), no training: env steps per second of
    the batches alone, and of ``episodic.episodes(feed, 16)`` over the same
    generator (steps of the fragments it read). ``cost`` is ``1 - episodes
    / multi`` per round: the share of the throughput that rebuilding the
    episodes takes (the learner process does it, on one of the two cores
    the workers use).
``record``
    ``--episodes`` episodes written into a Minari dataset (``create``
    included) by ``episodic.record`` over ``multi.rollout`` (2 workers x 8
    envs, the workers' start included), and by Minari's own
    ``DataCollector`` around one env in a loop that calls the same actor on
    each observation: env steps per second of the dataset written;
    ``x_minari`` per round. ``ceiling.minari_write`` is Minari's writer alone
    (``create_dataset_from_buffers`` of as many CartPole-sized episodes
    made up front): both recorders write through it, and it costs about
    as much per episode as the dataset already holds (it measures the
    dataset's size on disk after each episode), so that it bounds both;
    ``of_ceiling`` is the recorder's steps/s over it. Needs
    ``rlplay[minari]`` and, for the ``DataCollector``, ``minari[create]``
    (``rlplay[bench]``); a row whose package is missing is skipped.

Rows alternate over ``--rounds`` rounds; each gives its median and spread
(min-max), ratios are taken within a round. Nothing here asserts a timing.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import Row, fmt, median, paired, print_json, stats  # noqa: E402
from workloads import MLPActor, make_cartpole  # noqa: E402

from rlplay.engine.rollout import episodic, multi  # noqa: E402

N_STEPS, N_ACTORS, N_PER_ACTOR = 128, 2, 8
N_EPISODES = 16


def _multi(actor):
    return multi.rollout(make_cartpole, actor, N_STEPS, N_ACTORS,
                         N_PER_ACTOR, 2 * N_ACTORS, 1)


def run_multi(seconds):
    """Batches of multi.rollout alone."""
    feed = _multi(MLPActor())
    steps_per_batch = N_STEPS * N_PER_ACTOR
    with feed:
        harness.warm_workers(feed)
        return _timed(lambda: next(feed), lambda: steps_per_batch, seconds)


def run_episodes(seconds):
    """episodes() over the same generator; steps of the fragments read."""
    feed = _multi(MLPActor())
    eps = episodic.episodes(feed, N_EPISODES)
    steps_per_batch = N_STEPS * N_PER_ACTOR
    with eps:
        harness.warm_workers(feed, take=lambda: next(eps))
        return _timed(lambda: next(eps),
                      lambda: eps.stats["batches"] * steps_per_batch,
                      seconds, counts_total=True)


def _timed(call, steps, seconds, counts_total=False):
    tic = time.perf_counter()
    while time.perf_counter() - tic < harness.WARMUP_SECONDS:
        call()
    start = steps() if counts_total else 0
    n, tic = 0, time.perf_counter()
    while True:
        call()
        n += 1
        elapsed = time.perf_counter() - tic
        if elapsed >= seconds:
            done = steps() - start if counts_total else n * steps()
            return {"steps_per_s": done / elapsed, "steps": done}


def run_record(n_episodes):
    """episodic.record over multi.rollout, into a fresh dataset."""
    try:
        import minari  # noqa: F401
    except ImportError:
        return "Minari is not installed (rlplay[minari])"
    import gymnasium
    env = gymnasium.make("CartPole-v1")
    with _datasets() as name:
        tic = time.perf_counter()
        feed = _multi(MLPActor())
        with feed:
            dataset = episodic.record(
                feed, name, n_episodes, env="CartPole-v1",
                observation_space=env.observation_space,
                action_space=env.action_space, **_metadata())
        elapsed = time.perf_counter() - tic
        steps = dataset.total_steps
    return {"steps_per_s": steps / elapsed, "steps": steps}


def run_data_collector(n_episodes):
    """Minari's DataCollector around one env, the same actor per step."""
    try:
        import jax  # noqa: F401 (DataCollector needs it)
        import minari
    except ImportError:
        return "minari[create] is not installed (rlplay[bench])"
    import gymnasium
    actor = MLPActor()
    with _datasets() as name:
        tic = time.perf_counter()
        env = minari.DataCollector(gymnasium.make("CartPole-v1"),
                                   data_format="arrow")
        obs, _ = env.reset(seed=0)
        episodes = 0
        while episodes < n_episodes:
            act = int(actor.sample(torch.as_tensor(obs)[None])[0])
            obs, _, terminated, truncated, _ = env.step(act)
            if terminated or truncated:
                episodes += 1
                obs, _ = env.reset()
        dataset = env.create_dataset(name, algorithm_name="MLPActor",
                                     **_metadata())
        env.close()
        elapsed = time.perf_counter() - tic
        steps = dataset.total_steps
    return {"steps_per_s": steps / elapsed, "steps": steps}


def run_write_only(n_episodes):
    """Minari's writer alone: ``create_dataset_from_buffers`` of episodes
    made up front (CartPole-sized, 22 steps each): the ceiling of any
    recorder that writes through Minari."""
    try:
        import minari
        from minari.data_collector import EpisodeBuffer
    except ImportError:
        return "Minari is not installed (rlplay[minari])"
    L = 22
    buffers = [EpisodeBuffer(
        id=i, observations=np.zeros((L + 1, 4), np.float32),
        actions=np.zeros(L, np.int64), rewards=np.ones(L),
        terminations=np.arange(L) == L - 1, truncations=np.zeros(L, bool))
        for i in range(n_episodes)]
    with _datasets() as name:
        tic = time.perf_counter()
        minari.create_dataset_from_buffers(
            name, buffers, env="CartPole-v1", data_format="arrow",
            **_metadata())
        elapsed = time.perf_counter() - tic
    return {"steps_per_s": L * n_episodes / elapsed, "steps": L * n_episodes}


def _metadata():
    return dict(author="rlplay benchmarks", author_email="bench@example.org",
                code_permalink="benchmarks/episodes.py",
                description="CartPole-v1, an untrained MLP actor")


class _datasets:
    """A fresh ``MINARI_DATASETS_PATH`` for one dataset, removed after."""

    def __enter__(self):
        self.root = tempfile.mkdtemp(prefix="rlplay-bench-")
        self.saved = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = self.root
        return "cartpole/bench-v0"

    def __exit__(self, *exc):
        if self.saved is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = self.saved
        shutil.rmtree(self.root, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="timed seconds per multi row and round")
    parser.add_argument("--episodes", type=int, default=500,
                        help="episodes per dataset recorded")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=float,
                        default=harness.WARMUP_SECONDS,
                        help="seconds of warm-up of each multi row before "
                             "it is timed (default %(default)s); a dry run "
                             "takes less")
    args = parser.parse_args(argv)
    harness.WARMUP_SECONDS = args.warmup
    torch.set_num_threads(1)
    rows = [Row("multi/multi.rollout.2x8", run_multi),
            Row("multi/episodes.multi.2x8", run_episodes),
            Row("record/episodic.record.multi.2x8",
                lambda _: run_record(args.episodes)),
            Row("record/minari.DataCollector",
                lambda _: run_data_collector(args.episodes)),
            Row("record/ceiling.minari_write",
                lambda _: run_write_only(args.episodes))]
    results, skipped = {}, {}
    for round_ in range(args.rounds):
        for row in rows:
            if row.name in skipped:
                continue
            with torch.no_grad():
                result = row.run(args.seconds)
            if isinstance(result, str):
                print(f"{row.name}: skipped, {result}", file=sys.stderr)
                skipped[row.name] = result
                continue
            results.setdefault(row.name, {})[round_] = result["steps_per_s"]
            print(f"round {round_ + 1}: {row.name}: "
                  f"{result['steps_per_s']:,.0f} steps/s", file=sys.stderr)
    report(results, skipped, args)


def report(results, skipped, args):
    def ratio(num, den):
        num, den = results.get(num), results.get(den)
        if num is None or den is None:
            return None
        return paired(num, den)

    cost = ratio("multi/episodes.multi.2x8", "multi/multi.rollout.2x8")
    cost = None if cost is None else [1 - r for r in cost]
    x_minari = ratio("record/episodic.record.multi.2x8",
                     "record/minari.DataCollector")
    ceil = ratio("record/episodic.record.multi.2x8",
                 "record/ceiling.minari_write")
    extra = {"multi/episodes.multi.2x8": [("cost", cost)],
             "record/episodic.record.multi.2x8": [("x_minari", x_minari),
                                                  ("of_ceiling", ceil)]}
    records = []
    for name, values in results.items():
        mid, low, high = stats(list(values.values()))
        item = {"name": name, "steps_per_s": round(mid, 1),
                "min": round(low, 1), "max": round(high, 1)}
        for key, ratios in extra.get(name, []):
            if ratios:
                item.update({key: median(ratios), f"{key}_min": min(ratios),
                             f"{key}_max": max(ratios)})
        records.append(item)
    for name, why in skipped.items():
        records.append({"name": name, "skipped": why})
    if args.json:
        print_json(records)
        return
    print(f"{args.rounds} rounds; multi rows {args.seconds} s each; "
          f"{args.episodes} episodes per dataset; torch {torch.__version__}")
    print(f"{'name':36} {'steps/s [min-max]':>30}  ratio [min-max]")
    for item in records:
        if "skipped" in item:
            print(f"{item['name']:36} skipped: {item['skipped']}")
            continue
        text = (f"{item['name']:36} {item['steps_per_s']:>10,.0f} "
                f"[{item['min']:,.0f}-{item['max']:,.0f}]")
        for key in ("cost", "x_minari", "of_ceiling"):
            if key in item:
                text += (f"  {key} {fmt(item[key])} "
                         f"[{fmt(item[key + '_min'])}-"
                         f"{fmt(item[key + '_max'])}]")
        print(text)


if __name__ == "__main__":
    main()
