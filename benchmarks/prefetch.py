"""Prefetching: the learner's wait and the workers' idle time, with and
without ``prefetch=1``, of ``multi.rollout`` (2 workers x 8 envs, 64
steps, 2 fragments per batch, 4 buffers).

A training loop takes batches and runs a fake training step of fixed
cost on each: a loop of 128x128 matrix products (one torch thread),
calibrated at the start against the time one worker takes to collect one
fragment (``same.rollout`` of the same 8 envs, in this process): ``slow``
training costs twice that (collection is faster than training), ``fast``
half of it (training is faster than collection). Workloads: CartPole-v1
(the 4-64-64-2 MLP of ``workloads.py``) and HalfCheetah-v5 (the Gaussian
17-64-64-6 MLP of ``real_workloads.py``; skipped, saying why, where
MuJoCo is missing).

Per row, over ``--seconds`` of batches after a warm-up:

``wait``
    the share of the loop's wall time spent in ``next()`` (all of it: the
    wait for fragments, the collation and the copy without prefetch, the
    wait for the prepared batch and its hand-out with it), and ``T_wait``
    that time per batch;
``idle``
    the share of the workers' time spent waiting for the learner (their
    ``stats["time_worker_wait"]``, summed over the 2 workers, over twice
    the wall time);
``steps/s``
    env steps per second of the training loop, and ``x``: over the row
    without prefetch of the same workload and training, in the same round.

Every generator is made once (before any prefetch thread runs: its
workers are forked); the rows then run in turn in each of ``--rounds``
rounds, each from a warm-up of a few batches, and each figure is the
median over rounds with its spread (min-max). On a two-core machine the
two workers and the learner share two cores: what is measured there is
what the cores allow, not what the protocol does on an idle machine.

    python benchmarks/prefetch.py [--json] [--seconds 4] [--rounds 3]
        [--only cartpole,halfcheetah]
"""
import argparse
import time
from contextlib import closing

import torch

# the benchmarks' harness, envs and actors (this folder is on sys.path
# when a script in it runs)
from harness import print_json, stats, warm_workers
from rlplay.engine.rollout import multi, same
from workloads import MLPActor, make_cartpole

N_ACTORS, N_PER_ACTOR, N_STEPS, N_BUFFERS, N_PER_BATCH = 2, 8, 64, 4, 2
WARMUP_BATCHES = 4
# the fake training step's cost, in fragments' collection time of a worker
TRAINING = {"slow": 2.0, "fast": 0.5}
MATRIX = 128


def workloads(only):
    """``{name: (factory, actor class)}``, or a string: why it is
    skipped."""
    found = {"cartpole": (make_cartpole, MLPActor)}
    try:
        import mujoco  # noqa: F401
        from real_workloads import GaussianActor, make_cheetah
        found["halfcheetah"] = (make_cheetah, GaussianActor)
    except ImportError as exc:
        found["halfcheetah"] = f"skipped: {exc} (pip install " \
                               f"'rlplay[mujoco]')"
    return {name: found[name] for name in only}


class Training:
    """``n_iters`` products of a ``MATRIX`` square matrix: a training step
    of fixed cost that holds the learner's thread."""

    def __init__(self, n_iters):
        self.n_iters = n_iters
        self.a = torch.randn(MATRIX, MATRIX) / MATRIX ** 0.5
        self.x = torch.randn(MATRIX, MATRIX)

    def __call__(self, batch):
        x = self.x
        for _ in range(self.n_iters):
            x = torch.tanh(self.a @ x)
        return x


def calibrate(factory, actor):
    """Seconds for one fragment of ``N_PER_ACTOR`` envs collected in this
    process, and seconds per product of :class:`Training`."""
    with closing(same.rollout(factory, actor, N_STEPS, N_PER_ACTOR,
                              entropy=1)) as feed:
        for _ in range(2):
            next(feed)
        tic = time.perf_counter()
        for _ in range(5):
            next(feed)
        t_fragment = (time.perf_counter() - tic) / 5
    train = Training(200)
    train(None)
    tic = time.perf_counter()
    train(None)
    return t_fragment, (time.perf_counter() - tic) / 200


