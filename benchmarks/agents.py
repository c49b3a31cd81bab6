"""Many agents: agent steps per second over PettingZoo's simple_spread_v3
(mpe2; 3 agents, episodes of 25 steps), one actor for every agent.

The actor is the same 18-64-64-5 MLP sampling from a categorical
everywhere, called once per step on every agent of every env, ``--envs``
envs (``3 * envs`` agents):

``hand``
    a hand-written loop over the envs: one actor call, the observation
    dicts copied into one batch, one ``step`` per env, a ``reset`` when no
    agent is left (what ``same`` should be close to);
``same.rollout``, ``multi.rollout.2xk``
    rlplay, fragments of ``--steps`` steps (128) (``multi``: 2 workers of ``envs / 2``
    envs each, two fragments collated per batch);
``ceiling.2xk``
    the hand loop over ``envs / 2`` envs in each of 2 processes at once,
    their rates summed: what the 2 cores do with the work alone, the bound
    of any collector here (its ``x_peer`` is the most that ``multi``'s
    could be; ``x_ceil``, ``multi``'s rate over it, per round);
``same.rollout.alternating``
    ``same.rollout`` and the hand loop fragment by fragment, in turn, in
    one window: its ``x_hand`` is the ratio within that window, which
    keeps little of the machine's drift between rows;
``supersuit.sync``, ``supersuit.procs``
    SuperSuit's ``pettingzoo_env_to_vec_env_v1`` and
    ``concat_vec_envs_v1`` (in this process, and in 2 worker processes),
    driven by the same actor;
``torchrl.collector``, ``torchrl.multi.2xk``
    TorchRL's collector over a ``SerialEnv`` of ``PettingZooWrapper``
    envs, and its ``MultiSyncCollector`` of 2 workers, with the actor as a
    ``TensorDictModule``.

A peer's row is skipped where its package is missing (``rlplay[bench]``).
``x_hand`` is a row's agent steps per second over the hand loop's, per
round (the alternating row's, within its window); ``x_peer`` rlplay's
``multi`` over the fastest peer row. Rows run in turn over ``--rounds``
rounds; each gives its median and spread (min-max). Nothing here asserts
a timing.
"""
import argparse
import multiprocessing
import os
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Row, alternated, fmt, measure, median, paired,  # noqa
                     print_json, record, spread, warm_workers)

from rlplay.engine import BaseActorModule  # noqa: E402
from rlplay.engine.rollout import multi, same  # noqa: E402

N_STEPS, N_AGENTS, N_OBS, N_ACTIONS = 128, 3, 18, 5
PEERS = ("supersuit.sync", "supersuit.procs", "torchrl.collector",
         "torchrl.multi")


def make_env():
    from mpe2 import simple_spread_v3
    return simple_spread_v3.parallel_env()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(N_OBS, 64), nn.Tanh(), nn.Linear(64, 64),
                         nn.Tanh(), nn.Linear(64, N_ACTIONS))


def sample(net, obs):
    logits = net(obs)
    return torch.distributions.Categorical(logits=logits).sample()


