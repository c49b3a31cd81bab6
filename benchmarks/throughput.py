"""Collection throughput: env steps per second of each way of collecting,
against a hand-written loop and Gymnasium's vector envs, with the floors
and ceilings of each workload; ``README.md`` here says what every row,
floor, ceiling and column measures.

    python benchmarks/throughput.py [--json] [--profile] [--rounds 5]
                                    [--duration 1.5] [--warmup 0.5]
                                    [--only busy]

The default run measures ``cartpole``, ``busy`` and ``vector``; the real
workloads (``real_workloads.py``: Atari's Pong and MuJoCo's HalfCheetah,
slow) run where ``--only`` names them: ``--only atari``, ``--only mujoco``.

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

import analysis
import harness
import rlplay
from analysis import analyse, print_table
from harness import (Row, alternated, measure, print_json, timed,
                     timed_in_processes, warm_workers)
from peers import PUFFER_WORKERS, run_puffer, run_sb3_vec
from profiling import profile, profile_costs, run_profile
from real_workloads import REAL_WORKLOADS, real_rows
from rlplay.engine import PolicyActor
from rlplay.engine.rollout import same
from workloads import (N_ACTORS, N_CPUS, N_ENVS, WORKLOADS,
                       MLPActor, hand_layout_loop, hand_loop, hand_vector_loop,
                       make_cartpole_vec, make_envpool,
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


def cluster_module():
    """``rlplay.engine.rollout.cluster``, imported when its row runs
    (``None`` without Ray): Ray's import takes seconds, and under
    ``forkserver`` every worker of the other rows re-runs this script
    before it starts (CPython up to 3.12 does not preload ``__main__``:
    gh-126631), so an import here would be paid by each of them."""
    try:
        import ray  # noqa: F401 - the cluster row needs it
        from rlplay.engine.rollout import cluster
    except ImportError:
        return None
    return cluster


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
            warm_workers(feed)
            return timed(lambda: norm.update_from(next(feed)),
                         steps_per_batch, seconds)
    return run


def alternating(factory, actor, n_steps, n_envs, vector=False,
                layout=False):
    """A row's ``run``: ``same.rollout`` and the hand-written loop over the
    same envs and actor (``n_envs`` single envs, or with ``vector`` the
    vector env ``factory()``), fragment by fragment in one window
    (:func:`~harness.alternated`); same.rollout's steps/s, with
    ``x_hand``, its ratio to the hand loop's in that window. With
    ``layout`` (a vector env), the hand-written loop that writes rlplay's
    layout (:func:`~workloads.hand_layout_loop`) in place of
    ``same.rollout``: the ceiling of a loop that delivers rlplay's
    fragments."""
    def run(seconds):
        if layout:
            loop, close_loop = hand_layout_loop(factory(), actor, n_steps,
                                                n_envs)
        else:
            feed = same.rollout(factory, actor, n_steps, n_envs, entropy=0)
            loop, close_loop = (lambda: next(feed)), feed.close
        if vector:
            hand, close = hand_vector_loop(factory(), actor, n_steps, n_envs)
        else:
            hand, close = hand_loop(factory, actor, n_steps, n_envs=n_envs)
        try:
            rates = alternated({"loop": loop, "hand": hand},
                               n_steps * n_envs, seconds)
        finally:
            close_loop()
            close()
        return dict(rates["loop"], x_hand=rates["loop"]["steps_per_s"]
                    / rates["hand"]["steps_per_s"])
    return run


def rows(env_name, profile_rows=False):
    """The :class:`Row` list of a section (a workload): floors first, then
    the table, then the profile's (with ``profile_rows``)."""
    if env_name == "vector":
        return vector_rows()
    if env_name == PIXELS:
        return pixel_rows()
    if env_name in REAL_WORKLOADS:
        return real_rows(env_name)
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
        # served inference at the envs of multi.rollout: one server
        # process runs the actor for both workers (one group each, or two
        # stepped in turn while the server computes the other's actions)
        row("multi.rollout.served",
            gen(multi, N_ACTORS, n_per_actor, 2 * N_ACTORS, N_ACTORS,
                serve=True), f"{n2}x{n_per_actor}"),
        row("multi.rollout.served.groups2",
            gen(multi, N_ACTORS, n_per_actor, 2 * N_ACTORS, N_ACTORS,
                serve=True, groups=2), f"{n2}x{n_per_actor}"),
        # one worker of the 8 envs and the server: PufferLib's
        # Multiprocessing row's processes (its worker, the actor in the
        # learner's process)
        row(f"multi.rollout.served.1x{N_ENVS}",
            gen(multi, 1, N_ENVS, 2, 1, serve=True), f"1x{N_ENVS}"),
        row("AsyncVectorEnv",
            lambda s: run_vector(AsyncVectorEnv, factory, actor, n_steps, s),
            "async"),
        # the peers' vector envs over the same envs, the actor in this
        # process, into the hand loop's arrays (peers.py): SB3's (a
        # process an env), PufferLib's in this process and in one worker
        # process of 8 envs (its worker and this process spin-wait, a core
        # each: one worker is what two cores hold beside this process)
        row("sb3.SubprocVecEnv",
            lambda s: run_sb3_vec(factory, actor, n_steps, s), "async"),
        row(f"pufferlib.serial.{N_ENVS}", lambda s: run_puffer(
            "Serial", factory, actor, n_steps, s), f"1x{N_ENVS}"),
        row(f"pufferlib.multiprocessing.{PUFFER_WORKERS}x{N_ENVS}",
            lambda s: run_puffer("Multiprocessing", factory, actor, n_steps,
                                 s), f"1x{N_ENVS}"),
        # multi.rollout's layout, the workers being Ray actors
        row("cluster.rollout", lambda s: gen(
            cluster_module(), N_ACTORS, n_per_actor, 2 * N_ACTORS,
            N_ACTORS)(s), f"{n2}x{n_per_actor}"),
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