def run(feed, train, seconds):
    """Time the training loop over ``feed``'s batches."""
    for _ in range(WARMUP_BATCHES):
        train(next(feed))
    s = feed.stats
    idle, steps = s["time_worker_wait"], s["steps"]
    n_batches, waited, started = 0, 0.0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        tic = time.perf_counter()
        batch = next(feed)
        waited += time.perf_counter() - tic
        train(batch)
        n_batches += 1
    wall = time.perf_counter() - started
    s = feed.stats
    return {"wait": waited / wall,
            "idle": (s["time_worker_wait"] - idle) / (N_ACTORS * wall),
            "steps_per_s": (s["steps"] - steps) / wall,
            "t_wait": waited / n_batches, "batches": n_batches}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row")
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="timed seconds per row and round (after a "
                             "warm-up)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over every row; a row reports its "
                             "median and min-max")
    parser.add_argument("--only", default="cartpole,halfcheetah",
                        help="the workloads, comma-separated")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    rows, feeds, skipped = [], [], []
    for workload, found in workloads(args.only.split(",")).items():
        if isinstance(found, str):
            skipped.append({"name": f"{workload}/prefetch",
                            "skipped": found})
            continue
        factory, actor_class = found
        actor = actor_class()
        t_fragment, t_iter = calibrate(factory, actor)
        for training, cost in TRAINING.items():
            n_iters = max(1, round(cost * t_fragment / t_iter))
            for prefetch in (0, 1):
                name = f"{workload}/{training}/prefetch={prefetch}"
                feed = multi.rollout(
                    factory, actor, N_STEPS, N_ACTORS, N_PER_ACTOR,
                    N_BUFFERS, N_PER_BATCH, entropy=0, prefetch=prefetch,
                    start_method="fork")
                feeds.append(feed)
                rows.append(dict(name=name, feed=feed,
                                 train=Training(n_iters),
                                 t_train=n_iters * t_iter,
                                 t_fragment=t_fragment, rounds=[]))
    try:
        for row in rows:
            warm_workers(row["feed"])
        for _ in range(args.rounds):
            for row in rows:
                row["rounds"].append(run(row["feed"], row["train"],
                                         args.seconds))
    finally:
        for feed in feeds:
            feed.close()

    summary = []
    for row in rows:
        base = next(r for r in rows if r["name"] == row["name"].replace(
            "prefetch=1", "prefetch=0"))
        for mine, theirs in zip(row["rounds"], base["rounds"]):
            mine["x"] = mine["steps_per_s"] / theirs["steps_per_s"]
        out = {"name": row["name"], "rounds": len(row["rounds"]),
               "t_train": row["t_train"], "t_fragment": row["t_fragment"]}
        for key in ("wait", "idle", "steps_per_s", "x", "t_wait"):
            out[key], low, high = stats([r[key] for r in row["rounds"]])
            if key in ("wait", "idle", "x"):
                out[key + "_min"], out[key + "_max"] = low, high
        summary.append(out)

    if args.json:
        print_json(summary + skipped)
        return
    print(f"multi.rollout {N_ACTORS}x{N_PER_ACTOR} envs, {N_STEPS} steps, "
          f"{N_PER_BATCH} fragments per batch; medians of {args.rounds} "
          f"rounds (min-max)")
    print(f"{'name':<30} {'T_frag':>7} {'T_train':>8} {'T_wait':>7} "
          f"{'wait':>17} {'idle':>17} {'steps/s':>8} {'x':>17}")
    for row in summary:
        print(f"{row['name']:<30} {row['t_fragment'] * 1e3:>5.1f}ms "
              f"{row['t_train'] * 1e3:>6.1f}ms "
              f"{row['t_wait'] * 1e3:>5.1f}ms "
              f"{row['wait']:>5.1%} ({row['wait_min']:.1%}-"
              f"{row['wait_max']:.1%}) "
              f"{row['idle']:>5.1%} ({row['idle_min']:.1%}-"
              f"{row['idle_max']:.1%}) "
              f"{row['steps_per_s']:>8,.0f} {row['x']:>5.2f} "
              f"({row['x_min']:.2f}-{row['x_max']:.2f})")
    for row in skipped:
        print(f"{row['name']:<30} {row['skipped']}")


if __name__ == "__main__":
    main()
