"""Replay buffers: ``extend`` and ``sample`` throughput of rlplay's
``Replay``/``PrioritizedReplay`` beside TorchRL's ``ReplayBuffer`` and
Stable-Baselines3's ``ReplayBuffer``, on the same data.

    python benchmarks/replay.py [--json] [--rounds 5] [--seconds 1.0]

Two observation shapes: ``cartpole`` (4 float32) and ``atari`` (4 x 84 x 84
uint8); actions are one int64, 8 env columns of 128-step fragments with an
episode end every 50 steps on average. Each library gets the data in its
own native form, made before the timing: rlplay a fragment batch (``1 + T``
rows of ``B`` columns, as every generator yields), TorchRL a TensorDict of
``T x B`` transitions with ``("next", "observation")`` (its collectors'
layout), SB3 ``T`` calls of ``add`` with ``B`` envs each (its algorithms'
loop). Rows (``<library>/<operation>.<shape>``):

``extend``
    transitions stored per second, into a buffer of ``--capacity``
    (``--capacity-atari``) transitions, filled past its capacity.
``sample.uniform`` / ``sample.uniform.n3``
    batches of 256 drawn per second (n-step 1, and 3 where the library has
    n-step sampling: rlplay's ``n_step=3``, SB3's ``NStepReplayBuffer``).
``sample_update.prioritized``
    batches of 256 drawn and their priorities updated per second
    (rlplay's ``PrioritizedReplay``, TorchRL's ``PrioritizedSampler``;
    alpha 0.6, beta 0.4).
``memory``
    bytes per stored transition of the full buffer (image observations:
    rlplay stores each observation once, SB3 and TorchRL twice).

Rows of a round are interleaved (every library, then the next operation);
each prints its median and spread (min-max) over ``--rounds``, and the
ratio over each peer per round (``x_torchrl``, ``x_sb3``). A row whose
peer is not installed (the ``bench`` extra, ``pip install -e '.[bench]'``
in the clone) is skipped with a note. Nothing here asserts a timing.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch

from rlplay.engine import PrioritizedReplay, Replay
from rlplay.engine.core import EpisodeStats, Fragment, Meta, State

T, B, BATCH = 128, 8, 256
SHAPES = {"cartpole": ((4,), np.float32), "atari": ((4, 84, 84), np.uint8)}
LIBRARIES = ("rlplay", "torchrl", "sb3")


# ------------------------------------------------------------------ data --

class Data:
    """``n`` fragments of one shape in every library's form."""

    def __init__(self, shape, dtype, n, seed=0):
        rng = np.random.default_rng(seed)
        self.shape, self.dtype = shape, dtype
        rows = n * T + 1
        if dtype == np.uint8:
            obs = rng.integers(0, 255, (rows, B, *shape), np.uint8)
        else:
            obs = rng.normal(size=(rows, B, *shape)).astype(dtype)
        fin = rng.random((rows, B)) < 1 / 50
        fin[0] = True
        truncated = fin & (rng.random((rows, B)) < 0.2)
        act = rng.integers(0, 2, (rows, B))
        rew = rng.normal(size=(rows, B)).astype(np.float32)
        # the true last observations where episodes ended (made up)
        final = obs.copy()
        final[fin] = obs[::-1][fin]
        self.fragments = []
        for k in range(n):
            rs = slice(k * T, k * T + T + 1)
            length = np.where(fin[rs], 5, 0)
            length[0] = 0
            # every row but 0 is a transition (no frozen rows, no lost calls)
            moved = torch.ones(T + 1, B, dtype=torch.bool)
            moved[0] = False
            self.fragments.append(Fragment(
                state=State(stepno=torch.zeros(T + 1, B, dtype=torch.int64),
                            obs=torch.from_numpy(obs[rs].copy()),
                            act=torch.from_numpy(act[rs].copy()),
                            rew=torch.from_numpy(rew[rs].copy()),
                            fin=torch.from_numpy(fin[rs].copy())),
                truncated=torch.from_numpy(truncated[rs].copy()),
                final=torch.from_numpy(final[rs].copy()), actor={},
                env={}, env_mask={}, hx=(),
                stats=EpisodeStats(torch.zeros(T + 1, B),
                                   torch.from_numpy(length)),
                meta=Meta(version=torch.zeros(B, dtype=torch.int64),
                          worker=torch.zeros(B, dtype=torch.int64),
                          env=torch.arange(B), seq=torch.zeros(B, dtype=torch.int64),
                          generation=torch.zeros(B, dtype=torch.int64)),
                # (an older rlplay's fragments have no acted field)
                **({"acted": moved} if "acted" in Fragment._fields else {})))
        # transitions, row t -> t + 1, for the peers
        self.transitions = []
        for k in range(n):
            t = slice(k * T, k * T + T)
            t1 = slice(k * T + 1, k * T + T + 1)
            done = fin[t1]
            self.transitions.append(dict(
                obs=obs[t], next_obs=np.where(
                    done.reshape(*done.shape, *[1] * len(shape)),
                    final[t1], obs[t1]),
                act=act[t1], rew=rew[t1], done=done,
                truncated=truncated[t1]))
        self._seq = 0

    def fragment(self, k):
        """Fragment ``k`` stamped with the next ``meta.seq``."""
        f = self.fragments[k % len(self.fragments)]
        f.meta.seq.fill_(self._seq)
        self._seq += 1
        return f

    def tensordict(self, k):
        from tensordict import TensorDict
        tr = self.transitions[k % len(self.transitions)]
        N = T * B

        def flat(x):
            return torch.from_numpy(np.ascontiguousarray(
                x.reshape(N, *x.shape[2:])))
        return TensorDict({
            "observation": flat(tr["obs"]), "action": flat(tr["act"]),
            "next": {"observation": flat(tr["next_obs"]),
                     "reward": flat(tr["rew"]).unsqueeze(-1),
                     "done": flat(tr["done"]).unsqueeze(-1),
                     "terminated": flat(tr["done"] & ~tr["truncated"])
                     .unsqueeze(-1),
                     "truncated": flat(tr["truncated"]).unsqueeze(-1)}},
            batch_size=[N])


