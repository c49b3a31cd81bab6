"""Microbenchmark of the nested-structure utilities on a fragment-like row.

The structure is the one collection walks on every step: a ``State``-like
namedtuple of five fields, one of them a dict of two arrays::

    State(stepno, obs={"image", "vector"}, act, rew, fin)

Each case is timed with :mod:`timeit` (best of several repeats) and printed
as nanoseconds per call; a hand-written equivalent of each operation is
timed alongside as the floor to compare with.

Usage::

    python benchmarks/nested.py            # a table
    python benchmarks/nested.py --json     # one JSON object per line
"""
import argparse
import json
import timeit
from collections import namedtuple

import numpy as np

from rlplay.engine.nested import flatten, getitem, setitem, suply, tuply

State = namedtuple("State", "stepno obs act rew fin")

N_ENVS = 8


def make_tree():
    return State(stepno=np.zeros(N_ENVS, np.int64),
                 obs={"image": np.zeros((N_ENVS, 3, 8, 8), np.uint8),
                      "vector": np.zeros((N_ENVS, 4), np.float32)},
                 act=np.zeros(N_ENVS, np.int64),
                 rew=np.zeros(N_ENVS, np.float32),
                 fin=np.zeros(N_ENVS, bool))


def _identity(x):
    return x


def _add(x, y):
    return x


def cases():
    """``{name: (callable, hand-written equivalent)}``."""
    tree, other = make_tree(), make_tree()
    row = getitem(tree, 3)

    def by_hand_suply():
        return State(_identity(tree.stepno),
                     {"image": _identity(tree.obs["image"]),
                      "vector": _identity(tree.obs["vector"])},
                     _identity(tree.act), _identity(tree.rew),
                     _identity(tree.fin))

    def by_hand_suply2():
        return State(_add(tree.stepno, other.stepno),
                     {"image": _add(tree.obs["image"], other.obs["image"]),
                      "vector": _add(tree.obs["vector"],
                                     other.obs["vector"])},
                     _add(tree.act, other.act), _add(tree.rew, other.rew),
                     _add(tree.fin, other.fin))

    def by_hand_getitem():
        return State(tree.stepno[3], {"image": tree.obs["image"][3],
                                      "vector": tree.obs["vector"][3]},
                     tree.act[3], tree.rew[3], tree.fin[3])

    def by_hand_setitem():
        tree.stepno[3] = row.stepno
        tree.obs["image"][3] = row.obs["image"]
        tree.obs["vector"][3] = row.obs["vector"]
        tree.act[3] = row.act
        tree.rew[3] = row.rew
        tree.fin[3] = row.fin

    def by_hand_flatten():
        return [tree.stepno, tree.obs["image"], tree.obs["vector"],
                tree.act, tree.rew, tree.fin]

    return {
        "suply(fn, tree)": (lambda: suply(_identity, tree), by_hand_suply),
        "suply(fn, tree, other)": (lambda: suply(_add, tree, other),
                                   by_hand_suply2),
        "tuply(fn, tree, other)": (lambda: tuply(_identity, tree, other),
                                   by_hand_suply2),
        "getitem(tree, j)": (lambda: getitem(tree, 3), by_hand_getitem),
        "setitem(tree, j, row)": (lambda: setitem(tree, 3, row),
                                  by_hand_setitem),
        "flatten(tree)": (lambda: flatten(tree), by_hand_flatten),
    }


def time_ns(fn, repeat=5, budget=0.04):
    """Best-of-``repeat`` nanoseconds per call of ``fn``, each repeat
    making about ``budget`` seconds of calls."""
    timer = timeit.Timer(fn)
    per_call = timer.timeit(number=200) / 200  # also warms up
    number = max(200, int(budget / per_call))
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e9


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per line")
    args = parser.parse_args(argv)

    rows = []
    for name, (fn, by_hand) in cases().items():
        ns, floor = time_ns(fn), time_ns(by_hand)
        rows.append((name, ns, floor))

    if args.json:
        for name, ns, floor in rows:
            print(json.dumps({"name": name, "ns_per_call": round(ns, 1),
                              "by_hand_ns_per_call": round(floor, 1)}))
        return
    width = max(len(name) for name, _, _ in rows)
    print(f"{'operation':<{width}}  {'ns/call':>9}  {'by hand':>9}  "
          f"{'ratio':>6}")
    for name, ns, floor in rows:
        print(f"{name:<{width}}  {ns:9.0f}  {floor:9.0f}  {ns / floor:6.1f}")


if __name__ == "__main__":
    main()
