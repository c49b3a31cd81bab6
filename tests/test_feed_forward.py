"""Feed-forward actors written on batches (``FeedForwardActor.act``): the
``step`` made of ``act``, the checks of the class and of ``act``'s outputs,
and the fragment loops' fast call of ``act`` (``FeedForwardPolicy``),
which must collect exactly what the actor's own ``step`` collects."""
import functools
import itertools

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from cartpoles import torch_cartpole
from generators import assert_fragments_equal, make, without_version
from rlplay.engine import FeedForwardActor, PolicyActor, check_actor
from rlplay.engine.core import collect, prepare, startup
from rlplay.engine.policy import (FeedForwardPolicy, LocalPolicy,
                                   as_policy)
from rlplay.engine.envs import make_batch
from rlplay.engine.nested import suply
from rlplay.engine.rollout import same
from rlplay.engine.seeds import env_seed_sequences

T, B = 6, 5


class Sampler(FeedForwardActor):
    """Samples from the logits of a linear layer over CartPole's
    observations; ``info`` holds the value (one per observation) and
    ``logp``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.net = nn.Linear(4, 3)

    def act(self, obs):
        out = self.net(obs.float())
        dist = torch.distributions.Categorical(logits=out[:, :2])
        action = dist.sample()
        return action, {"value": out[:, 2], "logp": dist.log_prob(action)}


class Stepped(Sampler):
    """:class:`Sampler` called through its own ``step`` (no fast call)."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return super().step(stepno, obs, act, rew, fin, hx=hx,
                            virtual=virtual)


def cartpoles():
    return gymnasium.make("CartPole-v1")


def cartpole_vector():
    return gymnasium.make_vec("CartPole-v1", num_envs=B,
                              vectorization_mode="vector_entry_point")


def fragments(factory, actor, n=4, kind="same", **kwargs):
    torch.manual_seed(0)
    with make(kind, factory, actor, T, B, entropy=0, **kwargs) as feed:
        return [without_version(suply(torch.clone, b))
                for b in itertools.islice(feed, n)]


# ------------------------------------------------------------- the class --

def test_step_folds_the_rows_into_one_batch_for_act():
    seen = []

    class Twice(FeedForwardActor):
        def act(self, obs):
            seen.append(tuple(obs["x"].shape))
            return obs["x"].sum(-1) * 2, {"half": obs["y"] / 2}

    obs = {"x": torch.arange(24.0).reshape(3, 2, 4),
           "y": torch.arange(6.0).reshape(3, 2)}
    stepno = torch.zeros(3, 2, dtype=torch.int64)
    act, hx, info = Twice().step(stepno, obs, None, None, None, hx=(),
                                 virtual=False)
    assert seen == [(6, 4)] and hx == ()
    assert torch.equal(act, obs["x"].sum(-1) * 2) and act.shape == (3, 2)
    assert torch.equal(info["half"], obs["y"] / 2)
    assert Twice().reset((), torch.ones(2, dtype=torch.bool)) == ()


@pytest.mark.parametrize("source", [
    "def act(self):\n    pass",
    "def act(self, obs, hx):\n    pass",
    "def act(self, *obs):\n    pass",
])
def test_act_signature_is_checked_when_the_class_is_defined(source):
    namespace = {}
    exec(source, namespace)
    with pytest.raises(TypeError, match=r"Bad.act has signature act\(.*\); "
                                        r"FeedForwardActor expects "
                                        r"act\(self, obs\)"):
        type("Bad", (FeedForwardActor,), {"act": namespace["act"]})


def test_a_bare_feed_forward_actor_is_refused():
    with pytest.raises(TypeError, match="FeedForwardActor does not "
                                        "implement act()"):
        check_actor(FeedForwardActor())

    class Bare(FeedForwardActor):
        pass

    with pytest.raises(TypeError, match="Bare does not implement act()"):
        same.rollout(cartpoles, Bare(), T, B)


@pytest.mark.parametrize("out, what", [
    (lambda obs: torch.zeros(len(obs), dtype=torch.int64), "Tensor"),
    (lambda obs: (torch.zeros(len(obs), dtype=torch.int64),), "a tuple of 1"),
])
def test_act_must_return_an_action_and_info(out, what):
    class Bare(FeedForwardActor):
        def act(self, obs):
            return out(obs)

    with pytest.raises(TypeError, match=rf"Bare.act must return \(action, "
                                        rf"info\), got {what}"):
        next(same.rollout(cartpoles, Bare(), T, B))


# -------------------------------------------------- the fragment loops --

def test_the_policy_of_a_feed_forward_actor_calls_act():
    assert type(as_policy(Sampler())) is FeedForwardPolicy
    # its own step, or another actor: the actor's step
    assert type(as_policy(Stepped())) is LocalPolicy
    assert type(as_policy(PolicyActor(nn.Linear(4, 2)))) is FeedForwardPolicy


@pytest.mark.parametrize("factory", [
    cartpoles, cartpole_vector, functools.partial(torch_cartpole, B)],
    ids=["list", "vector", "torch"])