# ----------------------------------------------------------- the buffers --

def _timed(fn, seconds):
    """Calls of ``fn`` per second (after one warm-up call)."""
    fn()
    n, tic = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - tic
        if elapsed >= seconds:
            return n / elapsed


class RlplayBench:
    name = "rlplay"

    def __init__(self, data, capacity, prioritized=False):
        cls = PrioritizedReplay if prioritized else Replay
        self.buffer = cls(capacity, seed=0)
        self.data, self.k = data, 0

    def extend(self):
        self.buffer.extend(self.data.fragment(self.k))
        self.k += 1

    def sample(self, n_step=1):
        return self.buffer.sample(BATCH, n_step=n_step, gamma=0.99)

    def sample_update(self, rng):
        tr = self.buffer.sample(BATCH, gamma=0.99)
        self.buffer.update(tr.index, rng.random(BATCH))

    def memory(self):
        # every node's arrays (and a sampler's per node), over the
        # transitions held
        buffer = self.buffer
        return buffer.nbytes_per_node * buffer.capacity / len(buffer)


class TorchRLBench:
    name = "torchrl"

    def __init__(self, data, capacity, prioritized=False):
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.data.replay_buffers.samplers import (PrioritizedSampler,
                                                          RandomSampler)
        sampler = PrioritizedSampler(capacity, alpha=0.6, beta=0.4) \
            if prioritized else RandomSampler()
        self.buffer = ReplayBuffer(storage=LazyTensorStorage(capacity),
                                   sampler=sampler, batch_size=BATCH)
        self.data, self.k, self.capacity = data, 0, capacity
        self.tds = [data.tensordict(k) for k in range(len(data.fragments))]

    def extend(self):
        self.buffer.extend(self.tds[self.k % len(self.tds)])
        self.k += 1

    def sample(self, n_step=1):
        return self.buffer.sample()

    def sample_update(self, rng):
        # the indices (and importance weights) come in the info, not in
        # the data, of a plain ReplayBuffer; its sum tree is float32
        _, info = self.buffer.sample(return_info=True)
        self.buffer.update_priority(info["index"], torch.from_numpy(
            rng.random(BATCH, dtype=np.float32)))

    def memory(self):
        storage = self.buffer._storage._storage
        total = sum(x.numel() * x.element_size()
                    for x in storage.values(True, True))
        return total / len(self.buffer)


