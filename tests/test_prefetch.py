"""Prefetching (``prefetch=``) and publication apart from ``next()``
(``publish=``, ``feed.publish()``), for ``single`` and ``multi`` (the
``cluster`` cases are in tests/test_cluster.py's manner: last, on Ray).

The rules checked exactly:

- data: with a deterministic actor whose parameters do not change, the
  fragments with and without prefetch are the same, leaf by leaf, and so
  are their versions for ``single``; for ``multi`` only ``meta.version``
  may differ (a prefetched batch waits one publication longer);
- versions: ``meta.version`` of a fragment is the number of publications
  when its worker loaded the parameters it collected with (the actor's
  ``shift``, set to the number of the publication that carries it, shows
  in every action), whether ``next()`` publishes or ``publish()`` does;
- no aliasing: a batch changed in place by the caller leaves the next one
  (prepared before the change) as it was, ``copy=True`` or not;
- a prefetched batch not handed out is not delivered: ``state_dict()``
  counts it out, and a resumed run collects its ``meta.seq`` again;
- a worker killed while a batch is prefetched is reported by the next
  ``next()`` (``WorkerDied``), or replaced (``restarts``); ``close()``
  while the thread waits is bounded and leaves no thread behind
  (conftest.py's fixture checks every test for threads named
  ``rlplay-...``).
"""
import itertools
import multiprocessing.connection
import os
import signal
import threading
import time
from contextlib import closing

import pytest
import torch

from bounds import (FAULT, JOIN, RAY_START, RAY_STEADY, SHUTDOWN,
                    STEADY)
from envs import (ENV_INFO, LevelEnv, StallEnv, counting_factory,
                  mixed_factory)
from generators import (METHODS, CountingActor, assert_fragments_equal,
                        make, without_version)
from rlplay.engine.errors import WorkerDied
from rlplay.engine.rollout import same
from rlplay.engine.utils import get_context, preload_forkserver

preload_forkserver(get_context("forkserver"),
                   ("pytest", "envs", "generators", __name__))

KINDS = ["single", "multi"]
T, B = 4, 2


def _make(kind, factory=counting_factory, actor=None, **kwargs):
    kwargs.setdefault("timeout", STEADY)
    kwargs.setdefault("shutdown_timeout", SHUTDOWN)
    # multi: one worker, one fragment per batch, double buffered, so that
    # the order of the fragments is the worker's
    return make(kind, factory, CountingActor() if actor is None else actor,
                T, B, n_actors=1, **kwargs)


