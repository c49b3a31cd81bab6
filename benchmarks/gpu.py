"""Batches on a GPU: what rlplay's CUDA path costs on a pixel workload.

Needs CUDA: without it the script says so in one line and exits 0, unless
``--device cpu`` asks for a dry run of every section on the CPU (no
page-locked memory, wall-clock timers; the numbers mean nothing, the run
checks that the script works).

The workload: :class:`~workloads.PixelEnv` (``(4, 84, 84)`` uint8 frames, a
step that costs next to nothing) and a Nature-CNN actor
(:class:`~workloads.CNNActor`) in the workers, on their CPU, one torch
thread each. Sections, each a table (``--json``: one object per line):

``bandwidth``
    The device's host-to-device bandwidth for one tensor the size of a
    batch, from page-locked and from pageable memory (CUDA events, median
    and spread over ``--rounds`` copies).
``delivery``
    ``multi.rollout`` (``--actors`` workers of ``--envs`` envs, fragments of
    ``--steps`` steps, ``--per-batch`` fragments a batch) delivering on the
    host, in page-locked memory and on the device, the rows interleaved
    over ``--rounds`` rounds: steps/s [min-max], ``time_collate`` per batch
    (the collation and, on the device, the enqueueing of the copy) and the
    MB/s of batches that reach the learner. Then the copy itself: one
    batch of that layout delivered to the device by rlplay's
    ``Delivery`` (one non-blocking copy per leaf, CUDA events around
    them), in GB/s and as a share of the page-locked bandwidth of the
    same bytes.
``train``
    The learner trains the same CNN on the GPU on each batch (an
    actor-critic step: forward over the ``T * B`` frames, loss, backward,
    Adam). Times per batch: the copy alone, the training step alone on a
    batch already on the device, and, in a loop over
    ``multi.rollout(device=...)``, the wall time, the learner's wait in
    ``next()`` and the training step timed from the moment ``next()``
    returned (it waits on the GPU for the copy first: its excess over the
    step alone is the learner's wait for the copy).
``inference``
    One forward pass and a sampled action for ``n`` envs, ``n`` in 8, 64,
    256 and 1024: on the GPU (frames copied from page-locked memory,
    actions copied back: the round trip a central inference server
    makes) and on one CPU core (one torch thread: what each worker does),
    for the Nature CNN and for a 17-64-64-6 MLP; milliseconds a call and
    microseconds an env, and how many worker cores one GPU call replaces.

``served`` (where ``--sections`` names it)
    ``multi.rollout`` with the CNN in every worker (on its CPU core)
    beside ``serve=True`` (one inference server on the device, each
    worker's envs in ``groups`` 1 and 2), at the same workers and envs,
    the rows interleaved over the rounds: steps/s [min-max], the rows of
    an average server call and the share of the server's busy time spent
    in the forward pass.

    python benchmarks/gpu.py [--json] [--rounds 5] [--seconds 3]
                             [--device cuda] [--quick]
"""
import argparse
import sys
import time
from contextlib import closing

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from harness import print_json, stats
from rlplay.engine.nested import flatten, suply
from rlplay.engine.rollout import multi
from rlplay.engine.rollout._delivery import Delivery
from workloads import N_CPUS, CNNActor, NatureCNN, PixelEnv

INFERENCE_SIZES = (8, 64, 256, 1024)
MB = 1e6


class Clock:
    """Elapsed seconds of work queued on ``device``: CUDA events there, the
    wall clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, work):
        """``work()``'s result and the seconds the device took for it."""
        if not self.cuda:
            tic = time.perf_counter()
            out = work()
            return out, time.perf_counter() - tic
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        out = work()
        end.record()
        end.synchronize()
        return out, start.elapsed_time(end) / 1e3


def batch_bytes(batch):
    return sum(x.numel() * x.element_size() for x in flatten(batch))


