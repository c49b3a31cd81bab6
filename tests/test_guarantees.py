"""Guarantees of the generators that a careful user relies on, each checked
where it could break:

- no worker outlives a learner killed while the worker blocks in
  ``env.step`` (nor the helpers and named semaphores it keeps alive);
- failures arrive on time: a stalled env within ``timeout``, a first batch
  that never comes within ``timeout + start_timeout``, a worker's exception
  at once (under spawn too, and without waiting for another worker);
- the one Ctrl-C rule of :mod:`rlplay.engine.rollout._base`;
- bad arguments (a non-actor, bad timeouts, an actor of another
  architecture) are refused up front and close nothing;
- an env may start processes of its own, and none outlives ``close()``;
- ``single`` checks that its buffers fit in ``/dev/shm`` before it starts
  a worker;
- a script without the main guard is told what to do;
- the demo trains CartPole to a near-perfect return.

The autouse fixture of conftest.py also fails any test that leaves a child
process behind.
"""
import functools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import closing

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from envs import (CountingEnv, HelperProcessEnv, LateErrorEnv, SpacesEnv, StallEnv,
                  StampedFailure, stalling_factory)
from generators import METHODS, make as make_generator, running
from procs import descendants as all_descendants
from rlplay.engine import (BaseActorModule, CapacityError, PolicyActor,
                           RolloutError, RolloutTimeout, WorkerDied,
                           WorkerError, pool)
from rlplay.engine.rollout import single
from rlplay.engine.workers import _params, _supervisor
from rlplay.engine.utils import get_context, preload_forkserver

# workers unpickle the envs by reference: have the fork server import them
# once (this runs at collection, before any test starts the fork server)
preload_forkserver(get_context("forkserver"), ("envs",))

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
T = 4
# the bounds: backstops for what the tests do not time, and the guarantees
# that they check (bounds.py says why)
from bounds import (DEMO, FAULT, JOIN, LEFT_OVER, ORPHANED,  # noqa: E402
                    SCRIPT, START, STEADY)


# ----------------------------------------------------------------- helpers --

def actor_of(n_out=5):
    """A sampling actor for CountingEnv (observations (1,), Discrete(5))."""
    return PolicyActor(nn.Linear(1, n_out))


def make(kind, factory, start_method="fork", actor="default", **kwargs):
    """A generator of ``kind``: ``single`` (one env), ``multi`` (two workers
    of one env each, two buffers, both fragments in every batch), the
    ``evaluator`` (one env, one episode) or ``same``."""
    actor = actor_of() if isinstance(actor, str) else actor
    assert kind in ("same", "single", "multi", "evaluator"), kind
    if kind == "evaluator":
        kwargs = dict(n_episodes=1, **kwargs)
    return make_generator(kind, factory, actor, T, 1, n_actors=2,
                          n_buffers=2, n_per_batch=2,
                          start_method=start_method, **kwargs)


def wait_until(condition, bound, step=0.02):
    """Poll ``condition()`` until it holds or ``bound`` seconds passed;
    returns its last value."""
    deadline = time.monotonic() + bound
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


def descendants(pid):
    """The live descendants of process ``pid``."""
    return {p for p in all_descendants(pid) if running(p)}


def semaphores(pid):
    """The names in /dev/shm of the named semaphores of
    :mod:`multiprocessing` that process ``pid`` maps (glibc maps a
    temporary file that it then links to the name: same inode). Under
    fork they are unlinked at once, and have none."""
    inodes = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/sem."):
                inodes.add(int(fields[4]))
    names = set()
    for name in os.listdir("/dev/shm"):
        if name.startswith("sem.mp-"):
            try:
                if os.stat(f"/dev/shm/{name}").st_ino in inodes:
                    names.add(name)
            except OSError:
                pass
    return names


def named(names):
    """Those of ``names`` still in /dev/shm."""
    return set(names) & set(os.listdir("/dev/shm"))


def never_called(*args, **kwargs):
    raise AssertionError("the factory was called")


