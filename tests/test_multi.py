"""multi.rollout: equivalence with same.rollout, collation, completeness,
max_lag, argument checks, capacity checks, leaks and interpreter exit."""
import errno
import functools
import itertools
import os
import subprocess
import sys
import textwrap
import threading
from contextlib import closing

import numpy as np
import pytest
import torch
from torch import nn

from envs import ENV_INFO, counting_factory, mixed_factory
from generators import (CountingActor, assert_fragments_equal, identities,
                        running, slot, without_version)
from reference import reference
from rlplay.engine.rollout import multi, same
from rlplay.engine import pool
from rlplay.engine.utils import get_context, preload_forkserver

# workers unpickle this module's actors by reference, so each would import
# it (and pytest) anew: have the fork server import them once instead
# (this runs at collection, before any test starts the fork server)
preload_forkserver(get_context("forkserver"),
                   ("pytest", "envs", "generators", __name__))

# generous bounds: a failure is reported long before them
from bounds import (CLEAN_STOP, SCRIPT,  # the reasons in bounds.py
                    STEADY as TIMEOUT)


# ------------------------------------------------------------ equivalence --

@pytest.mark.parametrize("sticky", [False, True], ids=["plain", "sticky"])
def test_equivalent_to_same_rollout(sticky):
    """One worker, one fragment per batch: the fragments of same.rollout,
    every leaf, ``meta.version`` excepted (same.rollout records the batch
    number, multi.rollout the parameter version the worker loaded, which
    depends on how far ahead it ran). The worker leaves the copies of
    ``obs`` in ``final`` to the collation, which makes them by the rule of
    each (frozen rows, with ``sticky``, repeat the final of their end)."""
    kwargs = dict(entropy=1234, env_info=ENV_INFO, sticky=sticky)
    ref = same.rollout(mixed_factory, CountingActor(), 6, 3, **kwargs)
    feed = multi.rollout(mixed_factory, CountingActor(), 6, 1, 3, 2, 1,
                         timeout=TIMEOUT, **kwargs)
    ends = truncations = 0
    with closing(ref), closing(feed):
        for want, got in zip(itertools.islice(ref, 8),
                             itertools.islice(feed, 8)):
            assert_fragments_equal(without_version(got),
                                   without_version(want))
            ends += int(want.state.fin[1:].sum())
            truncations += int(want.truncated[1:].sum())
    assert ends > truncations > 0  # both kinds of episode ends were seen
    assert feed.stats["batches"] == 8 and feed.stats["steps"] == 8 * 6 * 3


def test_collation_matches_each_workers_fragments():
    """Two workers, two fragments per batch: each slot equals, leaf by leaf,
    the fragment of that worker and sequence number collected with the core
    loop alone (``hx`` collated along ``hx_dim = 0``)."""
    B, T, entropy = 3, 5, 99
    feed = multi.rollout(mixed_factory, CountingActor(), T, 2, B, 4, 2,
                         entropy=entropy, env_info=ENV_INFO, timeout=TIMEOUT)
    refs = [reference(mixed_factory, CountingActor(), T, B, entropy,
                      worker=w, count=20, env_info=ENV_INFO)
            for w in range(2)]
    with closing(feed):
        for batch in itertools.islice(feed, 10):
            assert batch.hx.shape == (2 * B, 2)
            assert batch.state.obs.shape == (T + 1, 2 * B, 1)
            for s, (worker, seq) in enumerate(identities(batch, 2, B)):
                assert_fragments_equal(
                    without_version(slot(batch, s, B, hx_dim=0)),
                    without_version(refs[worker][seq]))


# ----------------------------------------------------------- completeness --