def feed(args, **kwargs):
    # the reused device batch (copy=False), as the results kept here were
    # measured before copy=True became the default
    kwargs.setdefault("copy", False)
    return multi.rollout(PixelEnv, CNNActor(), args.steps, args.actors,
                         args.envs, 2 * args.per_batch, args.per_batch,
                         entropy=0, timeout=120.0, **kwargs)


# -------------------------------------------------------------- delivery --

def delivery_rows(args, device, pinned_ok):
    """steps/s, collation time per batch and MB/s to the learner, for each
    target, the rows interleaved over the rounds."""
    targets = {"host": {}, "pinned": dict(pinned=True),
               "device": dict(device=device)}
    if not pinned_ok:
        del targets["pinned"]
    per_batch = args.steps * args.envs * args.per_batch
    results = {name: [] for name in targets}
    size = None
    for _ in range(args.rounds):
        for name, kwargs in targets.items():
            with closing(feed(args, **kwargs)) as it:
                batch = next(it)  # the workers started, the CNN warm
                size = batch_bytes(batch)
                tic, before = time.perf_counter(), dict(it.stats)
                n = 0
                while time.perf_counter() - tic < args.seconds or n < 2:
                    next(it)
                    n += 1
                Clock(device).sync()
                wall = time.perf_counter() - tic
                collate = (it.stats["time_collate"]
                           - before["time_collate"]) / n
                results[name].append((n * per_batch / wall, collate,
                                      n * size / wall / MB))
    return results, size


def served_rows(args, device):
    """steps/s, rows per server call and forward share of the server's
    busy time, for per-worker inference and the served mode, the rows
    interleaved over the rounds."""
    targets = {"per-worker": {},
               "served.groups1": dict(serve=True, actor_device=device),
               "served.groups2": dict(serve=True, actor_device=device,
                                      groups=2)}
    if args.envs % 2:
        del targets["served.groups2"]
    per_batch = args.steps * args.envs * args.per_batch
    results = {name: [] for name in targets}
    for _ in range(args.rounds):
        for name, kwargs in targets.items():
            with closing(feed(args, **kwargs)) as it:
                next(it)  # the workers (and the server) started
                tic, before = time.perf_counter(), dict(it.stats)
                n = 0
                while time.perf_counter() - tic < args.seconds or n < 2:
                    next(it)
                    n += 1
                wall = time.perf_counter() - tic
                after = it.stats
                calls = after.get("served_calls", 0) - before.get(
                    "served_calls", 0)
                rows = after.get("served_rows", 0) - before.get(
                    "served_rows", 0)
                busy = after.get("time_serve_busy", 0.0) - before.get(
                    "time_serve_busy", 0.0)
                forward = after.get("time_serve_forward", 0.0) - \
                    before.get("time_serve_forward", 0.0)
                results[name].append((n * per_batch / wall,
                                      rows / max(calls, 1),
                                      forward / busy if busy else 0.0))
    return results


def copies(args, device, rounds):
    """GB/s of host-to-device copies, the three kinds interleaved copy by
    copy (so that each sees the same machine): one batch of the delivery
    layout by ``Delivery`` (one non-blocking copy a leaf, from page-locked
    memory), and one tensor of the same bytes from page-locked and from
    pageable memory. Returns ``({kind: [GB/s]}, the per-round ratios of
    the delivery to the page-locked tensor, the batch's bytes)``."""
    cuda = device.type == "cuda"
    with closing(feed(args, pinned=cuda, copy=True)) as it:
        host = next(it)
    n_bytes = batch_bytes(host)
    clock = Clock(device)
    delivery = Delivery(device, copy=False) if cuda \
        else Delivery(copy=True)
    tensors = {kind: (torch.empty(n_bytes, dtype=torch.uint8,
                                  pin_memory=pinned and cuda),
                      torch.empty(n_bytes, dtype=torch.uint8, device=device))
               for kind, pinned in (("pinned", True), ("pageable", False))}

    def tensor_copy(kind):
        source, target = tensors[kind]
        return lambda: target.copy_(source, non_blocking=kind == "pinned")

    work = {"delivery": lambda: delivery(host),
            "pinned": tensor_copy("pinned"),
            "pageable": tensor_copy("pageable")}
    rates = {kind: [] for kind in work}
    for round_ in range(rounds + 2):  # two rounds of warm-up
        for kind, copy in work.items():
            _, seconds = clock.time(copy)
            delivery.wait()
            if round_ >= 2:
                rates[kind].append(n_bytes / seconds / 1e9)
    delivery.close()
    ratios = [d / p for d, p in zip(rates["delivery"], rates["pinned"])]
    return rates, ratios, n_bytes