def no_workers(*args, **kwargs):
    raise AssertionError("a worker was about to start")


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail (with AssertionError) any attempt to share parameters or to
    start a worker."""
    def no_sharing(*args, **kwargs):
        raise AssertionError("the parameters were about to be shared")

    monkeypatch.setattr(_params.SharedParams, "__init__", no_sharing)
    monkeypatch.setattr(_supervisor.Supervisor, "__init__", no_workers)


# --------------------------------------- a learner killed outright (SIGKILL) --

_LEARNER = """
import functools, json, os, sys
sys.path.insert(0, {tests!r})
from torch import nn
from envs import StallEnv
from rlplay.engine import PolicyActor
from rlplay.engine.rollout import Evaluator, multi, single

if __name__ == "__main__":
    method, markers, pids = sys.argv[1:]
    # every worker's env stalls in its first step, and says so
    factory = functools.partial(StallEnv, at=1, marker_dir=markers)
    actor = PolicyActor(nn.Linear(1, 5))
    kw = dict(start_method=method, timeout=None)
    feed = single.rollout(factory, actor, 4, 1, **kw)
    pool = multi.rollout(factory, actor, 4, 2, 1, 2, 2, **kw)
    evaluator = Evaluator(factory, actor, n_episodes=1, **kw)
    evaluator.submit(actor)  # mid-evaluation from now on
    with open(pids + ".tmp", "w") as f:
        json.dump({{"single": feed.pids, "multi": pool.pids,
                   "evaluator": evaluator.pids}}, f)
    os.replace(pids + ".tmp", pids)
    next(feed)  # waits for good: its worker sleeps in env.step
"""


@pytest.mark.parametrize("start_method", METHODS)
def test_no_worker_outlives_a_killed_learner(start_method, tmp_path):
    """A learner SIGKILLed while the workers of single, multi and the
    evaluator block in ``env.step``: every worker is gone within
    ``ORPHANED`` s, and within ``LEFT_OVER`` s so is every other process
    the learner started (the resource tracker, the fork server) and every
    named semaphore it made (tests/bounds.py)."""
    script = tmp_path / "learner.py"
    script.write_text(textwrap.dedent(_LEARNER).format(tests=TESTS))
    markers, pids_path = tmp_path / "stalled", tmp_path / "pids.json"
    markers.mkdir()
    with open(tmp_path / "stderr", "w") as stderr:
        learner = subprocess.Popen(
            [sys.executable, str(script), start_method, str(markers),
             str(pids_path)], stdout=subprocess.DEVNULL, stderr=stderr)
    workers = {}
    try:
        def stalled():
            # every worker sits in env.step (or the learner ended early)
            if learner.poll() is not None or not pids_path.exists():
                return learner.poll() is not None
            workers.update(json.loads(pids_path.read_text()))
            inside = {int(name) for name in os.listdir(markers)
                      if name.isdigit()}
            return inside >= {p for pids in workers.values() for p in pids}

        assert wait_until(stalled, START, step=0.1)
        assert learner.poll() is None, (tmp_path / "stderr").read_text()
        assert [len(workers[kind]) for kind in ("single", "multi",
                                                "evaluator")] == [1, 2, 1]
        started = descendants(learner.pid)
        assert {p for pids in workers.values() for p in pids} <= started
        sems = semaphores(learner.pid)
        assert sems or start_method == "fork"  # the shared parameters'

        learner.kill()

        def alive():
            return {kind: [p for p in pids if running(p)]
                    for kind, pids in workers.items() if
                    any(map(running, pids))}

        wait_until(lambda: not alive(), ORPHANED)
        left = alive()
        assert not left, f"workers still running {ORPHANED} s after the " \
                         f"learner died: {left}"
        learner.wait(JOIN)

        def cleaned():
            return not any(map(running, started)) and not named(sems)

        wait_until(cleaned, LEFT_OVER)
        assert not [p for p in started if running(p)], \
            f"processes of the learner still running {LEFT_OVER} s after " \
            f"its death"
        assert not named(sems), \
            f"named semaphores left in /dev/shm {LEFT_OVER} s after the " \
            f"learner died"
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait(JOIN)
        for pid in {p for pids in workers.values() for p in pids}:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


_EXITING = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
import torch.nn as nn
from envs import CountingEnv
from rlplay.engine import PolicyActor
from rlplay.engine.rollout import Evaluator, single

if __name__ == "__main__":
    actor = PolicyActor(nn.Linear(1, 5))
    feeds = [single.rollout(CountingEnv, actor, 4, 2, start_method=method)
             for method in ("fork", "forkserver")]
    pids = [feed.pid for feed in feeds if next(feed)]
    evaluator = Evaluator(CountingEnv, actor, start_method="forkserver")
    pids.append(evaluator.pid)
    print(*pids, flush=True)
    # leave without closing anything
"""


