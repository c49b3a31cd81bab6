"""multi.rollout's fault matrix, under fork, forkserver and spawn.

The factory raises (in the workers), ``reset`` raises, ``step`` raises, the
actor raises, a worker calls ``os._exit(3)``, a worker is SIGKILLed from
here, the consumer breaks out early and drops the rollout. Each case raises
the right exception (faults after the first batch: within 5 s, the
rollout's timeout) and leaves no child process (the autouse fixture of
conftest.py checks). Plus: a segfault, a stalled env (a timeout is an error,
never a silent end), closures shipped by cloudpickle under spawn.
"""
import functools
import itertools
import multiprocessing
import os
import signal
import time

import pytest
import torch

from envs import CountingEnv, FaultyEnv, StallingEnv, counting_factory
from generators import (METHODS, ActorFailure, CountingActor, RaisingActor,
                        gone, make as make_generator, raises_within)
from rlplay.engine import BaseActorModule
from rlplay.engine import (RemoteTraceback, RolloutTimeout, WorkerDied,
                           WorkerError)
from rlplay.engine.utils import get_context, preload_forkserver

preload_forkserver(get_context("forkserver"),
                   ("pytest", "envs", "generators", __name__))

# the bound on reporting a fault after the first batch, and the rollout's
# timeout; start-up gets far more (a spawned worker imports torch)
from bounds import FAULT as BOUND, START  # the reasons in bounds.py


def worker_only_failing_factory():
    """Fails in a worker process, not in the learner (its probe env)."""
    if multiprocessing.parent_process() is not None:
        raise RuntimeError("factory failed on purpose")
    return CountingEnv()


def make(factory, actor=None, start_method="fork", **kwargs):
    """Two workers of one env each (one under spawn, whose workers import
    torch afresh), a pool of two buffers, one fragment per batch: a worker
    needs a buffer handed back by the learner before its third fragment
    (steps 9..12), so a fault at step 10 never comes before the first
    batch."""
    args = dict(timeout=BOUND, start_timeout=START, shutdown_timeout=2.0,
                entropy=0)
    args.update(kwargs)
    return make_generator(
        "multi", factory, actor or CountingActor(), 4, 1,
        n_actors=1 if start_method == "spawn" else 2, n_buffers=2,
        n_per_batch=1, start_method=start_method, **args)


def check_worker_error(err, exc_type, message, where=None):
    assert err.exc_type is exc_type
    assert message in err.remote_message and message in str(err)
    assert isinstance(err.__cause__, RemoteTraceback)
    assert message in err.remote_traceback
    assert err.worker in (0, 1)
    if where is not None:
        assert f"in {where}" in str(err)


@pytest.mark.parametrize("start_method", METHODS)
def test_factory_raises(start_method):
    feed = make(worker_only_failing_factory, start_method=start_method)
    with feed:
        err = raises_within(feed, WorkerError, START)
    check_worker_error(err, RuntimeError, "factory failed on purpose",
                       "the factory")


@pytest.mark.parametrize("start_method", METHODS)
def test_reset_raises(start_method):
    feed = make(functools.partial(FaultyEnv, "reset"),
                start_method=start_method)
    with feed:
        err = raises_within(feed, WorkerError, START)
    check_worker_error(err, RuntimeError, "reset failed on purpose", "reset")


@pytest.mark.parametrize("start_method", METHODS)
def test_step_raises(start_method):
    feed = make(functools.partial(FaultyEnv, "step", at=10),
                start_method=start_method)
    with feed:
        next(feed)
        err = raises_within(feed, WorkerError, BOUND)
    check_worker_error(err, ValueError, "step failed on purpose", "collect")
    assert "FaultyEnv" in err.remote_traceback or "envs.py" in \
        err.remote_traceback


@pytest.mark.parametrize("start_method", METHODS)
def test_actor_raises(start_method):
    feed = make(counting_factory, RaisingActor(), start_method=start_method)
    with feed:
        next(feed)
        err = raises_within(feed, WorkerError, BOUND)
    check_worker_error(err, ActorFailure, "actor failed on purpose",
                       "collect")


