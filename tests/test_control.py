"""Env control, ``feed.call_envs(name, *args, **kwargs)``, in every
generator: the envs (:class:`~envs.LevelEnv`, whose observations carry
their level) are set to level ``c`` by the ``c``-th call, so every step of
a fragment stamped ``meta.control == c`` must show level ``c``, in every
column, never two levels in one fragment; and so after a worker's restart
(every row, row 0 too: the replacement applies the calls before it
resets), after a resume (the calls are part of the state; an old state
without them continues at control 0), in the evaluator's results, and
through ``episodic``. A call that fails is an ``EnvCallError`` (a
``WorkerError`` of that type from a worker) naming the method and the env
column, never restarted; bad calls are refused up front. The delivery's
flow control is checked without processes.
"""
import functools
import io
import itertools
import os
import signal
import threading
import time

import gymnasium
import pytest
import torch
from torch import nn

from bounds import RAY_STEADY, START, STEADY
from envs import LevelAgentsEnv, LevelEnv, late_vector, level_vector
from generators import (RAY_STARTED_BOUND, CountingActor, fragments_of,
                        make, raises_within)
from rlplay.engine import EnvCallError, PolicyActor, WorkerError
from rlplay.engine.envs import EnvList, VectorSource, make_batch
from rlplay.engine.rollout import episodic, same
from rlplay.engine.workers._control import (MAX_CALL_BYTES, CallLog,
                                            CallMail)
from rlplay.engine.seeds import env_seed_sequences

T, B = 4, 2  # steps per fragment, envs per worker
# the calls of a run: set_level(c), the c-th call, made after batch k
SCHEDULE = {1: 1, 2: 2, 4: 3}
# the batches between a call and the first one it shows in
LAG = {"same": 1, "single": 2, "single-spawn": 2}
KINDS = ["same", "single", "multi", "single-spawn", "cluster"]


def make_kind(kind, request=None, **kwargs):
    """``(feed, n_per_batch)``: ``same`` and ``single`` over two
    :class:`LevelEnv`; ``multi`` and ``cluster``, two workers of one
    ``SyncVectorEnv`` of two (reached through ``VectorEnv.call``), two
    fragments a batch."""
    args = dict(entropy=0)
    if kind == "cluster":
        request.getfixturevalue("ray_cluster")
        args.update(timeout=RAY_STEADY, start_timeout=RAY_STARTED_BOUND)
    elif kind != "same":
        args.update(timeout=STEADY, start_timeout=START)
    if kind.endswith("-spawn"):
        kind, args["start_method"] = kind[:-len("-spawn")], "spawn"
    args.update(kwargs)
    if kind in ("multi", "cluster"):
        return make(kind, level_vector, CountingActor(), T, B, n_actors=2,
                    n_per_batch=2, n_buffers=4, **args), 2
    return make(kind, LevelEnv, CountingActor(), T, B, **args), 1


def stepped_at(fragment):
    """``(worker, seq, generation, control)`` of a fragment, checking that
    every step of it (rows 1..T, every column) ran at the level of its
    control."""
    meta = fragment.meta
    control = int(meta.control[0])
    assert torch.all(meta.control == control)
    levels = fragment.state.obs[1:, :, 0]
    assert torch.all(levels == control), (control, levels)
    return (int(meta.worker[0]), int(meta.seq[0]), int(meta.generation[0]),
            control)


