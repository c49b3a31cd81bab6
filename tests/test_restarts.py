"""Restarts of failed workers (``restarts=``, ``restart_delay=``) in
``single``, ``multi``, the ``Evaluator`` and ``cluster``.

Each fault happens a set number of times in a run, at a known step of a
known worker, whichever process gets there first: a
:class:`~envs.FlakyEnv` fails only when it claims a marker file in
``tmp_path``, created atomically (``O_CREAT | O_EXCL``). So a replacement,
whose env reaches the same step again, goes on. The faults, at step 6 of
worker 0 (in its second fragment), or step 9 of the evaluator's worker
(in its second evaluation):

- ``exit``: the env calls ``os._exit(3)``;
- ``kill``: the env hangs there and is SIGKILLed from here (mid fragment,
  for sure);
- ``step``: the env's ``step`` raises;
- ``factory``: the env exits, then the factory fails once more, when it
  is called with a seed of generation 1 (the engine passes ``seed=``), so
  that generation 2 delivers.

With ``restarts=2``, under fork and forkserver (under spawn: the factory's
fault), each fragment
delivered is checked against the one collected here with the core loop
alone from the seeds of the generation that collected it
(:func:`reference`): before the failure, those of generation 0; after it,
those of the replacement's generation, from resets (row 0: ``fin``,
``stepno = 0``), with ``meta.seq`` going on where the last fragment
received left off and ``meta.generation`` saying which generation
collected it (after two failures, 0, 1, then 2). So the fragment in
flight is never delivered in part, and no episode cut by the failure
shows in the statistics; ``single`` keeps a lag of exactly 1. The
evaluator's results are checked the same way.

Then, under fork: ``restarts=0`` raises as without restarts; the actor's
errors (in ``cluster`` too) and rlplay's own checks are never restarted;
crash loops raise at once; a spent budget raises with the count; the same
failures give the same run; a replacement loads the latest parameters; a
worker killed holding the parameters' lock does not wedge the run
(``multi`` under fork and forkserver, whose lock is a named semaphore as
under spawn); waiting out ``restart_delay`` is no stall. In ``cluster``:
a killed Ray actor is replaced by a new one whose fragments are the
reference's of its generation, and waiting out ``restart_delay`` is no
stall there either. And a soak: 200 batches over envs that crash at
random, every fragment checked, no resource growing.

No child process is left (conftest's fixture) and no shared memory either
(:func:`no_shm_left`, here).
"""
import contextlib
import functools
import gc
import itertools
import multiprocessing.synchronize
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

from envs import (CountingEnv, counting_factory, flaky_factory, claim,
                  in_worker, random_crash_factory)
from procs import children as _direct_children
from generators import (ActorFailure, CountingActor, RaisesAfter,
                        assert_fragments_equal, identities,
                        make as make_generator, slot, wait_started,
                        without_version)
from reference import reference as core_reference
from rlplay.engine import WorkerDied, WorkerError, evaluate
from rlplay.engine.envs import make_envs
from rlplay.engine.nested import suply
from rlplay.engine.rollout import multi
from rlplay.engine.workers._params import SharedParams
from rlplay.engine.seeds import (EVAL_COLLECTOR, PROBE_COLLECTOR,
                                 env_seed_sequences,
                                 next_reset_seeds, reset_seed)
from rlplay.engine.utils import get_context, preload_forkserver

preload_forkserver(get_context("forkserver"),
                   ("pytest", "envs", "generators", __name__))

FAULTS = ["exit", "kill", "step", "factory"]
T, B, TERM = 4, 2, 3      # steps per fragment, envs per worker, episode
AT = 6                    # the step that fails: in fragment 1 (steps 5..8)
EVAL_AT = 9               # in the evaluator's second evaluation (7..12)
LOST = (AT - 1) // T      # the seq of the fragment lost
ENTROPY = 7
DELAY = 0.05              # restart_delay
# the bounds (bounds.py says why)
from bounds import (JOIN, MARGIN, RAY_START, RAY_STEADY,  # noqa: E402
                    SHUTDOWN, SOAK, STEADY as BOUND, START)
PLAIN = functools.partial(counting_factory, term_every=TERM)
# what each fault leaves in the failed worker's last_cause
CAUSES = {"exit": "exit code 3", "kill": "signal SIGKILL",
          "step": "ValueError: step failed on purpose",
          "factory": "RuntimeError: factory failed on purpose"}


# ---------------------------------------------------------------- helpers --

def _shm_footprint():
    """This process's shared memory: /dev/shm entries named after it, and
    the /dev/shm files it maps or holds open (pools, named semaphores,
    torch's segments). Other processes' entries do not count."""
    pid = os.getpid()
    names = {name for name in os.listdir("/dev/shm")
             if f"-{pid}-" in name or f"_{pid}_" in name}
    held = set()
    with open("/proc/self/maps") as maps:
        held.update(line.split(None, 5)[-1].strip() for line in maps
                    if "/dev/shm/" in line)
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("/dev/shm/"):
                held.add(target)
    return names | held


def _heap_arena(path):
    # multiprocessing's heap (ctypes Values) maps arenas named pym-<pid>-*
    # once and keeps them for the life of the process, by design
    return os.path.basename(path).startswith("pym-")


