"""Collection throughput: env steps per second of each way of collecting,
against a hand-written loop and Gymnasium's vector envs, with the floors
and ceilings of each workload; ``README.md`` here says what every row,
floor, ceiling and column measures.

    python benchmarks/throughput.py [--json] [--profile] [--rounds 5]
                                    [--duration 1.5] [--warmup 0.5]
                                    [--only busy]

The script uses only rlplay's public API, so that it also runs against an
older checkout (``PYTHONPATH=/path/to/checkout``), skipping the rows whose
features are missing; the first line says which rlplay it measured.
"""
import argparse
import os
import sys
from contextlib import closing

import gymnasium
import torch
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

import harness
import rlplay
from harness import (Row, alternated, fmt, measure, median, paired,
                     print_json, record, spread, timed)
from profiling import print_profile, profile, profile_costs, run_profile
from rlplay.engine import PolicyActor
from rlplay.engine.rollout import same
from workloads import (N_ACTORS, N_CPUS, N_ENVS, N_VECTOR, WORKLOADS,
                       MLPActor, hand_loop, make_cartpole_vec, make_envpool,
                       n_cores, run_actor_alone, run_bare_loop, run_envs_alone,
                       run_generator, run_hand, run_hand_vector,
                       run_source_alone, run_vector)

try:
    from rlplay.engine.rollout import single
except ImportError:
    single = None
try:
    from rlplay.engine.rollout import multi
except ImportError:
    multi = None
try:
    import ray  # noqa: F401 - the cluster row needs it
    from rlplay.engine.rollout import cluster
except ImportError:
    cluster = None


def generator(module, factory, actor, n_steps, *counts, steps_per_batch,
              **kwargs):
    """A row's ``run``: ``module.rollout(factory, actor, n_steps, *counts,
    entropy=0, **kwargs)`` timed without training; skipped where the
    module is missing or does not take a keyword."""
    def run(seconds):
        if module is None:
            return "not available (import failed)"
        try:
            feed = module.rollout(factory, actor, n_steps, *counts,
                                  entropy=0, **kwargs)
        except TypeError as exc:
            missing = [key for key in kwargs if key in str(exc)]
            if not missing:
                raise
            return (f"{module.__name__}.rollout does not take "
                    f"{', '.join(missing)} ({exc})")
        return run_generator(feed, steps_per_batch, seconds)
    return run


def normalized(module, factory, actor, n_steps, *counts, steps_per_batch):
    """A row's ``run``: :func:`generator`'s, the learner also updating a
    :class:`~rlplay.engine.RunningNorm` of the observations from each
    batch (its cost on the learner, per batch)."""
    def run(seconds):
        try:
            from rlplay.engine import RunningNorm
        except ImportError:
            return "RunningNorm not available (an older rlplay)"
        if module is None:
            return "not available (import failed)"
        feed = module.rollout(factory, actor, n_steps, *counts, entropy=0)
        probe = factory()
        norm = RunningNorm(probe.observation_space.shape)
        probe.close()
        with closing(feed):
            return timed(lambda: norm.update_from(next(feed)),
                         steps_per_batch, seconds)
    return run


def alternating(factory, actor, n_steps, n_envs):
    """A row's ``run``: ``same.rollout`` and the hand-written loop over the
    same envs and actor, fragment by fragment in one window
    (:func:`~harness.alternated`); same.rollout's steps/s, with ``x_hand``,
    its ratio to the hand loop's in that window."""
    def run(seconds):
        feed = same.rollout(factory, actor, n_steps, n_envs, entropy=0)
        hand, close = hand_loop(factory, actor, n_steps, n_envs=n_envs)
        try:
            with closing(feed):
                rates = alternated({"same": lambda: next(feed), "hand": hand},
                                   n_steps * n_envs, seconds)
        finally:
            close()
        return dict(rates["same"], x_hand=rates["same"]["steps_per_s"]
                    / rates["hand"]["steps_per_s"])
    return run


