"""The measurement harness of the benchmarks: rows timed in rounds,
medians with their spread, ratios taken within a round, JSON lines.

A :class:`Row` is one thing timed: ``run(seconds)`` returns a dict with
``steps_per_s`` (and more), or a string saying why it was skipped.
:func:`measure` runs every row once per round, in turn (so that a drift of
the machine does not favour the rows that run first), and each row reports
the median of its rounds and their spread ``[min-max]``; :func:`paired`
takes a ratio of two rows round by round (two rows measured minutes apart
would drift). Where a ratio itself is the point, :func:`alternated` times
two loops fragment by fragment within one window, so that both see the
same machine. :func:`timed_in_processes` times copies of a loop in as
many processes at once: what the machine's cores do with the work when
nothing passes between them, the measured ceiling of a row of workers.
Nothing here asserts a timing.
"""
import json
import multiprocessing
import sys
import threading
import time
import traceback

import numpy as np
import torch

__all__ = ["WARMUP_SECONDS", "Row", "timed", "warm_workers", "alternated",
           "timed_in_processes", "measure",
           "stats", "paired", "median", "record", "print_json", "spread",
           "fmt"]

WARMUP_SECONDS = 0.5


class Row:
    """A row of a table: ``run(seconds)`` returns a dict with
    ``steps_per_s`` (and more), or a string saying why it was skipped.

    ``kind`` is ``floor``, ``row`` or ``profile``; ``ceiling`` names the
    ceiling of a ``row`` (``"1x8"``, ``"2x4"``, ``"async"``...); the part
    of ``name`` before its first ``/`` is its workload (its section)."""

    def __init__(self, name, run, kind="row", ceiling=None):
        self.name, self.run, self.kind, self.ceiling = name, run, kind, ceiling
        self.workload = name.split("/")[0]


def _warm_up(fragment):
    """Call ``fragment()`` for :data:`WARMUP_SECONDS`, at least twice."""
    tic = time.perf_counter()
    for n in range(1, 1 << 30):
        fragment()
        if n >= 2 and time.perf_counter() - tic >= WARMUP_SECONDS:
            return


def timed(fragment, steps_per_fragment, seconds, on_start=None):
    """Time ``fragment()`` for ``seconds`` after a warm-up (at least two
    calls), whole fragments only; ``on_start()`` runs as the timing starts.

    Returns ``{"steps_per_s", "steps", "learner_cpu"}``, the last being
    this process's CPU time (all its threads) over the wall time."""
    _warm_up(fragment)
    if on_start is not None:
        on_start()
    cpu, tic = time.process_time(), time.perf_counter()
    for n in range(1, 1 << 30):
        fragment()
        elapsed = time.perf_counter() - tic
        if elapsed >= seconds:
            steps = n * steps_per_fragment
            return {"steps_per_s": steps / elapsed, "steps": steps,
                    "learner_cpu": (time.process_time() - cpu) / elapsed}


def warm_workers(feed, fragments=2, seconds=None, take=None):
    """Take batches from the generator ``feed`` until each of its workers
    has delivered ``fragments`` fragments (its ``stats["workers"]``), so
    that a row of workers is timed once they all run, as the copies of
    :func:`timed_in_processes` are each built and warm before the window.

    The first batches of a generator may all come from its first worker:
    the learner starts its workers one after the other, and under
    ``forkserver`` each re-runs the benchmark script before it reads its
    work (CPython up to 3.12 does not preload ``__main__``: gh-126631), while
    the learner's ``start()`` of the next one waits for that read. Timed
    from there, a row of two workers times one of them and the other's
    start-up. Nothing to do for a generator without workers (``same``) or
    without these stats (an older checkout). ``take`` takes one batch
    (default ``next(feed)``): a consumer over ``feed`` (``episodes``)
    warms through itself.

    Raises
    ------
    RuntimeError
        A worker delivered fewer within ``seconds`` (default
        :data:`SET_UP_SECONDS`).
    """
    stats = getattr(feed, "stats", None)
    if not hasattr(stats, "get") or not stats.get("workers"):
        return
    seconds = SET_UP_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + seconds
    while True:
        delivered = [w.get("delivered", 0) for w in feed.stats["workers"]]
        if min(delivered) >= fragments:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the workers delivered {delivered} fragments within "
                f"{seconds} s, not {fragments} each")
        take() if take is not None else next(feed)


def alternated(fragments, steps_per_fragment, seconds):
    """Time the loops ``fragments`` (``{name: fragment}``) against each
    other: after a warm-up of each, one ``fragment()`` of each in turn (the
    first of a turn rotating), each call timed on its own, for ``seconds``
    of wall time per loop.

    A row timed for a second, then another for the next, sees a machine
    whose speed may have changed by tens of percent in between; here each
    loop's time is a sum over short calls spread over the same window, so
    the ratio of two loops keeps little of that drift.

    Returns ``{name: {"steps_per_s", "steps", "learner_cpu"}}``, the last
    being this process's CPU time over the window's wall time (the same for
    every loop)."""
    names = list(fragments)
    for name in names:
        _warm_up(fragments[name])
    spent = dict.fromkeys(names, 0.0)
    calls = dict.fromkeys(names, 0)
    cpu, start = time.process_time(), time.perf_counter()
    turn = 0
    while min(spent.values()) < seconds:
        for k in range(len(names)):
            name = names[(turn + k) % len(names)]
            tic = time.perf_counter()
            fragments[name]()
            spent[name] += time.perf_counter() - tic
            calls[name] += 1
        turn += 1
    load = (time.process_time() - cpu) / (time.perf_counter() - start)
    results = {}
    for name in names:
        steps = calls[name] * steps_per_fragment
        results[name] = {"steps_per_s": steps / spent[name], "steps": steps,
                         "learner_cpu": load}
    return results