def _until(condition, bound=STEADY):
    """Poll ``condition()`` until it holds (bounded)."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


def _prepared(feed, n=1):
    """Wait (bounded) until ``n`` batches are prepared ahead."""
    _until(lambda: feed._prefetch.thread.prepared() >= n)


def _threads():
    return [t.name for t in threading.enumerate()
            if t.name.endswith("-prefetch")]


# -------------------------------------------------------------- arguments --

@pytest.mark.parametrize("kind, kwargs, error, match", [
    ("multi", dict(prefetch=-1), ValueError, "prefetch must be at least 0"),
    ("multi", dict(prefetch=1.0), TypeError, "prefetch must be an int"),
    ("multi", dict(prefetch=True), TypeError, "prefetch must be an int"),
    ("single", dict(prefetch=2), ValueError, "at most 1, got 2"),
    ("multi", dict(publish="never"), ValueError, "publish must be one of"),
    ("single", dict(publish=None), ValueError, "publish must be one of"),
])
def test_bad_arguments_fail_up_front(kind, kwargs, error, match):
    with pytest.raises(error, match=match):
        _make(kind, **kwargs)


def test_same_takes_neither():
    # same collects with the caller's own actor in the caller's thread:
    # a thread collecting ahead would read parameters being trained
    with pytest.raises(TypeError, match="prefetch"):
        same.rollout(counting_factory, CountingActor(), T, B, prefetch=1)


# ------------------------------------------------------------------- data --

@pytest.mark.parametrize("start_method", METHODS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_same_fragments_with_and_without_prefetch(kind, start_method):
    """Leaf by leaf those of ``same`` (one worker): the versions too for
    ``single`` (its lag stays exactly one), all but them for ``multi``."""
    kwargs = dict(entropy=99, env_info=ENV_INFO)
    ref = same.rollout(mixed_factory, CountingActor(), T, B, **kwargs)
    plain = _make(kind, mixed_factory, start_method=start_method, **kwargs)
    feed = _make(kind, mixed_factory, start_method=start_method, prefetch=1,
                 **kwargs)
    with closing(ref), closing(plain), closing(feed):
        for want, got, base in zip(itertools.islice(ref, 6),
                                   itertools.islice(feed, 6),
                                   itertools.islice(plain, 6)):
            assert_fragments_equal(without_version(got),
                                   without_version(want))
            if kind == "single":
                assert torch.equal(got.meta.version, base.meta.version)
        assert feed.stats["batches"] == 6
        assert feed.stats["steps"] == 6 * T * B


# --------------------------------------------------------------- versions --

def _check_versions(batch):
    # CountingActor: act[t + 1] = (obs[t] + stepno[t] + shift) % 5, and
    # the shift of publication v is v: the version recorded is the one
    # whose parameters acted
    state, version = batch.state, batch.meta.version
    expected = (state.obs[:-1, :, 0].long() + state.stepno[:-1]
                + version[None, :]) % 5
    assert torch.equal(state.act[1:], expected)


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("publish", ["next", "manual"])
@pytest.mark.parametrize("kind", KINDS)
def test_versions_count_publications(kind, publish, prefetch):
    actor = CountingActor()
    feed = _make(kind, actor=actor, entropy=3, publish=publish,
                 prefetch=prefetch)
    published = 0
    with closing(feed):
        for k in range(10):
            # the next publication (by next(), or by publish()) carries
            # the shift of its own number
            with torch.no_grad():
                actor.shift.fill_(feed.params.version + 1)
            batch = next(feed)
            _check_versions(batch)
            if publish == "next":
                # single publishes from its second next() on
                published += int(kind == "multi" or k > 0)
            assert feed.params.version == published
            assert feed.stats["version"] == published
            assert feed.stats["lag"] == published - int(
                batch.meta.version.min())
            if publish == "manual":
                with torch.no_grad():
                    actor.shift.fill_(published + 1)
                published += 1
                assert feed.publish() == published
        state = feed.state_dict()
    assert state["version"] >= published
    with pytest.raises(RuntimeError, match="closed"):
        feed.publish()


@pytest.mark.parametrize("prefetch", [0, 1])
def test_max_lag_zero_with_manual_publication(prefetch):
    """Without prefetch, every fragment is of the parameters published
    before ``next()`` (on-policy); a prefetched batch was taken against
    the publication before, one behind at most."""
    actor = CountingActor()
    feed = _make("multi", actor=actor, entropy=0, max_lag=0,
                 publish="manual", prefetch=prefetch, n_buffers=3)
    with closing(feed):
        for k in range(10):
            batch = next(feed)
            _check_versions(batch)
            lag = feed.version - int(batch.meta.version.min())
            assert lag == feed.stats["lag"] and 0 <= lag <= prefetch
            with torch.no_grad():
                actor.shift.fill_(k + 1)
            assert feed.publish() == k + 1


def test_max_lag_is_applied_as_fragments_are_taken():
    """``publish="next"``, ``prefetch=1``: a batch prepared ahead was
    taken against the publication before the one of the ``next()`` that
    hands it out, so its lag is at most ``max_lag + 1``; and every
    fragment's version is that of the parameters that acted."""
    actor = CountingActor()
    feed = _make("multi", actor=actor, entropy=0, max_lag=1, prefetch=1,
                 n_buffers=3)
    lags = []
    with closing(feed):
        for _ in range(12):
            with torch.no_grad():
                actor.shift.fill_(feed.params.version + 1)
            batch = next(feed)
            _check_versions(batch)
            lag = feed.stats["lag"]
            assert lag == feed.version - int(batch.meta.version.min())
            lags.append(lag)
    assert 0 <= min(lags) and max(lags) <= 2


# --------------------------------------------------------------- aliasing --

