"""The fault matrix of single.rollout under fork, spawn and forkserver.

Each case raises the right exception within a bound (or ends cleanly) and
leaves no child process (the autouse fixture of conftest checks).
"""
import functools
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import closing

import pytest
import torch

from envs import CountingEnv, FaultyEnv, counting_factory, failing_factory
from generators import METHODS, make as make_generator, running

from rlplay.engine import BaseActorModule
from rlplay.engine import RolloutTimeout, WorkerDied, WorkerError

T, B = 4, 2
# the bound on reporting a failure once it happened (seconds)
from bounds import FAULT as BOUND, START  # the reasons in bounds.py


class ActorFault(Exception):
    """Raised by FaultyActor (module level: it travels by reference)."""


class FaultyActor(BaseActorModule):
    """Raises ActorFault at its ``fail_at``-th real (non-virtual) step, so
    it passes the learner's sizing call and fails in the worker."""

    def __init__(self, fail_at):
        super().__init__()
        self.fail_at, self.calls = fail_at, 0

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if not virtual:
            self.calls += 1
            if self.calls >= self.fail_at:
                raise ActorFault(f"actor failed on purpose at call "
                                 f"{self.calls}")
        return obs[..., 0].long() % 5, (), {"x": obs[..., 0].clone()}

    def reset(self, hx, at):
        return ()


class FailsInWorker:
    """A factory that works in the learner (for the probe env) and raises
    in any other process."""

    def __init__(self):
        self.learner = os.getpid()

    def __call__(self):
        if os.getpid() != self.learner:
            raise RuntimeError("factory failed in the worker")
        return CountingEnv()