@pytest.fixture(autouse=True)
def no_shm_left(monkeypatch, request):
    """Fail a test that leaves a shared-memory segment behind (once the
    generators it made are closed and collected): in this process's
    footprint, or a named semaphore it made (``sem.mp-*``: named, under
    spawn and forkserver, until the lock is collected). A test of
    ``cluster`` joins the session's Ray before the footprint is taken
    (Ray's object store stays mapped for the session)."""
    callspec = getattr(request.node, "callspec", None)
    if "ray_cluster" in request.fixturenames or (
            callspec is not None and callspec.params.get("kind") == "cluster"):
        request.getfixturevalue("ray_cluster")
    made, init = [], multiprocessing.synchronize.SemLock.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self._semlock.name is not None:
            made.append(self._semlock.name)

    monkeypatch.setattr(multiprocessing.synchronize.SemLock, "__init__", spy)
    gc.collect()
    before = _shm_footprint()
    yield
    gc.collect()
    left = {path for path in _shm_footprint() - before
            if not _heap_arena(path)}
    left |= {name for name in made
             if os.path.exists(f"/dev/shm/sem.{name.lstrip('/')}")}
    assert not left, f"shared memory left behind: {sorted(left)}"


def markers(tmp_path, name, n=1):
    return [str(tmp_path / f"{name}-{i}") for i in range(n)]


def seeds_of(collector, generation, n_envs=B):
    """The integer seeds the envs of that collector's generation get."""
    return {reset_seed(seq) for seq in env_seed_sequences(
        ENTROPY, n_envs, collector, generation)}


def reset_obs(collector, generation, n_envs=B):
    """The first observation of each env of that collector's generation
    (a CountingEnv's offset comes from its reset seed)."""
    return [float(CountingEnv().reset(seed=reset_seed(seq))[0][0])
            for seq in env_seed_sequences(ENTROPY, n_envs, collector,
                                          generation)]


def fault_factory(tmp_path, fault, *, at=AT, worker=0, collector=0,
                  n_envs=B, times=1):
    """The factory of a run with ``fault`` (see the module docstring),
    happening ``times`` times in worker ``worker``; and the generation that
    runs once the failures are over."""
    env_markers = markers(tmp_path, "env", times)
    if fault == "factory":
        return functools.partial(
            flaky_factory, fault="exit", markers=env_markers, at=at,
            worker=worker, failing_seeds=seeds_of(collector, 1, n_envs),
            factory_markers=markers(tmp_path, "factory")), times + 1
    return functools.partial(
        flaky_factory, fault="hang" if fault == "kill" else fault,
        markers=env_markers, at=at, worker=worker), times


@contextlib.contextmanager
def killer(tmp_path):
    """SIGKILL every worker that hangs on purpose (it writes its pid to a
    ``.pid`` file in ``tmp_path``) as soon as it says so; yields the list
    of pids killed."""
    stop, killed = threading.Event(), []

    def run():
        while not stop.wait(0.01):
            for path in sorted(tmp_path.glob("*.pid")):
                pid = int(path.read_text())
                if pid not in killed:
                    killed.append(pid)
                    os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=run, name="killer", daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        stop.set()
        thread.join(JOIN)


def reference(worker, generation, seq, count, n_envs=B):
    """Fragments ``seq .. seq + count - 1`` of worker ``worker`` as its
    generation ``generation`` collects them from its start, collected here
    with the core loop alone."""
    return core_reference(PLAIN, CountingActor(), T, n_envs, ENTROPY,
                          worker=worker, count=count, generation=generation,
                          seq=seq)


class SeedActor(CountingActor):
    """A CountingActor whose actions, hence the returns, depend on the
    offset that the reset seed gives a CountingEnv (in thousands): ``act =
    (obs // 1000 + stepno) % 5``."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        act, hx, info = super().step(stepno, obs, act, rew, fin, hx=hx,
                                     virtual=virtual)
        return (obs[..., 0].long() // 1000 + stepno) % 5, hx, info


def reference_evaluations(generation, count, n_envs=2, n_episodes=4):
    """The first ``count`` evaluations of the evaluator's worker of
    generation ``generation``, played here."""
    seeds = env_seed_sequences(ENTROPY, n_envs, EVAL_COLLECTOR, generation)
    envs = make_envs(PLAIN, seeds)
    actor = SeedActor().eval()
    return [evaluate(envs, actor, n_episodes,
                     seed_sequences=next_reset_seeds(seeds))
            for _ in range(count)]


def assert_reset_row(fragment, collector, generation):
    """Row 0 is the start of a new generation: every env reset, from that
    generation's seeds."""
    state = fragment.state
    assert torch.all(state.fin[0]) and torch.all(state.stepno[0] == 0)
    assert torch.all(state.rew[0] == 0) and torch.all(state.act[0] == 0)
    assert state.obs[0, :, 0].tolist() == reset_obs(collector, generation)
    assert torch.all(fragment.hx == 0)


def check_restarts(feed, restarts):
    """``stats["restarts"]``: as many as the accounts say, even after the
    failure that broke the generator."""
    assert feed.stats["restarts"] == restarts == sum(
        account["restarts"] for account in feed.stats["workers"])


def check_account(account, restarts, cause):
    assert account["restarts"] == restarts
    assert account["lost"] == restarts  # each failure held a fragment
    if cause is None:
        assert account["last_cause"] is None
    else:
        assert cause in account["last_cause"]


def gen_kwargs(start_method, **kwargs):
    """The generators' arguments here (``restarts=2``), updated with
    ``kwargs``."""
    args = dict(entropy=ENTROPY, start_method=start_method, restarts=2,
                restart_delay=DELAY, timeout=BOUND, start_timeout=START,
                shutdown_timeout=SHUTDOWN)
    args.update(kwargs)
    return args


def make_multi(factory, start_method="fork", actor=None, **kwargs):
    """Two workers of ``B`` envs, two buffers each, two fragments a batch
    (one worker under spawn: while a spawned replacement imports torch, a
    learner fed by another worker would take a core from it)."""
    n_actors = 1 if start_method == "spawn" else 2
    return make_generator("multi", factory, actor or CountingActor(), T, B,
                          n_actors=n_actors, n_buffers=2 * n_actors,
                          n_per_batch=2, **gen_kwargs(start_method, **kwargs))


