"""Collection throughput: env steps per second of each way of collecting.

Every row steps the same envs with the same actor, a 4-64-64-2 MLP that
samples actions from a categorical distribution (under ``torch.no_grad()``,
one torch thread), and stores what it collects:

``hand``
    A hand-written loop: one batched forward pass per step, the envs
    stepped in a Python loop, obs/act/rew/done written into preallocated
    numpy arrays. The reference.
``SyncVectorEnv``, ``AsyncVectorEnv``
    Gymnasium's vector envs (same-step autoreset) driven by the same actor,
    into the same preallocated arrays.
``same.rollout``, ``single.rollout``, ``multi.rollout``
    rlplay's generators, consumed without training (``multi``: 2 actors x
    ``n_envs / 2`` envs, ``n_envs`` envs per batch).
``same.rollout.check_always``
    ``same.rollout(..., check_spaces="always")``: the cost of the opt-in
    check of every step's actions and observations against their spaces
    (by default only the first fragment is checked). Skipped, with a note,
    where the generator does not know the keyword (older checkouts).
``multi.rollout.2x8``
    ``multi.rollout`` with 2 actors x 8 envs (two fragments, 16 envs, per
    batch): each actor call sees as many envs as ``same.rollout``'s, so its
    ratio to ``same`` over 2 is the parallel efficiency (column ``eff``).
``cluster.rollout`` (``busy`` only)
    ``cluster.rollout`` laid out as ``multi.rollout``: 2 Ray actors x 4
    envs, on the local Ray that each round's rollout starts and shuts
    down (before and after the timing, so that Ray's own processes load
    no other row). Skipped, with a note, where Ray is not installed.

Two envs: ``cartpole`` (CartPole-v1, 8 envs, 128-step fragments: the
actor's forward pass dominates) and ``busy`` (a synthetic env whose ``step``
burns about 0.5 ms of CPU time, 8 envs, 32-step fragments: the envs
dominate).

Floors and ceilings
-------------------
Measured in the same run, per env, as rows of their own:

``floor.envs``
    The 8 envs alone: stepped in a Python loop with random actions drawn up
    front, reset when an episode ends, nothing stored. Env steps/s.
``floor.actor.8``, ``floor.actor.4``
    The actor alone: one batched ``actor.step`` call for 8 (4) envs on a
    fixed observation, sampling included, under ``torch.no_grad()``.
    Env steps/s, i.e. envs per call over seconds per call.
``floor.policy_actor.8``
    The same, for ``PolicyActor`` wrapping the same MLP (rlplay's adapter
    of a plain policy: it samples from the logits and records the
    log-probability of the action). Not used by the ceilings; it shows
    what the adapter costs beside the benchmark's own actor.
``ceiling.1x8``
    What one core could do if storing cost nothing:
    ``1 / (1 / floor.envs + 1 / floor.actor.8)`` steps/s.
``ceiling.2x8``, ``ceiling.2x4``
    ``n`` cores, each running one actor over 8 (4) envs: ``n`` times the
    one-core ceiling with that actor batch, ``n = min(workers, CPUs)``
    (``multi.rollout`` has 2 workers; 2 on a two-core machine).
``ceiling.async``
    ``AsyncVectorEnv``: the actor in this process, the 8 envs spread over
    ``min(8, CPUs)`` cores, one after the other each step:
    ``1 / (1 / floor.actor.8 + 1 / (n x floor.envs))``.

Each row's ``%ceil`` is its steps/s as a percentage of the ceiling named in
its ``ceiling`` column (the cores that row uses: 1 for ``hand``,
``SyncVectorEnv``, ``same`` and ``single``, whose worker collects alone
while the learner waits). It says how much the row loses to storage,
bookkeeping and synchronisation. Ratios and percentages are taken within a
round (the row and its reference measured minutes apart would drift) and
their median over the rounds is reported.

The physical ceiling on two cores. The 2-core ceilings assume two whole
cores for the two workers, but the learner process shares them: it waits
on the workers, collates ``n_per_batch`` fragments into each batch (a copy
of every field) and publishes parameters, and the OS and anything else
running take their share too. So on a 2-core machine ``multi`` cannot reach
``ceiling.2xB``: column ``lrn`` is the learner's share, the CPU time of
this process over the wall time, in cores (1.00 for the in-process rows,
which do all the work here), and two workers have at most ``2 - lrn``
cores, so ``eff`` is at most about ``(2 - lrn) / 2``, and ``%ceil`` of
``ceiling.2xB`` at most ``(2 - lrn) / 2`` too. Here the learner only
collates (a few percent of a core); a learner that trains takes the rest
of its core from the workers. With more cores than workers the learner
gets a core of its own and the bound is the ceiling itself.

Profile (``--profile``)
-----------------------
Where an env step of ``same.rollout`` (that is ``core.collect``, plus the
generator's per-fragment work) goes, measured from the outside: a copy of
the actor whose ``step``/``reset`` and envs whose ``step``/``reset`` are
wrapped in ``perf_counter`` accumulators, driven by ``same.rollout``, and
the same wrappers around the hand-written loop's forward pass and envs.
Reported in microseconds per env step, median [min-max] over the rounds:

``actor call``
    inside ``actor.step`` (the T calls and the lookahead of a fragment).
``env step + reset``
    inside the envs' ``step`` and ``reset``.
``rest``
    the whole minus those two: buffer writes and bookkeeping (for the hand
    loop: the Python loop and its four array writes). The library is not
    edited, so this cannot be timed directly; it is split once more by the
    hand loop: ``as in hand`` is the hand loop's rest, ``rlplay's extra``
    is what ``same.rollout`` spends beyond it (final observations, step
    counters, episode statistics, env info, checks, the torch random
    stream swapped in per fragment, stats).
``whole``
    1 / steps/s of the instrumented run less ``instrumentation``, so that
    the parts and the whole come from one run; ``plain row`` is the plain
    row (``same.rollout``, ``hand``) of the same round, for comparison.
``instrumentation``
    what the wrappers add per env step: calls times the wall time a wrapper
    adds to a no-op call. The parts are corrected too, for the time a
    wrapped no-op reads (the clock's own cost inside the timed span). Both
    costs are calibrated in every round and the least is used.

The actor's share there can exceed ``1 / floor.actor.8``: between two
calls the envs evict the actor's code and weights from the caches (the
busy env, 0.5 ms a step, does so thoroughly), while the floor calls it hot;
the ceilings are thus optimistic where the envs are heavy.

Measurement hygiene
-------------------
The rows run in rounds (``--rounds``), every row once per round, in turn,
so that a drift of the machine (clock boost, other load) does not favour
the rows that run first; each row is warmed up, then timed over whole
fragments for ``--duration`` seconds. Each row reports its median over the
rounds and the spread ``[min-max]``. The defaults (5 rounds of 1.5 s) take
about four minutes on two cores, and two invocations on a quiet machine
agree within a few percent on every ratio; rows with several processes
(``multi``'s workers, ``AsyncVectorEnv``'s 8) take a larger share of a
machine that is busy with other work, so compare them on an idle one.
Nothing here asserts a timing.

Columns: ``steps/s`` (median) and ``[min-max]``; ``x hand``, the ratio to
the hand-written loop on the same env; ``x same``, the ratio to
``same.rollout``; ``%ceil`` and ``ceiling``; ``eff``, the parallel
efficiency (``x same / 2``, ``multi.rollout.2x8`` only); ``lrn``. ``--json``
prints one object per row instead: ``name``, ``kind`` (``floor``,
``ceiling``, ``row``, ``profile``), ``steps_per_s``, ``min``, ``max``,
``rounds`` (each round's steps/s), and for ``row``: ``ratio`` (``x hand``),
``ratio_same``, ``pct_ceiling`` (0-100), ``ceiling``, ``efficiency``,
``learner_cpu``; a skipped row has ``skipped`` (the reason), a row that
raised has ``failed`` (the error, its traceback goes to stderr and the
exit status is 1); a profile has ``us_per_step``.

    python benchmarks/throughput.py [--json] [--profile] [--rounds 5]
                                    [--duration 1.5] [--only busy]

The script uses only rlplay's public API, so that it also runs against an
older checkout (``PYTHONPATH=/path/to/checkout``), skipping the rows whose
features are missing; the first line says which rlplay it measured.
"""
import argparse
import copy
import json
import os
import sys
import time
import traceback
from contextlib import closing

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from torch import nn