# a copy's set-up and warm-up, and its report after the window (seconds)
SET_UP_SECONDS = 120


def timed_in_processes(build, steps_per_fragment, seconds, n_procs):
    """Time ``n_procs`` copies of a loop at once, each in a process of its
    own (forked, one torch thread): ``build()`` returns ``(fragment,
    close)`` there; every copy warms up, they start together and each
    calls ``fragment()`` for ``seconds``.

    Returns ``{"steps_per_s", "steps", "learner_cpu"}``: the sum of the
    copies' steps/s (this process only waits). Each wait is bounded; a
    copy that fails or hangs raises ``RuntimeError`` here, with its error,
    and none outlives the call."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n_procs + 1)
    pipes = [ctx.Pipe(duplex=False) for _ in range(n_procs)]
    procs = [ctx.Process(target=_timed_copy, daemon=True, args=(
        build, steps_per_fragment, seconds, barrier, send))
        for _, send in pipes]
    results = []
    try:
        for proc in procs:
            proc.start()
        try:
            barrier.wait(SET_UP_SECONDS)  # every copy built and warm
        except threading.BrokenBarrierError:
            pass  # a copy failed or hung: its report says which
        for (receive, _), proc in zip(pipes, procs):
            if not receive.poll(seconds + SET_UP_SECONDS):
                results.append(f"no report (exit code {proc.exitcode})")
                break
            results.append(receive.recv())
    finally:
        barrier.abort()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    # the copy that failed first, rather than those its failure stopped
    errors = sorted((result for result in results if isinstance(result, str)),
                    key=lambda error: "BrokenBarrierError" in error)
    if errors:
        raise RuntimeError(f"a timed copy failed: {errors[0]}")
    return {"steps_per_s": sum(r["steps_per_s"] for r in results),
            "steps": sum(r["steps"] for r in results), "learner_cpu": 0.0}


@torch.no_grad()
def _timed_copy(build, steps_per_fragment, seconds, barrier, send):
    torch.set_num_threads(1)
    try:
        fragment, close = build()
        try:
            _warm_up(fragment)
            barrier.wait(SET_UP_SECONDS)
            tic, n = time.perf_counter(), 0
            while time.perf_counter() - tic < seconds:
                fragment()
                n += 1
            elapsed = time.perf_counter() - tic
        finally:
            close()
        send.send({"steps_per_s": n * steps_per_fragment / elapsed,
                   "steps": n * steps_per_fragment})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        send.send(f"{type(exc).__name__}: {exc}")
        barrier.abort()


def measure(selected, n_rounds, seconds):
    """Run every row once per round, in turn. Returns ``{name: {round:
    result}}``, and ``{name: reason}`` of the skipped and of the failed
    rows (a failure is printed to stderr and the row is not run again)."""
    results, skipped, failed = {}, {}, {}
    for round_ in range(n_rounds):
        for row in selected:
            if row.name in skipped or row.name in failed:
                continue
            try:
                with torch.no_grad():
                    result = row.run(seconds)
            except Exception as exc:  # report the row, measure the others
                traceback.print_exc()
                failed[row.name] = f"{type(exc).__name__}: {exc}"
                continue
            if isinstance(result, str):
                print(f"{row.name}: skipped, {result}", file=sys.stderr)
                skipped[row.name] = result
            else:
                results.setdefault(row.name, {})[round_] = result
                print(f"round {round_ + 1}: {row.name}: "
                      f"{result['steps_per_s']:,.0f} steps/s",
                      file=sys.stderr)
    return results, skipped, failed


def stats(values):
    """Median, min and max of a non-empty list."""
    return float(np.median(values)), min(values), max(values)


def paired(numerators, denominators):
    """Per-round ratios of two ``{round: value}``, for the rounds that have
    both; ``None`` if none."""
    ratios = [numerators[r] / denominators[r] for r in numerators
              if r in denominators]
    return ratios or None


def median(values):
    """The median of a list, ``None`` for none."""
    return None if not values else float(np.median(values))


def record(name, kind, values):
    """The output record of a row's ``{round: steps/s}``."""
    mid, low, high = stats(list(values.values()))
    return {"name": name, "kind": kind, "steps_per_s": round(mid, 1),
            "min": round(low, 1), "max": round(high, 1),
            "rounds": [round(values[r], 1) for r in sorted(values)]}


def _rounded(value):
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {key: _rounded(v) for key, v in value.items()}
    return value


def print_json(records):
    """One JSON object per record, floats to three decimals."""
    for item in records:
        print(json.dumps({key: _rounded(value)
                          for key, value in item.items()}))


def spread(item):
    """``steps/s [min-max]`` of a record, for a table."""
    low, high = item["min"], item["max"]
    return (f"{item['steps_per_s']:>9,.0f} "
            f"{f'[{low:,.0f}-{high:,.0f}]':<19}")


def fmt(ratio):
    """A ratio for a table (``-`` for none)."""
    return "-" if ratio is None else f"{ratio:.2f}"