def make_single(factory, start_method="fork", actor=None, **kwargs):
    return make_generator("single", factory, actor or CountingActor(), T, B,
                          **gen_kwargs(start_method, **kwargs))


def make_ray(factory, start_method=None, actor=None, n_actors=2,
             n_buffers=4, n_per_batch=2, n_envs=B, **kwargs):
    """``cluster``, on the session's local Ray: two Ray actors of ``B``
    envs, two buffers each, two fragments a batch (Ray starts the actors:
    ``start_method`` is left out); the bounds of Ray's actors."""
    args = gen_kwargs(None, timeout=RAY_STEADY, start_timeout=RAY_START)
    del args["start_method"]
    args.update(kwargs)
    return make_generator("cluster", factory, actor or CountingActor(), T,
                          n_envs, n_actors=n_actors, n_buffers=n_buffers,
                          n_per_batch=n_per_batch, **args)


def make_evaluator(factory, start_method="fork", actor=None, **kwargs):
    """Two envs, four episodes of 3 steps: 6 steps per env and evaluation
    (step 6 ends the first evaluation: faults go at step 9)."""
    return make_generator("evaluator", factory, actor or SeedActor(),
                          n_envs=2, n_episodes=4,
                          **gen_kwargs(start_method, **kwargs))


def run_multi(feed, worker, restarts, after=3, keep=20, bound=START):
    """Iterate until worker ``worker`` has ``restarts`` restarts and
    delivered ``after`` fragments since, checking each batch's
    statistics; returns ``(seqs, got)``: per worker the ``meta.seq`` of
    each fragment delivered, in order, and copies of worker ``worker``'s
    fragments and of the others' first ``keep``, by ``(w, seq)``."""
    seqs, got = tuple([] for _ in feed.pids), {}
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        batch = next(feed)
        for s, (w, seq) in enumerate(identities(batch, 2, B)):
            seqs[w].append(seq)
            if w == worker or seq < keep:
                got[w, seq] = suply(torch.clone, slot(batch, s, B, hx_dim=0))
        # no partial episode: every episode in the stats is a whole one
        assert np.all(feed.stats["lengths"] == TERM)
        if feed.stats["workers"][worker]["restarts"] == restarts and \
                len(seqs[worker]) >= LOST + after:
            return seqs, got
    pytest.fail(f"worker {worker} did not come back within {bound} s: "
                f"{feed.stats['workers']}")


def check_multi(seqs, got, worker, generation):
    """Per worker, the fragments ``0 .. d - 1`` in order; worker
    ``worker``'s from ``LOST`` on are its generation ``generation``'s."""
    for w in range(len(seqs)):
        assert seqs[w] == list(range(len(seqs[w])))  # no gap, no duplicate
        kept = sorted(seq for v, seq in got if v == w)
        if w == worker:
            want = reference(w, 0, 0, LOST) + reference(
                w, generation, LOST, len(kept) - LOST)
        else:
            want = reference(w, 0, 0, len(kept))
        for seq in kept:
            assert_fragments_equal(without_version(got[w, seq]),
                                   without_version(want[seq]))
            # 0 before the failure, then the replacement's generation
            expected = generation if w == worker and seq >= LOST else 0
            assert torch.all(got[w, seq].meta.generation == expected)
    assert_reset_row(got[worker, LOST], worker, generation)
    assert reset_obs(worker, generation) != reset_obs(worker, 0)


def run_single(feed, n_batches=6):
    """``n_batches`` fragments (copies), checking the policy lag and the
    statistics of each."""
    fragments = []
    for k, batch in enumerate(itertools.islice(feed, n_batches)):
        assert torch.all(batch.meta.seq == k)
        # lag exactly 1, restart or not
        assert torch.all(batch.meta.version == max(k - 1, 0))
        assert feed.stats["lag"] == int(k > 0)
        assert np.all(feed.stats["lengths"] == TERM)
        fragments.append(suply(torch.clone, batch))
    assert len(fragments) == n_batches
    return fragments


def check_single(fragments, generation):
    want = reference(0, 0, 0, LOST) + reference(
        0, generation, LOST, len(fragments) - LOST)
    for got, ref in zip(fragments, want):
        assert_fragments_equal(without_version(got), without_version(ref))
    assert_reset_row(fragments[LOST], 0, generation)
    # 0 before the failure, then the replacement's generation
    assert [fragment.meta.generation.tolist() for fragment in fragments] \
        == [[0] * B] * LOST + [[generation] * B] * (len(fragments) - LOST)


def run_evaluator(evaluator, actor, count=3):
    """``count`` requests, one after the other; returns the results.

    ``result()`` waits by the evaluator's own bound: its
    ``timeout`` (BOUND), plus ``start_timeout`` (START) while a replacement
    starts, which is what the library promises; a bound of BOUND alone
    failed once under two CPU hogs, while a spawned replacement imported
    torch."""
    results = []
    for _ in range(count):
        version = evaluator.submit(actor)
        result = evaluator.result()
        assert result.version == version
        results.append(result)
    return results


def check_evaluations(results, generation):
    """Evaluation 0 by generation 0; evaluation 1, lost with generation 0,
    played again by ``generation`` from its start; then its second."""
    want = reference_evaluations(0, 1) + reference_evaluations(
        generation, len(results) - 1)
    for got, (returns, lengths) in zip(results, want):
        assert np.array_equal(got.returns, returns)
        assert np.array_equal(got.lengths, lengths)
        assert np.all(got.lengths == TERM)  # whole episodes only
    # what generation 0 would have returned differs: the replacement
    # played from seeds of its own
    assert not np.array_equal(results[1].returns,
                              reference_evaluations(0, 2)[1][0])