import rlplay
from rlplay.engine import BaseActorModule, PolicyActor
from rlplay.engine.rollout import same

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

N_ENVS = 8
N_ACTORS = 2                  # multi.rollout: N_ACTORS x N_ENVS // N_ACTORS
BUSY_SECONDS = 0.5e-3         # CPU time a busy env burns per step
WARMUP_SECONDS = 0.5
ACTOR_CALLS = 64              # actor floor: calls between two clock reads
try:
    N_CPUS = len(os.sched_getaffinity(0))
except AttributeError:        # not on Linux
    N_CPUS = os.cpu_count() or 1


class BusyEnv(gymnasium.Env):
    """A CPU-bound env: each ``step`` burns ``busy`` seconds of CPU time.

    The wait is measured in this thread's CPU time, not wall time, so the
    env does the same work however loaded the machine is. Episodes are
    truncated after ``length`` steps; the observation is cheap to make.
    """

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, busy=BUSY_SECONDS, length=200):
        self.busy, self.length, self.t = busy, length, 0

    def _obs(self):
        return np.full(4, self.t / self.length, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        deadline = time.thread_time() + self.busy
        while time.thread_time() < deadline:
            pass
        self.t += 1
        return self._obs(), 1.0, False, self.t >= self.length, {}


def make_cartpole():
    return gymnasium.make("CartPole-v1")


class MLPActor(BaseActorModule):
    """The benchmark's actor; :meth:`sample` is what every row calls."""

    def __init__(self, n_obs=4, n_actions=2, n_hidden=64):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(n_obs, n_hidden), nn.Tanh(),
            nn.Linear(n_hidden, n_hidden), nn.Tanh(),
            nn.Linear(n_hidden, n_actions))

    def sample(self, obs):
        logits = self.mlp(obs)
        return torch.distributions.Categorical(logits=logits).sample()

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return self.sample(obs), (), {}