# ----------------------------------------------------------------- train --

class Learner:
    """An actor-critic step of the Nature CNN on ``device`` over a batch's
    ``T * B`` frames (advantages from the recorded values: enough work of
    the right shape, not a tuned algorithm)."""

    def __init__(self, device):
        self.net = NatureCNN().to(device)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-4)

    def step(self, batch):
        obs = batch.state.obs[:-1]
        T, B = obs.shape[:2]
        logits, value = self.net(obs.reshape(T * B, *obs.shape[2:]))
        act = batch.state.act[1:].reshape(T * B)
        target = batch.state.rew[1:].reshape(T * B) \
            + 0.99 * batch.actor["value"][1:].reshape(T * B)
        adv = (target - value).detach()
        logp = torch.log_softmax(logits, -1).gather(
            1, act.unsqueeze(1)).squeeze(1)
        loss = -(logp * adv).mean() + F.mse_loss(value, target)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss


def train_rows(args, device):
    """Per batch: the copy alone, the training step alone, and in a loop
    over ``multi.rollout(device=...)`` the wall time, the wait in
    ``next()`` and the step timed from when ``next()`` returned."""
    clock, learner = Clock(device), Learner(device)
    with torch.enable_grad(), closing(feed(args, device=device)) as it:
        batch = next(it)
        for _ in range(3):  # warm-up (cuDNN's choice of kernels)
            learner.step(batch)
        alone = [clock.time(lambda: learner.step(batch))[1]
                 for _ in range(args.rounds * 4)]
        # the copy alone: this batch, back in page-locked host memory,
        # delivered again as next() delivers it
        cuda = device.type == "cuda"
        host = suply(lambda x: x.cpu().pin_memory() if cuda else x.clone(),
                     batch)
        delivery = Delivery(device, copy=False) if cuda \
        else Delivery(copy=True)
        copy = []
        for _ in range(args.rounds * 4):
            copy.append(clock.time(lambda: delivery(host))[1])
            delivery.wait()
        delivery.close()
        waits, steps, walls = [], [], []
        deadline = time.perf_counter() + args.seconds * args.rounds
        while time.perf_counter() < deadline or len(walls) < 3:
            tic = time.perf_counter()
            batch = next(it)
            toc = time.perf_counter()
            learner.step(batch).item()  # waits for the copy, then trains
            done = time.perf_counter()
            waits.append(toc - tic)
            steps.append(done - toc)
            walls.append(done - tic)
    return {"copy": stats(copy), "step_alone": stats(alone),
            "next": stats(waits),
            "step_in_loop": stats(steps), "wall": stats(walls),
            "batches": len(walls)}


# ------------------------------------------------------------- inference --

class MLP(nn.Module):
    """HalfCheetah's size of policy: 17-64-64-6."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(17, 64), nn.Tanh(),
                                 nn.Linear(64, 64), nn.Tanh(),
                                 nn.Linear(64, 6))

    def forward(self, obs):
        return self.net(obs), None


def inference_call(model, host, device):
    """One central-inference round trip for the envs of ``host``: the
    observations to ``device``, a forward pass, sampled actions back."""
    obs = host.to(device, non_blocking=True)
    logits, _ = model(obs)
    action = torch.distributions.Categorical(logits=logits).sample()
    return action.cpu()


def time_calls(call, seconds, min_calls=3):
    """Median and spread of one call's seconds, over ``seconds``."""
    call()
    call()
    times, tic = [], time.perf_counter()
    while time.perf_counter() - tic < seconds or len(times) < min_calls:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return stats(times)