# ------------------------------------ the run goes on: fork, forkserver, spawn

# every fault under fork and forkserver; under spawn, whose replacements
# differ only in how they start (a fresh interpreter that unpickles the
# worker's spec and imports torch, seconds each on a 2-core machine), one:
# the factory's, whose run starts two spawned replacements, the first of
# which fails in its factory
SURVIVES = [(method, fault) for method in ("fork", "forkserver")
            for fault in FAULTS] + [("spawn", "factory")]


@pytest.mark.parametrize("start_method, fault", SURVIVES)
def test_multi_survives(tmp_path, start_method, fault):
    factory, generation = fault_factory(tmp_path, fault)
    feed = make_multi(factory, start_method)
    with killer(tmp_path) as killed, feed:
        seqs, got = run_multi(feed, 0, generation)
        assert len(killed) == (fault == "kill")
    check_multi(seqs, got, 0, generation)
    restarts = generation  # one per failure, none for worker 1
    check_restarts(feed, restarts)
    check_account(feed.stats["workers"][0], restarts, CAUSES[fault])
    for account in feed.stats["workers"][1:]:
        check_account(account, 0, None)


@pytest.mark.parametrize("start_method, fault", SURVIVES)
def test_single_survives(tmp_path, start_method, fault):
    factory, generation = fault_factory(tmp_path, fault)
    feed = make_single(factory, start_method)
    with killer(tmp_path) as killed, feed:
        fragments = run_single(feed)
        assert len(killed) == (fault == "kill")
        check_restarts(feed, generation)
        check_account(feed.stats["workers"][0], generation, CAUSES[fault])
    check_single(fragments, generation)


@pytest.mark.parametrize("start_method, fault", SURVIVES)
def test_evaluator_survives(tmp_path, start_method, fault):
    factory, generation = fault_factory(tmp_path, fault, at=EVAL_AT,
                                        collector=EVAL_COLLECTOR)
    actor = SeedActor()
    evaluator = make_evaluator(factory, start_method, actor)
    with killer(tmp_path) as killed, evaluator:
        results = run_evaluator(evaluator, actor)
        assert len(killed) == (fault == "kill")
    check_evaluations(results, generation)
    check_restarts(evaluator, generation)
    assert evaluator.stats["evaluations"] == 3
    check_account(evaluator.stats["workers"][0], generation, CAUSES[fault])


# -------------------------------------------------- meta.generation --

@pytest.mark.parametrize("kind", ["single", "multi"])
def test_generation_counts_the_restarts(tmp_path, kind):
    """Worker 0 fails twice, each time in the second fragment of its
    generation: generation 0 delivers fragment 0, generation 1 (from
    resets) fragment 1, generation 2 (from resets) fragments 2 on. Each
    fragment's ``meta.generation`` is that of the worker that collected
    it, the number of restarts before it started; each fragment is the
    reference's of that generation (which records ``generation`` too)."""
    feed, generation = make(kind, tmp_path, "exit", times=2)
    assert generation == 2
    with feed:
        if kind == "multi":
            seqs, got = run_multi(feed, 0, 2)
            assert seqs[0] == list(range(len(seqs[0])))
            fragments = [got[0, seq] for seq in seqs[0]]
            others = [got[1, seq] for seq in seqs[1] if (1, seq) in got]
        else:
            fragments, others = run_single(feed), []
        check_restarts(feed, 2)
        check_account(feed.stats["workers"][0], 2, CAUSES["exit"])
    assert [fragment.meta.generation.tolist() for fragment in fragments] \
        == [[0] * B, [1] * B] + [[2] * B] * (len(fragments) - 2)
    want = reference(0, 0, 0, 1) + reference(0, 1, 1, 1) + reference(
        0, 2, 2, len(fragments) - 2)
    for got_fragment, ref in zip(fragments, want):
        assert_fragments_equal(without_version(got_fragment),
                               without_version(ref))
    assert_reset_row(fragments[1], 0, 1)
    assert_reset_row(fragments[2], 0, 2)
    # the other worker never restarted
    assert all(torch.all(fragment.meta.generation == 0)
               for fragment in others)


# ----------------------------------------------- when a restart is refused --

MAKERS = {"single": make_single, "multi": make_multi,
          "evaluator": make_evaluator}
KINDS = list(MAKERS)


class RaisingActor(RaisesAfter, SeedActor):
    """Raises at its ``after + 1``-th real step (in the worker's second
    fragment, or the evaluator's second evaluation)."""

    def __init__(self, after=T + 1):
        super().__init__(after)


def make(kind, tmp_path, fault, start_method="fork", actor=None, at=None,
         times=1, **kwargs):
    """A generator of ``kind`` whose worker 0 meets ``fault`` (see
    :func:`fault_factory`; by default at step 6, or 9 for the evaluator);
    and the generation that runs once the failures are over."""
    evaluator = kind == "evaluator"
    if at is None:
        at = EVAL_AT if evaluator else AT
    factory, generation = fault_factory(
        tmp_path, fault, at=at, times=times,
        collector=EVAL_COLLECTOR if evaluator else 0)
    return MAKERS[kind](factory, start_method, actor, **kwargs), generation


def fails(kind, feed, exc_type, bound=START):
    """Use the generator until it raises ``exc_type`` (within ``bound``
    s); returns the exception, checking that the generator stays
    broken with it."""
    actor = SeedActor()
    deadline = time.monotonic() + bound
    with pytest.raises(exc_type) as info:
        while time.monotonic() < deadline:
            if kind == "evaluator":
                feed.submit(actor)
                feed.result(timeout=BOUND)
            else:
                next(feed)
    with pytest.raises(exc_type) as again:
        feed.poll() if kind == "evaluator" else next(feed)
    assert again.value is info.value
    return info.value


