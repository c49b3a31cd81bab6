"""Soak test of worker restarts: ``multi.rollout`` over envs that crash.

Each env of each worker crashes at random, about ``--crash-rate`` of the
fragments of a worker (``os._exit``, a SIGKILL or an exception, drawn from
a generator seeded with the env's seed, so a run is reproducible), never
within the first fragment of a generation (two failures in a row before
delivering are a crash loop, which rlplay refuses to retry). The rollout
has a budget of restarts large enough for the run; the learner does no
training.

Every fragment delivered is checked: its layout (step counts, episode ends,
rewards, returns), and, per worker, that it follows the previous one (row 0
is the previous row ``T``) or starts a new generation (every env reset),
with ``meta.seq`` going on without a gap. At the end it prints the counts
(batches, fragments, restarts, per worker restarts, lost fragments and last
cause) and the resources of the learner (descriptors, ``/dev/shm`` files it
maps or holds, processes under it, resident memory) early in the run and at
its end; it exits with status 1 if a check failed or, over a run of at
least 200 batches, descriptors or ``/dev/shm`` files grew. A progress bar
on stderr counts the batches and the restarts so far.

    python benchmarks/soak_restarts.py [--batches 2000] [--crash-rate 0.05]
        [--start-method forkserver] [--workers 3]

Not run by the test suite (``tests/test_restarts.py`` has a short soak).
"""
import argparse
import contextlib
import functools
import itertools
import os
import signal
import sys
import time

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from tqdm import tqdm

from rlplay.engine import BaseActorModule
from rlplay.engine.nested import suply
from rlplay.engine.rollout import multi

TERM = 5  # every episode lasts 5 steps