def rows(env_name, profile_rows=False):
    """The :class:`Row` list of a section (a workload): floors first, then
    the table, then the profile's (with ``profile_rows``)."""
    if env_name == "vector":
        return vector_rows()
    factory, n_steps, _ = WORKLOADS[env_name]
    actor = MLPActor()
    n_per_actor = N_ENVS // N_ACTORS
    n2 = n_cores(N_ACTORS)
    batch = n_steps * N_ENVS

    def gen(module, *counts, steps_per_batch=batch, **kwargs):
        return generator(module, factory, actor, n_steps, *counts,
                         steps_per_batch=steps_per_batch, **kwargs)

    def row(name, run, ceiling):
        return Row(f"{env_name}/{name}", run, "row", ceiling)

    def floor(name, run):
        return Row(f"{env_name}/floor.{name}", run, "floor")

    table = [
        floor("envs", lambda s: run_envs_alone(factory, n_steps, s)),
        floor(f"actor.{N_ENVS}",
              lambda s: run_actor_alone(factory, actor, N_ENVS, s)),
        floor(f"actor.{n_per_actor}",
              lambda s: run_actor_alone(factory, actor, n_per_actor, s)),
        floor(f"policy_actor.{N_ENVS}",
              lambda s: run_actor_alone(factory, PolicyActor(actor.mlp),
                                        N_ENVS, s)),
        row("hand", lambda s: run_hand(factory, actor, n_steps, s),
            f"1x{N_ENVS}"),
        row("SyncVectorEnv",
            lambda s: run_vector(SyncVectorEnv, factory, actor, n_steps, s),
            f"1x{N_ENVS}"),
        row("same.rollout", gen(same, N_ENVS), f"1x{N_ENVS}"),
        row("same.rollout.check_always",
            gen(same, N_ENVS, check_spaces="always"), f"1x{N_ENVS}"),
        # same.rollout and the hand loop, fragment by fragment in one
        # window: its x hand is the ratio of two loops that saw the same
        # machine
        row("same.rollout.alternating",
            alternating(factory, actor, n_steps, N_ENVS), f"1x{N_ENVS}"),
        row("single.rollout", gen(single, N_ENVS), f"1x{N_ENVS}"),
        # n_buffers: two per actor, n_per_batch: one fragment per actor
        row("multi.rollout",
            gen(multi, N_ACTORS, n_per_actor, 2 * N_ACTORS, N_ACTORS),
            f"{n2}x{n_per_actor}"),
        row(f"multi.rollout.{N_ACTORS}x{N_ENVS}",
            gen(multi, N_ACTORS, N_ENVS, 2 * N_ACTORS, N_ACTORS,
                steps_per_batch=batch * N_ACTORS),
            f"{n2}x{N_ENVS}"),
        # the same, the learner updating a RunningNorm from each batch
        row(f"multi.rollout.{N_ACTORS}x{N_ENVS}.norm",
            normalized(multi, factory, actor, n_steps, N_ACTORS, N_ENVS,
                       2 * N_ACTORS, N_ACTORS,
                       steps_per_batch=batch * N_ACTORS),
            f"{n2}x{N_ENVS}"),
        row("AsyncVectorEnv",
            lambda s: run_vector(AsyncVectorEnv, factory, actor, n_steps, s),
            "async"),
        # multi.rollout's layout, the workers being Ray actors
        row("cluster.rollout",
            gen(cluster, N_ACTORS, n_per_actor, 2 * N_ACTORS, N_ACTORS),
            f"{n2}x{n_per_actor}"),
    ]
    if profile_rows:
        table += [
            Row(f"{env_name}/profile.{kind}",
                lambda s, kind=kind: run_profile(kind, factory, actor,
                                                 n_steps, s), "profile")
            for kind in ("same", "hand")]
    skip = {"busy": {"SyncVectorEnv", "single.rollout",
                     "same.rollout.check_always",
                     f"multi.rollout.{N_ACTORS}x{N_ENVS}.norm"},
            "cartpole": {"cluster.rollout"}}.get(env_name, set())
    return [r for r in table if r.name.split("/", 1)[1] not in skip]


