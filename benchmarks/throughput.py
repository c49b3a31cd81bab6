"""Collection throughput: env steps per second of each way of collecting.

Every row steps the same envs with the same actor, a 4-64-64-2 MLP that
samples actions from a categorical distribution (under ``torch.no_grad()``,
one torch thread), and stores what it collects:

``hand``
    A hand-written loop: one batched forward pass per step, the envs
    stepped in a Python loop, obs/act/rew/done written into preallocated
    numpy arrays. The reference.
``SyncVectorEnv``, ``AsyncVectorEnv``
    Gymnasium's vector envs (same-step autoreset) driven by the same actor,
    into the same preallocated arrays.
``same.rollout``, ``single.rollout``, ``multi.rollout``
    rlplay's generators, consumed without training (``multi``: 2 actors x
    ``n_envs / 2`` envs, ``n_envs`` envs per batch).

Two envs: ``cartpole`` (CartPole-v1, 8 envs, 128-step fragments: the
actor's forward pass dominates) and ``busy`` (a synthetic env whose ``step``
burns about 0.5 ms of CPU time, 8 envs, 32-step fragments: the envs
dominate). The rows run in turn, ``--rounds`` times (each warmed up, then
timed over whole fragments for ``--seconds``), and each reports its median,
so that a drift of the machine does not favour the rows that run first. Columns: ``steps/s``; ``x hand``, the ratio to the
hand-written loop on the same env; ``x same``, the ratio to
``same.rollout`` on the same env. ``--json`` prints one object per row
(``name``, ``steps_per_s``, ``ratio`` = ``x hand``, ``ratio_same``).

    python benchmarks/throughput.py [--json] [--seconds 1.5] [--rounds 3]
                                    [--only busy]

Reading the numbers: on ``cartpole`` one call of the actor costs about
55 us of CPU whether it sees 4 or 8 envs, and a CartPole step about 5 us,
so two workers of 4 envs on two cores can beat one loop over 8 envs by at
most (55 + 8 x 5) / (55 + 4 x 5), about 1.3x; more cores (more actors)
scale further. Rows with several processes (``multi``'s workers,
``AsyncVectorEnv``'s 8) take a larger share of a machine that is busy with
other work: compare rows on an otherwise idle machine.
"""
import argparse
import json
import sys
import time
import traceback
from contextlib import closing

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from torch import nn

from rlplay.engine import BaseActorModule
from rlplay.engine.rollout import same

try:
    from rlplay.engine.rollout import single
except ImportError:
    single = None
try:
    from rlplay.engine.rollout import multi
except ImportError:
    multi = None

N_ENVS = 8
N_ACTORS = 2                  # multi.rollout: N_ACTORS x N_ENVS // N_ACTORS
BUSY_SECONDS = 0.5e-3         # CPU time a busy env burns per step
WARMUP_SECONDS = 0.5


class BusyEnv(gymnasium.Env):
    """A CPU-bound env: each ``step`` burns ``busy`` seconds of CPU time.

    The wait is measured in this thread's CPU time, not wall time, so the
    env does the same work however loaded the machine is. Episodes are
    truncated after ``length`` steps; the observation is cheap to make.
    """

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, busy=BUSY_SECONDS, length=200):
        self.busy, self.length, self.t = busy, length, 0

    def _obs(self):
        return np.full(4, self.t / self.length, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        deadline = time.thread_time() + self.busy
        while time.thread_time() < deadline:
            pass
        self.t += 1
        return self._obs(), 1.0, False, self.t >= self.length, {}


def make_cartpole():
    return gymnasium.make("CartPole-v1")


class MLPActor(BaseActorModule):
    """The benchmark's actor; :meth:`sample` is what every row calls."""

    def __init__(self, n_obs=4, n_actions=2, n_hidden=64):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(n_obs, n_hidden), nn.Tanh(),
            nn.Linear(n_hidden, n_hidden), nn.Tanh(),
            nn.Linear(n_hidden, n_actions))

    def sample(self, obs):
        logits = self.mlp(obs)
        return torch.distributions.Categorical(logits=logits).sample()

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return self.sample(obs), (), {}


def timed(fragment, steps_per_fragment, seconds):
    """Steps/s of calling ``fragment()`` for ``seconds``, after a warm-up
    (at least two calls): whole fragments only."""
    tic = time.perf_counter()
    for n in range(1, 1 << 30):
        fragment()
        if n >= 2 and time.perf_counter() - tic >= WARMUP_SECONDS:
            break
    tic = time.perf_counter()
    for n in range(1, 1 << 30):
        fragment()
        elapsed = time.perf_counter() - tic
        if elapsed >= seconds:
            return n * steps_per_fragment / elapsed


class Arrays:
    """Preallocated obs/act/rew/done of one fragment, for the loops that
    rlplay does not drive (``obs`` has the lookahead row ``T``)."""

    def __init__(self, space, n_steps, n_envs):
        self.obs = np.zeros((n_steps + 1, n_envs, *space.shape), space.dtype)
        self.act = np.zeros((n_steps, n_envs), np.int64)
        self.rew = np.zeros((n_steps, n_envs), np.float32)
        self.done = np.zeros((n_steps, n_envs), bool)
        self.obs_pyt = torch.from_numpy(self.obs)  # the same memory