def check_raised(err, fault):
    if fault in ("exit", "factory"):  # the factory's run: exit comes first
        assert isinstance(err, WorkerDied) and err.exitcode == 3
    elif fault == "kill":
        assert isinstance(err, WorkerDied)
        assert err.exitcode == -signal.SIGKILL
    else:
        assert isinstance(err, WorkerError) and err.exc_type is ValueError
    assert err.worker == 0
    assert CAUSES["exit" if fault == "factory" else fault].split(": ")[-1] \
        in str(err)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("kind", KINDS)
def test_no_restarts_raises_as_before(tmp_path, kind, fault):
    feed, _ = make(kind, tmp_path, fault, restarts=0)
    with killer(tmp_path), feed:
        err = fails(kind, feed, (WorkerDied, WorkerError))
    check_raised(err, fault)
    assert "restart" not in str(err)
    check_restarts(feed, 0)
    check_account(feed.stats["workers"][0], 0,
                  CAUSES["exit" if fault == "factory" else fault])


@pytest.mark.parametrize("kind", KINDS + ["cluster"])
def test_actor_errors_are_never_restarted(kind):
    maker = make_ray if kind == "cluster" else MAKERS[kind]
    feed = maker(PLAIN, "fork", RaisingActor(), restarts=5)
    with feed:
        err = fails(kind, feed, WorkerError,
                    RAY_START if kind == "cluster" else START)
    assert err.exc_type is ActorFailure and "after" not in str(err)
    check_restarts(feed, 0)


def test_rlplay_checks_are_never_restarted(tmp_path):
    # an observation of the wrong shape: rlplay's own check raises, a bug
    # that a new worker would only repeat
    factory = functools.partial(flaky_factory, fault="obs",
                                markers=markers(tmp_path, "env", 5))
    feed = make_multi(factory, restarts=5)
    with feed:
        err = fails("multi", feed, WorkerError)
    assert err.exc_type is ValueError and "obs" in str(err).lower()
    assert feed.stats["workers"][0]["restarts"] == 0
    assert len(os.listdir(tmp_path)) == 1  # it failed once


@pytest.mark.parametrize("kind", KINDS)
def test_crash_loop_raises_at_once(tmp_path, kind):
    """Generation 0 fails before delivering anything (step 2), and so
    does its replacement: raised at the second failure, with a budget of
    5."""
    feed, _ = make(kind, tmp_path, "exit", at=2, times=5, restarts=5)
    with feed:
        err = fails(kind, feed, WorkerDied)
    assert "crash loop" in str(err) and "after 1 restart" in str(err)
    assert err.exitcode == 3 and err.worker == 0
    check_restarts(feed, 1)
    check_account(feed.stats["workers"][0], 1, CAUSES["exit"])
    assert len(os.listdir(tmp_path)) == 2  # no third generation


@pytest.mark.parametrize("kind", KINDS)
def test_crash_loop_after_a_restart(tmp_path, kind):
    """Generation 0 delivers, then exits; the factory fails in generation
    1 and again in generation 2, neither delivering: a crash loop at the
    third failure."""
    evaluator = kind == "evaluator"
    collector = EVAL_COLLECTOR if evaluator else 0
    factory = functools.partial(
        flaky_factory, fault="exit", markers=markers(tmp_path, "env"),
        at=EVAL_AT if evaluator else AT,
        failing_seeds=seeds_of(collector, 1) | seeds_of(collector, 2),
        factory_markers=markers(tmp_path, "factory", 5))
    feed = MAKERS[kind](factory, "fork", restarts=5)
    with feed:
        err = fails(kind, feed, WorkerError)
    assert err.exc_type is RuntimeError
    assert "crash loop" in str(err) and "after 2 restarts" in str(err)
    check_restarts(feed, 2)
    check_account(feed.stats["workers"][0], 2, CAUSES["factory"])


@pytest.mark.parametrize("kind, fault", [
    ("single", "exit"), ("multi", "exit"), ("multi", "step"),
    ("evaluator", "exit")])
def test_budget_spent_raises_with_the_count(tmp_path, kind, fault):
    """Three failures, each after the worker delivered: the third raises
    with a budget of 2, and says so."""
    feed, _ = make(kind, tmp_path, fault, times=3, restarts=2)
    with feed:
        err = fails(kind, feed, (WorkerDied, WorkerError))
    check_raised(err, fault)
    assert str(err).endswith("after 2 restarts")
    assert "crash loop" not in str(err)
    check_restarts(feed, 2)
    check_account(feed.stats["workers"][0], 2, CAUSES[fault])
    assert len(os.listdir(tmp_path)) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_budget_spent_by_a_factory(tmp_path, kind):
    """The worker exits, its replacement's factory fails: with a budget
    of 1, that is raised, as the factory's error."""
    feed, _ = make(kind, tmp_path, "factory", restarts=1)
    with feed:
        err = fails(kind, feed, WorkerError)
    assert err.exc_type is RuntimeError and "in the factory" in str(err)
    assert str(err).endswith("after 1 restart")
    check_restarts(feed, 1)
    check_account(feed.stats["workers"][0], 1, CAUSES["factory"])


# --------------------------------------------------------- seeds, params --