def vector_rows():
    """The vector section: CartPole-v1, 64 envs per actor call, sources
    that step them in one call (see README.md here)."""
    factory, n_steps, n_envs = WORKLOADS["vector"]
    actor = MLPActor()
    n2 = n_cores(N_ACTORS)
    batch = n_steps * n_envs

    def gen(module, make, *counts, steps_per_batch=batch, **kwargs):
        return generator(module, make, actor, n_steps, *counts,
                         steps_per_batch=steps_per_batch, **kwargs)

    def envpool_row(seconds):
        try:
            make_envpool().close()
        except ImportError:
            return "EnvPool is not installed (pip install rlplay[envpool])"
        return gen(same, make_envpool, n_envs)(seconds)

    def row(name, run, ceiling):
        return Row(f"vector/{name}", run, "row", ceiling)

    return [
        Row("vector/floor.envs", lambda s: run_source_alone(
            make_cartpole_vec, n_steps, s), "floor"),
        Row(f"vector/floor.actor.{n_envs}", lambda s: run_actor_alone(
            factory, actor, n_envs, s), "floor"),
        Row("vector/floor.bare_loop", lambda s: run_bare_loop(
            make_cartpole_vec, actor, n_steps, s), "floor"),
        row("hand", lambda s: run_hand_vector(make_cartpole_vec, actor,
                                              n_steps, s), f"1x{n_envs}"),
        row("same.rollout.singles", gen(same, factory, n_envs),
            f"1x{n_envs}"),
        row("same.rollout.make_vec", gen(same, make_cartpole_vec, n_envs),
            f"1x{n_envs}"),
        row("same.rollout.envpool", envpool_row, f"1x{n_envs}"),
        row(f"multi.rollout.{N_ACTORS}x{n_envs}",
            gen(multi, make_cartpole_vec, N_ACTORS, n_envs, 2 * N_ACTORS,
                N_ACTORS, steps_per_batch=batch * N_ACTORS),
            f"{n2}x{n_envs}"),
        row(f"multi.rollout.{N_ACTORS}x{n_envs}.affinity",
            gen(multi, make_cartpole_vec, N_ACTORS, n_envs, 2 * N_ACTORS,
                N_ACTORS, steps_per_batch=batch * N_ACTORS,
                cpu_affinity="auto"),
            f"{n2}x{n_envs}"),
    ]


# ------------------------------------------------------------- ceilings --

def ceilings(env_rate, actor_rates, n_envs=N_ENVS):
    """``{name: steps/s}`` of the ceilings of one section and round, from
    the floors: ``env_rate`` and ``{envs per call: actor_rate}``;
    ``n_envs``: the section's envs per actor call."""
    result = {}
    n2 = n_cores(N_ACTORS)
    for n_call, actor_rate in sorted(actor_rates.items(), reverse=True):
        one = 1 / (1 / env_rate + 1 / actor_rate)
        if n_call == n_envs:
            result[f"1x{n_call}"] = one
        result[f"{n2}x{n_call}"] = n2 * one
    if n_envs == N_ENVS and N_ENVS in actor_rates:
        result["async"] = 1 / (1 / actor_rates[N_ENVS]
                               + 1 / (n_cores(N_ENVS) * env_rate))
    return result


CEILING_NOTES = {
    "1x": "one core: 1/(1/envs + 1/actor.{b})",
    "async": "actor.{b} + envs over {n} cores: "
             "1/(1/actor.{b} + 1/({n} x envs))",
}


def ceiling_note(key):
    if key == "async":
        return CEILING_NOTES["async"].format(b=N_ENVS, n=n_cores(N_ENVS))
    n, b = key.split("x")
    note = CEILING_NOTES["1x"].format(b=b)
    return note if n == "1" else f"{n} cores: {n} x ({note})"


