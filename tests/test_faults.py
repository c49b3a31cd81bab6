"""The fault matrix of the process-based generators: generator x start
method x fault.

The columns: ``single``, ``multi`` and the ``Evaluator`` under fork,
forkserver and spawn, and ``cluster`` on the session's local Ray (where Ray
is installed; conftest's ``ray_cluster``). The faults:

- ``factory``: the factory raises in the worker (it works in the learner);
- ``reset``: the env's ``reset`` raises;
- ``step``: the env's ``step`` raises, once the worker has delivered;
- ``actor``: the actor raises, once the worker has delivered;
- ``exit``: the worker calls ``os._exit(3)``, once it has delivered;
- ``sigkill``: the worker is SIGKILLed from here, once it has delivered;
- ``hang``: the env stalls for good once the worker has delivered
  (``timeout=0.5``): an error, never a silent end (the evaluator's rule
  differs: a ``result()`` that runs out keeps the request, see
  test_guarantees.py);
- ``close``, ``drop``: the consumer breaks out early, then closes the
  generator, or drops it without closing it.

Each case raises the right exception (with the worker's type, message and
traceback, and where it failed) within a bound: :data:`~bounds.FAULT` once
the worker had delivered, :data:`~bounds.START` while it starts
(:data:`~bounds.RAY_START` for a Ray actor); a broken
generator stays broken with the same error; and no child process, no Ray
actor is left (conftest's autouse fixture). Then a few faults of one kind:
a factory that fails in the learner, a segfault, a first wait without
``start_timeout``, closures shipped by cloudpickle under spawn, a death
while the evaluator publishes.
"""
import functools
import gc
import itertools
import os
import signal
import threading
import time
from contextlib import closing

import pytest
import torch

from envs import (CountingEnv, FaultyEnv, StallingEnv, counting_factory,
                  failing_factory)
from generators import (METHODS, ActorFailure, CountingActor, RaisesAfter,
                        gone, make as make_generator, raises_within,
                        wait_started)
from rlplay.engine import BaseActorModule
from rlplay.engine import (RemoteTraceback, RolloutTimeout, WorkerDied,
                           WorkerError)
from rlplay.engine.utils import get_context, preload_forkserver

preload_forkserver(get_context("forkserver"),
                   ("pytest", "envs", "generators", __name__))

# the bounds (their reasons in bounds.py)
from bounds import (FAULT, RAY_START, RAY_STEADY, SHUTDOWN,  # noqa: E402
                    STALLED, START)

T = 4  # steps per fragment


# ---------------------------------------------------------------- columns --

class Column:
    """One generator under one start method (``None`` for ``cluster``), as
    the matrix makes and drives it.

    - ``single``: one worker of two envs;
    - ``multi``: two workers of one env each (one under spawn, whose
      workers import torch afresh), two buffers, one fragment per batch: a
      worker needs a buffer handed back by the learner before its third
      fragment (steps 9..12), so a fault at step 10 never comes before the
      first batch;
    - ``cluster``: as ``multi``, two Ray actors;
    - ``evaluator``: one env, one episode of 4 steps per evaluation: a
      fault at step 6 comes in the second evaluation.
    """

    def __init__(self, kind, method):
        self.kind, self.method = kind, method
        self.rollout = kind != "evaluator"
        self.n_workers = 2 if kind == "cluster" or (
            kind == "multi" and method != "spawn") else 1
        self.n_columns = 2 if kind == "single" else 1  # of a batch
        # the step of a fault once the worker delivered, and where the
        # worker then is
        self.late = {"single": T + 2, "evaluator": 6}.get(kind, 10)
        self.where = {"single": "collect (fragment 1)",
                      # the worker counts its evaluations from 0
                      "evaluator": "evaluation 1"}.get(
                          kind, "collect (fragment 2)")

    def __repr__(self):
        return self.kind if self.method is None else \
            f"{self.kind}-{self.method}"

    def env(self, fault):
        """A factory of :class:`~envs.FaultyEnv` with ``fault``, whose step
        faults come once the worker has delivered."""
        return functools.partial(
            FaultyEnv, fault, at=self.late,
            term_every=4 if self.kind == "evaluator" else None)

    def plain(self):
        """A factory of envs that never fail (whose episodes end, for the
        evaluator)."""
        return counting_factory if self.rollout else \
            functools.partial(CountingEnv, term_every=4)

    def make(self, factory, actor=None, **kwargs):
        actor = CountingActor() if actor is None else actor
        args = dict(timeout=FAULT, start_timeout=START)
        if self.kind == "evaluator":
            args.update(kwargs)
            return make_generator("evaluator", factory, actor, n_envs=1,
                                  n_episodes=1, start_method=self.method,
                                  **args)
        if self.kind == "single":
            args.update(kwargs)
            return make_generator("single", factory, actor, T, 2,
                                  start_method=self.method, **args)
        args.update(shutdown_timeout=SHUTDOWN, entropy=0)
        if self.kind == "cluster":
            # a Ray worker on a loaded machine may go without CPU for
            # longer than FAULT: what is timed is the report of a fault
            args.update(timeout=RAY_STEADY)
        args.update(kwargs)
        return make_generator(self.kind, factory, actor, T, 1,
                              n_actors=self.n_workers, n_buffers=2,
                              n_per_batch=1, start_method=self.method,
                              **args)

    def first(self, gen, actor=None):
        """What the generator delivers first: a batch, or an evaluation
        (every Ray actor started first: ``pids`` names them)."""
        if self.kind == "evaluator":
            gen.submit(CountingActor() if actor is None else actor)
            return gen.result()
        if self.kind == "cluster":
            wait_started(gen)
        return next(gen)

    def fails(self, gen, exc_type, bound):
        """Use the generator until it raises ``exc_type``, within ``bound``
        s; it stays broken with that error, and closes twice."""
        if self.rollout:
            err = raises_within(gen, exc_type, bound)
        else:
            actor, tic = CountingActor(), time.monotonic()
            with pytest.raises(exc_type) as info:
                for _ in range(100):
                    gen.submit(actor)  # may already raise
                    gen.result()
            assert time.monotonic() - tic < bound
            with pytest.raises(exc_type) as again:
                gen.poll()
            assert again.value is info.value
            err = info.value
        gen.close()
        gen.close()
        return err