WORKLOADS = {"cartpole": (make_cartpole, 128), "busy": (BusyEnv, 32)}


def timed(fragment, steps_per_fragment, seconds, on_start=None):
    """Time ``fragment()`` for ``seconds`` after a warm-up (at least two
    calls), whole fragments only; ``on_start()`` runs as the timing starts.

    Returns ``{"steps_per_s", "steps", "learner_cpu"}``, the last being
    this process's CPU time (all its threads) over the wall time."""
    tic = time.perf_counter()
    for n in range(1, 1 << 30):
        fragment()
        if n >= 2 and time.perf_counter() - tic >= WARMUP_SECONDS:
            break
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


class Arrays:
    """Preallocated obs/act/rew/done of one fragment, for the loops that
    rlplay does not drive (``obs`` has the lookahead row ``T``)."""

    def __init__(self, space, n_steps, n_envs):
        self.obs = np.zeros((n_steps + 1, n_envs, *space.shape), space.dtype)
        self.act = np.zeros((n_steps, n_envs), np.int64)
        self.rew = np.zeros((n_steps, n_envs), np.float32)
        self.done = np.zeros((n_steps, n_envs), bool)
        self.obs_pyt = torch.from_numpy(self.obs)  # the same memory


def run_hand(factory, actor, n_steps, seconds, sample=None, on_start=None):
    """The hand-written loop; ``sample`` replaces ``actor.sample`` (the
    profile passes a clocked one)."""
    sample = actor.sample if sample is None else sample
    envs = [factory() for _ in range(N_ENVS)]
    buf = Arrays(envs[0].observation_space, n_steps, N_ENVS)
    for j, env in enumerate(envs):
        buf.obs[0, j], _ = env.reset(seed=j)

    def fragment():
        obs, act, rew, done = buf.obs, buf.act, buf.rew, buf.done
        for t in range(n_steps):
            actions = sample(buf.obs_pyt[t]).numpy()
            act[t] = actions
            obs_next, rew_t, done_t = obs[t + 1], rew[t], done[t]
            for j, (env, a) in enumerate(zip(envs, actions.tolist())):
                x, r, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    x, _ = env.reset()
                    done_t[j] = True
                else:
                    done_t[j] = False
                obs_next[j] = x
                rew_t[j] = r
        obs[0] = obs[n_steps]

    try:
        return timed(fragment, n_steps * N_ENVS, seconds, on_start)
    finally:
        for env in envs:
            env.close()