@pytest.mark.parametrize("start_method", METHODS)
def test_worker_exits(start_method):
    feed = make(functools.partial(FaultyEnv, "exit", at=10),
                start_method=start_method)
    with feed:
        next(feed)
        err = raises_within(feed, WorkerDied, BOUND)
    assert err.exitcode == 3 and "exit code 3" in str(err)
    assert err.worker in (0, 1)


@pytest.mark.parametrize("start_method", METHODS)
def test_worker_sigkilled(start_method):
    feed = make(counting_factory, start_method=start_method)
    with feed:
        next(feed)
        os.kill(feed.pids[0], signal.SIGKILL)
        err = raises_within(feed, WorkerDied, BOUND)
    assert err.exitcode == -signal.SIGKILL and "SIGKILL" in str(err)
    assert err.worker == 0


@pytest.mark.parametrize("start_method", METHODS)
def test_consumer_breaks_out_and_drops(start_method):
    feed = make(counting_factory, start_method=start_method)
    pids = feed.pids
    for batch in feed:
        break
    assert batch.state.obs.shape == (5, 1, 1)
    del feed  # no close(): dropping the rollout shuts it down
    assert all(gone(pid) for pid in pids)


def test_worker_segfaults():
    # not forked from pytest, whose fault handler would print a traceback
    feed = make(functools.partial(FaultyEnv, "segfault", at=10),
                start_method="forkserver")
    with feed:
        next(feed)
        err = raises_within(feed, WorkerDied, BOUND)
    assert err.exitcode == -signal.SIGSEGV and "SIGSEGV" in str(err)


def test_stalled_env_times_out():
    feed = make(StallingEnv, timeout=0.5, shutdown_timeout=0.5)
    tic = time.monotonic()
    with pytest.raises(RolloutTimeout, match="within 0.5 s"):
        for _ in range(100):
            next(feed)
    # close() ended the stalled workers: stop, then SIGTERM after 0.5 s
    assert all(gone(pid) for pid in feed.pids)
    assert time.monotonic() - tic < 2 * BOUND


class StalledEnv(CountingEnv):
    """Stalls (sleeps for a minute) at its first step."""

    def step(self, action):
        time.sleep(60)
        return super().step(action)


# backstop: an unbounded first wait would sleep with the env
@pytest.mark.timeout(30)
def test_no_start_timeout_keeps_the_first_wait_bounded():
    # start_timeout=None adds nothing to timeout: the first batch, which
    # never forms, times out after `timeout` like any other
    feed = make(StalledEnv, timeout=0.5, start_timeout=None,
                shutdown_timeout=0.5)
    tic = time.monotonic()
    with pytest.raises(RolloutTimeout, match="within 0.5 s"):
        next(feed)
    assert time.monotonic() - tic < BOUND
    feed.close()


def test_closures_under_spawn():
    """A lambda factory and an actor class defined here travel by
    cloudpickle; the actor works for two batches, then raises (the one
    worker fills both buffers, then one more when the first batch hands one
    back: 12 steps; the 13th needs the second batch's buffer)."""
    term, limit = 3, 12

    class LocalActor(BaseActorModule):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            if not virtual:
                self.calls += 1
                if self.calls > limit:
                    raise KeyError("closure actor failed on purpose")
            return (obs[..., 0].long() + term) % 5, (), {}

        def reset(self, hx, at):
            return ()

    feed = make(lambda: CountingEnv(term_every=term), LocalActor(),
                start_method="spawn")
    with feed:
        for batch in itertools.islice(feed, 2):
            obs, act = batch.state.obs[:-1, :, 0], batch.state.act[1:]
            assert torch.equal(act, (obs.long() + term) % 5)
            assert batch.state.fin[1:].any()  # episodes of 3 steps
        err = raises_within(feed, WorkerError, BOUND)
    assert err.exc_type is KeyError
    assert "closure actor failed on purpose" in err.remote_message