def test_the_fast_call_collects_what_step_collects(factory):
    got = fragments(factory, Sampler())
    want = fragments(factory, Stepped())
    for g, w in zip(got, want):
        assert_fragments_equal(g, w)
    # the actions were sampled, and episodes ended among them
    assert len(set(torch.cat([g.state.act.flatten() for g in got]).tolist())
               ) == 2
    assert any(g.state.fin[1:].any() for g in got)


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_the_fast_call_in_worker_processes(kind):
    want = fragments(cartpoles, Stepped(), n=3)
    got = fragments(cartpoles, Sampler(), n=3, kind=kind, n_actors=1)
    for g, w in zip(got, want):
        assert_fragments_equal(g, w)


def _context(actor, n=2):
    seeds = env_seed_sequences(0, B)
    envs = make_batch(cartpoles, seeds)
    buffer = prepare(envs, actor, T, B)
    ctx = startup(envs, actor, buffer, seeds)
    frags = []
    torch.manual_seed(0)
    for _ in range(n):
        collect(actor, buffer, ctx)
        frags.append(suply(torch.clone, buffer.pyt))
    envs.close()
    return ctx, frags


def test_act_gets_views_of_the_rows_made_once():
    calls = []

    class Seen(Sampler):
        def act(self, obs):
            calls.append((tuple(obs.shape), obs.data_ptr()))
            return super().act(obs)

    ctx, _ = _context(Seen(), n=3)
    assert isinstance(ctx.policy, FeedForwardPolicy)
    assert {shape for shape, _ in calls} == {(B, 4)}
    # rows 1..T-1 of the one buffer, kept; row 0 (checked) and the
    # lookahead from row T go through step
    assert len(ctx.policy._flat) == T - 1
    # a fragment calls act on rows 0..T, the same memory in each fragment
    last, before = calls[-(T + 1):], calls[-2 * (T + 1):-(T + 1)]
    rows = [ptr for _, ptr in last]
    assert len(set(rows)) == T + 1 and rows == [ptr for _, ptr in before]


def test_a_few_kept_rows_at_most(monkeypatch):
    _, want = _context(Sampler(), n=3)
    monkeypatch.setattr(FeedForwardPolicy, "MAX_ROWS", 2)
    ctx, got = _context(Sampler(), n=3)
    assert len(ctx.policy._flat) <= 2
    for g, w in zip(got, want):
        assert_fragments_equal(g, w)


def test_a_wrong_action_of_act_is_caught_at_the_first_step():
    class Wrong(Sampler):
        def act(self, obs):
            action, info = super().act(obs)
            return action[:1], info  # one action for B envs

    with pytest.raises(ValueError, match=r"Wrong.act returned an action of "
                                         r"shape \(1,\) for 5 observations"):
        next(same.rollout(cartpoles, Wrong(), T, B))

    class Late(Sampler):  # wrong once told to be
        wrong = False

        def act(self, obs):
            action, info = super().act(obs)
            if self.wrong:
                info["value"] = info["value"][:2]
            return action, info

    actor = Late()
    feed = same.rollout(cartpoles, actor, T, B)
    next(feed)
    actor.wrong = True
    with pytest.raises(ValueError, match=r"Late.act returned an info leaf "
                                         r"of shape \(2,\) for 5"):
        next(feed)
    feed.close()


# ------------------------------------------------------ PolicyActor -------

class Frames(gymnasium.Env):
    """Frames ``(2, 8, 8)`` uint8 of the step count; three actions;
    episodes of 5 steps."""

    observation_space = spaces.Box(0, 255, (2, 8, 8), np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros((2, 8, 8), np.uint8), {}

    def step(self, action):
        self.t += 1
        return (np.full((2, 8, 8), self.t, np.uint8), float(action), False,
                self.t >= 5, {})


class ConvPolicy(nn.Module):
    """A convolution over ``(N, 2, 8, 8)`` frames: logits and a value
    ``(N, 1)``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(2, 4, 3, stride=2), nn.ReLU(),
                                  nn.Flatten())
        self.head = nn.Linear(4 * 3 * 3, 4)

    def forward(self, frames):
        assert frames.dim() == 4, frames.shape  # one batch of frames
        out = self.head(self.body(frames.float() / 255))
        return out[:, :3], out[:, 3:]


def test_policy_actor_takes_a_convolution_as_it_is():
    policy = ConvPolicy()
    frags = fragments(Frames, PolicyActor(policy), n=2)
    for f in frags:
        with torch.no_grad():
            logits, value = policy(f.state.obs.flatten(0, 1))
        # the value (N, 1) recorded as one per env, (1 + T, B)
        assert torch.equal(f.actor["value"], value.view(T + 1, B))
        # logp of row t: of the action it chose, recorded in row t + 1
        logp = torch.log_softmax(logits, -1).view(T + 1, B, 3)
        chosen = logp[:-1].gather(-1, f.state.act[1:].unsqueeze(-1))
        torch.testing.assert_close(f.actor["logp"][:-1], chosen.squeeze(-1))