def inference_rows(args, device):
    """ms per call on the device and on one CPU core, per model and n."""
    pinned = device.type == "cuda"
    models = {"cnn": (NatureCNN, lambda n: torch.randint(
        0, 256, (n, 4, 84, 84), dtype=torch.uint8)),
              "mlp": (MLP, lambda n: torch.randn(n, 17))}
    rows = []
    threads = torch.get_num_threads()
    for name, (make_model, make_obs) in models.items():
        on_device, on_cpu = make_model().to(device), make_model()
        for n in args.sizes:
            obs = make_obs(n)
            host = obs.pin_memory() if pinned else obs
            gpu = time_calls(lambda: inference_call(on_device, host, device),
                             args.seconds / 2)
            torch.set_num_threads(1)
            try:
                cpu = time_calls(lambda: inference_call(on_cpu, obs, "cpu"),
                                 args.seconds / 2)
            finally:
                torch.set_num_threads(threads)
            rows.append({"model": name, "n": n, "device_ms": gpu,
                         "cpu_ms": cpu})
    return rows


# ------------------------------------------------------------------ main --

def fmt3(triple, scale=1.0, width=8, digits=1):
    mid, low, high = (value * scale for value in triple)
    return (f"{mid:>{width},.{digits}f} "
            f"[{low:,.{digits}f}-{high:,.{digits}f}]")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--actors", type=int, default=None,
                        help="workers (default: the cores less two, at "
                        "most 12)")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--per-batch", type=int, default=4)
    parser.add_argument("--copies", type=int, default=100,
                        help="copies of each kind in the bandwidth section")
    parser.add_argument("--sections", default="delivery,train,inference",
                        help="a comma-separated subset of delivery (with "
                        "the bandwidth), train, inference, served (not "
                        "by default)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny run: 2 workers of 2 envs, 1 round "
                        "of 0.3 s, n in 8 and 64")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: needs CUDA, and this machine has none "
              "(--device cpu runs it dry on the CPU)")
        return 0
    if args.actors is None:
        args.actors = max(1, min(12, N_CPUS - 2))
    args.sizes = INFERENCE_SIZES
    if args.quick:
        args.actors, args.envs, args.steps, args.per_batch = 2, 2, 8, 2
        args.rounds, args.seconds, args.sizes = 1, 0.3, (8, 64)
        args.copies = 5
    args.sections = set(args.sections.split(","))
    unknown = args.sections - {"delivery", "train", "inference", "served"}
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}")
    torch.set_num_threads(2)
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else "cpu (dry run)"
    print(f"# device: {name}; torch {torch.__version__}; {N_CPUS} CPUs; "
          f"{args.actors} workers x {args.envs} envs, fragments of "
          f"{args.steps} steps, {args.per_batch} a batch", flush=True)
    records = []

    copy_mid = None
    if "delivery" in args.sections:
        with torch.no_grad():
            rates, ratios, copied = copies(args, device, args.copies)
        copy_mid = stats(rates["delivery"])[0]
        print(f"\n## bandwidth, {copied / MB:.1f} MB host to device, "
              f"{args.copies} copies of each kind interleaved (GB/s, "
              f"median [min-max])")
        for kind, label in (("pinned", "one tensor, page-locked"),
                            ("pageable", "one tensor, pageable"),
                            ("delivery", "a batch by Delivery")):
            print(f"{label:<26} {fmt3(stats(rates[kind]), digits=2)}")
            records.append({"name": f"bandwidth/{kind}",
                            "gb_per_s": stats(rates[kind])})
        share = stats(ratios)
        print(f"Delivery's copy over the page-locked tensor's, per round: "
              f"{fmt3(share, 100, width=4, digits=0)} %")
        records.append({"name": "bandwidth/share", "ratio": share,
                        "bytes": copied})

        with torch.no_grad():
            results, size = delivery_rows(args, device, pinned_ok=cuda)
        print(f"\n## delivery: multi.rollout, batches of {size / MB:.1f} MB")
        print(f"{'target':<8} {'steps/s [min-max]':<28} "
              f"{'collate ms/batch':<24} MB/s to the learner")
        for target, rounds in results.items():
            rate, collate, mbps = (stats([r[i] for r in rounds])
                                   for i in range(3))
            print(f"{target:<8} {fmt3(rate, width=9, digits=0):<28} "
                  f"{fmt3(collate, 1e3, width=6, digits=2):<24} "
                  f"{fmt3(mbps, width=7, digits=0)}")
            records.append({"name": f"delivery/{target}",
                            "steps_per_s": rate, "collate_s": collate,
                            "mb_per_s": mbps})

    if "train" in args.sections:
        train_section(args, device, name, records)
    if "inference" in args.sections:
        inference_section(args, device, name, records)
    if "served" in args.sections:
        served_section(args, device, name, records)
    if args.json:
        print_json(records)
    return 0


