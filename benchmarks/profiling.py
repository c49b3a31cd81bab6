"""The profile of ``throughput.py --profile``: where an env step of
``same.rollout`` and of the hand-written loop goes, measured from the
outside with ``perf_counter`` accumulators wrapped around the actor and
the envs (see ``README.md`` here).
"""
import copy
import time

from harness import stats
from rlplay.engine.rollout import same
from workloads import N_ENVS, run_generator, run_hand

__all__ = ["Clock", "clocked", "clock_costs", "clocked_env", "run_profile",
           "profile_costs", "profile", "print_profile"]


class Clock:
    """Seconds spent in, and number of, the calls that :func:`clocked`
    wrappers made."""

    def __init__(self):
        self.seconds, self.calls = 0.0, 0

    def zero(self):
        self.seconds, self.calls = 0.0, 0


def clocked(fn, clock):
    """``fn`` with every call's duration added to ``clock``."""
    perf_counter = time.perf_counter

    def wrapper(*args, **kwargs):
        tic = perf_counter()
        result = fn(*args, **kwargs)
        clock.seconds += perf_counter() - tic
        clock.calls += 1
        return result
    return wrapper


def clock_costs(n=50_000):
    """``(bias, overhead)`` of a :func:`clocked` wrapper, in seconds per
    call: ``bias``, what a wrapped no-op adds to its clock (the clock's own
    cost inside the timed span), subtracted from each part of the profile;
    ``overhead``, the wall time the wrapper adds to each call, subtracted
    from the instrumented whole. The best of a few tries."""
    def noop(*args, **kwargs):
        return None

    clock = Clock()
    wrapped = clocked(noop, clock)
    args, kwargs = (1, 2, 3, 4, 5), {"hx": (), "virtual": False}
    bias = overhead = float("inf")
    for _ in range(5):
        clock.zero()
        tic = time.perf_counter()
        for _ in range(n // 5):
            wrapped(*args, **kwargs)
        toc = time.perf_counter()
        for _ in range(n // 5):
            noop(*args, **kwargs)
        plain = time.perf_counter() - toc
        bias = min(bias, clock.seconds / clock.calls)
        overhead = min(overhead, (toc - tic - plain) / (n // 5))
    return bias, overhead


def clocked_env(factory, clock):
    """A factory of envs whose ``step`` and ``reset`` add to ``clock``."""
    def make():
        env = factory()
        env.step = clocked(env.step, clock)
        env.reset = clocked(env.reset, clock)
        return env
    return make


def run_profile(kind, factory, actor, n_steps, seconds):
    """One instrumented run of ``same.rollout`` (``kind="same"``) or of the
    hand loop: steps/s, and the seconds and calls inside the actor and the
    envs during the timed span."""
    actor_clock, env_clock = Clock(), Clock()
    factory = clocked_env(factory, env_clock)
    actor = copy.deepcopy(actor)    # the wrappers stay off the shared one

    def on_start():
        actor_clock.zero()
        env_clock.zero()

    if kind == "same":
        # instance attributes: collect looks them up on the instance
        actor.step = clocked(actor.step, actor_clock)
        actor.reset = clocked(actor.reset, actor_clock)
        feed = same.rollout(factory, actor, n_steps, N_ENVS, entropy=0)
        result = run_generator(feed, n_steps * N_ENVS, seconds, on_start)
    else:
        result = run_hand(factory, actor, n_steps, seconds,
                          sample=clocked(actor.sample, actor_clock),
                          on_start=on_start)
    # the wrappers' own cost, calibrated every round: the least over the
    # run is taken, the cost on a machine not slowed down by other work
    bias, overhead = clock_costs()
    return dict(result, actor_s=actor_clock.seconds,
                actor_calls=actor_clock.calls, env_s=env_clock.seconds,
                env_calls=env_clock.calls, bias=bias, overhead=overhead)


def profile_costs(results):
    """The least ``(bias, overhead)`` that the profile rows calibrated."""
    runs = [res for name, rounds in results.items() if "/profile." in name
            for res in rounds.values()]
    return (min(res["bias"] for res in runs),
            min(res["overhead"] for res in runs))


def profile(env_name, results, costs):
    """The profile record of an env: microseconds per env step of each
    part, per round, for ``same.rollout`` and the hand loop; ``costs`` are
    :func:`profile_costs`."""
    bias, overhead = costs
    per_round = {"same": {}, "hand": {}}
    for kind, plain_name in (("same", "same.rollout"), ("hand", "hand")):
        instrumented = results.get(f"{env_name}/profile.{kind}", {})
        plain = results.get(f"{env_name}/{plain_name}", {})
        for r, res in instrumented.items():
            us = 1e6 / res["steps"]
            calls = res["actor_calls"] + res["env_calls"]
            actor = (res["actor_s"] - bias * res["actor_calls"]) * us
            env = (res["env_s"] - bias * res["env_calls"]) * us
            # the whole from the instrumented run itself, less what the
            # wrappers added: no noise from comparing two runs
            instrumentation = overhead * calls * us
            whole = 1e6 / res["steps_per_s"] - instrumentation
            per_round[kind][r] = {
                "actor call": actor, "env step + reset": env,
                "rest": whole - actor - env, "whole": whole,
                "instrumentation": instrumentation,
                "plain row": (1e6 / plain[r]["steps_per_s"] if r in plain
                              else None)}
    # rest of same.rollout split by the hand loop's rest, round by round
    for r, parts in per_round["same"].items():
        hand = per_round["hand"].get(r)
        if hand is not None:
            parts["as in hand"] = hand["rest"]
            parts["rlplay's extra"] = parts["rest"] - hand["rest"]
    us_per_step = {}
    for kind, rounds in per_round.items():
        keys = dict.fromkeys(k for parts in rounds.values() for k in parts)
        us_per_step[kind] = {
            key: _stats_or_none([p[key] for p in rounds.values()
                                 if p.get(key) is not None])
            for key in keys}
    return {"name": f"{env_name}/profile", "kind": "profile",
            "us_per_step": us_per_step}


def _stats_or_none(values):
    if not values:
        return None
    median, low, high = stats(values)
    return {"median": round(median, 3), "min": round(low, 3),
            "max": round(high, 3)}


def _us(part):
    if part is None:
        return ""
    return (f"{part['median']:.2f} [{part['min']:.2f}-{part['max']:.2f}]")


def print_profile(item, costs):
    """The table of a profile record (:func:`profile`)."""
    parts = item["us_per_step"]
    print(f"\n{item['name']}: us per env step, median [min-max] over "
          f"rounds; per wrapped call, {costs[0] * 1e9:.0f} ns of clock "
          f"removed from the parts, {costs[1] * 1e9:.0f} ns of wrapper "
          "from the whole")
    print(f"{'':<26} {'same.rollout':<26} {'hand':<26}")
    for key in ("actor call", "env step + reset", "rest", "as in hand",
                "rlplay's extra", "whole", "plain row", "instrumentation"):
        label = f"  {key}" if key in ("as in hand",
                                      "rlplay's extra") else key
        cells = [_us(parts[kind].get(key)) for kind in ("same", "hand")]
        if key == "as in hand":
            cells[1] = ""
        if any(cells):
            print(f"  {label:<24} {cells[0]:<26} {cells[1]:<26}")