# the row that each section's ``x same`` divides by, and the vector
# section's ``ratio_list`` (its rows over 64 single envs in same.rollout)
SAME_ROW = {"vector": "same.rollout.make_vec"}
LIST_ROW = {"vector": "same.rollout.singles"}


def analyse(selected, results):
    """Rates per round of every row, ceilings and the ratios of each row.

    Returns a list of output records (dicts), in table order."""
    rate = {name: {r: res["steps_per_s"] for r, res in rounds.items()}
            for name, rounds in results.items()}
    records = []
    for env_name in dict.fromkeys(row.workload for row in selected):
        env_rows = [row for row in selected if row.workload == env_name]
        for row in env_rows:
            if row.kind == "floor" and row.name in rate:
                records.append(record(row.name, "floor", rate[row.name]))
        # ceilings, per round from that round's floors
        env_rate = rate.get(f"{env_name}/floor.envs", {})
        actor_rates = {int(name.rsplit(".", 1)[1]): values
                       for name, values in rate.items()
                       if name.startswith(f"{env_name}/floor.actor.")}
        ceiling = {}
        for r in env_rate:
            at_r = {b: v[r] for b, v in actor_rates.items() if r in v}
            for key, value in ceilings(env_rate[r], at_r,
                                       WORKLOADS[env_name][2]).items():
                ceiling.setdefault(key, {})[r] = value
        for key, values in ceiling.items():
            records.append(dict(record(f"{env_name}/ceiling.{key}",
                                       "ceiling", values),
                                note=ceiling_note(key)))
        hand = rate.get(f"{env_name}/hand", {})
        same_ = rate.get(
            f"{env_name}/{SAME_ROW.get(env_name, 'same.rollout')}", {})
        listed = rate.get(f"{env_name}/{LIST_ROW.get(env_name)}", {})
        n_envs = WORKLOADS[env_name][2]
        for row in env_rows:
            if row.kind != "row" or row.name not in rate:
                continue
            values = rate[row.name]
            ratio_same = paired(values, same_)
            pct = paired(values, ceiling.get(row.ceiling, {}))
            efficiency = None
            if f".{N_ACTORS}x{n_envs}" in row.name and ratio_same:
                efficiency = [x / N_ACTORS for x in ratio_same]
            # a row timed beside the hand loop brings its own ratio
            within = [res["x_hand"] for res in results[row.name].values()
                      if "x_hand" in res]
            item = dict(
                record(row.name, "row", values),
                ratio=median(within or paired(values, hand)),
                ratio_same=median(ratio_same),
                pct_ceiling=median(pct and [100 * x for x in pct]),
                ceiling=row.ceiling,
                efficiency=median(efficiency),
                learner_cpu=median([res["learner_cpu"] for res in
                                    results[row.name].values()]))
            if env_name in LIST_ROW:
                item["ratio_list"] = median(paired(values, listed))
            records.append(item)
    return records


# ------------------------------------------------------------------ CLI --