def test_workers_end_with_a_learner_that_exits_without_closing():
    """The interpreter exits although nothing was closed (single under
    fork and forkserver, the evaluator), and leaves no worker behind (a
    learner killed outright: above)."""
    code = textwrap.dedent(_EXITING).format(tests=TESTS)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=SCRIPT)
    assert done.returncode == 0, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 3
    assert wait_until(lambda: not any(map(running, pids)), FAULT)


# ------------------------------------------------------ failures on time --

@pytest.mark.parametrize("kind", ["single", "multi"])
def test_a_stalled_env_times_out_within_the_bound(kind):
    """``timeout=2`` with ``start_timeout=None``: a next() whose fragments
    never come (the envs stall in their first step after the first batch)
    raises RolloutTimeout after 2 s and before 3 s: the stalled workers
    are torn down, not waited for (``shutdown_timeout`` is 5 s)."""
    feed = make(kind, functools.partial(StallEnv, at=T + 1), timeout=2.0,
                start_timeout=None)
    with closing(feed):
        next(feed)
        pids = list(feed.pids)
        tic = time.monotonic()
        with pytest.raises(RolloutTimeout) as info:
            next(feed)
        elapsed = time.monotonic() - tic
        assert 2.0 <= elapsed < 3.0
        assert not any(map(running, pids))
        with pytest.raises(RolloutTimeout) as again:
            next(feed)
        assert again.value is info.value


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_a_worker_error_arrives_at_once_under_spawn(kind):
    """The learner raises a worker's exception less than 0.5 s after the
    worker raised it (its message carries the time). In multi, worker 0
    fails while worker 1 stalls for good in its first step: the error
    does not wait for worker 1's fragment."""
    if kind == "single":  # in fragment 1, while the learner waits for it
        factory = functools.partial(LateErrorEnv, at=T + 2)
    else:
        factory = functools.partial(LateErrorEnv, at=2, stall_others_at=1)
    feed = make(kind, factory, "spawn", timeout=STEADY, start_timeout=START)
    with closing(feed):
        if kind == "single":
            next(feed)
        with pytest.raises(WorkerError) as info:
            next(feed)
        caught = time.time()
    err = info.value
    assert err.exc_type is StampedFailure and err.worker == 0
    raised = float(err.remote_message.rsplit(" ", 1)[1])
    assert 0.0 <= caught - raised < 0.5


@pytest.mark.parametrize("lock", ["free", "held"])
def test_multi_first_batch_times_out_within_timeout_plus_start_timeout(lock):
    """Workers that never answer (their factory sleeps): the first next()
    raises RolloutTimeout after ``timeout + start_timeout`` = 2 s, and
    before 3 s, also when the parameters' lock is held for 1.5 s of it (the
    lock and the gather share one deadline)."""
    feed = make("multi", stalling_factory, timeout=1.0, start_timeout=1.0)
    held, release = threading.Event(), threading.Event()

    def hold(shared_lock):
        with shared_lock:
            held.set()
            release.wait(1.5)

    holder = threading.Thread(target=hold,
                              args=(feed.params._version.get_lock(),))
    with closing(feed):
        if lock == "held":
            holder.start()
            assert held.wait(JOIN)
        try:
            tic = time.monotonic()
            with pytest.raises(RolloutTimeout):
                next(feed)
            elapsed = time.monotonic() - tic
        finally:
            release.set()
            if holder.is_alive():
                holder.join(JOIN)
    assert 2.0 <= elapsed < 3.0