# the section of 84x84x4 frames and a Nature CNN (workloads.PixelEnv,
# workloads.CNNActor), per-worker and served inference at equal envs; run
# where --only names it (a CNN on one core is slow)
PIXELS = "pixels"
PIXEL_STEPS = 32
# the analysis reads a section's envs per actor call from its table
analysis.SECTIONS.setdefault(PIXELS, (None, PIXEL_STEPS, N_ENVS))


def pixel_rows():
    """The pixels section: ``multi.rollout`` 2x4 with the Nature CNN in
    each worker, and served by one server (one group, two groups)."""
    from workloads import CNNActor, PixelEnv
    actor = CNNActor()
    n_per_actor = N_ENVS // N_ACTORS
    ceiling = f"{n_cores(N_ACTORS)}x{n_per_actor}"

    def gen(**kwargs):
        return generator(multi, PixelEnv, actor, PIXEL_STEPS, N_ACTORS,
                         n_per_actor, 2 * N_ACTORS, N_ACTORS,
                         steps_per_batch=PIXEL_STEPS * N_ENVS, **kwargs)

    return [Row(f"{PIXELS}/{name}", run, "row", ceiling) for name, run in [
        ("multi.rollout", gen()),
        ("multi.rollout.served", gen(serve=True)),
        ("multi.rollout.served.groups2", gen(serve=True, groups=2))]]


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
            return ("EnvPool is not installed (pip install -e "
                    "'.[envpool]' in rlplay's clone)")
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
        # the hand loop in N_ACTORS processes at once: the measured ceiling
        # of the multi rows
        row(f"hand.parallel.{N_ACTORS}x{n_envs}", lambda s: (
            timed_in_processes(lambda: hand_vector_loop(
                make_cartpole_vec(), actor, n_steps, n_envs), batch, s,
                N_ACTORS)), f"{n2}x{n_envs}"),
        row("same.rollout.singles", gen(same, factory, n_envs),
            f"1x{n_envs}"),
        row("same.rollout.make_vec", gen(same, make_cartpole_vec, n_envs),
            f"1x{n_envs}"),
        row("same.rollout.make_vec.alternating",
            alternating(make_cartpole_vec, actor, n_steps, n_envs,
                        vector=True), f"1x{n_envs}"),
        # the ceiling of the row above: a loop that writes rlplay's layout
        # by hand, as lean as it goes, against the hand loop in one window
        row("hand.layout.alternating",
            alternating(make_cartpole_vec, actor, n_steps, n_envs,
                        vector=True, layout=True), f"1x{n_envs}"),
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
    every = [row for env_name in sections(patterns)
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


def sections(patterns):
    """The sections whose rows ``--only``'s ``patterns`` may select: the
    default ones, and a real one (slow) only where a pattern names it
    (``atari`` names ``atari`` and ``atari_gym``; ``mujoco/hand``,
    ``mujoco``)."""
    return list(WORKLOADS) + [
        name for name in list(REAL_WORKLOADS) + [PIXELS]
        if any(p and (p in name or p.startswith(name + "/"))
               for p in patterns)]


if __name__ == "__main__":
    main()