COLUMNS = [Column(kind, method) for kind in ("single", "multi", "evaluator")
           for method in METHODS] + [Column("cluster", None)]
ROLLOUTS = [column for column in COLUMNS if column.rollout]


@pytest.fixture(params=COLUMNS, ids=repr)
def column(request):
    if request.param.kind == "cluster":
        request.getfixturevalue("ray_cluster")
    return request.param


def ray_actors_of(feed):
    """The rollout's Ray actors that Ray does not know dead."""
    from conftest import _ray_actors
    handles = feed._supervision.supervisor._handles.values()
    ids = {handle._actor_id.hex() for handle in handles}
    return ids & set(_ray_actors())


class FailsInWorker:
    """A factory that works in the learner (for the probe env) and raises
    in any other process (a worker's, or a Ray actor's)."""

    def __init__(self):
        self.learner = os.getpid()

    def __call__(self):
        if os.getpid() != self.learner:
            raise RuntimeError("factory failed in the worker")
        return CountingEnv()


def check_worker_error(err, column, exc_type, message):
    """A worker's exception: its type, message and traceback came back."""
    assert err.exc_type is exc_type
    assert err.type_name == f"{exc_type.__module__}.{exc_type.__qualname__}"
    assert message in err.remote_message and message in str(err)
    assert isinstance(err.__cause__, RemoteTraceback)
    assert str(err.__cause__) == err.remote_traceback
    assert "Traceback (most recent call last)" in err.remote_traceback
    assert message in err.remote_traceback
    assert err.worker in range(column.n_workers)


# ----------------------------------------------------------------- matrix --

def test_factory_raises(column):
    gen = column.make(FailsInWorker())
    err = column.fails(gen, WorkerError, RAY_START if column.kind ==
                       "cluster" else START)
    check_worker_error(err, column, RuntimeError,
                       "factory failed in the worker")
    assert "in the factory" in str(err)
    assert "test_faults.py" in err.remote_traceback
    assert "in __call__" in err.remote_traceback


def test_reset_raises(column):
    gen = column.make(column.env("reset"))
    err = column.fails(gen, WorkerError, RAY_START if column.kind ==
                       "cluster" else START)
    check_worker_error(err, column, RuntimeError, "reset failed on purpose")
    assert "in reset" in err.remote_traceback
    # the evaluator resets its envs at the start of each evaluation
    assert ("in reset" if column.rollout else "in evaluation") in str(err)


def test_step_raises(column):
    gen = column.make(column.env("step"))
    column.first(gen)
    err = column.fails(gen, WorkerError, FAULT)
    check_worker_error(err, column, ValueError, "step failed on purpose")
    assert f"in {column.where}" in str(err)
    assert "in step" in err.remote_traceback
    assert "FaultyEnv" in err.remote_traceback or "envs.py" in \
        err.remote_traceback


