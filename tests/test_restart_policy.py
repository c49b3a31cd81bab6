"""The restart policy, without processes: who is replaced, who is raised,
and how the counts move."""
import types

import pytest

from rlplay.engine.workers._restarts import Member, RestartPolicy


class Crash(Exception):
    pass


def policy(n=2, restarts=2, delay=0.0, run=None):
    members = [Member(i, {}) for i in range(n)]
    return RestartPolicy(members, restarts, delay, run), members


def test_a_restartable_failure_within_the_budget_is_replaced():
    pol, (a, b) = policy(restarts=2, delay=5.0)
    a.delivered = True
    assert pol._fail(a, Crash("env died"), True, "Crash: env died") is None
    pol._replace(a, lost=1)
    assert (a.generation, pol.restarts, a.account["restarts"],
            a.account["lost"]) == (1, 1, 1, 1)
    assert a.account["last_cause"] == "Crash: env died"
    assert a.due is not None and pol.replacing
    assert not a.failed_early  # it had delivered


def test_a_failure_that_is_not_restartable_is_raised_at_once():
    pol, (a, _) = policy(restarts=5)
    with pytest.raises(Crash, match="^actor bug$"):
        pol._fail(a, Crash("actor bug"), False, "Crash: actor bug")
    assert pol.restarts == 0


def test_the_budget_is_a_total_for_the_run_and_named_when_spent():
    pol, (a, b) = policy(restarts=2)
    for member in (a, b):
        member.delivered = True
        pol._fail(member, Crash("x"), True, "x")
        pol._replace(member, lost=0)
        member.delivered = True
    with pytest.raises(Crash, match=r"^x after 2 restarts$"):
        pol._fail(a, Crash("x"), True, "x")


def test_a_crash_loop_is_raised_with_its_reason():
    """Two generations in a row that failed before delivering anything."""
    pol, (a, _) = policy(restarts=10)
    pol._fail(a, Crash("boom"), True, "boom")  # generation 0, nothing yet
    pol._replace(a, lost=0)
    assert a.failed_early and a.generation == 1
    a.delivered = False  # the new generation has not delivered either
    with pytest.raises(Crash, match=r"crash loop: generation 1 of worker 0"
                                    r".* after 1 restart$"):
        pol._fail(a, Crash("boom"), True, "boom")


def test_a_generation_that_delivered_is_not_a_crash_loop():
    pol, (a, _) = policy(restarts=10)
    pol._fail(a, Crash("boom"), True, "boom")
    pol._replace(a, lost=0)
    a.delivered = True
    assert pol._fail(a, Crash("boom"), True, "boom") is None


def test_starting_replacing_and_positions():
    pol, (a, b) = policy()
    assert pol.starting and not pol.replacing
    a.delivered = b.delivered = True
    assert not pol.starting
    ready = types.SimpleNamespace(next_seq=[4, 9])
    pol._replace(b, lost=2)
    assert pol.positions(ready) == [(4, 0, 0), (9, 1, 1)]


def test_a_resumed_run_goes_on_with_its_counts():
    run = types.SimpleNamespace(counters={"restarts": 3},
                                generation=[2, 1], restarts=[2, 1])
    pol, (a, b) = policy(restarts=4, run=run)
    assert pol.restarts == 3
    assert (a.generation, b.generation) == (2, 1)
    assert (a.account["restarts"], b.account["restarts"]) == (2, 1)
    a.delivered = True
    pol._fail(a, Crash("x"), True, "x")
    pol._replace(a, lost=0)
    a.delivered = True
    with pytest.raises(Crash, match="after 4 restarts"):
        pol._fail(a, Crash("x"), True, "x")