def served_section(args, device, name, records):
    with torch.no_grad():
        results = served_rows(args, device)
    print(f"\n## served: the CNN in each worker, or served on {name} "
          f"(median [min-max])")
    print(f"{'inference':<16} {'steps/s':<28} {'rows/call':<22} "
          f"forward share")
    for target, rounds in results.items():
        rate, rows, share = (stats([r[i] for r in rounds])
                             for i in range(3))
        print(f"{target:<16} {fmt3(rate, width=9, digits=0):<28} "
              f"{fmt3(rows, width=5, digits=1):<22} "
              f"{fmt3(share, 100, width=3, digits=0)} %")
        records.append({"name": f"served/{target}", "steps_per_s": rate,
                        "rows_per_call": rows, "forward_share": share})


def train_section(args, device, name, records):
    train = train_rows(args, device)
    copy_ms = train["copy"][0] * 1e3
    print(f"\n## train: the CNN on {name}, per batch "
          f"({train['batches']} batches; ms, median [min-max])")
    print(f"copy alone              {fmt3(train['copy'], 1e3, digits=2)}")
    print(f"training step alone     {fmt3(train['step_alone'], 1e3, digits=2)}")
    print(f"in the loop: next()     {fmt3(train['next'], 1e3, digits=2)}")
    print(f"in the loop: step       "
          f"{fmt3(train['step_in_loop'], 1e3, digits=2)}")
    print(f"in the loop: wall       {fmt3(train['wall'], 1e3, digits=2)}")
    excess = train["step_in_loop"][0] - train["step_alone"][0]
    print(f"the learner's wait for the copy (step in the loop less the "
          f"step alone): {excess * 1e3:.2f} ms")
    records.append({"name": "train", "copy_ms": copy_ms,
                    "wait_for_copy_ms": excess * 1e3,
                    **{key: value for key, value in train.items()}})


def inference_section(args, device, name, records):
    with torch.no_grad():
        rows = inference_rows(args, device)
    print(f"\n## inference: one call for n envs, on {name} (the round trip) "
          f"and on one CPU core (ms, median [min-max]; us an env)")
    print(f"{'model':<5} {'n':>5} {'device ms':<24} {'cpu ms':<26} "
          f"{'us/env dev':>10} {'us/env cpu':>10} {'cores':>6}")
    for row in rows:
        n, gpu, cpu = row["n"], row["device_ms"], row["cpu_ms"]
        cores = cpu[0] / gpu[0]
        print(f"{row['model']:<5} {n:>5} {fmt3(gpu, 1e3, digits=2):<24} "
              f"{fmt3(cpu, 1e3, width=8, digits=2):<26} "
              f"{gpu[0] / n * 1e6:>10.1f} {cpu[0] / n * 1e6:>10.1f} "
              f"{cores:>6.1f}")
        records.append({"name": f"inference/{row['model']}.{n}",
                        **row, "cores_replaced": cores})
    print("cores: the worker cores one device call replaces (cpu ms over "
          "device ms for the same n)")


if __name__ == "__main__":
    sys.exit(main())