class RaisingActor(RaisesAfter, CountingActor):
    """Raises :class:`~generators.ActorFailure` at its ``after + 1``-th
    real step."""


def test_actor_raises(column):
    gen = column.make(column.plain(), RaisingActor(column.late - 1))
    column.first(gen, CountingActor())
    err = column.fails(gen, WorkerError, FAULT)
    check_worker_error(err, column, ActorFailure, "actor failed on purpose")
    assert f"in {column.where}" in str(err)


def test_worker_exits(column):
    gen = column.make(column.env("exit"))
    column.first(gen)
    pids = list(gen.pids)
    nodes = list(gen.nodes) if column.kind == "cluster" else None
    err = column.fails(gen, WorkerDied, FAULT)
    assert err.worker in range(column.n_workers)
    if column.kind == "cluster":  # a Ray actor's exit code is not known
        assert err.exitcode is None and err.node == nodes[err.worker]
        assert f"pid {pids[err.worker]}" in str(err)
        assert nodes[err.worker] in str(err)
    else:
        assert err.exitcode == 3 and "exit code 3" in str(err)


def test_worker_sigkilled(column):
    gen = column.make(column.plain())
    column.first(gen)
    pid = gen.pids[0]
    node = gen.nodes[0] if column.kind == "cluster" else None
    os.kill(pid, signal.SIGKILL)
    err = column.fails(gen, WorkerDied, FAULT)
    assert err.worker == 0
    if column.kind == "cluster":  # a Ray actor's exit code is not known
        assert err.node == node and err.exitcode is None
        assert f"pid {pid}" in str(err) and node in str(err)
    else:
        assert err.exitcode == -signal.SIGKILL
        assert "signal SIGKILL" in str(err)


@pytest.mark.parametrize("column", ROLLOUTS, ids=repr, indirect=True)
def test_hung_env_times_out(column):
    """Each worker delivers, then its env stalls (a minute from step 6 on):
    once every worker has delivered (until then a worker is starting, and
    ``start_timeout`` adds to the bound), next() raises RolloutTimeout
    after ``timeout`` of no news, and the stalled workers are ended
    (SIGTERM after ``shutdown_timeout``), not waited for."""
    feed = column.make(StallingEnv, timeout=0.5, shutdown_timeout=0.5)
    accounts = feed.stats["workers"]
    deadline = time.monotonic() + 2 * START
    while sum(a["received"] > 0 for a in accounts) < column.n_workers:
        assert time.monotonic() < deadline, "the workers did not deliver"
        if column.kind == "single":
            next(feed)  # fragment 0; the worker then stalls in fragment 1
        else:
            feed.poll(timeout=0.1)
    pids = list(feed.pids)
    tic = time.monotonic()
    err = column.fails(feed, RolloutTimeout, 2 * FAULT if column.kind ==
                       "cluster" else FAULT)
    assert "within 0.5 s" in str(err)
    assert time.monotonic() - tic >= 0.5
    if column.kind == "cluster":
        assert not ray_actors_of(feed)  # killed at once, hung or not
    else:
        assert all(gone(pid) for pid in pids)


def test_consumer_breaks_out_and_closes(column):
    gen = column.make(column.plain())
    pids = gen.pids
    if column.rollout:
        with closing(gen):
            for k, batch in enumerate(gen):
                if k == 1:
                    break
            if column.kind == "cluster":
                assert len(ray_actors_of(gen)) == 2
        assert batch.state.obs.shape == (1 + T, column.n_columns, 1)
        with pytest.raises(StopIteration):
            next(gen)
        assert gen.params is None  # released
    else:  # closed in the middle of an evaluation
        gen.submit(CountingActor())
        gen.close()
        with pytest.raises(RuntimeError, match="closed"):
            gen.submit(CountingActor())
    if column.kind == "cluster":
        assert not ray_actors_of(gen)  # close() waited until Ray knew
    else:
        assert all(gone(pid) for pid in pids)
    gen.close()  # idempotent


def test_consumer_breaks_out_and_drops(column):
    gen = column.make(column.plain())
    if column.rollout:
        for batch in gen:
            break
        assert batch.state.obs.shape == (1 + T, column.n_columns, 1)
        del batch
    else:  # dropped in the middle of an evaluation
        gen.submit(CountingActor())
    pids = gen.pids
    ids = ray_actors_of(gen) if column.kind == "cluster" else set()
    del gen  # no close(): dropping the generator shuts it down
    gc.collect()
    if column.kind == "cluster":
        from conftest import _ray_actors
        assert len(ids) == 2 and not ids & set(_ray_actors())
    else:
        assert all(gone(pid) for pid in pids)