# ------------------------------------------------------------- Ctrl-C rule --

def interrupt_main_after(delay):
    """A timer that sends SIGINT to the main thread (as Ctrl-C does; a
    thread-directed signal interrupts the main thread's blocking wait)."""
    timer = threading.Timer(delay, signal.pthread_kill,
                            (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    return timer


@pytest.mark.parametrize("kind", ["single", "multi", "evaluator"])
def test_ctrl_c_while_waiting_breaks_the_generator(kind):
    """The rule of rollout/_base.py: a KeyboardInterrupt while next() (or
    result()) waits propagates, the workers are torn down at once (no wait
    for the stalled ones: ``shutdown_timeout`` is 10 s), and every later
    call raises RolloutError saying it was interrupted (the same one each
    time), closed or not."""
    actor = actor_of()
    if kind == "evaluator":
        gen = make(kind, functools.partial(StallEnv, at=1), actor=actor,
                   timeout=STEADY, shutdown_timeout=10.0)
        gen.submit(actor)
        wait, later = gen.result, [gen.result, gen.poll,
                                   functools.partial(gen.submit, actor)]
    else:  # the envs stall once the first batch was delivered
        gen = make(kind, functools.partial(StallEnv, at=T + 1), actor=actor,
                   timeout=STEADY, shutdown_timeout=10.0)
        next(gen)
        wait = functools.partial(next, gen)
        later = [wait, wait]
    pids = list(gen.pids)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = interrupt_main_after(0.5)
        tic = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                wait()
        finally:
            timer.cancel()
            timer.join()
        elapsed = time.monotonic() - tic
    finally:
        signal.signal(signal.SIGINT, previous)
    assert elapsed < 5.0
    assert not any(map(running, pids))  # torn down and joined already
    errors = []
    for call in later:
        with pytest.raises(RolloutError, match="(?i)interrupt") as info:
            call()
        assert not isinstance(info.value, (WorkerError, WorkerDied,
                                           RolloutTimeout))
        errors.append(info.value)
    assert all(err is errors[0] for err in errors)
    gen.close()  # idempotent, and it stays broken
    with pytest.raises(RolloutError) as info:
        later[0]()
    assert info.value is errors[0]


def test_a_worker_ignores_ctrl_c():
    """A terminal sends SIGINT to the whole process group: the learner
    handles it, the worker carries on until it is closed in order."""
    feed = single.rollout(CountingEnv, actor_of(), T, 2,
                          start_method="fork")
    with closing(feed):
        next(feed)
        os.kill(feed.pid, signal.SIGINT)
        for _ in range(3):
            next(feed)
        assert feed.process.is_alive()


def test_evaluator_result_timeout_and_bad_timeouts_keep_the_request():
    """The rule's one exception: result(timeout=) running out leaves the
    request outstanding; so do bad timeouts (refused up front). The
    evaluation is still collected afterwards, and the evaluator goes on."""
    actor = actor_of()
    # the first step takes 1.5 s, an episode two steps
    factory = functools.partial(StallEnv, at=1, stall_for=1.5, term_every=2)
    with make("evaluator", factory, actor=actor) as evaluator:
        version = evaluator.submit(actor)
        for bad in ("5", -1, float("nan"), float("inf")):
            with pytest.raises((TypeError, ValueError), match="timeout"):
                evaluator.result(timeout=bad)
        with pytest.raises(RolloutTimeout):
            evaluator.result(timeout=0.1)
        assert evaluator.pending
        result = evaluator.result(timeout=START)
        assert result.version == version and result.lengths.tolist() == [2]
        assert evaluator.submit(actor) == version + 1
        assert evaluator.result(timeout=STEADY).version == version + 1


# ----------------------------------------------- bad arguments, up front --

@pytest.mark.parametrize("kind", ["same", "single", "multi", "evaluator"])
@pytest.mark.parametrize("actor", [None, object(), nn.Linear(1, 1)],
                         ids=["None", "object", "Linear"])
def test_a_non_actor_is_refused_up_front(kind, actor, nothing_starts):
    with pytest.raises(TypeError, match="actor must be a torch.nn.Module "
                                        "with the actor API"):
        make(kind, never_called, actor=actor)


@pytest.mark.parametrize("kind", ["single", "multi", "evaluator"])
@pytest.mark.parametrize("bad", [
    dict(timeout="5"), dict(timeout=-1), dict(timeout=float("nan")),
    dict(start_timeout=-1), dict(start_timeout="1"),
    dict(shutdown_timeout=None), dict(shutdown_timeout=-0.5),
    dict(timeout=float("inf")), dict(start_timeout=float("inf")),
    dict(shutdown_timeout=float("inf")),
], ids=lambda bad: "{}={!r}".format(*next(iter(bad.items()))))
def test_bad_timeouts_are_refused_before_anything_starts(kind, bad,
                                                         nothing_starts):
    # same.rollout has no timeouts: nothing waits there
    name = next(iter(bad))
    with pytest.raises((TypeError, ValueError), match=name):
        make(kind, never_called, **bad)


@pytest.mark.parametrize("kind", ["single", "multi", "evaluator"])
@pytest.mark.parametrize("delay", [float("inf"), float("nan"), -1.0, "1"],
                         ids=repr)
def test_a_restart_delay_that_is_not_finite_is_refused(kind, delay,
                                                      nothing_starts):
    """A replacement due at infinity would leave next() (or result())
    waiting for good after a failure, whatever ``timeout``."""
    with pytest.raises(ValueError, match=r"restart_delay must be a finite "
                                         r"number of seconds"):
        make(kind, never_called, restarts=1, restart_delay=delay)


def test_submit_refuses_an_actor_of_another_architecture():
    """Evaluator.submit with another architecture raises ValueError naming
    the parameter, whether the shapes would broadcast or not, for another
    dtype, or other names; nothing is published, and the evaluator goes
    on."""
    actor = PolicyActor(nn.Linear(1, 3))
    with torch.no_grad():
        actor.policy.weight.fill_(0.25)
        actor.policy.bias.fill_(0.5)
    with make("evaluator", functools.partial(CountingEnv, term_every=2),
              actor=actor) as evaluator:
        shared = [t.clone() for t in evaluator.params.tensors]
        others = [
            (PolicyActor(nn.Linear(1, 1)), r"'policy\.weight'"),  # broadcasts
            (PolicyActor(nn.Linear(1, 2)), r"'policy\.weight'"),
            (PolicyActor(nn.Linear(1, 3)).double(), r"'policy\.weight'"),
            (PolicyActor(nn.Sequential(nn.Linear(1, 3))),
             r"policy\.0\.weight"),
        ]
        for other, name in others:
            with torch.no_grad():
                for t in other.parameters():
                    t.fill_(7.0)
            with pytest.raises(ValueError, match=name):
                evaluator.submit(other)
            assert not evaluator.pending
            assert all(torch.equal(t, s) for t, s in
                       zip(evaluator.params.tensors, shared))
        assert evaluator.submit(actor) == 1  # the first publication
        result = evaluator.result(timeout=START)
        assert result.version == 1 and result.returns.shape == (1,)


# ------------------------------------------- envs with processes of their own --

@pytest.mark.parametrize("start_method", METHODS)
@pytest.mark.parametrize("kind", ["single", "multi"])
def test_an_env_may_start_processes_of_its_own(kind, start_method,
                                               tmp_path):
    """Workers are not daemonic: an env that starts a multiprocessing
    child (of the worker's own start method) works, and neither the
    workers nor those children outlive close()."""
    factory = functools.partial(HelperProcessEnv, start_method,
                                str(tmp_path))
    feed = make(kind, factory, start_method, timeout=STEADY,
                start_timeout=START)
    with closing(feed):
        for _ in range(3):
            batch = next(feed)
        workers = list(feed.pids)
    assert batch.state.obs.shape[:2] == (1 + T, len(workers))
    helpers = {int(name): int((tmp_path / name).read_text())
               for name in os.listdir(tmp_path)}
    # one helper for the learner's probe env, one per worker's env
    assert sorted(helpers.values()) == sorted([os.getpid(), *workers])
    assert not [pid for pid in [*workers, *helpers] if running(pid)]


# ---------------------------------------------------------------- capacity --

class ZeroActor(BaseActorModule):
    """Action 0 whatever it sees (a tiny parameter, for the shared copy)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return torch.zeros_like(stepno), (), {}

    def reset(self, hx, at):
        return ()


def test_single_refuses_buffers_too_large_for_dev_shm(monkeypatch):
    """Two buffers of 256 KiB observations (3 MiB with the final ones) do
    not fit in 1 MiB of /dev/shm: CapacityError, and no worker started."""
    monkeypatch.setattr(_supervisor.Supervisor, "__init__", no_workers)
    monkeypatch.setattr(pool, "shm_free_bytes", lambda path=None: 2 ** 20)
    box = spaces.Box(-1.0, 1.0, (2 ** 16,), np.float32)
    wide = functools.partial(
        SpacesEnv, box, spaces.Discrete(2),
        lambda episode, t: np.zeros(2 ** 16, np.float32))
    with pytest.raises(CapacityError, match=r"buffers.*/dev/shm"):
        single.rollout(wide, ZeroActor(), 2, 1, start_method="fork")


# ------------------------------------------- named semaphores at close() --

@pytest.mark.parametrize("kind", ["single", "multi", "evaluator"])
def test_close_unlinks_the_named_semaphores_of_a_live_generator(kind):
    """Under spawn the lock of the shared parameters is a named semaphore
    in /dev/shm: it goes with close(), even while the generator object is
    still referenced (a notebook keeps it in a variable)."""
    before = semaphores(os.getpid())
    feed = make(kind, functools.partial(CountingEnv, term_every=3),
                start_method="spawn")
    with closing(feed):
        if kind == "evaluator":
            feed.submit(actor_of())
            feed.result(timeout=START)
        else:
            next(feed)
        ours = semaphores(os.getpid()) - before
        assert ours, "no named semaphore to watch"
    assert not named(ours)
    assert feed is not None  # still referenced until here


# ---------------------------------------- a script without the main guard --

_UNGUARDED = """
import functools
import gymnasium
from torch import nn
from rlplay.engine import PolicyActor, WorkerDied
from rlplay.engine.rollout import single

feed = single.rollout(functools.partial(gymnasium.make, "CartPole-v1"),
                      PolicyActor(nn.Linear(4, 2)), 4, 1,
                      start_method={method!r}, timeout={timeout},
                      start_timeout={start_timeout})
try:
    next(feed)
except WorkerDied as exc:
    print("caught WorkerDied:", exc, flush=True)
finally:
    feed.close()
"""


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_script_without_the_main_guard_is_told_why(start_method,
                                                     tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(_UNGUARDED).format(
        method=start_method, timeout=STEADY, start_timeout=START))
    done = subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=SCRIPT, cwd=tmp_path)
    caught = [line for line in done.stdout.splitlines()
              if line.startswith("caught WorkerDied:")]
    assert caught, (done.stdout, done.stderr)
    assert 'if __name__ == "__main__":' in caught[0]
    assert start_method in caught[0]


# --------------------------------------------------------------- the demo --

def test_the_demo_learns_cartpole():
    done = subprocess.run([sys.executable, "-m", "rlplay.demo"],
                          capture_output=True, text=True, timeout=DEMO,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r"^evaluation return: (\S+) \+- \S+ over \d+ greedy "
                      r"episodes$", done.stdout, re.MULTILINE)
    assert found, done.stdout
    assert float(found.group(1)) >= 475.0