class SB3Bench:
    name = "sb3"

    def __init__(self, data, capacity, n_step=1):
        import gymnasium
        from stable_baselines3.common.buffers import (NStepReplayBuffer,
                                                      ReplayBuffer)
        low, high = (0, 255) if data.dtype == np.uint8 else (-np.inf, np.inf)
        obs_space = gymnasium.spaces.Box(low, high, data.shape, data.dtype)
        act_space = gymnasium.spaces.Discrete(2)
        cls, kwargs = ReplayBuffer, {}
        if n_step > 1:
            cls, kwargs = NStepReplayBuffer, {"n_steps": n_step,
                                               "gamma": 0.99}
        self.buffer = cls(capacity, obs_space, act_space, device="cpu",
                          n_envs=B, handle_timeout_termination=True,
                          **kwargs)
        self.data, self.k = data, 0

    def extend(self):
        tr = self.data.transitions[self.k % len(self.data.transitions)]
        for t in range(T):
            infos = [{"TimeLimit.truncated": bool(x)}
                     for x in tr["truncated"][t]]
            self.buffer.add(tr["obs"][t], tr["next_obs"][t],
                            tr["act"][t][:, None], tr["rew"][t],
                            tr["done"][t], infos)
        self.k += 1

    def sample(self, n_step=1):
        return self.buffer.sample(BATCH)

    def memory(self):
        buf = self.buffer
        total = sum(getattr(buf, name).nbytes for name in (
            "observations", "next_observations", "actions", "rewards",
            "dones", "timeouts") if getattr(buf, name, None) is not None)
        return total / (buf.buffer_size * buf.n_envs)


def _make(library, data, capacity, **kwargs):
    try:
        if library == "rlplay":
            return RlplayBench(data, capacity, **kwargs)
        if library == "torchrl":
            return TorchRLBench(data, capacity, **kwargs)
        return SB3Bench(data, capacity, **kwargs)
    except ImportError as exc:
        return f"{library} is not installed ({exc.name}; rlplay[bench])"
    except RuntimeError as exc:  # e.g. a C++ extension built for another torch
        return (f"{library} failed to set up: {exc} (TorchRL's sum tree is "
                f"a C++ extension that loads only with the torch its wheel "
                f"was built for: make bench-torchrl)")


# ------------------------------------------------------------- a round --