def run_hand(factory, actor, n_steps, seconds):
    envs = [factory() for _ in range(N_ENVS)]
    buf = Arrays(envs[0].observation_space, n_steps, N_ENVS)
    for j, env in enumerate(envs):
        buf.obs[0, j], _ = env.reset(seed=j)

    def fragment():
        obs, act, rew, done = buf.obs, buf.act, buf.rew, buf.done
        for t in range(n_steps):
            actions = actor.sample(buf.obs_pyt[t]).numpy()
            act[t] = actions
            obs_next, rew_t, done_t = obs[t + 1], rew[t], done[t]
            for j, (env, a) in enumerate(zip(envs, actions.tolist())):
                x, r, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    x, _ = env.reset()
                    done_t[j] = True
                else:
                    done_t[j] = False
                obs_next[j] = x
                rew_t[j] = r
        obs[0] = obs[n_steps]

    try:
        return timed(fragment, n_steps * N_ENVS, seconds)
    finally:
        for env in envs:
            env.close()


def run_vector(vector_env, factory, actor, n_steps, seconds):
    venv = vector_env([factory] * N_ENVS,
                      autoreset_mode=AutoresetMode.SAME_STEP)
    buf = Arrays(venv.single_observation_space, n_steps, N_ENVS)
    buf.obs[0], _ = venv.reset(seed=0)

    def fragment():
        obs, act, rew, done = buf.obs, buf.act, buf.rew, buf.done
        for t in range(n_steps):
            actions = actor.sample(buf.obs_pyt[t]).numpy()
            act[t] = actions
            obs[t + 1], rew[t], terminated, truncated, _ = venv.step(actions)
            np.logical_or(terminated, truncated, out=done[t])
        obs[0] = obs[n_steps]

    try:
        return timed(fragment, n_steps * N_ENVS, seconds)
    finally:
        venv.close()


def run_generator(feed, n_steps, n_envs, seconds):
    with closing(feed):
        return timed(lambda: next(feed), n_steps * n_envs, seconds)


def rows(env_name):
    """``(name, run)`` of every row of an env; ``run(seconds)`` returns
    steps/s, or a string saying why the row was skipped."""
    factory, n_steps = {"cartpole": (make_cartpole, 128),
                        "busy": (BusyEnv, 32)}[env_name]
    actor = MLPActor()
    n_per_actor = N_ENVS // N_ACTORS

    def gen(module, *counts):
        def run(seconds):
            if module is None:
                return "not available (import failed)"
            feed = module.rollout(factory, actor, n_steps, *counts,
                                  entropy=0)
            return run_generator(feed, n_steps, N_ENVS, seconds)
        return run

    table = {
        "hand": lambda s: run_hand(factory, actor, n_steps, s),
        "SyncVectorEnv": lambda s: run_vector(SyncVectorEnv, factory, actor,
                                              n_steps, s),
        "same.rollout": gen(same, N_ENVS),
        "single.rollout": gen(single, N_ENVS),
        # n_buffers: two per actor, n_per_batch: one fragment per actor
        "multi.rollout": gen(multi, N_ACTORS, n_per_actor, 2 * N_ACTORS,
                             N_ACTORS),
        "AsyncVectorEnv": lambda s: run_vector(AsyncVectorEnv, factory,
                                               actor, n_steps, s),
    }
    names = {"cartpole": list(table),
             "busy": ["hand", "same.rollout", "multi.rollout",
                      "AsyncVectorEnv"]}[env_name]
    return [(f"{env_name}/{name}", table[name]) for name in names]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row")
    parser.add_argument("--seconds", type=float, default=1.5,
                        help="timed seconds per row and round (after a "
                             "warm-up)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over all rows; a row reports its median")
    parser.add_argument("--only", default="",
                        help="run the rows whose name contains this")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    # rounds: every row once per round, in turn, so that a drift of the
    # machine (clock boost, other load) does not favour the rows that come
    # first; each row reports its median over the rounds
    selected = [(name, run) for env_name in ("cartpole", "busy")
                for name, run in rows(env_name) if args.only in name]
    rates, failed = {}, []
    for round_ in range(args.rounds):
        for name, run in selected:
            if name in failed:
                continue
            try:
                with torch.no_grad():
                    rate = run(args.seconds)
            except Exception:  # report the row, measure the others
                traceback.print_exc()
                failed.append(name)
                continue
            if isinstance(rate, str):
                print(f"{name}: skipped, {rate}", file=sys.stderr)
                failed.append(name)
            else:
                rates.setdefault(name, []).append(rate)
                print(f"round {round_ + 1}: {name}: {rate:,.0f} steps/s",
                      file=sys.stderr)
    results = {name: float(np.median(values))
               for name, values in rates.items()}

    if not args.json:
        print(f"{'name':<24} {'steps/s':>9} {'x hand':>7} {'x same':>7}")
    for name, rate in results.items():
        env_name = name.split("/")[0]
        hand = results.get(f"{env_name}/hand")
        same_ = results.get(f"{env_name}/same.rollout")
        ratio = None if hand is None else rate / hand
        ratio_same = None if same_ is None else rate / same_
        if args.json:
            print(json.dumps({"name": name, "steps_per_s": round(rate, 1),
                              "ratio": _round(ratio),
                              "ratio_same": _round(ratio_same)}))
        else:
            print(f"{name:<24} {rate:>9,.0f} {_fmt(ratio):>7} "
                  f"{_fmt(ratio_same):>7}")
    if not args.json:
        print("x hand: steps/s over the hand-written loop's on the same env; "
              "x same: over same.rollout's")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def _round(ratio):
    return None if ratio is None else round(ratio, 3)


def _fmt(ratio):
    return "-" if ratio is None else f"{ratio:.2f}"


if __name__ == "__main__":
    main()
