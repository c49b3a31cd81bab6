"""Processes that envs start: a worker whose env is a
``gymnasium.vector.AsyncVectorEnv`` (its subprocesses forked from the
worker, holding whatever the worker held) is seen to die at once, is
replaced, and takes its env's processes with it when it is torn down:
after ``close()``, after a restart, after the learner's death; under fork
and forkserver (and the report under spawn). The env's processes are made
to hang (sleeping in ``step``) so that they are alive, with the worker's
files open, when the worker or the learner dies."""
import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import closing

import pytest

from envs import hanging_vector
from procs import descendants as _descendants
from generators import METHODS, CountingActor, gone, make, raises_within
from rlplay.engine.errors import RolloutTimeout, WorkerDied

# how soon a death is reported, and how soon after a teardown every
# process of the run is gone: what these tests check (not backstops); and
# the backstops (bounds.py says why)
from bounds import (GONE as GONE_BOUND, HUNG as HUNG_BOUND,  # noqa: E402
                    JOIN, REPORTED as REPORTED_BOUND)
T, K, HANG_AT = 4, 2, 6  # the env's processes hang in the second fragment


def _pids(marker_dir, prefix):
    return {int(name.split("-")[1]) for name in os.listdir(marker_dir)
            if name.startswith(prefix + "-")}


def _wait_hung(marker_dir, n=K):
    deadline = time.monotonic() + HUNG_BOUND
    while len(_pids(marker_dir, "hung")) < n:
        assert time.monotonic() < deadline, "the env's processes never hung"
        time.sleep(0.01)
    return _pids(marker_dir, "hung")


def _all_gone(pids, bound=GONE_BOUND):
    """Whether every one of ``pids`` has ended within ``bound`` s
    (polled; the bound is the issue's)."""
    deadline = time.monotonic() + bound
    while not all(gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _feed(method, marker_dir, **kwargs):
    factory = functools.partial(hanging_vector, str(marker_dir), K, HANG_AT)
    return make("multi", factory, CountingActor(), T, K, n_actors=1,
                start_method=method, **kwargs)


# the env's processes are forked from the worker (multiprocessing's
# default context, on Linux) whatever the worker's start method; what the
# start method changes is whose child the worker is (the learner's, or the
# fork server's), which these tests cover under fork and forkserver. Under
# spawn (a worker that imports torch afresh: seconds on a 2-core machine)
# one: the report of a death. A finite timeout once: without one, the
# report cannot come from a timeout running out.
KILLED = [(method, None) for method in METHODS] + [("fork", 4.0)]
FORKED = ["fork", "forkserver"]


@pytest.mark.parametrize("method, timeout", KILLED)
def test_a_worker_killed_while_its_envs_processes_live_is_reported(
        tmp_path, method, timeout):
    feed = _feed(method, tmp_path, timeout=timeout)
    with closing(feed):
        next(feed)
        worker = feed.pids[0]
        hung = _wait_hung(tmp_path)
        run = {worker} | _descendants(worker)
        assert hung <= run
        os.kill(worker, signal.SIGKILL)
        err = raises_within(feed, WorkerDied, REPORTED_BOUND)
        assert "SIGKILL" in str(err)
        # the worker is retired with its group at once
        assert _all_gone(run)


@pytest.mark.parametrize("method", FORKED)
def test_a_worker_killed_while_its_envs_processes_live_is_replaced(
        tmp_path, method):
    feed = _feed(method, tmp_path, timeout=None, restarts=1,
                 restart_delay=0.0)
    with closing(feed):
        next(feed)
        worker = feed.pids[0]
        _wait_hung(tmp_path)
        run = {worker} | _descendants(worker)
        # the replacement's envs do not hang
        open(tmp_path / "stop-hanging", "w").close()
        os.kill(worker, signal.SIGKILL)
        tic = time.monotonic()
        batch = next(feed)
        assert int(batch.meta.generation[0]) == 1
        assert feed.stats["restarts"] == 1
        assert _all_gone(run, 0.0)  # retired before the replacement
        replacement = {feed.pids[0]} | _descendants(feed.pids[0])
    assert _all_gone(replacement)
    assert time.monotonic() - tic < HUNG_BOUND


@pytest.mark.parametrize("method", FORKED)
def test_close_after_a_hung_sub_env_leaves_no_process(tmp_path, method):
    feed = _feed(method, tmp_path, timeout=1.0)
    with closing(feed):
        next(feed)
        worker = feed.pids[0]
        _wait_hung(tmp_path)
        run = {worker} | _descendants(worker)
        raises_within(feed, RolloutTimeout, HUNG_BOUND)
    assert _all_gone(run)


LEARNER = """
import functools, os, sys
sys.path.insert(0, {tests!r})
from envs import hanging_vector
from generators import CountingActor, make

if __name__ == "__main__":
    feed = make("multi", functools.partial(hanging_vector, {marker!r}, {K},
                                           {hang_at}),
                CountingActor(), {T}, {K}, n_actors=1,
                start_method={method!r}, timeout=None)
    next(feed)
    with open(os.path.join({marker!r}, "worker"), "w") as f:
        f.write(str(feed.pids[0]))
    next(feed)  # the env's processes hang: this waits for good
"""


@pytest.mark.parametrize("method", FORKED)
def test_the_learner_killed_while_a_sub_env_hangs_leaves_no_process(
        tmp_path, method):
    tests = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(tests)
    script = tmp_path / "learner.py"
    script.write_text(textwrap.dedent(LEARNER.format(
        tests=tests, marker=str(tmp_path), K=K, T=T, hang_at=HANG_AT,
        method=method)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + ([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ
                  else [])))
    learner = subprocess.Popen([sys.executable, str(script)], env=env,
                               cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + HUNG_BOUND
        while not (tmp_path / "worker").exists() or not (
                tmp_path / "worker").read_text():
            assert learner.poll() is None, "the learner ended early"
            assert time.monotonic() < deadline, "no worker"
            time.sleep(0.01)
        worker = int((tmp_path / "worker").read_text())
        _wait_hung(tmp_path)
        run = {worker} | _descendants(worker)
        assert len(run) >= 1 + K
        learner.kill()
        learner.wait(JOIN)
        assert _all_gone(run), [pid for pid in run if not gone(pid)]
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait(JOIN)
