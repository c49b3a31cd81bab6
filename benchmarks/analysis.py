"""What ``throughput.py`` reports: the ceilings of each section from its
floors, the ratios of each row taken round by round, and the table;
``README.md`` here says what each column is.
"""
from harness import fmt, median, paired, record, spread
from profiling import print_profile
from real_workloads import REAL_WORKLOADS
from workloads import N_ACTORS, N_ENVS, N_VECTOR, WORKLOADS, n_cores

__all__ = ["ceilings", "ceiling_note", "analyse", "print_table",
           "SECTIONS", "MEMORY"]

# every section's (factory, n_steps, envs per actor call, ...)
SECTIONS = {**WORKLOADS, **REAL_WORKLOADS}
# what a row may report of its memory beside its steps/s (the real
# sections, see real_workloads.py)
MEMORY = ("bytes_per_step", "shm_per_worker")

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
                                       SECTIONS[env_name][2]).items():
                ceiling.setdefault(key, {})[r] = value
        for key, values in ceiling.items():
            records.append(dict(record(f"{env_name}/ceiling.{key}",
                                       "ceiling", values),
                                note=ceiling_note(key)))
        hand = rate.get(f"{env_name}/hand", {})
        same_ = rate.get(
            f"{env_name}/{SAME_ROW.get(env_name, 'same.rollout')}", {})
        listed = rate.get(f"{env_name}/{LIST_ROW.get(env_name)}", {})
        n_envs = SECTIONS[env_name][2]
        # the hand loop in as many processes, by ceiling ("2x4": its rows)
        parallel = {row.ceiling: rate[row.name] for row in env_rows
                    if row.name.startswith(f"{env_name}/hand.parallel.")
                    and row.name in rate}
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
                ratio_parallel=median(paired(
                    values, parallel.get(row.ceiling, {}))),
                pct_ceiling=median(pct and [100 * x for x in pct]),
                ceiling=row.ceiling,
                efficiency=median(efficiency),
                learner_cpu=median([res["learner_cpu"] for res in
                                    results[row.name].values()]))
            if env_name in LIST_ROW:
                item["ratio_list"] = median(paired(values, listed))
            # the same in every round: the first round's
            first = results[row.name][min(results[row.name])]
            item.update((key, first[key]) for key in MEMORY if key in first)
            records.append(item)
    return records



# ---------------------------------------------------------------- table --

def _memory(item):
    """The memory columns of a row: bytes per env step, and the shared
    memory per worker (``-``: none reported, or no worker)."""
    size, shm = item.get("bytes_per_step"), item.get("shm_per_worker")
    if shm is not None:
        shm = next(f"{shm / 2**k:.1f}{unit}" if k else f"{shm:.0f}"
                   for k, unit in ((20, "M"), (10, "K"), (0, ""))
                   if shm >= 2**k or not k)
    return f" {'-' if size is None else f'{size:,.0f}':>8} {shm or '-':>8}"


def print_table(records, notes, order, costs):
    name_width = max([34] + [len(r["name"]) + 1 for r in records + notes])
    # the memory columns where a row reports them (the real sections)
    memory = any("bytes_per_step" in item for item in records)
    print("\nfloors and ceilings: steps/s, median [min-max] over rounds")
    for item in records:
        if item["kind"] in ("floor", "ceiling"):
            print(f"{item['name']:<{name_width}} "
                  f"{spread(item)}  {item.get('note', '')}")

    print(f"\n{'name':<{name_width}} {'steps/s':>9} {'[min-max]':<19} "
          f"{'x hand':>6} {'x same':>6} {'x par':>5} {'%ceil':>5} "
          f"{'ceiling':>7} "
          f"{'eff':>4} {'lrn':>4} {'x list':>6}"
          + (f" {'B/step':>8} {'shm':>8}" if memory else ""))
    table = [r for r in records if r["kind"] == "row"] + notes
    for item in sorted(table, key=lambda r: order.get(r["name"], 0)):
        if "skipped" in item or "failed" in item:
            what = "skipped" if "skipped" in item else "failed"
            print(f"{item['name']:<{name_width}} {what}: {item[what]}")
            continue
        pct = item["pct_ceiling"]
        print(f"{item['name']:<{name_width}} {spread(item)} "
              f"{fmt(item['ratio']):>6} {fmt(item['ratio_same']):>6} "
              f"{fmt(item['ratio_parallel']):>5} "
              f"{'-' if pct is None else f'{pct:.0f}%':>5} "
              f"{item['ceiling'] or '-':>7} "
              f"{fmt(item['efficiency']):>4} "
              f"{fmt(item['learner_cpu']):>4} "
              f"{fmt(item.get('ratio_list')):>6}"
              + (_memory(item) if memory else ""))
    print("x hand, x same: over the hand-written loop's and same.rollout's "
          "steps/s on the same env (vector: same.rollout.make_vec); x par: "
          "over the hand loop's in as many processes at once "
          "(hand.parallel.<ceiling>: the measured ceiling); %ceil: "
          f"of ceiling.<ceiling>; eff: x same / {N_ACTORS}; lrn: this "
          "process's CPU time over wall time (cores); x list (vector): over "
          f"same.rollout over {N_VECTOR} single envs. Ratios are medians of "
          "per-round ratios."
          + (" B/step: bytes that reach the learner's batch per env step; "
             "shm: shared memory per worker process (bytes, K: KiB, M: "
             "MiB)." if memory else ""))
    for item in records:
        if item["kind"] == "profile":
            print_profile(item, costs)