def test_every_fragment_delivered_exactly_once():
    """Three workers, four buffers, two fragments per batch, 200 batches.

    Each fragment is identified by ``(meta.worker, meta.seq)``. None is
    delivered twice; per worker, the sequence numbers delivered are
    exactly ``0 .. d - 1`` (nothing lost in between); and after ``close()``
    each worker's own count of fragments it collected equals those
    delivered plus those still queued for the learner when it closed
    (``discarded``): every fragment collected is accounted for, exactly.
    """
    n_actors, B, n_per_batch, n_batches = 3, 2, 2, 200
    feed = multi.rollout(functools.partial(counting_factory, term_every=7),
                         CountingActor(), 4, n_actors, B, 4, n_per_batch,
                         entropy=5, start_method="fork", timeout=TIMEOUT,
                         shutdown_timeout=CLEAN_STOP)
    seen = []
    with closing(feed):
        for batch in itertools.islice(feed, n_batches):
            seen.extend(identities(batch, n_per_batch, B))
    assert len(seen) == n_batches * n_per_batch
    assert len(set(seen)) == len(seen)  # no duplicate
    accounts = feed.stats["workers"]
    for w, account in enumerate(accounts):
        seqs = sorted(seq for worker, seq in seen if worker == w)
        assert seqs == list(range(len(seqs)))  # no loss
        assert account["delivered"] == len(seqs)
        assert account["dropped"] == 0
        assert account["collected"] == account["received"] == \
            len(seqs) + account["discarded"]
    assert sum(a["delivered"] for a in accounts) == len(seen)
    assert feed.stats["steps"] == n_batches * n_per_batch * B * 4


# ---------------------------------------------------------------- max_lag --

def test_max_lag_drops_stale_fragments():
    """A fragment finished before the version is bumped past ``max_lag`` is
    dropped, counted, and its buffer reused; none is lost."""
    actor = CountingActor()
    feed = multi.rollout(counting_factory, actor, 4, 1, 2, 3, 1, entropy=0,
                         max_lag=1, start_method="fork", timeout=TIMEOUT,
                         shutdown_timeout=CLEAN_STOP)
    with closing(feed):
        batch = next(feed)
        v0, s0 = feed.version, int(batch.meta.seq[0])
        dropped0 = feed.stats["dropped"]
        assert int(batch.meta.version[0]) >= v0 - 1
        assert s0 == dropped0  # the fragments before s0 were dropped
        # a fragment finished after that batch, so it was collected with a
        # version <= v0; bumping twice more makes it stale for max_lag=1
        assert feed.poll(timeout=TIMEOUT) >= 1
        feed.params.publish(actor)
        batch = next(feed)  # publishes v0 + 2: needs version >= v0 + 1
        s1, dropped = int(batch.meta.seq[0]), feed.stats["dropped"]
        assert feed.version == v0 + 2
        assert int(batch.meta.version[0]) >= feed.version - 1
        assert dropped > dropped0
        assert s1 - s0 - 1 == dropped - dropped0  # in between: all dropped
    account = feed.stats["workers"][0]
    assert account["dropped"] == dropped
    assert account["received"] == account["delivered"] + \
        account["dropped"] + account["discarded"] == account["collected"]


def test_max_lag_zero_is_on_policy():
    """With ``max_lag=0`` every fragment delivered was collected with the
    parameters published by that very ``next()``, and the workers follow
    parameter changes (``shift`` changes the actions)."""
    actor = CountingActor()
    feed = multi.rollout(counting_factory, actor, 3, 2, 2, 4, 2, entropy=0,
                         max_lag=0, start_method="fork", timeout=TIMEOUT,
                         shutdown_timeout=CLEAN_STOP)
    with closing(feed):
        for k, batch in enumerate(itertools.islice(feed, 12)):
            assert torch.all(batch.meta.version == feed.version)
            state = batch.state
            # act[t + 1] = (obs[t] + stepno[t] + shift) % 5 with the shift
            # of the parameters that collected it (published before next())
            expected = (state.obs[:-1, :, 0].long() + state.stepno[:-1]
                        + k) % 5
            assert torch.equal(state.act[1:], expected)
            with torch.no_grad():
                actor.shift += 1
    accounts = feed.stats["workers"]
    assert sum(a["delivered"] for a in accounts) == 24
    assert all(a["received"] == a["delivered"] + a["dropped"] +
               a["discarded"] == a["collected"] for a in accounts)