def run_vector(vector_env, factory, actor, n_steps, seconds):
    venv = vector_env([factory] * N_ENVS,
                      autoreset_mode=AutoresetMode.SAME_STEP)
    buf = Arrays(venv.single_observation_space, n_steps, N_ENVS)
    buf.obs[0], _ = venv.reset(seed=0)

    def fragment():
        obs, act, rew, done = buf.obs, buf.act, buf.rew, buf.done
        for t in range(n_steps):
            actions = actor.sample(buf.obs_pyt[t]).numpy()
            act[t] = actions
            obs[t + 1], rew[t], terminated, truncated, _ = venv.step(actions)
            np.logical_or(terminated, truncated, out=done[t])
        obs[0] = obs[n_steps]

    try:
        return timed(fragment, n_steps * N_ENVS, seconds)
    finally:
        venv.close()


def run_generator(feed, steps_per_batch, seconds, on_start=None):
    with closing(feed):
        return timed(lambda: next(feed), steps_per_batch, seconds, on_start)


# floors: the envs alone and the actor alone

def run_envs_alone(factory, n_steps, seconds):
    """``N_ENVS`` envs stepped with random actions drawn up front, reset
    when an episode ends; nothing stored."""
    envs = [factory() for _ in range(N_ENVS)]
    for j, env in enumerate(envs):
        env.reset(seed=j)
    rng = np.random.default_rng(0)
    actions = [[int(a) for a in rng.integers(
        envs[0].action_space.n, size=N_ENVS)] for _ in range(n_steps)]

    def fragment():
        for actions_t in actions:
            for env, a in zip(envs, actions_t):
                _, _, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    env.reset()

    try:
        return timed(fragment, n_steps * N_ENVS, seconds)
    finally:
        for env in envs:
            env.close()


def run_actor_alone(factory, actor, n_envs, seconds):
    """One batched ``actor.step`` for ``n_envs`` envs on a fixed
    observation (their reset observations), ``ACTOR_CALLS`` times."""
    envs = [factory() for _ in range(n_envs)]
    obs = np.stack([env.reset(seed=j)[0] for j, env in enumerate(envs)])
    for env in envs:
        env.close()
    row = (torch.zeros((1, n_envs), dtype=torch.int64),
           torch.from_numpy(obs).unsqueeze(0),
           torch.zeros((1, n_envs), dtype=torch.int64),
           torch.zeros((1, n_envs), dtype=torch.float32),
           torch.zeros((1, n_envs), dtype=torch.bool))

    def fragment():
        for _ in range(ACTOR_CALLS):
            actor.step(*row, hx=(), virtual=False)

    return timed(fragment, ACTOR_CALLS * n_envs, seconds)


# the profile: perf_counter accumulators wrapped around the actor and envs

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


class Row:
    """A row of the table: ``run(seconds)`` returns a dict with
    ``steps_per_s`` (and more), or a string saying why it was skipped.

    ``kind`` is ``floor``, ``row`` or ``profile``; ``ceiling`` names the
    ceiling of a ``row`` (``"1x8"``, ``"2x4"``, ``"async"``...)."""

    def __init__(self, name, run, kind="row", ceiling=None):
        self.name, self.run, self.kind, self.ceiling = name, run, kind, ceiling
        self.workload = name.split("/")[0]


def n_cores(n_workers):
    return min(n_workers, N_CPUS)


def rows(env_name, profile=False):
    """The :class:`Row` of an env: floors first, then the table, then the
    profile's (with ``profile``)."""
    factory, n_steps = WORKLOADS[env_name]
    actor = MLPActor()
    n_per_actor = N_ENVS // N_ACTORS
    n2 = n_cores(N_ACTORS)

    def gen(module, *counts, steps_per_batch=n_steps * N_ENVS, **kwargs):
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
        row("single.rollout", gen(single, N_ENVS), f"1x{N_ENVS}"),
        # n_buffers: two per actor, n_per_batch: one fragment per actor
        row("multi.rollout",
            gen(multi, N_ACTORS, n_per_actor, 2 * N_ACTORS, N_ACTORS),
            f"{n2}x{n_per_actor}"),
        row(f"multi.rollout.{N_ACTORS}x{N_ENVS}",
            gen(multi, N_ACTORS, N_ENVS, 2 * N_ACTORS, N_ACTORS,
                steps_per_batch=n_steps * N_ENVS * N_ACTORS),
            f"{n2}x{N_ENVS}"),
        row("AsyncVectorEnv",
            lambda s: run_vector(AsyncVectorEnv, factory, actor, n_steps, s),
            "async"),
        # multi.rollout's layout, the workers being Ray actors
        row("cluster.rollout",
            gen(cluster, N_ACTORS, n_per_actor, 2 * N_ACTORS, N_ACTORS),
            f"{n2}x{n_per_actor}"),
    ]
    if profile:
        table += [
            Row(f"{env_name}/profile.{kind}",
                lambda s, kind=kind: run_profile(kind, factory, actor,
                                                 n_steps, s), "profile")
            for kind in ("same", "hand")]
    skip = {"busy": {"SyncVectorEnv", "single.rollout",
                     "same.rollout.check_always"},
            "cartpole": {"cluster.rollout"}}.get(env_name, set())
    return [r for r in table if r.name.split("/", 1)[1] not in skip]


