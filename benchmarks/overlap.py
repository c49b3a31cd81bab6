"""Overlap of collection and training: ``same.rollout`` vs ``single.rollout``.

A training loop consumes CartPole-v1 fragments (8 envs, 128 steps, a
4-64-64-2 MLP actor sampling from a categorical) and runs a CPU training
step on each: gradient steps of the actor's MLP on the fragment, their
number calibrated at the start so that one training step costs about as
long as collecting one fragment. Then the same loop runs

(a) sequentially, with ``same.rollout``: collect, train, collect, ...
(b) double-buffered, with ``single.rollout``: the worker collects the next
    fragment while the learner trains on this one.

Per batch, averaged over ``--seconds`` of batches after a warm-up:

``T_collect``
    collecting one fragment (``next()`` for (a); the worker's own time for
    (b), from ``stats["time_collect"]``);
``T_train``
    one training step;
``T_wait``
    time the learner spent in ``next()`` (waiting, for (b));
``T_wall``
    wall time per batch;
``overlap``
    ``(T_collect + T_train) / T_wall``: 1.0 when nothing overlaps, 2.0 when
    collection is entirely hidden behind training of the same cost;
``steps/s``
    env steps per second of the training loop, and ``x seq``, over (a)'s.

The two rows alternate over ``--rounds`` rounds (so that a slow spell of a
noisy machine hits both); each column gives the median over rounds, and
``overlap`` and ``x seq`` their spread (min-max) too. ``x seq`` is taken
per round, (b) over the (a) of the same round.

Both sides run one torch thread (``torch.set_num_threads(1)`` here; the
worker of ``single.rollout`` sets its own), so on two cores each has one.
``--json`` prints one object per row (``name``, ``overlap``,
``steps_per_s``, ``x_seq`` and the times in seconds, medians; ``overlap``
and ``x_seq`` with ``_min`` and ``_max``).

    python benchmarks/overlap.py [--json] [--seconds 3] [--rounds 5]
"""
import argparse
import time
from contextlib import closing

import torch
import torch.nn.functional as F

# the benchmarks' harness, env and actor (this folder is on sys.path when
# a script in it runs)
from harness import print_json, stats
from rlplay.engine.rollout import same
from workloads import MLPActor, make_cartpole

try:
    from rlplay.engine.rollout import single
except ImportError:
    single = None

N_ENVS, N_STEPS = 8, 128
WARMUP_BATCHES = 3


class Trainer:
    """``n_iters`` gradient steps of the actor's MLP on a fragment: the
    log-likelihood of the actions taken, a stand-in for a real loss."""

    def __init__(self, actor, n_iters=1):
        self.actor, self.n_iters = actor, n_iters
        # a small step: the policy, hence the episode lengths, stay put
        self.optim = torch.optim.Adam(actor.parameters(), lr=1e-5)

    def __call__(self, batch):
        obs = batch.state.obs[:-1].flatten(0, 1)   # rows t = 0 .. T-1
        act = batch.state.act[1:].flatten(0, 1)    # the actions taken there
        for _ in range(self.n_iters):
            loss = F.cross_entropy(self.actor.mlp(obs), act)
            self.optim.zero_grad()
            loss.backward()
            self.optim.step()


def calibrate(actor):
    """The number of gradient steps that cost about one fragment's
    collection; and that collection time."""
    with closing(same.rollout(make_cartpole, actor, N_STEPS, N_ENVS,
                              entropy=1)) as feed:
        for _ in range(WARMUP_BATCHES):
            batch = next(feed)
        tic = time.perf_counter()
        for _ in range(5):
            batch = next(feed)
        t_collect = (time.perf_counter() - tic) / 5
        train = Trainer(actor, n_iters=10)
        train(batch)
        tic = time.perf_counter()
        train(batch)
        t_iter = (time.perf_counter() - tic) / 10
    return max(1, round(t_collect / t_iter)), t_collect


def run(name, module, actor, train, seconds):
    """Time the training loop over ``module.rollout``'s batches."""
    feed = module.rollout(make_cartpole, actor, N_STEPS, N_ENVS, entropy=0)
    with closing(feed):
        for _ in range(WARMUP_BATCHES):
            train(next(feed))
        collected = feed.stats["time_collect"]
        n_batches, t_wait, t_train = 0, 0.0, 0.0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            tic = time.perf_counter()
            batch = next(feed)
            toc = time.perf_counter()
            train(batch)
            t_wait += toc - tic
            t_train += time.perf_counter() - toc
            n_batches += 1
        t_wall = (time.perf_counter() - started) / n_batches
        t_collect = (feed.stats["time_collect"] - collected) / n_batches
    t_train, t_wait = t_train / n_batches, t_wait / n_batches
    return {"name": name, "overlap": (t_collect + t_train) / t_wall,
            "steps_per_s": N_STEPS * N_ENVS / t_wall, "t_collect": t_collect,
            "t_train": t_train, "t_wait": t_wait, "t_wall": t_wall,
            "batches": n_batches}


def summarize(rounds):
    """Per row: the median of every quantity over rounds, and the spread
    of ``overlap`` and ``x_seq`` (this round's steps/s over (a)'s)."""
    for rows in rounds:
        for row in rows:
            row["x_seq"] = row["steps_per_s"] / rows[0]["steps_per_s"]
    summary = []
    for column in zip(*rounds):
        row = {"name": column[0]["name"], "rounds": len(column)}
        for key in ("overlap", "steps_per_s", "x_seq", "t_collect",
                    "t_train", "t_wait", "t_wall"):
            row[key], low, high = stats([r[key] for r in column])
            if key in ("overlap", "x_seq"):
                row[key + "_min"], row[key + "_max"] = low, high
        summary.append(row)
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="timed seconds per row and round (after a "
                             "warm-up)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds over both rows; a row reports its "
                             "median and min-max")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    actor = MLPActor()
    n_iters, t_collect = calibrate(actor)
    if not args.json:
        print(f"calibrated: collecting a fragment takes {t_collect * 1e3:.1f}"
              f" ms; a training step is {n_iters} gradient steps")
    modules = [("cartpole/same.rollout", same)]
    if single is None:
        print("cartpole/single.rollout skipped: rlplay.engine.rollout.single "
              "is not available")
    else:
        modules.append(("cartpole/single.rollout", single))
    rounds = [[run(name, module, actor, Trainer(actor, n_iters),
                   args.seconds) for name, module in modules]
              for _ in range(args.rounds)]
    rows = summarize(rounds)

    if args.json:
        print_json(rows)
        return
    print(f"medians of {args.rounds} rounds (min-max)")
    print(f"{'name':<24} {'T_collect':>9} {'T_train':>8} {'T_wait':>7} "
          f"{'T_wall':>7} {'overlap':>17} {'steps/s':>8} {'x seq':>17}")
    for row in rows:
        print(f"{row['name']:<24} {row['t_collect'] * 1e3:>7.1f}ms "
              f"{row['t_train'] * 1e3:>6.1f}ms {row['t_wait'] * 1e3:>5.1f}ms "
              f"{row['t_wall'] * 1e3:>5.1f}ms {row['overlap']:>5.2f} "
              f"({row['overlap_min']:.2f}-{row['overlap_max']:.2f}) "
              f"{row['steps_per_s']:>8,.0f} {row['x_seq']:>5.2f} "
              f"({row['x_seq_min']:.2f}-{row['x_seq_max']:.2f})")


if __name__ == "__main__":
    main()