def one_round(shape_name, data, capacity, seconds, results, skipped):
    def put(name, value):
        if isinstance(value, str):
            skipped.setdefault(name, value)
        else:
            results.setdefault(name, []).append(value)

    rng = np.random.default_rng(0)
    benches = {}
    for library in LIBRARIES:
        bench = _make(library, data, capacity)
        name = f"{library}/extend.{shape_name}"
        if isinstance(bench, str):
            put(name, bench)
            continue
        # fill past capacity, timing whole fragments of T x B transitions
        n = 0
        tic = time.perf_counter()
        while n * T * B < capacity or time.perf_counter() - tic < seconds:
            bench.extend()
            n += 1
        put(name, n * T * B / (time.perf_counter() - tic))
        benches[library] = bench
    for library, bench in benches.items():
        put(f"{library}/sample.uniform.{shape_name}",
            _timed(bench.sample, seconds))
    for library in LIBRARIES:
        name = f"{library}/sample.uniform.n3.{shape_name}"
        if library == "torchrl":
            put(name, "TorchRL computes n-step returns when it stores them "
                      "(MultiStepTransform), not when it samples")
            continue
        if library not in benches:
            continue
        if library == "sb3":
            bench = _make("sb3", data, capacity, n_step=3)
            while bench.k * T * B < capacity:
                bench.extend()
        else:
            bench = benches[library]
        put(name, _timed(lambda: bench.sample(3), seconds))
    for library in LIBRARIES:
        name = f"{library}/memory.{shape_name}"
        if library in benches:
            results.setdefault(name, []).append(benches[library].memory())
    benches.clear()
    for library in ("rlplay", "torchrl"):
        name = f"{library}/sample_update.prioritized.{shape_name}"
        bench = _make(library, data, capacity, prioritized=True)
        if isinstance(bench, str):
            put(name, bench)
            continue
        while bench.k * T * B < capacity:
            bench.extend()
        put(name, _timed(lambda: bench.sample_update(rng), seconds))


def report(results, skipped, args):
    records = []
    for name, values in results.items():
        library, op = name.split("/", 1)
        item = {"name": name, "per_s": float(np.median(values)),
                "min": float(min(values)), "max": float(max(values))}
        for peer in ("torchrl", "sb3"):
            other = results.get(f"{peer}/{op}")
            if library == "rlplay" and other:
                ratios = [a / b for a, b in zip(values, other)]
                if op.startswith("memory"):
                    ratios = [b / a for a, b in zip(values, other)]
                item[f"x_{peer}"] = float(np.median(ratios))
                item[f"x_{peer}_min"] = float(min(ratios))
                item[f"x_{peer}_max"] = float(max(ratios))
        records.append(item)
    for name, why in skipped.items():
        records.append({"name": name, "skipped": why})
    if args.json:
        for item in records:
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in item.items()}))
        return
    print(f"{args.rounds} rounds x {args.seconds:g} s; batch {BATCH}; "
          f"capacity {args.capacity} (atari {args.capacity_atari}); "
          f"torch {torch.__version__}")
    print(f"{'name':42} {'per_s [min-max]':>28}  x_torchrl [min-max]   "
          f"x_sb3 [min-max]")
    for item in records:
        if "skipped" in item:
            print(f"{item['name']:42} skipped: {item['skipped']}")
            continue
        spread = f"[{item['min']:,.0f}-{item['max']:,.0f}]"
        line = f"{item['name']:42} {item['per_s']:>10,.0f} {spread:<17}"
        for peer in ("torchrl", "sb3"):
            if f"x_{peer}" in item:
                line += (f" {item[f'x_{peer}']:6.2f} "
                         f"[{item[f'x_{peer}_min']:.2f}-"
                         f"{item[f'x_{peer}_max']:.2f}]")
            else:
                line += f" {'-':>6} {'':13}"
        print(line)
    print("per_s: transitions stored (extend), batches of 256 (sample, "
          "sample_update), bytes per transition (memory: x = peer's bytes "
          "over rlplay's); x_<peer>: rlplay over the peer, per round.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="timed seconds per row and round")
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--capacity-atari", type=int, default=20_000)
    parser.add_argument("--only", default="",
                        help="cartpole or atari (default both)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be at least 1 and --seconds positive")
    torch.set_num_threads(1)
    results, skipped = {}, {}
    data = {name: Data(shape, dtype, 4) for name, (shape, dtype)
            in SHAPES.items() if args.only in ("", name)}
    for round_ in range(args.rounds):
        for name, d in data.items():
            capacity = args.capacity_atari if name == "atari" \
                else args.capacity
            one_round(name, d, capacity, args.seconds, results, skipped)
        print(f"round {round_ + 1} done", file=sys.stderr)
    report(results, skipped, args)


if __name__ == "__main__":
    main()