def ceilings(env_rate, actor_rates):
    """``{name: steps/s}`` of the ceilings of one env and round, from the
    floors: ``env_rate`` and ``{n_envs: actor_rate}``."""
    result = {}
    n2 = n_cores(N_ACTORS)
    for n_envs, actor_rate in sorted(actor_rates.items(), reverse=True):
        one = 1 / (1 / env_rate + 1 / actor_rate)
        if n_envs == N_ENVS:
            result[f"1x{n_envs}"] = one
        result[f"{n2}x{n_envs}"] = n2 * one
    if N_ENVS in actor_rates:
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


def stats(values):
    """Median, min and max of a non-empty list."""
    return float(np.median(values)), min(values), max(values)


def measure(selected, n_rounds, seconds):
    """Run every row once per round, in turn. Returns ``{name: {round:
    result}}`` and ``{name: reason}`` of skipped and failed rows."""
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


def paired(numerators, denominators):
    """Per-round ratios of two ``{round: value}``, for the rounds that have
    both; ``None`` if none."""
    ratios = [numerators[r] / denominators[r] for r in numerators
              if r in denominators]
    return ratios or None


def analyse(selected, results):
    """Rates per round of every row, ceilings and the ratios of each row.

    Returns a list of output records (dicts), in table order."""
    rate = {name: {r: res["steps_per_s"] for r, res in rounds.items()}
            for name, rounds in results.items()}
    records = []
    for env_name in dict.fromkeys(row.workload for row in selected):
        env_rows = [row for row in selected if row.workload == env_name]
        # floors
        for row in env_rows:
            if row.kind == "floor" and row.name in rate:
                records.append(_record(row.name, "floor", rate[row.name]))
        # ceilings, per round from that round's floors
        env_rate = rate.get(f"{env_name}/floor.envs", {})
        actor_rates = {int(name.rsplit(".", 1)[1]): values
                       for name, values in rate.items()
                       if name.startswith(f"{env_name}/floor.actor.")}
        ceiling = {}
        for r in env_rate:
            at_r = {b: v[r] for b, v in actor_rates.items() if r in v}
            for key, value in ceilings(env_rate[r], at_r).items():
                ceiling.setdefault(key, {})[r] = value
        for key, values in ceiling.items():
            records.append(dict(_record(f"{env_name}/ceiling.{key}",
                                        "ceiling", values),
                                note=ceiling_note(key)))
        # the table
        hand = rate.get(f"{env_name}/hand", {})
        same_ = rate.get(f"{env_name}/same.rollout", {})
        for row in env_rows:
            if row.kind != "row" or row.name not in rate:
                continue
            values = rate[row.name]
            ratio_same = paired(values, same_)
            pct = paired(values, ceiling.get(row.ceiling, {}))
            efficiency = None
            if row.name.endswith(f".{N_ACTORS}x{N_ENVS}") and ratio_same:
                efficiency = [x / N_ACTORS for x in ratio_same]
            records.append(dict(
                _record(row.name, "row", values),
                ratio=_median(paired(values, hand)),
                ratio_same=_median(ratio_same),
                pct_ceiling=_median(pct and [100 * x for x in pct]),
                ceiling=row.ceiling,
                efficiency=_median(efficiency),
                learner_cpu=_median([res["learner_cpu"] for res in
                                     results[row.name].values()])))
    return records


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


def _record(name, kind, values):
    median, low, high = stats(list(values.values()))
    return {"name": name, "kind": kind, "steps_per_s": round(median, 1),
            "min": round(low, 1), "max": round(high, 1),
            "rounds": [round(values[r], 1) for r in sorted(values)]}