@pytest.mark.parametrize("copy", [True, False], ids=["copy", "reused"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_changed_in_place_leaves_the_next_alone(kind, copy):
    ref = same.rollout(counting_factory, CountingActor(), T, B, entropy=5)
    feed = _make(kind, entropy=5, copy=copy, prefetch=1)
    with closing(ref), closing(feed):
        batch = next(feed)
        for k, want in enumerate(itertools.islice(ref, 1, 6)):
            _prepared(feed)  # the next one is ready before the change
            held = [leaf.data_ptr() for leaf in (batch.state.obs,
                                                 batch.state.rew)]
            batch.state.obs.fill_(-1)
            batch.state.rew.fill_(-1)
            batch = next(feed)
            assert batch.state.obs.data_ptr() not in held
            assert_fragments_equal(without_version(batch),
                                   without_version(want))


# ------------------------------------------------------- state, poll, stats --

def test_a_prefetched_batch_is_not_counted_delivered():
    feed = _make("multi", entropy=11, prefetch=1)
    with closing(feed):
        seqs = [int(next(feed).meta.seq[0]) for _ in range(3)]
        _prepared(feed)
        assert feed.poll() >= 1  # the prepared batch's fragment
        state = feed.state_dict()
        assert state["counters"]["batches"] == feed.stats["batches"] == 3
        assert state["workers"][0]["seq"] == seqs[-1] + 1 == 3
        prefetched = next(feed)
        assert int(prefetched.meta.seq[0]) == 3
        # it is counted once handed out
        assert feed.state_dict()["workers"][0]["seq"] == 4
        stats = feed.stats
        assert stats["batches"] == 4
        assert 0 <= stats["time_learner_wait"] <= stats["time_wall"]
    resumed = _make("multi", prefetch=1, resume=state)
    with closing(resumed):
        assert int(next(resumed).meta.seq[0]) == 3  # collected again
        assert resumed.stats["batches"] == 4


@pytest.mark.parametrize("kind", KINDS)
def test_call_envs_under_prefetch(kind):
    """Every step of a fragment runs at the level of its ``meta.control``
    (:class:`~envs.LevelEnv`); ``single`` sees each call exactly two
    batches later, as without prefetch (its publications are the same);
    ``multi`` in order, one call at a time, every call reached."""
    feed = _make(kind, LevelEnv, entropy=0, prefetch=1)
    schedule = {1: 1, 2: 2, 4: 3}  # after batch k, the c-th call
    controls = []
    with closing(feed):
        for k in range(10):
            batch = next(feed)
            control = int(batch.meta.control[0])
            assert torch.all(batch.meta.control == control)
            assert torch.all(batch.state.obs[1:, :, 0] == control)
            controls.append(control)
            if k in schedule:
                assert feed.call_envs("set_level", schedule[k]) == \
                    schedule[k]
        if kind == "multi":
            # a call reaches the fragments that the worker starts after
            # the publication that carries it: the fragments in its two
            # buffers and the batch prepared ahead may come before, and how
            # many of them were already filled depends on timing; a few
            # more batches (a bound, not a guess) reach the last call
            for _ in range(10):
                if controls[-1] == 3:
                    break
                batch = next(feed)
                controls.append(int(batch.meta.control[0]))
                assert torch.all(batch.state.obs[1:, :, 0] == controls[-1])
    assert controls == sorted(controls) and controls[-1] == 3
    if kind == "single":
        assert controls == [sum(1 for j in schedule if j <= k - 2)
                            for k in range(10)]


# ------------------------------------------------------------ faults, close --

@pytest.mark.parametrize("start_method", METHODS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_killed_while_a_batch_is_prefetched(kind, start_method):
    feed = _make(kind, entropy=0, prefetch=1, start_method=start_method,
                 timeout=FAULT)
    with closing(feed):
        next(feed)
        _prepared(feed)
        sentinel = feed.process.sentinel
        os.kill(feed.pids[0], signal.SIGKILL)
        # once the death shows (its sentinel: forkserver's reports come
        # after the process ended), the next next() reports it (the
        # workers' news come first), the prepared batch undelivered
        assert multiprocessing.connection.wait([sentinel], FAULT)
        tic = time.monotonic()
        with pytest.raises(WorkerDied) as info:
            next(feed)
        assert time.monotonic() - tic < FAULT
        assert info.value.exitcode == -signal.SIGKILL
        with pytest.raises(WorkerDied) as again:
            next(feed)
        assert again.value is info.value
        assert not _threads()


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_worker_is_replaced_under_prefetch(kind):
    feed = _make(kind, entropy=0, prefetch=1, restarts=1, restart_delay=0,
                 start_method="fork")
    with closing(feed):
        next(feed)
        _prepared(feed)
        pid = feed.pids[0]
        os.kill(pid, signal.SIGKILL)
        generations = [int(next(feed).meta.generation[0]) for _ in range(6)]
        assert generations[-1] == 1 and feed.stats["restarts"] == 1
        assert feed.pids[0] != pid


@pytest.mark.parametrize("kind", KINDS)
def test_close_while_the_thread_waits_is_bounded(kind):
    # the worker stalls in its second fragment: the thread waits for it
    feed = _make(kind, _stalled_factory, entropy=0, prefetch=1,
                 timeout=60.0)
    next(feed)
    assert _threads()
    tic = time.monotonic()
    feed.close()
    assert time.monotonic() - tic < SHUTDOWN + JOIN
    assert not _threads()
    with pytest.raises(StopIteration):
        next(feed)


def _stalled_factory():
    return StallEnv(at=T + 2)


def test_dropping_a_prefetching_rollout_ends_its_thread():
    feed = _make("multi", entropy=0, prefetch=1)
    next(feed)
    _prepared(feed)
    del feed
    deadline = time.monotonic() + JOIN
    while _threads():
        assert time.monotonic() < deadline, "the thread outlived its feed"
        time.sleep(0.01)


# ---------------------------------------------------------------- cluster --

def test_cluster_prefetches_and_publishes(ray_cluster):
    """The same part on Ray: versions counted by ``publish()``, a batch
    prepared ahead counted out of the state."""
    actor = CountingActor()
    feed = make("cluster", counting_factory, actor, T, B, n_actors=1,
                entropy=3, prefetch=1, publish="manual",
                timeout=RAY_STEADY, start_timeout=RAY_START)
    with closing(feed):
        for k in range(6):
            batch = next(feed)
            _check_versions(batch)
            assert int(batch.meta.seq[0]) == k
            with torch.no_grad():
                actor.shift.fill_(k + 1)
            assert feed.publish() == k + 1
        _prepared(feed)
        state = feed.state_dict()
        assert state["counters"]["batches"] == 6
        assert state["workers"][0]["seq"] == 6