# ---------------------------------------------------------- checks, stats --

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_buffers=1, n_per_batch=2), ValueError, "n_buffers >= n_per_batch"),
    (dict(n_actors=0), ValueError, "n_actors must be at least 1"),
    (dict(n_per_actor=2.0), TypeError, "n_per_actor must be an int"),
    (dict(max_lag=-1), ValueError, "max_lag must be at least 0"),
    (dict(timeout=-1), ValueError, "timeout"),
    (dict(start_method="nope"), ValueError, "start_method"),
])
def test_bad_arguments_fail_up_front(kwargs, error, match):
    args = dict(n_actors=2, n_per_actor=2, n_buffers=4, n_per_batch=2)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        multi.rollout(counting_factory, CountingActor(), 4, **args)


class WideHxActor(CountingActor):
    """An hx whose env dimension is not where ``hx_dim`` says."""

    hx_dim = 1

    def reset(self, hx, at):
        return hx.masked_fill(at[:, None], 0)


def test_hx_without_env_dimension_is_refused():
    with pytest.raises(ValueError, match="hx_dim=1"):
        multi.rollout(counting_factory, WideHxActor(), 4, 1, 3, 2, 1)


def test_stats_copy_and_closed_iteration():
    feed = multi.rollout(functools.partial(counting_factory, term_every=2),
                         CountingActor(), 4, 2, 2, 4, 2, entropy=3,
                         copy=True, start_method="fork", timeout=TIMEOUT)
    with feed:
        first, second = next(feed), next(feed)
        assert first.state.obs.data_ptr() != second.state.obs.data_ptr()
        stats = feed.stats
        assert stats["batches"] == 2 and stats["steps"] == 2 * 4 * 4
        assert stats["steps_per_s"] > 0 and stats["time_wall"] > 0
        # one set of keys for every generator, with the same meanings
        assert set(stats) == {
            "steps", "batches", "time_collect", "time_wall",
            "time_learner_wait", "time_worker_wait", "steps_per_s",
            "steps_per_s_collect", "returns", "lengths",
            "dropped", "version", "lag", "time_collate", "workers",
            "restarts"}
        assert stats["steps_per_s"] == pytest.approx(
            stats["steps"] / stats["time_wall"])
        assert stats["steps_per_s_collect"] == pytest.approx(
            stats["steps"] / stats["time_collect"])
        # every env ends an episode every 2 steps: 2 per env and fragment
        assert len(stats["returns"]) == len(stats["lengths"]) == 2 * 4
        assert np.all(stats["lengths"] == 2)
        assert stats["lag"] >= 0 and stats["version"] == 2
        assert len(feed.pids) == 2
    with pytest.raises(StopIteration):
        next(feed)
    assert feed.params is None  # released
    feed.close()  # idempotent


# --------------------------------------------------------------- capacity --

def test_pool_too_large_for_dev_shm(monkeypatch):
    monkeypatch.setattr(pool, "shm_free_bytes", lambda path=None: 4096)
    with pytest.raises(pool.CapacityError, match="shared memory.*free"):
        multi.rollout(counting_factory, CountingActor(), 64, 2, 8, 16, 2)


def test_pool_over_the_fd_limit(monkeypatch):
    monkeypatch.setattr(pool, "fd_limit", lambda: pool.open_fds() + 8)
    with pytest.raises(pool.CapacityError, match="file descriptors"):
        multi.rollout(counting_factory, CountingActor(), 4, 2, 2, 4, 2)