class Actor(BaseActorModule):
    """The MLP as an rlplay actor (feed-forward)."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return sample(self.net, obs), (), {}


def _timed(call, steps, seconds):
    """``steps`` agent steps per ``call()``, timed for ``seconds`` after a
    warm-up of two calls."""
    call(), call()
    tic, n = time.perf_counter(), 0
    while True:
        call()
        n += 1
        elapsed = time.perf_counter() - tic
        if elapsed >= seconds:
            return {"steps_per_s": n * steps / elapsed}


def hand_loop(n_envs):
    """The hand-written loop: a function that steps one fragment."""
    envs = [make_env() for _ in range(n_envs)]
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    net = mlp()
    batch = np.zeros((n_envs * N_AGENTS, N_OBS), np.float32)

    def step():
        for e, env in enumerate(envs):
            for a, agent in enumerate(env.possible_agents):
                batch[e * N_AGENTS + a] = obs[e][agent]
        act = sample(net, torch.from_numpy(batch)).numpy()
        for e, env in enumerate(envs):
            agents = env.possible_agents
            obs[e] = env.step({agent: act[e * N_AGENTS + a]
                               for a, agent in enumerate(agents)
                               if agent in env.agents})[0]
            if not env.agents:
                obs[e] = env.reset()[0]

    def fragment():
        for _ in range(N_STEPS):
            step()
    return fragment


def run_hand(n_envs, seconds):
    return _timed(hand_loop(n_envs), N_STEPS * n_envs * N_AGENTS, seconds)


def _ceiling_part(n_envs, seconds, barrier, out):
    """One core of the ceiling: the hand loop over ``n_envs`` envs, timed
    once every part has warmed up, so that the parts overlap."""
    torch.set_num_threads(1)
    fragment = hand_loop(n_envs)
    fragment()
    barrier.wait()
    out.put(_timed(fragment, N_STEPS * n_envs * N_AGENTS, seconds))


def run_ceiling(n_envs, seconds, n_cores=2):
    """What ``n_cores`` cores do with the work and nothing else: the hand
    loop over ``n_envs / n_cores`` envs in each of ``n_cores`` processes
    at once, their agent steps per second summed (no collection, no
    learner: the bound of any collector here, ``multi`` included)."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(n_cores), ctx.Queue()
    parts = [ctx.Process(target=_ceiling_part, daemon=True,
                         args=(n_envs // n_cores, seconds, barrier, out))
             for _ in range(n_cores)]
    for part in parts:
        part.start()
    try:
        rates = [out.get(timeout=60 + 10 * seconds) for _ in parts]
    finally:
        for part in parts:
            part.join(timeout=10)
            if part.is_alive():
                part.kill()
                part.join()
    return {"steps_per_s": sum(r["steps_per_s"] for r in rates)}


def run_alternating(n_envs, seconds):
    """``same.rollout`` and the hand loop fragment by fragment in one
    window (:func:`~harness.alternated`): same's agent steps/s, and
    ``x_hand`` its ratio to the hand loop's in that window."""
    feed = same.rollout(make_env, Actor(), N_STEPS, n_envs * N_AGENTS,
                        copy=False)
    with feed:
        rates = alternated({"same": lambda: next(feed),
                            "hand": hand_loop(n_envs)},
                           N_STEPS * n_envs * N_AGENTS, seconds)
    return dict(rates["same"], x_hand=rates["same"]["steps_per_s"]
                / rates["hand"]["steps_per_s"])


def run_same(n_envs, seconds):
    feed = same.rollout(make_env, Actor(), N_STEPS, n_envs * N_AGENTS,
                        copy=False)
    with feed:
        return _timed(lambda: next(feed), N_STEPS * n_envs * N_AGENTS,
                      seconds)


def run_multi(n_envs, seconds):
    k = n_envs // 2
    feed = multi.rollout(make_env, Actor(), N_STEPS, 2, k * N_AGENTS, 4, 2)
    with feed:
        warm_workers(feed)
        return _timed(lambda: next(feed), N_STEPS * 2 * k * N_AGENTS,
                      seconds)


def run_supersuit(n_envs, seconds, num_cpus):
    try:
        import supersuit
    except ImportError:
        return "needs supersuit (rlplay[bench])"
    vec = supersuit.concat_vec_envs_v1(
        supersuit.pettingzoo_env_to_vec_env_v1(make_env()), n_envs,
        num_cpus=num_cpus, base_class="gymnasium")
    net = mlp()
    try:
        obs, _ = vec.reset(seed=0)

        def fragment():
            nonlocal obs
            for _ in range(N_STEPS):
                act = sample(net, torch.as_tensor(obs)).numpy()
                obs = vec.step(act)[0]
        return _timed(fragment, N_STEPS * n_envs * N_AGENTS, seconds)
    finally:
        vec.close()


def _torchrl_policy():
    from tensordict.nn import TensorDictModule

    class Sampler(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, obs):
            return sample(self.net, obs)
    return TensorDictModule(Sampler(), in_keys=[("agent", "observation")],
                            out_keys=[("agent", "action")])


def _serial(n):
    from torchrl.envs import SerialEnv
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper
    return SerialEnv(n, lambda: PettingZooWrapper(make_env()))


def run_torchrl(n_envs, seconds, workers):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchrl.collectors import Collector, MultiSyncCollector
    except ImportError:
        return "needs torchrl (rlplay[bench])"
    frames = N_STEPS * n_envs  # env steps of a batch: N_STEPS per env
    with warnings.catch_warnings():  # its PettingZoo version, transforms
        warnings.simplefilter("ignore")
        if workers == 1:
            collector = Collector(_serial(n_envs), _torchrl_policy(),
                                  frames_per_batch=frames)
        else:
            k = n_envs // workers
            collector = MultiSyncCollector(
                [lambda: _serial(k)] * workers, _torchrl_policy(),
                frames_per_batch=frames)
        it = iter(collector)
        try:
            return _timed(lambda: next(it), frames * N_AGENTS, seconds)
        finally:
            collector.shutdown()


def rows(n_envs):
    k = n_envs // 2
    return [
        Row("spread/hand", lambda s: run_hand(n_envs, s)),
        Row("spread/same.rollout", lambda s: run_same(n_envs, s)),
        Row("spread/same.rollout.alternating",
            lambda s: run_alternating(n_envs, s)),
        Row(f"spread/ceiling.2x{k}", lambda s: run_ceiling(n_envs, s)),
        Row(f"spread/multi.rollout.2x{k}", lambda s: run_multi(n_envs, s)),
        Row("spread/supersuit.sync",
            lambda s: run_supersuit(n_envs, s, 0)),
        Row("spread/supersuit.procs",
            lambda s: run_supersuit(n_envs, s, 2)),
        Row("spread/torchrl.collector",
            lambda s: run_torchrl(n_envs, s, 1)),
        Row(f"spread/torchrl.multi.2x{k}",
            lambda s: run_torchrl(n_envs, s, 2)),
    ]


def report(results, skipped, failed, args):
    def values(name):
        return {r: v["steps_per_s"] for r, v in results.get(name, {}).items()}

    hand = values("spread/hand")
    peers = [name for name in results
             if name.split("/")[1].startswith(("supersuit", "torchrl"))]
    multi_name = next((n for n in results if "multi.rollout" in n), None)
    ceiling = values(next((n for n in results if "ceiling" in n), ""))
    records = []
    for name in results:
        item = record(name, "row", values(name))
        own = [v["x_hand"] for v in results[name].values() if "x_hand" in v]
        x_hand = own or (paired(values(name), hand) if hand else None)
        if x_hand:
            item["x_hand"] = median(x_hand)
        # multi over the fastest peer, and the most that 2 cores allow
        if (name == multi_name or "ceiling" in name) and peers:
            best = {r: max(values(p).get(r, 0) for p in peers)
                    for r in values(name)}
            ratios = paired(values(name), best)
            if ratios:
                item["x_peer"] = median(ratios)
        if name == multi_name and paired(values(name), ceiling):
            item["of_ceiling"] = median(paired(values(name), ceiling))
        records.append(item)
    for name, why in {**skipped, **failed}.items():
        records.append({"name": name, "skipped": why})
    if args.json:
        print_json(records)
        return
    print(f"simple_spread_v3, {args.envs} envs x {N_AGENTS} agents, "
          f"{args.rounds} rounds of {args.seconds} s; agent steps/s")
    print(f"{'name':32} {'agent steps/s [min-max]':>30}  x_hand  x_peer"
          f"  x_ceil")
    for item in records:
        if "skipped" in item:
            print(f"{item['name']:32} skipped: {item['skipped']}")
            continue
        print(f"{item['name']:32} {spread(item):>30}  "
              f"{fmt(item.get('x_hand')):>6}  {fmt(item.get('x_peer')):>6}"
              f"  {fmt(item.get('of_ceiling')):>6}")


def main(argv=None):
    global N_STEPS  # the rows read it
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="timed seconds per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--envs", type=int, default=8,
                        help="simple_spread envs (even)")
    parser.add_argument("--steps", type=int, default=N_STEPS,
                        help="steps per fragment (and per peer batch)")
    args = parser.parse_args(argv)
    if args.envs < 2 or args.envs % 2:
        parser.error(f"--envs must be an even number of at least 2, got "
                     f"{args.envs}")
    try:
        make_env()
    except ImportError:
        print("needs mpe2 (pip install mpe2)", file=sys.stderr)
        return
    N_STEPS = args.steps
    torch.set_num_threads(1)
    results, skipped, failed = measure(rows(args.envs), args.rounds,
                                       args.seconds)
    report(results, skipped, failed, args)


if __name__ == "__main__":
    main()