@pytest.mark.parametrize("kind", KINDS)
def test_same_failures_same_run(tmp_path, kind):
    """Two runs with the same entropy and the same failure give the same
    data, after the restart too; the replacement's streams are its own:
    its reset observations are neither generation 0's nor those of any
    other collector of the run."""
    runs = []
    for run in range(2):
        folder = tmp_path / str(run)
        folder.mkdir()
        feed, generation = make(kind, folder, "step")
        with feed:
            if kind == "multi":
                seqs, got = run_multi(feed, 0, 1)
                runs.append([got[0, seq] for seq in seqs[0]])
            elif kind == "single":
                runs.append(run_single(feed))
            else:
                runs.append(run_evaluator(feed, SeedActor()))
    if kind == "evaluator":
        first, second = ([(r.returns, r.lengths) for r in results]
                         for results in runs)
        assert len(first) == len(second) == 3
        for (ret_a, len_a), (ret_b, len_b) in zip(first, second):
            assert np.array_equal(ret_a, ret_b)
            assert np.array_equal(len_a, len_b)
        return
    n = min(map(len, runs))
    assert n > LOST + 1
    for got, want in zip(runs[0][:n], runs[1][:n]):
        assert_fragments_equal(without_version(got), without_version(want))
    restarted = runs[0][LOST].state.obs[0, :, 0].tolist()
    others = reset_obs(0, 0) + reset_obs(1, 0) + reset_obs(0, 2) + \
        reset_obs(EVAL_COLLECTOR, 0) + reset_obs(PROBE_COLLECTOR, 0, 1)
    assert restarted == reset_obs(0, 1)
    assert not set(restarted) & set(others)


class ShiftActor(CountingActor):
    """A CountingActor; the tests set its ``shift`` to the version about to
    be published, so that ``act = (obs + stepno + meta.version) % 5``."""


def check_actions_follow_versions(fragment):
    state = fragment.state
    expected = (state.obs[:-1, :, 0].long() + state.stepno[:-1]
                + fragment.meta.version) % 5
    assert torch.equal(state.act[1:], expected)


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_replacement_loads_the_latest_parameters(tmp_path, kind):
    """The actor changes with every version; the replacement of a worker
    that fails in its fourth fragment (step 14) collects with the latest
    version, not the one it was made with."""
    actor = ShiftActor()
    factory, _ = fault_factory(tmp_path, "exit", at=3 * T + 2)
    feed = MAKERS[kind](factory, "fork", actor)
    first_after = None
    with feed:
        deadline = time.monotonic() + START
        for k in itertools.count():
            assert time.monotonic() < deadline
            with torch.no_grad():  # what next() #k publishes
                actor.shift.fill_(k if kind == "single" else k + 1)
            batch = next(feed)
            n = 1 if kind == "single" else 2
            for s, (w, seq) in enumerate(identities(batch, n, B)):
                fragment = batch if kind == "single" else slot(batch, s, B, 0)
                check_actions_follow_versions(fragment)
                if w == 0 and seq == 3:
                    first_after = int(fragment.meta.version[0])
            if first_after is not None:
                break
    assert feed.stats["workers"][0]["restarts"] == 1
    # a version published after the worker started: the actions of the
    # actor it was made with (shift 0) would not pass the checks above
    if kind == "single":
        assert first_after == 2  # lag 1: the version of next() #2
    else:
        assert first_after >= 1  # its buffer came back at next() #0 or later


class LockKillingActor(CountingActor):
    """Kills its own worker (worker 0) while it holds the parameters' lock:
    loading the shared parameters calls ``state_dict`` under the lock, and
    its second call there SIGKILLs the process, once in the run."""

    def __init__(self, marker, at=2):
        super().__init__()
        self.marker, self.at, self.calls = marker, at, 0

    def state_dict(self, *args, **kwargs):
        if in_worker(0):
            self.calls += 1
            if self.calls == self.at and claim([self.marker]):
                os.kill(os.getpid(), signal.SIGKILL)
        return super().state_dict(*args, **kwargs)


@pytest.fixture
def recoveries(monkeypatch):
    """What each ``SharedParams.recover`` call in this process returned
    (``True``: it released a lock that a dead worker held)."""
    calls, recover = [], SharedParams.recover

    def spy(self, pid):
        calls.append(recover(self, pid))
        return calls[-1]

    monkeypatch.setattr(SharedParams, "recover", spy)
    return calls


# under forkserver the lock is a named semaphore, as under spawn
@pytest.mark.parametrize("kind, start_method", [
    ("multi", "fork"), ("multi", "forkserver"), ("single", "fork")])
def test_killed_holding_the_lock(tmp_path, recoveries, kind, start_method):
    actor = LockKillingActor(str(tmp_path / "killed"))
    feed = MAKERS[kind](PLAIN, start_method, actor)
    with feed:
        # each next() publishes, under the lock, and would wait on a lock
        # that nobody releases
        deadline = time.monotonic() + START
        while feed.stats["workers"][0]["restarts"] == 0 or \
                feed.stats["workers"][0]["received"] < 4:
            assert time.monotonic() < deadline
            next(feed)
        for _ in range(4):
            next(feed)
        assert os.path.exists(tmp_path / "killed")
        assert True in recoveries  # the dead worker held it
        assert "signal SIGKILL" in feed.stats["workers"][0]["last_cause"]


def test_killed_holding_the_lock_without_restarts(tmp_path):
    feed = make_multi(PLAIN, actor=LockKillingActor(str(tmp_path / "k")),
                      restarts=0)
    with feed:
        err = fails("multi", feed, WorkerDied, bound=BOUND)
    assert err.exitcode == -signal.SIGKILL and err.worker == 0


@pytest.mark.parametrize("kind", ["single", "evaluator"])
def test_restart_delay_longer_than_timeout(tmp_path, kind):
    """Waiting out ``restart_delay`` is no stall: a delay of 1.5 s with a
    timeout of 0.5 s (the learner has nothing else to wait for)."""
    feed, generation = make(kind, tmp_path, "exit", timeout=0.5,
                            restart_delay=1.5)
    tic = time.monotonic()
    with feed:
        if kind == "single":
            check_single(run_single(feed), generation)
        else:
            # result()'s bound: the evaluator's timeout
            check_evaluations(run_evaluator(feed, SeedActor()), generation)
        assert feed.stats["restarts"] == 1
    assert time.monotonic() - tic > 1.5