def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="See benchmarks/README.md for what each row measures.")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row")
    parser.add_argument("--duration", "--seconds", type=float, default=1.5,
                        dest="seconds",
                        help="timed seconds per row and round, after a "
                             "warm-up (default 1.5)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds over all rows; a row reports its "
                             "median and min-max (default 5)")
    parser.add_argument("--warmup", type=float,
                        default=harness.WARMUP_SECONDS,
                        help="seconds of warm-up of each row before it is "
                             "timed (default %(default)s); a dry run takes "
                             "less")
    parser.add_argument("--only", default="",
                        help="run the rows whose name contains this (or "
                             "any of these, comma-separated); the floors "
                             "of their section run too")
    parser.add_argument("--profile", action="store_true",
                        help="also profile same.rollout and the hand loop: "
                             "us per env step in the actor, the envs and "
                             "the rest")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--rounds must be at least 1, --duration positive and "
                     "--warmup not negative")
    harness.WARMUP_SECONDS = args.warmup
    torch.set_num_threads(1)
    torch.manual_seed(0)

    patterns = [p for p in args.only.split(",") if p] or [""]
    every = [row for env_name in WORKLOADS
             for row in rows(env_name, args.profile)]
    wanted = {row.name for row in every
              if any(p in row.name for p in patterns)}
    # the floors of every section measured, and the plain rows a profile
    # needs
    for row in every:
        if row.kind == "profile" and row.name in wanted:
            wanted |= {f"{row.workload}/hand", f"{row.workload}/same.rollout"}
    envs_wanted = list(dict.fromkeys(row.workload for row in every
                                     if row.name in wanted))
    selected = [row for row in every if row.name in wanted or (
        row.kind == "floor" and row.workload in envs_wanted)]

    header = (f"rlplay {os.path.dirname(rlplay.__file__)}; {N_CPUS} CPUs; "
              f"{args.rounds} rounds x {args.seconds:g} s; torch "
              f"{torch.__version__}, gymnasium {gymnasium.__version__}")
    print(header, file=sys.stderr)
    results, skipped, failed = measure(selected, args.rounds, args.seconds)
    records = analyse(selected, results)
    profiled = [env_name for env_name in envs_wanted
                if any(f"{env_name}/profile." in name for name in results)]
    costs = profile_costs(results) if profiled else None
    records += [profile(env_name, results, costs) for env_name in profiled]
    order = {row.name: i for i, row in enumerate(selected)}
    notes = ([{"name": name, "kind": "row", "skipped": reason}
              for name, reason in skipped.items()]
             + [{"name": name, "kind": "row", "failed": reason}
                for name, reason in failed.items()])

    if args.json:
        print_json(records + notes)
    else:
        print(header)
        print_table(records, notes, order, costs)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def print_table(records, notes, order, costs):
    name_width = 34
    print("\nfloors and ceilings: steps/s, median [min-max] over rounds")
    for item in records:
        if item["kind"] in ("floor", "ceiling"):
            print(f"{item['name']:<{name_width}} "
                  f"{spread(item)}  {item.get('note', '')}")

    print(f"\n{'name':<{name_width}} {'steps/s':>9} {'[min-max]':<19} "
          f"{'x hand':>6} {'x same':>6} {'%ceil':>5} {'ceiling':>7} "
          f"{'eff':>4} {'lrn':>4} {'x list':>6}")
    table = [r for r in records if r["kind"] == "row"] + notes
    for item in sorted(table, key=lambda r: order.get(r["name"], 0)):
        if "skipped" in item or "failed" in item:
            what = "skipped" if "skipped" in item else "failed"
            print(f"{item['name']:<{name_width}} {what}: {item[what]}")
            continue
        pct = item["pct_ceiling"]
        print(f"{item['name']:<{name_width}} {spread(item)} "
              f"{fmt(item['ratio']):>6} {fmt(item['ratio_same']):>6} "
              f"{'-' if pct is None else f'{pct:.0f}%':>5} "
              f"{item['ceiling'] or '-':>7} "
              f"{fmt(item['efficiency']):>4} "
              f"{fmt(item['learner_cpu']):>4} "
              f"{fmt(item.get('ratio_list')):>6}")
    print("x hand, x same: over the hand-written loop's and same.rollout's "
          "steps/s on the same env (vector: same.rollout.make_vec); %ceil: "
          f"of ceiling.<ceiling>; eff: x same / {N_ACTORS}; lrn: this "
          "process's CPU time over wall time (cores); x list (vector): over "
          f"same.rollout over {N_VECTOR} single envs. Ratios are medians of "
          "per-round ratios.")
    for item in records:
        if item["kind"] == "profile":
            print_profile(item, costs)


if __name__ == "__main__":
    main()