class HangingEnv(CountingEnv):
    """A CountingEnv whose step blocks for a minute from step ``at`` on."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def step(self, action):
        if self.t + 1 >= self.at:
            time.sleep(60)
        return super().step(action)


def make(factory, start_method, actor=None, **kwargs):
    kwargs = {"timeout": BOUND, "start_timeout": START, **kwargs}
    return make_generator("single", factory, actor or FaultyActor(10**9), T,
                          B, start_method=start_method, **kwargs)


def failure(feed, exc_type, *, started=False):
    """The exception ``next(feed)`` raises within a few calls; asserts the
    bound when the worker had already started (``started``)."""
    tic = time.monotonic()
    with pytest.raises(exc_type) as info:
        for _ in range(5):
            next(feed)
    if started:
        assert time.monotonic() - tic < BOUND
    # the generator is closed, and says why again
    with pytest.raises(exc_type) as again:
        next(feed)
    assert again.value is info.value
    feed.close()
    return info.value


def assert_worker_error(err, type_name, message, *, exc_type=None):
    assert err.type_name == type_name
    assert message in err.remote_message
    assert message in err.remote_traceback
    assert "Traceback (most recent call last)" in err.remote_traceback
    assert str(err.__cause__) == err.remote_traceback
    if exc_type is not None:
        assert err.exc_type is exc_type


def test_factory_fails_in_the_learner():
    # the probe env is made here, so the error is the factory's own, as in
    # same.rollout, and no worker is started
    with pytest.raises(RuntimeError, match="factory failed on purpose"):
        make(failing_factory, "fork")


@pytest.mark.parametrize("start_method", METHODS)
def test_factory_fails_in_the_worker(start_method):
    feed = make(FailsInWorker(), start_method)
    err = failure(feed, WorkerError)
    assert_worker_error(err, "builtins.RuntimeError",
                        "factory failed in the worker",
                        exc_type=RuntimeError)
    assert "in the factory" in str(err)
    assert "test_single_faults.py" in err.remote_traceback
    assert "in __call__" in err.remote_traceback


def test_lambda_factory_fails_in_the_worker_spawn():
    learner = os.getpid()
    factory = lambda: (  # noqa: E731
        CountingEnv() if os.getpid() == learner else 1 / 0)
    err = failure(make(factory, "spawn"), WorkerError)
    assert_worker_error(err, "builtins.ZeroDivisionError", "division by zero",
                        exc_type=ZeroDivisionError)


@pytest.mark.parametrize("start_method", METHODS)
def test_reset_raises(start_method):
    feed = make(functools.partial(FaultyEnv, "reset"), start_method)
    err = failure(feed, WorkerError)
    assert_worker_error(err, "builtins.RuntimeError",
                        "reset failed on purpose", exc_type=RuntimeError)
    assert "in reset" in err.remote_traceback


@pytest.mark.parametrize("start_method", METHODS)
def test_step_raises(start_method):
    # the fault comes in fragment 1, once the worker runs
    feed = make(functools.partial(FaultyEnv, "step", at=T + 2), start_method)
    next(feed)
    err = failure(feed, WorkerError, started=True)
    assert_worker_error(err, "builtins.ValueError", "step failed on purpose",
                        exc_type=ValueError)
    assert "in step" in err.remote_traceback
    assert "fragment 1" in str(err)


@pytest.mark.parametrize("start_method", METHODS)
def test_actor_raises(start_method):
    feed = make(CountingEnv, start_method, actor=FaultyActor(T + 2))
    next(feed)
    err = failure(feed, WorkerError, started=True)
    assert_worker_error(err, f"{__name__}.ActorFault",
                        "actor failed on purpose", exc_type=ActorFault)


def test_closure_actor_raises_spawn():
    # an actor and an exception class defined here: both travel by value,
    # the class cannot come back by reference, its name and text do
    class LocalFault(Exception):
        pass

    class LocalActor(BaseActorModule):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            if not virtual and (obs[..., 0] % 1000 >= 3).any():
                raise LocalFault("closure actor failed")
            return torch.zeros(obs.shape[:2], dtype=torch.long), (), {}

        def reset(self, hx, at):
            return ()

    err = failure(make(CountingEnv, "spawn", actor=LocalActor()),
                  WorkerError)
    assert err.type_name.endswith("LocalFault")
    assert err.exc_type is None
    assert "closure actor failed" in err.remote_traceback


@pytest.mark.parametrize("start_method", METHODS)
@pytest.mark.parametrize("fault, exitcode, text", [
    ("exit", 3, "exit code 3"),
    ("kill", -signal.SIGKILL, "signal SIGKILL"),
    ("segfault", -signal.SIGSEGV, "signal SIGSEGV"),
])
def test_silent_death(start_method, fault, exitcode, text):
    feed = make(functools.partial(FaultyEnv, fault, at=T + 2), start_method)
    next(feed)
    err = failure(feed, WorkerDied, started=True)
    assert err.exitcode == exitcode
    assert text in str(err)


@pytest.mark.parametrize("start_method", METHODS)
def test_killed_from_outside(start_method):
    feed = make(CountingEnv, start_method)
    next(feed)
    os.kill(feed.pid, signal.SIGKILL)
    err = failure(feed, WorkerDied, started=True)
    assert err.exitcode == -signal.SIGKILL
    assert "SIGKILL" in str(err)


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_timeout(start_method):
    feed = make(functools.partial(HangingEnv, at=T + 2), start_method,
                timeout=0.5, shutdown_timeout=0.5)
    next(feed)
    tic = time.monotonic()
    failure(feed, RolloutTimeout, started=True)
    # the bound was honoured, and the hung worker was terminated
    assert time.monotonic() - tic >= 0.5


# backstop: an unbounded first wait would sleep with the env
@pytest.mark.timeout(30)
def test_no_start_timeout_keeps_the_first_wait_bounded():
    # start_timeout=None adds nothing to timeout: fragment 0, which the
    # worker never finishes, times out after `timeout` like any other
    feed = make(functools.partial(HangingEnv, at=2), "fork", timeout=0.5,
                start_timeout=None, shutdown_timeout=0.5)
    tic = time.monotonic()
    failure(feed, RolloutTimeout)
    assert 0.5 <= time.monotonic() - tic < BOUND


@pytest.mark.parametrize("start_method", METHODS)
def test_break_early_and_close(start_method):
    with closing(make(counting_factory, start_method)) as feed:
        for k, batch in enumerate(feed):
            if k == 1:
                break
    with pytest.raises(StopIteration):
        next(feed)


@pytest.mark.parametrize("start_method", METHODS)
def test_break_early_and_drop(start_method):
    feed = make(counting_factory, start_method)
    for batch in feed:
        break
    del feed
    gc.collect()  # the autouse fixture then finds no child


_SCRIPT = """
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
    if {kill!r}:
        os.kill(os.getpid(), signal.SIGKILL)
    # leave without closing anything
"""


@pytest.mark.parametrize("kill", [False, True], ids=["exit", "killed"])
def test_workers_end_with_the_learner(kill):
    """The interpreter exits although nothing was closed; a learner killed
    outright leaves no orphan behind either."""
    code = textwrap.dedent(_SCRIPT).format(
        tests=os.path.dirname(__file__), kill=kill)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == (-signal.SIGKILL if kill else 0), done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 3
    deadline = time.monotonic() + BOUND
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(running, pids))


def test_worker_ignores_ctrl_c():
    # a terminal sends SIGINT to the whole process group: the learner
    # handles it, the worker carries on until it is closed in order
    feed = make(counting_factory, "fork")
    with closing(feed):
        next(feed)
        os.kill(feed.pid, signal.SIGINT)
        for _ in range(3):
            next(feed)
        assert feed.process.is_alive()