class CrashingEnv(gymnasium.Env):
    """Observation = steps since reset + 100 * episode + a seeded offset in
    thousands; reward = action; episodes of ``TERM`` steps. After ``safe``
    steps, each step crashes with probability ``rate``."""

    def __init__(self, seed=None, rate=0.0, safe=0):
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,),
                                            np.float32)
        self.action_space = spaces.Discrete(5)
        self.rng = np.random.default_rng(seed)
        self.rate, self.safe, self.steps = rate, safe, 0
        self.episode, self.t, self.offset = -1, 0, 0.0

    def _obs(self):
        return np.array([self.t + 100 * self.episode + self.offset],
                        np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.offset = float(self.np_random.integers(1000)) * 1000
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        if self.steps > self.safe and self.rng.random() < self.rate:
            kind = self.rng.integers(3)
            if kind == 0:
                os._exit(5)
            if kind == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            raise ConnectionError("the simulator went away")
        self.t += 1
        return self._obs(), float(action), self.t == TERM, False, {}


def crashing_factory(seed=None, rate=0.0, safe=0):
    return CrashingEnv(seed, rate, safe)


class RuleActor(BaseActorModule):
    """``act = (obs + stepno) % 5``, feed-forward."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return (obs[..., 0].long() + stepno) % 5, (), {}

    def reset(self, hx, at):
        return ()


class Streams:
    """Checks each worker's stream of fragments (see the module
    docstring); counts the restarts seen in them."""

    def __init__(self, n_workers, n_steps):
        self.T = n_steps
        self.seq = [-1] * n_workers
        self.last = [None] * n_workers
        self.running = [None] * n_workers
        self.resets = [0] * n_workers

    def add(self, fragment):
        state, T = fragment.state, self.T
        obs, stepno, fin = state.obs[..., 0], state.stepno, state.fin
        a, b = slice(None, -1), slice(1, None)
        assert torch.equal(state.act[b], (obs[a].long() + stepno[a]) % 5)
        assert torch.equal(state.rew[b], state.act[b].float())
        assert torch.equal(fin[b], (stepno[a] + 1) % TERM == 0)
        assert torch.equal(stepno[b], torch.where(fin[b], 0, stepno[a] + 1))
        assert torch.equal(obs[b], torch.where(fin[b], obs[a] + 101 - TERM,
                                               obs[a] + 1))
        w, seq = int(fragment.meta.worker[0]), int(fragment.meta.seq[0])
        assert seq == self.seq[w] + 1, (w, seq, self.seq[w])
        row = [x[0] for x in state]
        if self.last[w] is None or any(not torch.equal(x, y) for x, y
                                       in zip(row, self.last[w])):
            # a new generation: every env reset
            assert torch.all(fin[0]) and torch.all(stepno[0] == 0)
            assert torch.all(obs[0] % 1000 == 0)
            self.running[w] = torch.zeros(fin.shape[1], dtype=torch.float64)
            self.resets[w] += seq > 0
        running = self.running[w]
        for t in range(1, T + 1):
            running += state.rew[t].double()
            ended = fin[t]
            assert torch.equal(fragment.stats.ret[t][ended], running[ended])
            running[ended] = 0
        self.seq[w] = seq
        self.last[w] = [x[-1].clone() for x in state]


def slot(batch, s, B):
    """The fields of the fragment in slot ``s`` that the checks read."""
    cols = slice(s * B, (s + 1) * B)
    return batch._replace(state=suply(lambda x: x[:, cols], batch.state),
                          stats=suply(lambda x: x[:, cols], batch.stats),
                          meta=suply(lambda x: x[cols], batch.meta))


# the fewest batches over which growth is judged
JUDGE_AFTER = 200


def descendants():
    """Processes under this one (its workers, multiprocessing's helpers
    and what they started)."""
    found, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # it ended meanwhile
            continue
        for task in tasks:
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
                found.extend(children)
                todo.extend(children)
    return len(found)


def resources():
    """``(fds, shm, processes, rss_mb)`` of this process."""
    fds = os.listdir("/proc/self/fd")
    held = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("/dev/shm/"):
                held.add(target)
    with open("/proc/self/maps") as maps:
        held.update(line.split(None, 5)[-1].strip() for line in maps
                    if "/dev/shm/" in line)
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f
                   if line.startswith("VmRSS:"))
    return len(fds), len(held), descendants(), rss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--crash-rate", type=float, default=0.05,
                        help="the fraction of a worker's fragments that "
                             "crash (default 0.05)")
    parser.add_argument("--start-method", default="forkserver",
                        choices=["fork", "forkserver", "spawn"])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--envs", type=int, default=2,
                        help="envs per worker")
    parser.add_argument("--steps", type=int, default=8,
                        help="steps per fragment")
    parser.add_argument("--restart-delay", type=float, default=0.05)
    parser.add_argument("--entropy", type=int, default=0)
    args = parser.parse_args()

    T, B, n_workers = args.steps, args.envs, args.workers
    # per step and env, so that a worker's fragment (T * B steps) crashes
    # with probability crash_rate
    rate = 1 - (1 - args.crash_rate) ** (1 / (T * B))
    factory = functools.partial(crashing_factory, rate=rate, safe=T)
    feed = multi.rollout(factory, RuleActor(), T, n_workers, B,
                         2 * n_workers, 2, entropy=args.entropy,
                         start_method=args.start_method,
                         restarts=10 * args.batches + 100,
                         restart_delay=args.restart_delay, timeout=60.0)
    streams, samples = Streams(n_workers, T), []
    failed = None
    tic = time.perf_counter()
    bar = tqdm(total=args.batches, unit="batch", desc=args.start_method)
    with feed, bar:
        try:
            for batch in itertools.islice(feed, args.batches):
                for s in range(2):
                    streams.add(slot(batch, s, B))
                samples.append(resources())
                bar.set_postfix(restarts=feed.stats["restarts"],
                                refresh=False)
                bar.update()
        except AssertionError as exc:
            failed = f"a layout check failed: {exc!r}"
        stats = feed.stats
    elapsed = time.perf_counter() - tic

    n = len(samples)
    fragments = 2 * stats["batches"]
    print(f"{args.start_method}: {stats['batches']} batches, {fragments} "
          f"fragments of {T} steps x {B} envs, {n_workers} workers, in "
          f"{elapsed:.1f} s ({stats['steps'] / elapsed:.0f} steps/s)")
    received = sum(a["received"] for a in stats["workers"])
    print(f"restarts: {stats['restarts']} "
          f"({stats['restarts'] / max(1, received):.3f} per fragment "
          f"received, {args.crash_rate} asked); seen as reset rows in the "
          f"streams: {sum(streams.resets)}")
    for w, account in enumerate(stats["workers"]):
        print(f"  worker {w}: received {account['received']}, delivered "
              f"{account['delivered']}, restarts {account['restarts']}, "
              f"lost {account['lost']}, last cause: {account['last_cause']}")
    grew = []
    if n >= 20:
        window = max(10, n // 10)
        early, late = samples[5:5 + window], samples[-window:]
        print(f"{'':>14} {'early (max)':>12} {'end (max)':>10}")
        for i, name in enumerate(["descriptors", "/dev/shm", "processes",
                                  "RSS MB"]):
            a, b = max(s[i] for s in early), max(s[i] for s in late)
            fmt = ".1f" if i == 3 else "d"
            print(f"{name:>14} {a:>12{fmt}} {b:>10{fmt}}")
            # a handful of processes come and go (a worker being replaced);
            # memory may settle: only descriptors and shm are held to "no
            # growth", and only over a run long enough for the early
            # window to have seen replacements in flight too
            if i < 2 and b > a and n >= JUDGE_AFTER:
                grew.append(name)
        if n < JUDGE_AFTER:
            print(f"(growth is judged over {JUDGE_AFTER} batches or more)")
    if failed:
        print(failed)
    if grew:
        print(f"GREW: {', '.join(grew)}")
    return 1 if failed or grew else 0


if __name__ == "__main__":
    sys.exit(main())
