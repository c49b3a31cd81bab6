"""The policy seam (``rlplay.engine.policy``): the call in two phases,
``submit(row, hx)`` then ``wait()``, with ``step`` as both; a policy that
defines only the two phases (as one served by another process would) fits
both loops unchanged and collects exactly what the local policy does;
``as_policy`` chooses without a lazy import."""
import gymnasium
import pytest
import torch

from generators import assert_fragments_equal
from rlplay.engine import BaseActorModule
from rlplay.engine.core import collect, evaluate, prepare, startup
from rlplay.engine.core.layout import State
from rlplay.engine.envs import make_batch
from rlplay.engine.nested import suply
from rlplay.engine.policy import (DevicePolicy, FeedForwardPolicy,
                                  LocalPolicy, Policy, as_policy)
from rlplay.engine.seeds import env_seed_sequences

T, B = 5, 3


class Recurrent(BaseActorModule):
    """Samples CartPole actions from a linear layer; ``hx`` counts the
    steps since each env's reset, and enters the logits."""

    hx_dim = 0

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.net = torch.nn.Linear(5, 2)

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if hx is None:
            hx = torch.zeros(obs.shape[1])
        x = torch.cat([obs.float(), hx[None, :, None]
                       .to(obs.dtype)], dim=-1)
        logits = self.net(x)
        act = torch.distributions.Categorical(logits=logits).sample()
        return act, hx if virtual else hx + 1, {"logits": logits}

    def reset(self, hx, at):
        return torch.where(at, torch.zeros_like(hx), hx)


class Deferred(Policy):
    """The two phases only: ``submit`` keeps the row and ``hx``, ``wait``
    makes the call (a served policy's shape); the rest from a local
    policy."""

    def __init__(self, actor):
        self.local, self.calls, self._call = LocalPolicy(actor), [], None

    def probe(self, row, observation_space):
        return self.local.probe(row, observation_space)

    def initial_hx(self, row):
        return self.local.initial_hx(row)

    def submit(self, row, hx):
        assert self._call is None
        self.calls.append("submit")
        self._call = row, hx

    def wait(self):
        (row, hx), self._call = self._call, None
        self.calls.append("wait")
        return self.local.actor.step(*row, hx=hx, virtual=False)

    def lookahead(self, row, hx):
        return self.local.lookahead(row, hx)

    def reset(self, hx, fin):
        return self.local.reset(hx, fin)


def cartpoles():
    return gymnasium.make("CartPole-v1")


def fragments(actor, n=3):
    seeds = env_seed_sequences(0, B)
    envs = make_batch(cartpoles, seeds)
    buffer = prepare(envs, actor, T, B)
    ctx = startup(envs, actor, buffer, seeds)
    got = []
    torch.manual_seed(0)
    for _ in range(n):
        collect(actor, buffer, ctx)
        got.append(suply(torch.clone, buffer.pyt))
    envs.close()
    return got


def test_a_policy_of_two_phases_collects_what_the_local_one_does():
    want = fragments(Recurrent())
    deferred = Deferred(Recurrent())
    got = fragments(deferred)
    for g, w in zip(got, want):
        assert_fragments_equal(g, w)
    # every step of the loop went through submit then wait, in turn
    assert deferred.calls == ["submit", "wait"] * (3 * T)
    assert any(g.state.fin[1:].any() for g in got)


def test_a_policy_of_two_phases_plays_what_the_local_one_does():
    def played(actor):
        envs = make_batch(cartpoles, env_seed_sequences(4, 2))
        torch.manual_seed(0)
        try:
            return evaluate(envs, actor, 3,
                            seed_sequences=env_seed_sequences(4, 2))
        finally:
            envs.close()

    want = played(Recurrent())
    deferred = Deferred(Recurrent())
    got = played(deferred)
    assert [list(map(float, x)) for x in got] == \
        [list(map(float, x)) for x in want]
    assert deferred.calls[:2] == ["submit", "wait"]


def _state(n_envs):
    return State(torch.zeros(1, n_envs, dtype=torch.int64),
                 torch.zeros(1, n_envs, 4), torch.zeros(1, n_envs,
                                                        dtype=torch.int64),
                 torch.zeros(1, n_envs), torch.ones(1, n_envs,
                                                    dtype=torch.bool))


def test_the_local_policy_submits_and_waits_as_one_step():
    state = _state(B)
    policy = LocalPolicy(Recurrent())
    hx = policy.initial_hx(state)
    torch.manual_seed(5)
    want = policy.step(state, hx)
    torch.manual_seed(5)
    policy.submit(state, hx)
    got = policy.wait()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(RuntimeError, match=r"wait\(\) without a submit\(\)"):
        policy.wait()


def test_as_policy_chooses_without_a_lazy_import():
    import rlplay.engine.policy.choose as choose
    deferred = Deferred(Recurrent())
    assert as_policy(deferred) is deferred
    assert type(as_policy(Recurrent())) is LocalPolicy
    assert type(as_policy(Recurrent(), device="cpu")) is DevicePolicy
    assert choose.DevicePolicy is DevicePolicy
    assert issubclass(FeedForwardPolicy, Policy)


def test_the_protocol_leaves_the_phases_to_an_implementation():
    with pytest.raises(NotImplementedError):
        Policy().step(_state(1), None)
