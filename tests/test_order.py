"""The order guarantee: a worker's fragments reach the learner in
``meta.seq`` order, across batches and within one batch's slots, in every
generator, with a slow and a fast worker and across restarts.

A worker numbers its fragments ``0, 1, 2, ...`` (a replacement goes on
from the last one received); the learner delivers them in that order. A
fragment may be missing (dropped by ``max_lag``, lost in flight by a
worker that failed), never out of order, never twice.
"""
import functools
import itertools
import os
import random
import signal
import time

import pytest

from envs import CountingEnv, claim
from rlplay.engine.seeds import env_seed_sequences, reset_seed
from rlplay.engine.rollout import multi, single
from generators import RAY_STARTED_BOUND, CountingActor, identities

from bounds import MARGIN, STEADY as BOUND, START  # the reasons in bounds.py


class OrderEnv(CountingEnv):
    """A CountingEnv (terminating every 3 steps) that is slow (each step
    sleeps ``delay`` s) when ``slow``, and SIGKILLs its process at its
    ``kill_at``-th step when ``kill`` and it claims one of ``markers``
    (once in the whole run)."""

    def __init__(self, slow=False, delay=0.004, kill=False, markers=(),
                 kill_at=10):
        super().__init__(term_every=3)
        self.slow, self.delay, self.kill = slow, delay, kill
        self.markers, self.kill_at, self.steps = markers, kill_at, 0

    def step(self, action):
        self.steps += 1
        if self.slow:
            time.sleep(self.delay)
        if self.kill and self.steps == self.kill_at and claim(self.markers):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


def order_factory(seed=None, *, slow_seeds=(), kill_seeds=(), markers=()):
    """An :class:`OrderEnv`, slow or killed by the seed it gets, so that
    the learner picks which worker is which (the seeds of worker ``i``'s
    first generation: :func:`seeds_of`)."""
    return OrderEnv(slow=seed in slow_seeds, kill=seed in kill_seeds,
                    markers=markers)


def seeds_of(worker, n_envs=1, entropy=0):
    """The env seeds of worker ``worker``'s first generation."""
    return {reset_seed(ss) for ss in env_seed_sequences(entropy, n_envs,
                                                        worker)}


def slow_and_fast(tmp_path, slow=1, killed=0):
    """Worker ``slow`` is slow; worker ``killed`` is killed once."""
    return functools.partial(order_factory, slow_seeds=seeds_of(slow),
                             kill_seeds=seeds_of(killed),
                             markers=[str(tmp_path / "kill")])


def assert_in_order(seen):
    """``seen``: ``(worker, seq)`` in the order the learner got them (batch
    by batch, slot by slot): per worker strictly increasing."""
    last = {}
    for worker, seq in seen:
        assert seq > last.get(worker, -1), \
            f"worker {worker}: seq {seq} after {last[worker]}"
        last[worker] = seq


from bounds import REPLACEMENT as REPLACEMENT_BOUND  # noqa: E402


def read_on(feed, at_least=30):
    """The batches of ``feed``: ``at_least``, then on until both workers
    have delivered and the killed one was replaced (bounded): which worker
    fills the first batches is the scheduler's, and the fast worker is
    killed at its 10th step, before it may have delivered anything."""
    workers, tic = set(), time.monotonic()
    for k, batch in enumerate(feed):
        yield batch
        workers.update(batch.meta.worker.tolist())
        if k + 1 >= at_least and workers == {0, 1} \
                and feed.stats["restarts"] == 1:
            return
        assert time.monotonic() - tic < REPLACEMENT_BOUND, (
            f"workers {sorted(workers)} delivered, restarts "
            f"{feed.stats['restarts']}, after {REPLACEMENT_BOUND} s")


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_single_in_order_across_restarts(tmp_path, start_method):
    factory = functools.partial(order_factory,
                                kill_seeds=seeds_of(0, n_envs=2),
                                markers=[str(tmp_path / "kill")])
    feed = single.rollout(factory, CountingActor(), 4, 2, entropy=0, restarts=1, restart_delay=0.05,
        timeout=BOUND, start_timeout=START, start_method=start_method)
    seen = []
    with feed:
        for batch in itertools.islice(feed, 12):
            seen.extend(identities(batch, 1, 2))
        assert feed.stats["restarts"] == 1
    assert_in_order(seen)
    assert [seq for _, seq in seen] == list(range(12))  # lag 1, no gap