def test_reservation_failure_is_a_capacity_error(monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(pool.CapacityError, match="could not reserve"):
        multi.rollout(counting_factory, CountingActor(), 4, 2, 2, 4, 2,
                      start_method="fork")


def test_forkserver_fd_passing_limit(monkeypatch):
    # every shared storage is one descriptor handed to each worker, and the
    # fork server passes a bounded number of them
    monkeypatch.setattr(pool, "FORKSERVER_MAX_FDS", 2)
    with pytest.raises(pool.CapacityError, match="forkserver"):
        multi.rollout(counting_factory, CountingActor(), 4, 1, 2, 2, 1,
                      start_method="forkserver")


class ManyTensorsActor(CountingActor):
    def __init__(self, n):
        super().__init__()
        self.extra = nn.ParameterList(
            [nn.Parameter(torch.full((1,), float(i))) for i in range(n)])


def test_many_parameter_tensors_under_forkserver():
    """An actor with 300 parameter tensors starts under forkserver (its
    parameters travel as a few storages) and its workers load them."""
    actor = ManyTensorsActor(300)
    feed = multi.rollout(counting_factory, actor, 4, 1, 2, 2, 1,
                         start_method="forkserver", timeout=TIMEOUT)
    with closing(feed):
        next(feed)
    assert feed.stats["batches"] == 1


def test_segment_layout_and_views():
    tree = {"a": torch.zeros(3, 5, dtype=torch.float64),
            "b": (torch.zeros(7, dtype=torch.bool), torch.zeros(0, 2))}
    spec, stride = pool.layout(tree)
    assert stride % pool.ALIGN == 0
    segment = pool.Segment.create(2 * stride)
    try:
        one = pool.views(segment.flat, spec, 0)
        two = pool.views(segment.flat, spec, stride)
        one.npy["a"][...] = 1.5
        two.pyt["b"][0][3] = True
        assert float(one.pyt["a"].sum()) == 1.5 * 15
        assert float(two.pyt["a"].sum()) == 0.0
        assert two.npy["b"][0].tolist() == [False] * 3 + [True] + [False] * 3
        assert two.pyt["b"][1].shape == (0, 2)
        del one, two
    finally:
        segment.close()
    segment.close()  # idempotent


# ------------------------------------------------------------------ leaks --

def _shm_in_use():
    """Shared-memory files this process maps or holds open."""
    held = set()
    with open("/proc/self/maps") as f:
        for line in f:
            if "/dev/shm/" in line:
                held.add(line.split(None, 5)[-1].strip())
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            held.add(target)
    return held


def _cycle(start_method):
    feed = multi.rollout(functools.partial(counting_factory, term_every=3),
                         CountingActor(), 4, 2, 2, 3, 2, entropy=0,
                         start_method=start_method, timeout=TIMEOUT)
    with closing(feed):
        for _ in itertools.islice(feed, 3):
            pass


# 50 cycles under fork and forkserver. Not under spawn: the learner's side
# of a cycle is forkserver's (the same named semaphores, the same pool and
# channels; only how a worker process starts differs), and each spawned
# worker imports torch afresh (seconds each on a 2-core machine); that
# close() unlinks a spawned run's named semaphores is checked in
# test_guarantees.py
@pytest.mark.parametrize("start_method, n_cycles",
                         [("forkserver", 50), ("fork", 50)])
def test_no_leaks(start_method, n_cycles):
    for _ in range(5):  # warm-up: the fork server, lazily opened files
        _cycle(start_method)
    fds, threads = pool.open_fds(), threading.active_count()
    shm = _shm_in_use()
    for _ in range(n_cycles):
        _cycle(start_method)
    assert pool.open_fds() <= fds
    assert threading.active_count() <= threads
    assert _shm_in_use() <= shm
    mine = f"rlplay-pool-{os.getpid()}-"
    assert not [name for name in os.listdir(pool.SHM_DIR)
                if name.startswith(mine)]


_EXIT_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from envs import counting_factory
from generators import CountingActor
from rlplay.engine.rollout import multi

if __name__ == "__main__":
    feed = multi.rollout(counting_factory, CountingActor(), 4, 2, 2, 4, 2,
                         start_method={start_method!r}, timeout={timeout})
    next(feed)
    print(*feed.pids, flush=True)
    cycle = [feed]
    cycle.append(cycle)  # only the exit handler can close it
    {ending}
"""


@pytest.mark.parametrize("ending, returncode, start_method", [
    ("pass", 0, "forkserver"),
    ("raise RuntimeError('the learner failed')", 1, "fork"),
])
def test_interpreter_exits_without_close(ending, returncode, start_method):
    """A script that never closes its rollout (kept alive by a reference
    cycle, so only the exit handler can close it) still exits, ending
    normally or with an error, and leaves no worker behind."""
    script = _EXIT_SCRIPT.format(tests=os.path.dirname(__file__),
                                 ending=ending, start_method=start_method,
                                 timeout=TIMEOUT)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=SCRIPT)
    assert done.returncode == returncode, done.stderr
    for pid in map(int, done.stdout.split()):
        assert not running(pid), f"worker {pid} outlived the interpreter"