@pytest.mark.parametrize("kind", KINDS)
def test_every_step_of_a_fragment_runs_at_the_level_of_its_control(
        kind, request):
    feed, n = make_kind(kind, request)
    seen, controls = {}, []  # per worker, [(seq, control)]; per batch
    # a worker may start long after the other has delivered many batches
    # (a Ray actor especially): the bound is a time, the start bound
    deadline = time.monotonic() + (RAY_STARTED_BOUND if kind == "cluster"
                                   else START)
    with feed:
        for k in itertools.count():
            assert time.monotonic() < deadline, (
                f"the calls did not reach every worker: {seen}")
            batch = next(feed)
            stamps = [stepped_at(f) for f in fragments_of(batch, n, B, 0)]
            for worker, seq, _, control in stamps:
                seen.setdefault(worker, []).append((seq, control))
            controls.append({stamp[3] for stamp in stamps})
            if k in SCHEDULE:
                assert feed.call_envs("set_level", SCHEDULE[k]) == \
                    SCHEDULE[k]
            if k > max(SCHEDULE) and len(seen) == n and all(
                    got[-1][1] == len(SCHEDULE) for got in seen.values()):
                break
    for got in seen.values():  # in order: never back, one call at a time
        assert [seq for seq, _ in got] == sorted(seq for seq, _ in got)
        assert [c for _, c in got] == sorted(c for _, c in got)
    if kind in LAG:  # published with the parameters: their lag exactly
        for k, got in enumerate(controls):
            assert got == {sum(1 for j in SCHEDULE if j <= k - LAG[kind])}


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_a_replacement_applies_every_call_before_its_first_reset(kind):
    feed, n = make_kind(kind, restarts=1, restart_delay=0.0)
    after = []  # worker 0's fragments of generation 1
    with feed:
        next(feed)
        feed.call_envs("set_level", 1)
        feed.call_envs("set_level", 2)
        deadline = time.monotonic() + START
        killed = False
        while len(after) < 2:
            assert time.monotonic() < deadline
            batch = next(feed)
            for fragment in fragments_of(batch, n, B, 0):
                worker, _, generation, control = stepped_at(fragment)
                if worker == 0 and generation == 1:
                    after.append(fragment)
                if worker == 0 and control == 2 and not killed:
                    os.kill(feed.pids[0], signal.SIGKILL)
                    killed = True
        assert feed.stats["restarts"] == 1
    for fragment in after:  # row 0 too: the reset came after the calls
        assert torch.all(fragment.meta.control == 2)
        assert torch.all(fragment.state.obs[:, :, 0] == 2)