@pytest.mark.timeout(REPLACEMENT_BOUND + 2 * MARGIN)
@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_multi_in_order_slow_and_fast_workers(tmp_path, start_method):
    """A fast worker and a slow one, six buffers, three fragments per
    batch: the fast worker fills several slots of a batch; it is killed
    once and replaced. Its fragments and the slow one's come in order, in
    slot order within a batch."""
    feed = multi.rollout(
        slow_and_fast(tmp_path), CountingActor(), 4, 2, 1, 6, 3, entropy=0, restarts=1,
        restart_delay=0.05, timeout=BOUND, start_timeout=START,
        start_method=start_method)
    seen, several = [], 0
    with feed:
        for batch in read_on(feed):
            slots = identities(batch, 3, 1)
            several += max(sum(w == 0 for w, _ in slots), 1) > 1
            seen.extend(slots)
        assert feed.stats["restarts"] == 1
    assert_in_order(seen)
    assert several > 0  # a batch held more than one fragment of a worker
    assert {w for w, _ in seen} == {0, 1}


@pytest.mark.timeout(RAY_STARTED_BOUND + REPLACEMENT_BOUND + 2 * MARGIN)
def test_cluster_in_order_slow_and_fast_workers(ray_cluster, tmp_path):
    """As for multi, on the session's local Ray."""
    from rlplay.engine.rollout import cluster
    feed = cluster.rollout(
        slow_and_fast(tmp_path), CountingActor(), 4, 2, 1, 6, 3, entropy=0,
        restarts=1, restart_delay=0.05, timeout=BOUND,
        start_timeout=RAY_STARTED_BOUND)
    seen = []
    with feed:
        for batch in read_on(feed):
            seen.extend(identities(batch, 3, 1))
        assert feed.stats["restarts"] == 1
    assert_in_order(seen)
    assert {w for w, _ in seen} == {0, 1}


@pytest.mark.timeout(RAY_STARTED_BOUND + 2 * MARGIN)
def test_cluster_in_order_when_ray_reports_calls_out_of_order(
        ray_cluster, monkeypatch):
    """Ray does not promise that the results of one actor's calls become
    visible to the caller in the order the calls ran: here ``ray.wait``
    sees each result up to 10 ms (at random, seeded) after it is ready,
    as if its reply were still in transit. The learner delivers each worker's
    fragments in order all the same."""
    from rlplay.engine.rollout import cluster
    ray = ray_cluster
    real_wait, rng, visible_at = ray.wait, random.Random(0), {}

    def wait(refs, *, num_returns=1, timeout=None, **kwargs):
        # each result is seen up to 10 ms after it is ready
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = set(real_wait(refs, num_returns=len(refs), timeout=0,
                                  **kwargs)[0])
            now = time.monotonic()
            for ref in ready:
                visible_at.setdefault(ref, now + rng.uniform(0.0, 0.01))
            seen = [ref for ref in refs
                    if ref in ready and visible_at[ref] <= now]
            if len(seen) >= num_returns or (deadline is not None
                                            and now >= deadline):
                seen = seen[:num_returns]
                return seen, [ref for ref in refs if ref not in seen]
            time.sleep(0.001)

    monkeypatch.setattr(ray, "wait", wait)
    feed = cluster.rollout(CountingEnv, CountingActor(), 2, 2, 1, 8, 2,
                           entropy=0, timeout=BOUND,
                           start_timeout=RAY_STARTED_BOUND)
    seen = []
    with feed:
        for batch in itertools.islice(feed, 40):
            seen.extend(identities(batch, 2, 1))
            time.sleep(0.02)  # training: the workers' results pile up
    assert_in_order(seen)