# ------------------------------------------------------------ one kind --

@pytest.mark.parametrize("kind", ["single", "multi", "evaluator"])
def test_factory_fails_in_the_learner(kind):
    # the probe env is made here, so the error is the factory's own, as in
    # same.rollout, and no worker is started (the evaluator sizes its
    # sources with a probe too)
    with pytest.raises(RuntimeError, match="factory failed on purpose"):
        Column(kind, "fork").make(failing_factory)


@pytest.mark.parametrize("kind", ["single", "multi", "evaluator"])
def test_worker_segfaults(kind):
    # forkserver: not forked from pytest, whose fault handler would print
    # a traceback
    column = Column(kind, "forkserver")
    gen = column.make(column.env("segfault"))
    column.first(gen)
    err = column.fails(gen, WorkerDied, FAULT)
    assert err.exitcode == -signal.SIGSEGV and "signal SIGSEGV" in str(err)


class StalledEnv(CountingEnv):
    """Stalls (sleeps for a minute) at its first step."""

    def step(self, action):
        time.sleep(60)
        return super().step(action)


# backstop: an unbounded first wait would sleep with the env
@pytest.mark.timeout(STALLED)
@pytest.mark.parametrize("kind", ["single", "multi"])
def test_no_start_timeout_keeps_the_first_wait_bounded(kind):
    # start_timeout=None adds nothing to timeout: the first batch, which
    # never forms, times out after `timeout` like any other
    feed = Column(kind, "fork").make(StalledEnv, timeout=0.5,
                                     start_timeout=None,
                                     shutdown_timeout=0.5)
    tic = time.monotonic()
    with pytest.raises(RolloutTimeout, match="within 0.5 s"):
        next(feed)
    assert 0.5 <= time.monotonic() - tic < FAULT
    feed.close()


def test_closure_factory_fails_in_the_worker_under_spawn():
    learner = os.getpid()
    factory = lambda: (  # noqa: E731
        CountingEnv() if os.getpid() == learner else 1 / 0)
    column = Column("single", "spawn")
    err = column.fails(column.make(factory), WorkerError, START)
    check_worker_error(err, column, ZeroDivisionError, "division by zero")


def test_closure_factory_of_the_evaluator_under_spawn():
    column = Column("evaluator", "spawn")
    factory = lambda: FaultyEnv("step", at=1)  # noqa: E731
    err = column.fails(column.make(factory), WorkerError, START)
    assert err.exc_type is ValueError
    assert "step failed on purpose" in err.remote_traceback
    assert "in step" in err.remote_traceback


def test_closure_actor_raises_under_spawn():
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

    column = Column("single", "spawn")
    err = column.fails(column.make(CountingEnv, LocalActor()), WorkerError,
                       START)
    assert err.type_name.endswith("LocalFault")
    assert err.exc_type is None
    assert "closure actor failed" in err.remote_traceback


def test_closures_of_multi_under_spawn():
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

    column = Column("multi", "spawn")
    feed = column.make(lambda: CountingEnv(term_every=term), LocalActor())
    with feed:
        for batch in itertools.islice(feed, 2):
            obs, act = batch.state.obs[:-1, :, 0], batch.state.act[1:]
            assert torch.equal(act, (obs.long() + term) % 5)
            assert batch.state.fin[1:].any()  # episodes of 3 steps
        err = raises_within(feed, WorkerError, FAULT)
    assert err.exc_type is KeyError
    assert "closure actor failed on purpose" in err.remote_message


def test_death_while_publishing_closes_the_evaluator():
    """The worker dies while submit() waits for the parameters' lock (held
    here by another thread): the evaluator is closed, and says why again."""
    actor = CountingActor()
    evaluator = make_generator("evaluator",
                               functools.partial(CountingEnv, term_every=4),
                               actor, start_method="fork")
    lock = evaluator.params._version.get_lock()
    held, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(FAULT)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(FAULT)
        killer = threading.Timer(
            0.3, os.kill, (evaluator.pid, signal.SIGKILL))
        killer.start()
        with pytest.raises(WorkerDied, match="the parameter lock") as info:
            evaluator.submit(actor)
        killer.join()
    finally:
        release.set()
        holder.join()
    with pytest.raises(WorkerDied) as again:
        evaluator.poll()
    assert again.value is info.value
    assert not os.path.exists(f"/proc/{evaluator.pid}")  # joined, reaped