def _median(values):
    return None if not values else float(np.median(values))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="See the module docstring for what each row measures.")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row")
    parser.add_argument("--duration", "--seconds", type=float, default=1.5,
                        dest="seconds",
                        help="timed seconds per row and round, after a "
                             f"{WARMUP_SECONDS} s warm-up (default 1.5)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds over all rows; a row reports its "
                             "median and min-max (default 5)")
    parser.add_argument("--only", default="",
                        help="run the rows whose name contains this (or "
                             "any of these, comma-separated); the floors "
                             "of their env run too")
    parser.add_argument("--profile", action="store_true",
                        help="also profile same.rollout and the hand loop: "
                             "us per env step in the actor, the envs and "
                             "the rest")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be at least 1 and --duration positive")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    patterns = [p for p in args.only.split(",") if p] or [""]
    every = [row for env_name in WORKLOADS
             for row in rows(env_name, args.profile)]
    wanted = {row.name for row in every
              if any(p in row.name for p in patterns)}
    # the floors of every env measured, and the plain rows a profile needs
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
        for record in records + notes:
            print(json.dumps({key: _round(value) for key, value
                              in record.items()}))
    else:
        print(header)
        print_table(records, notes, order, costs)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def print_table(records, notes, order, costs):
    name_width = 34
    print("\nfloors and ceilings: steps/s, median [min-max] over rounds")
    for record in records:
        if record["kind"] in ("floor", "ceiling"):
            print(f"{record['name']:<{name_width}} "
                  f"{_spread(record)}  {record.get('note', '')}")

    print(f"\n{'name':<{name_width}} {'steps/s':>9} {'[min-max]':<19} "
          f"{'x hand':>6} {'x same':>6} {'%ceil':>5} {'ceiling':>7} "
          f"{'eff':>4} {'lrn':>4}")
    table = [r for r in records if r["kind"] == "row"] + notes
    for record in sorted(table, key=lambda r: order.get(r["name"], 0)):
        if "skipped" in record or "failed" in record:
            what = "skipped" if "skipped" in record else "failed"
            print(f"{record['name']:<{name_width}} {what}: {record[what]}")
            continue
        pct = record["pct_ceiling"]
        print(f"{record['name']:<{name_width}} {_spread(record)} "
              f"{_fmt(record['ratio']):>6} {_fmt(record['ratio_same']):>6} "
              f"{'-' if pct is None else f'{pct:.0f}%':>5} "
              f"{record['ceiling'] or '-':>7} "
              f"{_fmt(record['efficiency']):>4} "
              f"{_fmt(record['learner_cpu']):>4}")
    print("x hand, x same: over the hand-written loop's and same.rollout's "
          "steps/s on the same env; %ceil: of ceiling.<ceiling>; eff: "
          f"x same / {N_ACTORS}; lrn: this process's CPU time over wall "
          "time (cores). Ratios are medians of per-round ratios.")

    for record in records:
        if record["kind"] != "profile":
            continue
        parts = record["us_per_step"]
        print(f"\n{record['name']}: us per env step, median [min-max] over "
              f"rounds; per wrapped call, {costs[0] * 1e9:.0f} ns of clock "
              f"removed from the parts, {costs[1] * 1e9:.0f} ns of wrapper "
              "from the whole")
        print(f"{'':<26} {'same.rollout':<26} {'hand':<26}")
        for key in ("actor call", "env step + reset", "rest", "as in hand",
                    "rlplay's extra", "whole", "plain row",
                    "instrumentation"):
            label = f"  {key}" if key in ("as in hand",
                                          "rlplay's extra") else key
            cells = [_us(parts[kind].get(key)) for kind in ("same", "hand")]
            if key == "as in hand":
                cells[1] = ""
            if any(cells):
                print(f"  {label:<24} {cells[0]:<26} {cells[1]:<26}")


def _spread(record):
    low, high = record["min"], record["max"]
    return (f"{record['steps_per_s']:>9,.0f} "
            f"{f'[{low:,.0f}-{high:,.0f}]':<19}")


def _us(part):
    if part is None:
        return ""
    return (f"{part['median']:.2f} [{part['min']:.2f}-{part['max']:.2f}]")


def _round(value):
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {key: _round(v) for key, v in value.items()}
    return value


def _fmt(ratio):
    return "-" if ratio is None else f"{ratio:.2f}"


if __name__ == "__main__":
    main()