def exited(pid):
    """Whether our child ``pid`` has exited, all its threads (and with them
    its descriptors) gone; it is left to be reaped by its owner."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG
                     | os.WNOWAIT) is not None


def test_evaluator_killed_while_idle():
    """A worker that dies between requests had nothing in flight: its
    replacement plays the next request from its own start (fork: the
    worker is this process's child)."""
    actor = SeedActor()
    evaluator = make_evaluator(PLAIN, actor=actor, restarts=1)
    with evaluator:
        first, = run_evaluator(evaluator, actor, 1)
        pid = evaluator.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + BOUND
        while not exited(pid):  # so that submit() finds it dead
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second, = run_evaluator(evaluator, actor, 1)
    (returns, lengths), = reference_evaluations(1, 1)
    assert np.array_equal(second.returns, returns)
    assert np.array_equal(second.lengths, lengths)
    assert second.version == first.version + 1
    check_restarts(evaluator, 1)
    account = evaluator.stats["workers"][0]
    assert account["lost"] == 0 and "signal SIGKILL" in \
        account["last_cause"]


# ------------------------------------------------ cluster: a new Ray actor --

@pytest.mark.timeout(2 * RAY_START + MARGIN)
def test_cluster_replaces_a_killed_actor(ray_cluster):
    """``restarts=1``: the killed actor's worker gets a new actor (another
    process), whose fragments go on from the last sequence number received,
    from resets; the run goes on. ``meta.generation`` is 0 before the
    restart and 1 (the generation the replacement was started with: its
    worker's restart count) for the replacement's fragments, which are
    the reference's of generation 1."""
    # the replacement is a new Ray actor process (nice 15, importing
    # torch): its start gets RAY_START, here and in the library
    # (start_timeout); what is checked is the order and the generations
    # across the restart, not how soon Ray starts a process
    feed = make_ray(counting_factory, n_envs=1, entropy=0, restarts=1,
                    restart_delay=0.1, timeout=RAY_STEADY)
    seen, fragments = [], {}

    def take(batch):
        for s, key in enumerate(identities(batch, 2, 1)):
            seen.append(key)
            fragments[key] = suply(torch.clone, slot(batch, s, 1, hx_dim=0))

    with feed:
        wait_started(feed)
        for batch in itertools.islice(feed, 3):
            take(batch)
        old, before = feed.pids[1], len(seen)
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + RAY_START
        # until the replacement has delivered three fragments (two more
        # may be the killed one's, finished before it died)
        while sum(w == 1 for w, _ in seen[before:]) < 3 + 2:
            assert time.monotonic() < deadline, "no replacement"
            take(next(feed))
        assert feed.pids[1] not in (None, old)
        stats = feed.stats
    assert stats["restarts"] == 1
    account = stats["workers"][1]
    assert account["restarts"] == 1 and account["lost"] <= 1
    assert account["last_cause"].startswith("WorkerDied: worker 1")
    assert len(set(seen)) == len(seen)
    for w in (0, 1):
        seqs = [seq for worker, seq in seen if worker == w]
        assert seqs == sorted(seqs) and seqs[-1] >= 3

    def generation(key):
        meta = fragments[key].meta
        assert torch.all(meta.generation == meta.generation[0])
        return int(meta.generation[0])

    assert all(generation(key) == 0 for key in seen[:before])
    assert all(generation(key) == 0 for key in seen if key[0] == 0)
    mine = [key for key in seen if key[0] == 1]
    generations = [generation(key) for key in mine]
    # the killed actor's, then the replacement's (at least three)
    n_old = generations.count(0)
    assert generations == [0] * n_old + [account["restarts"]] * (
        len(mine) - n_old)
    assert len(mine) - n_old >= 3
    first = mine[n_old][1]  # the replacement's first seq, from resets
    state = fragments[1, first].state
    assert torch.all(state.fin[0]) and torch.all(state.stepno[0] == 0)
    # each fragment, by its seq, is the reference's of its generation
    old_refs = core_reference(counting_factory, CountingActor(), T, 1, 0,
                              worker=1, count=first)
    new_refs = core_reference(counting_factory, CountingActor(), T, 1, 0,
                              worker=1, count=mine[-1][1] - first + 1,
                              generation=1, seq=first)
    for k, (_, seq) in enumerate(mine):
        ref = old_refs[seq] if k < n_old else new_refs[seq - first]
        assert_fragments_equal(without_version(fragments[1, seq]),
                               without_version(ref))


@pytest.mark.timeout(2 * RAY_START + MARGIN)
def test_cluster_waits_out_the_restart_delay(ray_cluster):
    """The only worker's actor is killed and its replacement starts only
    after ``restart_delay`` > ``timeout``: next() waits for it (then
    ``start_timeout`` for its start) instead of raising RolloutTimeout."""
    # the replacement's start gets RAY_START (a new Ray actor at nice
    # 15: under two CPU hogs START was not enough, once); the point is
    # that restart_delay > timeout is waited out, not how soon Ray starts
    feed = make_ray(counting_factory, n_actors=1, n_buffers=2,
                    n_per_batch=1, n_envs=1, entropy=0, restarts=1,
                    restart_delay=2.0, timeout=1.0)
    with feed:
        wait_started(feed)
        next(feed)
        old = feed.pids[0]
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 2.0 + RAY_START
        while feed.pids[0] in (None, old):
            assert time.monotonic() < deadline, "no replacement"
            next(feed)
        next(feed)
        assert feed.stats["restarts"] == 1


# ------------------------------------------------------------------- soak --

def check_layout(fragment):
    """The invariants of every fragment of CountingEnv(term_every=TERM)
    envs and a CountingActor (shift 0), rows ``1..T`` against the rows
    before them."""
    state, stats = fragment.state, fragment.stats
    obs, stepno, fin = state.obs[..., 0], state.stepno, state.fin
    prev, nxt = slice(None, -1), slice(1, None)
    assert torch.equal(state.act[nxt], (obs[prev].long() + stepno[prev]) % 5)
    assert torch.equal(state.rew[nxt], state.act[nxt].float())
    assert torch.equal(fin[nxt], (stepno[prev] + 1) % TERM == 0)
    assert torch.equal(stepno[nxt], torch.where(fin[nxt], 0,
                                                stepno[prev] + 1))
    assert not fragment.truncated.any()
    # the next observation: one more step, or the next episode's first
    assert torch.equal(obs[nxt], torch.where(fin[nxt], obs[prev] + 101 - TERM,
                                             obs[prev] + 1))
    assert torch.equal(fragment.final[nxt, :, 0], obs[prev] + 1)
    assert torch.equal(stats.length[nxt], torch.where(fin[nxt], TERM, 0))
    assert torch.all(stats.ret[nxt][~fin[nxt]] == 0)
    meta = fragment.meta
    assert len(set(meta.worker.tolist())) == len(set(meta.seq.tolist())) == 1


class Streams:
    """Per worker: the fragments delivered follow one another (row 0 is
    the previous fragment's row ``T``) or start a new generation (a reset
    row); ``meta.seq`` has no gap; every episode's return is the sum of
    its rewards, across fragments, since the last reset of its worker."""

    def __init__(self, n_workers):
        self.seq = [-1] * n_workers
        self.last = [None] * n_workers
        self.running = [None] * n_workers
        self.resets = [0] * n_workers

    def add(self, fragment):
        check_layout(fragment)
        w, seq = int(fragment.meta.worker[0]), int(fragment.meta.seq[0])
        assert seq == self.seq[w] + 1
        row = suply(lambda x: x[0].clone(), fragment.state)
        last = self.last[w]
        if last is None or any(not torch.equal(a, b)
                               for a, b in zip(row, last)):
            # a new generation: every env reset, an offset in thousands
            assert seq == 0 or last is not None
            assert torch.all(row.fin) and torch.all(row.stepno == 0)
            assert torch.all(row.rew == 0) and torch.all(row.act == 0)
            assert torch.all(row.obs % 1000 == 0)
            assert torch.all(fragment.hx == 0)
            self.running[w] = torch.zeros(B, dtype=torch.float64)
            self.resets[w] += seq > 0
        running = self.running[w]
        for t in range(1, T + 1):
            running += fragment.state.rew[t].double()
            ended = fragment.state.fin[t]
            assert torch.equal(fragment.stats.ret[t][ended], running[ended])
            running[ended] = 0
        self.seq[w], self.last[w] = seq, suply(lambda x: x[-1].clone(),
                                               fragment.state)


def _live_children(before=()):
    """This process's children that are not zombies, but for ``before``:
    its workers, under fork (not the workers' own short-lived children,
    such as the ``ldconfig`` that ``ctypes.util.find_library`` runs)."""
    alive = 0
    for pid in _direct_children(os.getpid()) - set(before):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat") as f:
                alive += f.read().rsplit(")", 1)[1].split()[0] != "Z"
    return alive


def _resources(before):
    """Descriptors, shared memory and child processes (but for
    ``before``) of this process."""
    return (len(os.listdir("/proc/self/fd")), len(_shm_footprint()),
            _live_children(before))


@pytest.mark.timeout(SOAK)
def test_soak_random_crashes():
    """Three workers whose envs crash at random (about one fragment in 20:
    os._exit, SIGKILL or an exception), never in a generation's first
    fragment; 200 batches of two fragments with a large budget. Every
    fragment passes the layout checks, the streams of each worker are
    whole; descriptors, shared memory and child processes do not grow
    (the largest count over the last 50 batches is no more than over
    batches 10..60: a leak per restart would show)."""
    n_actors, n_batches, rate = 3, 200, 1 - 0.95 ** (1 / (T * B))
    factory = functools.partial(random_crash_factory, rate=rate, safe=T,
                                term_every=TERM)
    others = _direct_children(os.getpid())  # helpers, from other tests
    feed = multi.rollout(factory, CountingActor(), T, n_actors, B, 6, 2,
                         entropy=ENTROPY, start_method="fork",
                         restarts=1000, restart_delay=0.01, timeout=BOUND,
                         shutdown_timeout=SHUTDOWN)
    streams, samples = Streams(n_actors), []
    with feed:
        for k, batch in enumerate(itertools.islice(feed, n_batches)):
            for s in range(2):
                streams.add(slot(batch, s, B, hx_dim=0))
            assert np.all(feed.stats["lengths"] == TERM)
            samples.append(_resources(others))
        stats = feed.stats
        assert stats["batches"] == n_batches
        restarts = stats["restarts"]
        accounts = stats["workers"]
    early, late = samples[10:60], samples[-50:]
    for i, what in enumerate(["descriptors", "/dev/shm files",
                              "child processes"]):
        assert max(s[i] for s in late) <= max(s[i] for s in early), what
    assert max(s[2] for s in samples) == n_actors
    # about 400 / 20 crashes; each restart shows as a reset row in its
    # worker's stream, but for the last ones not delivered yet
    assert restarts == sum(a["restarts"] for a in accounts) >= 5
    for account, resets in zip(accounts, streams.resets):
        assert account["restarts"] - 1 <= resets <= account["restarts"]
        assert account["lost"] <= account["restarts"]
