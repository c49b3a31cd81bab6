"""What ``final`` costs a batch of Atari frames: the workers' end-of-fragment
fill and the learner's collation, with the copies of ``obs`` in ``final``
written by the workers (``dense``, as before) or by the collation alone
(``sparse``, what ``multi``, ``cluster`` and ``single`` do).

Each row times the copy work of one batch of ``--fragments`` fragments of
``T = 32`` rows of ``B = 8`` stacked frames (84x84x4 uint8, Pong's layout),
with an episode ending in one column every ``--every`` rows:

- ``dense``: each worker fills ``final`` with the observation where no
  episode ended (rows ``1..T``), then the collation copies every leaf,
  ``final`` included, into a fresh batch;
- ``sparse``: each worker fills row ``T`` alone (the next fragment's row
  0), then the collation copies every leaf but ``final`` and makes the
  batch's ``final`` from the batch's ``obs`` where no episode ended and
  from the fragments' ``final`` elsewhere.

Both give the same batch (checked before timing). The rows are timed in
turn within each round; each prints its median and min-max over rounds
(ms per batch), and ``x dense``, the median of the per-round ratios of
``dense``'s time over its own (the same machine's speed within a round). Frames written per frame stepped: the
worker's row, then (dense) the worker's fill, the collation's ``obs`` and
its ``final``: 4; (sparse) the collation's ``obs`` and ``final``: 3.
"""
import argparse
import time

import numpy as np
import torch

from harness import fmt, median, paired, print_json, stats
from rlplay.engine.core import EpisodeStats, Fragment, Meta, State
from rlplay.engine.core.finals import fill_final
from rlplay.engine.nested import suply
from rlplay.engine.workers._batch import Collation

T, B, FRAME = 32, 8, (4, 84, 84)


def fragment(seed, every):
    """One worker's fragment (numpy): random frames, an episode end in
    one column every ``every`` rows (its true last frame in ``final``)."""
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 256, (1 + T, B, *FRAME), dtype=np.uint8)
    fin = np.zeros((1 + T, B), bool)
    for t in range(every, 1 + T, every):
        fin[t, rng.integers(B)] = True
    final = rng.integers(0, 256, obs.shape, dtype=np.uint8)
    acted = np.ones((1 + T, B), bool)
    acted[0] = False
    zeros = np.zeros((1 + T, B))
    return Fragment(
        state=State(stepno=zeros.astype(np.int64), obs=obs,
                    act=zeros.astype(np.int64), rew=zeros.astype(np.float32),
                    fin=fin),
        truncated=np.zeros_like(fin), final=final, actor={}, env={},
        env_mask={}, hx=(), stats=EpisodeStats(ret=zeros, length=zeros),
        meta=Meta(*[np.zeros(B, np.int64) for _ in range(7)]), acted=acted)


def setups(n_fragments, every):
    """``{name: batch()}``: a batch's copy work, dense and sparse."""
    frags = [fragment(s, every) for s in range(n_fragments)]
    template = suply(torch.from_numpy, frags[0])
    # as before: the collation copies `final` as any leaf
    dense_collation = Collation(template, 1, n_fragments)
    dense_collation._finals = []
    sparse_collation = Collation(template, 1, n_fragments)
    sources = [Collation.sources(f) for f in frags]

    def dense():
        for f in frags:
            fill_final(f, False)
        return dense_collation.collate(sources, fresh=True)

    def sparse():
        for f in frags:
            fill_final(f, False, rows=slice(T - 1, T))
        return sparse_collation.collate(sources, fresh=True)

    a, b = dense()[0], sparse()[0]
    assert torch.equal(a.final, b.final) and torch.equal(a.state.obs,
                                                          b.state.obs)
    return {"dense": dense, "sparse": sparse}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fragments", type=int, default=2,
                        help="fragments per batch (default 2)")
    parser.add_argument("--every", type=int, default=8,
                        help="rows between episode ends (default 8)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=10,
                        help="batches timed per row and round")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = setups(args.fragments, args.every)
    seconds = {name: {} for name in rows}  # {round: seconds per batch}
    for r in range(args.rounds):
        for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
            tic = time.perf_counter()
            for _ in range(args.repeats):
                rows[name]()
            seconds[name][r] = (time.perf_counter() - tic) / args.repeats
    records = []
    for name, values in seconds.items():
        ms, ms_min, ms_max = stats([1e3 * v for v in values.values()])
        records.append(dict(name=f"finals/{name}", ms=ms, ms_min=ms_min,
                            ms_max=ms_max, x_dense=median(paired(
                                seconds["dense"], values))))
    if args.json:
        print_json(records)
        return
    print(f"{args.fragments} fragments of {T} x {B} frames per batch, an "
          f"end every {args.every} rows; {args.rounds} rounds x "
          f"{args.repeats} batches")
    print(f"{'name':<16}{'ms/batch [min-max]':>26}{'x dense':>9}")
    for rec in records:
        spread = f"{rec['ms']:.2f} [{rec['ms_min']:.2f}-{rec['ms_max']:.2f}]"
        print(f"{rec['name']:<16}{spread:>26}{fmt(rec['x_dense']):>9}")


if __name__ == "__main__":
    main()