def roundtrip(state):
    """``state`` through ``torch.save`` and ``torch.load(weights_only=
    True)``: it holds plain values only."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def evaluated_level(result):
    """The level the evaluation's envs were at, from its returns: the
    CountingActor plays ``(level + t) % 5`` at step ``t`` of episodes of
    three steps, a return of 3, 6 or 9 at levels 0, 1 or 2."""
    returns = set(result.returns.tolist())
    assert len(returns) == 1, returns
    return {3.0: 0, 6.0: 1, 9.0: 2}[returns.pop()]


def evaluator(**kwargs):
    return make("evaluator", LevelEnv, CountingActor(), n_envs=1,
                n_episodes=2, timeout=STEADY, start_timeout=START, **kwargs)


def test_the_evaluator_evaluates_under_the_calls_made_before_submit():
    actor = CountingActor()
    with evaluator() as feed:
        feed.submit(actor)
        result = feed.result()
        assert (result.control, evaluated_level(result)) == (0, 0)
        assert feed.call_envs("set_level", 1) == 1
        assert feed.call_envs("set_level", 2) == 2
        feed.submit(actor)
        result = feed.result()
        assert (result.control, evaluated_level(result)) == (2, 2)


@pytest.mark.parametrize("kind", ["same", "single", "multi", "evaluator"])
def test_a_resumed_run_applies_every_call_before_collecting(kind):
    actor = CountingActor()
    feed = evaluator() if kind == "evaluator" else make_kind(kind)[0]
    with feed:
        if kind != "evaluator":
            next(feed)
        feed.call_envs("set_level", 1)
        feed.call_envs("set_level", 2)
        state = roundtrip(feed.state_dict())
    assert [call["method"] for call in state["calls"]] == ["set_level"] * 2
    # a state saved before call_envs (and before the acted field and
    # meta.agent): no calls, no meta.control, no acted, no meta.agent
    old = {key: value for key, value in state.items() if key != "calls"}
    added = {"batch.meta.control", "batch.acted", "batch.meta.agent"}
    if state["layout"] is not None:
        rows = state["layout"]["buffer"]
        assert added <= {r[0] for r in rows}
        old["layout"] = dict(state["layout"], buffer=[
            row for row in rows if row[0] not in added])
    for resume, control in ((state, 2), (old, 0)):
        if kind == "evaluator":
            with evaluator(resume=resume) as feed:
                feed.submit(actor)
                result = feed.result()
                assert (result.control, evaluated_level(result)) == \
                    (control, control)
            continue
        with make_kind(kind, resume=resume)[0] as feed:
            batch = next(feed)  # row 0 too: the reset followed the calls
            assert torch.all(batch.meta.control == control)
            assert torch.all(batch.state.obs[:, :, 0] == control)
            assert feed.call_envs("set_level", 1) == control + 1


def test_a_damaged_call_in_a_state_is_refused_naming_it():
    with make_kind("same")[0] as feed:
        feed.call_envs("set_level", 1)
        state = feed.state_dict()
    for calls, error, match in (
            ("set_level", TypeError, r"resume\['calls'\] must be a list"),
            ([{"method": "set_level"}], TypeError,
             r"resume\['calls'\]\[0\] must be a dict"),
            ([{"method": "set_level", "payload": "*"}], ValueError,
             r"resume\['calls'\]\[0\]\['payload'\] is not base64")):
        with pytest.raises(error, match=match):
            same.rollout(LevelEnv, CountingActor(), T, B,
                         resume=dict(state, calls=calls))


@pytest.mark.parametrize("kind, call", [
    ("same", "missing"), ("same", "raises"), ("single", "raises"),
    ("multi", "missing")])
def test_a_failing_call_names_its_method_and_column_and_is_not_restarted(
        kind, call):
    feed, _ = make_kind(kind, **({} if kind == "same" else {"restarts": 2}))
    name, level = ("set_levl", 1) if call == "missing" else ("set_level", -1)
    with feed:
        next(feed)
        feed.call_envs(name, level)
        exc = raises_within(feed, WorkerError if kind != "same"
                            else EnvCallError, STEADY)
    where = "env columns 0..1" if kind == "multi" else "env column 0"
    said = ("no level -1" if call == "raises" else
            f"{name!r}" if kind != "multi" else "set_levl")
    for part in ("call 1 of call_envs", where, said):
        assert part in str(exc), (part, str(exc))
    if kind == "same":
        assert exc.method == name and (call == "missing" or isinstance(
            exc.__cause__, ValueError))
    else:
        assert exc.exc_type is EnvCallError
        assert feed.stats["restarts"] == 0


def test_bad_calls_are_refused_up_front():
    feed, _ = make_kind("same")
    with feed:
        for args, error, match in (
                ((3,), TypeError, "name must be the name of a method of "
                                  "the envs .a str., got int 3"),
                (("set level",), ValueError, "must be a method's name"),
                (("reset",), ValueError, "'reset' is refused"),
                (("set_level", threading.Lock()), TypeError,
                 r"arguments of set_level\(\) cannot be pickled"),
                (("set_level", b"x" * MAX_CALL_BYTES), ValueError,
                 f"more than {MAX_CALL_BYTES}")):
            with pytest.raises(error, match=match):
                feed.call_envs(*args)
        batch = next(feed)  # none of them was kept
        assert torch.all(batch.meta.control == 0)
        assert feed.state_dict()["calls"] == []
    with pytest.raises(RuntimeError, match="closed"):
        feed.call_envs("set_level", 1)


def envpool_cartpole(seed=None):
    import envpool
    return envpool.make_gymnasium("CartPole-v1", num_envs=2,
                                  seed=0 if seed is None else seed % 2**31)


@pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning")
@pytest.mark.parametrize("kind", ["same", "single"])
def test_envpool_is_refused_up_front_naming_it(kind):
    pytest.importorskip("envpool")
    feed = make(kind, envpool_cartpole, PolicyActor(nn.Linear(4, 2)), T, 2,
                **({} if kind == "same" else dict(timeout=STEADY,
                                                  start_timeout=START)))
    with feed:
        with pytest.raises(TypeError, match=r"EnvPool made by factory .*"
                                            r"cannot take call_envs: EnvPool"):
            feed.call_envs("set_level", 1)


def test_episodic_passes_the_calls_through():
    feed = episodic.rollout(LevelEnv, CountingActor(), B, 2, n_steps=T)
    with feed:
        next(feed)
        assert feed.call_envs("set_level", 1) == 1
        for _ in range(10):  # until the episodes begun before it are out
            episodes = next(feed)
            if torch.all(episodes.obs[:, 0] == 1):
                break
        else:
            raise AssertionError("no episode at the level of the call")


def test_the_env_adapter_calls_through_wrappers_and_vector_envs():
    envs = EnvList([gymnasium.wrappers.TimeLimit(LevelEnv(), 10)
                    for _ in range(2)])
    envs.call("set_level", (3,), {}, first=4)
    assert [env.unwrapped.level for env in envs] == [3, 3]
    with pytest.raises(EnvCallError, match=r"env column 4 \(LevelEnv\) has "
                                           r"no method 'set_levl'"):
        envs.call("set_levl", (3,), {}, first=4)
    source = VectorSource(level_vector(3))
    source.call("set_level", (), {"k": 2})
    assert [env.level for env in source.source.envs] == [2, 2, 2]
    native = VectorSource(late_vector(), name="the native env")
    with pytest.raises(EnvCallError, match=r"env columns 0..3 \(the native "
                                           r"env\) is a natively vectorized"):
        native.call("set_level", (1,), {})


@pytest.mark.parametrize("kind", ["same", "single", "multi"])
def test_a_pettingzoo_env_takes_the_calls_once_per_env(kind):
    """Over PettingZoo parallel envs (two envs of two agents a worker),
    ``set_level`` reaches each env's own method once per call, and every
    agent's step of a fragment stamped with control ``c`` ran at level
    ``c``."""
    pytest.importorskip("pettingzoo")
    args = {} if kind == "same" else dict(timeout=STEADY,
                                          start_timeout=START)
    feed = make(kind, LevelAgentsEnv, CountingActor(), T, 4, n_actors=1,
                **args)
    deadline = time.monotonic() + START
    with feed:
        next(feed)
        assert feed.call_envs("set_level", 1) == 1
        while True:
            assert time.monotonic() < deadline, "the call never showed"
            batch = next(feed)
            if stepped_at(batch)[3] == 1:
                break
        batch = next(feed)
        assert stepped_at(batch)[3] == 1
        assert feed.call_envs("set_level", 2) == 2
        while stepped_at(next(feed))[3] != 2:
            assert time.monotonic() < deadline, "the call never showed"


def test_the_env_adapter_calls_each_pettingzoo_env_once():
    pytest.importorskip("pettingzoo")
    envs = make_batch(LevelAgentsEnv, env_seed_sequences(0, 4, 0))
    envs.call("set_level", (3,), {}, first=4)
    assert [env.levels for env in envs.envs] == [[3], [3]]
    with pytest.raises(EnvCallError, match=r"set_level\(-1\) of env "
                       r"columns 4..5 \(.*LevelAgentsEnv.*\) raised "
                       r"ValueError: no level -1") as info:
        envs.call("set_level", (-1,), {}, first=4)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(EnvCallError, match=r"env columns 4..5 \(.*"
                       r"LevelAgentsEnv.*\) has no method 'set_levl'"):
        envs.call("set_levl", (3,), {}, first=4)


def test_the_learner_sends_new_calls_once_those_before_are_applied():
    log = CallLog()
    mail = CallMail(log, 2, gated=True)
    for k in range(3):
        assert log.add("set_level", (k,), {}) == k + 1
    assert mail.take(0) is None  # made, not published
    log.publish()
    order = mail.take(0)
    assert order.first == 0 and len(order.payloads) == 3
    log.add("set_level", (3,), {})
    log.publish()
    assert mail.take(0) is None  # the three are not applied yet
    mail.applied_by(0, 3)
    assert mail.take(0).first == 3
    assert len(mail.start(1)) == 4 and mail.take(1) is None  # a replacement
    # at most MAX_CALL_BYTES a message (but one call)
    for _ in range(3):
        log.add("set_level", (b"x" * (MAX_CALL_BYTES // 3),), {})
    log.publish()
    ungated = CallMail(log, 1, gated=False)
    ungated.sent[0] = 4
    sizes = [len(ungated.take(0).payloads), len(ungated.take(0).payloads)]
    assert sizes == [2, 1] and ungated.take(0) is None
