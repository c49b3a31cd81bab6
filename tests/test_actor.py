"""The actor API: signature checks, the default reset, PolicyActor."""
import gymnasium
import numpy as np
import pytest
import torch
from torch import nn

from rlplay.engine import (BaseActorModule, PolicyActor, acted, check_actor,
                           squashed_normal)
from envs import SpacesEnv
from rlplay.engine.rollout import same

EXPECTED = r"step\(self, stepno, obs, act, rew, fin, /, \*, hx, virtual\)"


# signatures, checked when a class is defined

def test_a_correct_actor_is_accepted():
    class Good(BaseActorModule):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            return act, hx, {}

        def reset(self, hx, at):
            return hx

    class WithDefaults(BaseActorModule):
        def step(self, stepno, obs, act, rew, fin, /, *, hx=None,
                 virtual=False):
            return act, hx, {}

    class Later(Good):  # inherits both: nothing to check
        pass

    class KeywordsSwapped(BaseActorModule):
        def step(self, stepno, obs, act, rew, fin, /, *, virtual, hx):
            return act, hx, {}

    assert issubclass(Later, BaseActorModule)


def test_wrong_positional_names():
    with pytest.raises(TypeError) as info:
        class Renamed(BaseActorModule):
            def step(self, stepno, observation, act, rew, fin, /, *, hx,
                     virtual):
                pass
    message = str(info.value)
    assert message.startswith("Renamed.step has signature step(self, "
                              "stepno, observation, act, rew, fin, /, *, hx, "
                              "virtual)")
    assert "the actor API expects step(self, stepno, obs, act, rew, fin, /, "\
           "*, hx, virtual)" in message
    assert message.endswith("its positional inputs are (stepno, observation,"
                            " act, rew, fin), expected (stepno, obs, act, "
                            "rew, fin) in this order")


def test_positional_order_matters():
    with pytest.raises(TypeError, match=EXPECTED):
        class Swapped(BaseActorModule):
            def step(self, obs, stepno, act, rew, fin, /, *, hx, virtual):
                pass


def test_missing_slash():
    with pytest.raises(TypeError, match=r"NoSlash.step has signature "
                                        r"step\(self, stepno, obs, act, rew, "
                                        r"fin, \*, hx, virtual\).*the five "
                                        r"inputs must be positional-only: "
                                        r"add '/' after fin$"):
        class NoSlash(BaseActorModule):
            def step(self, stepno, obs, act, rew, fin, *, hx, virtual):
                pass


def test_missing_star():
    with pytest.raises(TypeError, match=r"NoStar.step has signature "
                                        r"step\(self, stepno, obs, act, rew, "
                                        r"fin, /, hx, virtual\).*hx and "
                                        r"virtual must be keyword-only: add "
                                        r"'\*' before hx$"):
        class NoStar(BaseActorModule):
            def step(self, stepno, obs, act, rew, fin, /, hx, virtual):
                pass


@pytest.mark.parametrize("source, problem", [
    ("def step(self, stepno, obs, act, rew, fin, /, *, hx): pass",
     r"its keyword parameters are \(hx\), expected \(hx, virtual\)"),
    ("def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual, extra):"
     " pass", r"its keyword parameters are \(hx, virtual, extra\)"),
    ("def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual, **kw):"
     " pass", r"it must not take \*args or \*\*kwargs"),
    ("def step(self, stepno, obs, act, rew, /, *, hx, virtual): pass",
     r"its positional inputs are \(stepno, obs, act, rew\), expected"),
    ("def step(self, *args, hx, virtual): pass",
     r"it must not take \*args"),
    ("def step(self, stepno, obs, act, rew, fin, hx, /, *, virtual): pass",
     r"hx and virtual must be keyword-only"),
], ids=["no-virtual", "extra-keyword", "var-keyword", "four-positional",
        "var-positional", "positional-hx"])
def test_other_wrong_step_signatures(source, problem):
    namespace = {}
    exec(source, namespace)
    with pytest.raises(TypeError, match=EXPECTED + ": " + problem):
        type("Bad", (BaseActorModule,), {"step": namespace["step"]})


@pytest.mark.parametrize("source", [
    "def reset(self, hx): pass",
    "def reset(self, state, at): pass",
    "def reset(self, hx, at, extra): pass",
    "def reset(self, hx, *, at): pass",
    "def reset(self, at, hx): pass",
], ids=["one-arg", "renamed", "extra", "keyword-at", "swapped"])
def test_wrong_reset_signatures(source):
    namespace = {}
    exec(source, namespace)
    signature = source[len("def reset"):source.index(":")]
    with pytest.raises(TypeError) as info:
        type("BadReset", (BaseActorModule,), {"reset": namespace["reset"]})
    assert str(info.value).startswith(
        f"BadReset.reset has signature reset{signature}; the actor API "
        f"expects reset(self, hx, at)")


def test_positional_only_reset_is_accepted():
    class Fine(BaseActorModule):
        def reset(self, hx, at, /):
            return hx


# the default reset

def test_default_reset_of_a_gru_state():
    actor = BaseActorModule()
    hx = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3) + 1
    before = hx.clone()
    at = torch.tensor([False, True, False, True])
    out = actor.reset(hx, at)
    assert torch.equal(hx, before)  # never mutates its input
    assert out is not hx
    assert (out[:, [1, 3]] == 0).all()
    assert torch.equal(out[:, [0, 2]], before[:, [0, 2]])


def test_default_reset_of_an_lstm_state_and_feed_forward():
    actor = BaseActorModule()
    h, c = torch.ones(1, 3, 2), torch.full((1, 3, 2), 2.0)
    at = torch.tensor([True, False, False])
    h1, c1 = actor.reset((h, c), at)
    assert h1[:, 0].eq(0).all() and c1[:, 0].eq(0).all()
    assert h1[:, 1:].eq(1).all() and c1[:, 1:].eq(2).all()
    assert actor.reset((), at) == ()
    assert actor.reset(None, at) is None


def test_default_reset_along_another_dimension():
    class BatchFirst(BaseActorModule):
        hx_dim = 0

    hx = torch.ones(3, 5)
    out = BatchFirst().reset(hx, torch.tensor([False, False, True]))
    assert out[2].eq(0).all() and out[:2].eq(1).all()


def test_default_reset_in_a_real_gru():
    gru = nn.GRU(2, 4)
    actor = BaseActorModule()
    _, hx = gru(torch.randn(3, 2, 2))
    out = actor.reset(hx, torch.tensor([True, False]))
    assert out[:, 0].eq(0).all() and torch.equal(out[:, 1], hx[:, 1])


# PolicyActor

def row(obs):
    n_envs = obs.shape[1]
    return (torch.zeros(1, n_envs, dtype=torch.int64), obs,
            torch.zeros(1, n_envs, dtype=torch.int64), torch.zeros(1, n_envs),
            torch.ones(1, n_envs, dtype=torch.bool))


class Fixed(nn.Module):
    """Returns fixed logits (and a value) whatever the observation."""

    def __init__(self, logits, value=None):
        super().__init__()
        self.logits, self.value = torch.tensor(logits), value

    def forward(self, obs):
        logits = self.logits.expand(*obs.shape[:-1], -1)
        if self.value is None:
            return logits
        return logits, torch.full((*obs.shape[:-1], 1), self.value)


def test_policy_actor_with_logits():
    torch.manual_seed(0)
    actor = PolicyActor(Fixed([0.0, 1.0, 2.0]))
    act, hx, info = actor.step(*row(torch.zeros(1, 64, 4)), hx=None,
                               virtual=False)
    assert hx == ()
    assert act.shape == (1, 64) and act.dtype == torch.int64
    assert set(act.flatten().tolist()) == {0, 1, 2}  # sampled in training
    assert list(info) == ["logp"] and info["logp"].shape == (1, 64)
    expected = torch.log_softmax(torch.tensor([0.0, 1.0, 2.0]), -1)[act]
    assert torch.allclose(info["logp"], expected)


def test_policy_actor_greedy_in_eval():
    actor = PolicyActor(Fixed([0.0, 3.0, 1.0])).eval()
    act, _, info = actor.step(*row(torch.zeros(1, 32, 4)), hx=(),
                              virtual=False)
    assert act.eq(1).all()
    actor = PolicyActor(Fixed([0.0, 3.0, 1.0]), greedy_in_eval=False).eval()
    torch.manual_seed(0)
    act, _, _ = actor.step(*row(torch.zeros(1, 256, 4)), hx=(),
                           virtual=False)
    assert set(act.flatten().tolist()) == {0, 1, 2}


def test_policy_actor_with_logits_and_value():
    actor = PolicyActor(Fixed([1.0, 1.0], value=0.5))
    act, _, info = actor.step(*row(torch.zeros(1, 3, 4)), hx=(),
                              virtual=True)
    assert set(info) == {"logp", "value"}
    assert info["value"].shape == (1, 3) and info["value"].eq(0.5).all()
    assert torch.allclose(info["logp"], torch.full((1, 3), -0.6931),
                          atol=1e-4)


class Gaussian(nn.Module):
    def forward(self, obs):
        mean = obs[..., :2] + 1.0
        dist = torch.distributions.Independent(
            torch.distributions.Normal(mean, torch.ones_like(mean)), 1)
        return dist, obs.sum(-1, keepdim=True)


def test_policy_actor_with_a_distribution():
    actor = PolicyActor(Gaussian())
    obs = torch.zeros(1, 5, 3)
    act, _, info = actor.step(*row(obs), hx=(), virtual=False)
    assert act.shape == (1, 5, 2) and act.dtype == torch.float32
    assert info["logp"].shape == (1, 5) and info["value"].shape == (1, 5)
    actor.eval()
    act, _, _ = actor.step(*row(obs), hx=(), virtual=False)
    assert act.eq(1.0).all()  # the mode of the Normal


def test_policy_actor_reset_and_forward():
    actor = PolicyActor(nn.Linear(4, 2))
    assert actor.reset((), torch.ones(3, dtype=torch.bool)) == ()
    dist, value = actor(torch.zeros(2, 4))
    assert isinstance(dist, torch.distributions.Categorical) and value is None
    assert dict(actor.named_parameters()).keys() == {"policy.weight",
                                                     "policy.bias"}


def test_policy_actor_with_nan_logits_fails():
    actor = PolicyActor(Fixed([float("nan"), 0.0]))
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        actor.step(*row(torch.zeros(1, 2, 4)), hx=(), virtual=False)


def test_policy_actor_with_a_per_dimension_distribution():
    class Plain(nn.Module):
        def forward(self, obs):
            mean = obs[..., :2]
            return torch.distributions.Normal(mean, torch.ones_like(mean))

    _, _, info = PolicyActor(Plain()).step(*row(torch.zeros(1, 3, 4)),
                                           hx=(), virtual=False)
    assert info["logp"].shape == (1, 3, 2)


# check_actor: is it an actor at all?

NOT_AN_ACTOR = (r"^actor must be a torch.nn.Module with the actor API "
                r"step\(...\)/reset\(...\) \(see BaseActorModule\), got ")


@pytest.mark.parametrize("thing, name", [
    (None, "NoneType"), (object(), "object"), (nn.Linear(2, 2), "Linear"),
    (lambda *args: None, "function"), (PolicyActor, "type")])
def test_check_actor_rejects_non_actors(thing, name):
    # a plain module is told about the adapter
    hint = r": a plain policy .* PolicyActor\(Linear\(\.\.\.\)\)" \
        if name == "Linear" else ""
    with pytest.raises(TypeError, match=NOT_AN_ACTOR + name + hint + "$"):
        check_actor(thing)


def test_check_actor_accepts_actors_and_returns_them():
    actor = PolicyActor(nn.Linear(4, 2))
    assert check_actor(actor) is actor

    class Duck(nn.Module):  # the API without the base class
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            return act, hx, {}

        def reset(self, hx, at):
            return hx

    duck = Duck()
    assert check_actor(duck) is duck


def test_check_actor_rejects_a_bare_base_class():
    with pytest.raises(TypeError, match=r"actor BaseActorModule does not "
                                        r"implement step\(\)"):
        check_actor(BaseActorModule())


def test_check_actor_checks_a_duck_typed_modules_signatures():
    class Loose(nn.Module):
        def step(self, obs, hx=None):
            return obs, hx, {}

        def reset(self, hx, at):
            return hx

    with pytest.raises(TypeError, match=r"Loose.step has signature "
                                        r"step\(obs, hx=None\); the actor "
                                        r"API expects " + EXPECTED):
        check_actor(Loose())

    class BadReset(nn.Module):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            return act, hx, {}

        def reset(self, hx):
            return hx

    with pytest.raises(TypeError, match=r"BadReset.reset has signature "
                                        r"reset\(hx\); the actor API "
                                        r"expects reset\(self, hx, at\)"):
        check_actor(BadReset())


# PolicyActor samples logits as Categorical does, without building one

@pytest.mark.parametrize("shape, dtype", [
    ((1, 8, 2), torch.float32), ((1, 64, 5), torch.float32),
    ((6, 3, 7), torch.float64), ((1, 1, 3), torch.float32)])
def test_policy_actor_samples_exactly_as_categorical(shape, dtype):
    class Logits(nn.Module):
        def forward(self, obs):
            return obs * 3.0

    actor = PolicyActor(Logits())
    for seed in range(5):
        logits = torch.randn(*shape, dtype=dtype,
                             generator=torch.Generator().manual_seed(seed))
        torch.manual_seed(seed)
        act, hx, info = actor.step(*row(logits), hx=(), virtual=False)
        torch.manual_seed(seed)
        dist = torch.distributions.Categorical(logits=logits * 3.0)
        expected = dist.sample()
        assert act.dtype == expected.dtype and act.shape == expected.shape
        assert torch.equal(act, expected)
        assert torch.equal(info["logp"], dist.log_prob(act))
        # greedy in eval mode: the distribution's mode
        actor.eval()
        act, _, info = actor.step(*row(logits), hx=(), virtual=False)
        actor.train()
        assert torch.equal(act, dist.mode)
        assert torch.equal(info["logp"], dist.log_prob(dist.mode))


def test_policy_actor_leaves_the_generator_where_categorical_does():
    actor = PolicyActor(Fixed([0.1, 0.5, -0.2]))
    torch.manual_seed(3)
    actor.step(*row(torch.zeros(1, 16, 4)), hx=(), virtual=False)
    after_fast = torch.rand(8)
    torch.manual_seed(3)
    dist, _ = actor(torch.zeros(1, 16, 4))
    dist.sample()
    assert torch.equal(after_fast, torch.rand(8))


def test_policy_actor_log_prob_matches_log_softmax():
    actor = PolicyActor(Fixed([0.0, 1.0, 2.0, -30.0]))
    torch.manual_seed(1)
    act, _, info = actor.step(*row(torch.zeros(1, 256, 4)), hx=(),
                              virtual=False)
    expected = torch.log_softmax(torch.tensor([0.0, 1.0, 2.0, -30.0]),
                                 -1)[act]
    torch.testing.assert_close(info["logp"], expected)


def test_policy_actor_calls_a_subclass_forward_and_hooks():
    calls = []

    class Tempered(PolicyActor):
        def forward(self, obs):
            calls.append("forward")
            dist, value = super().forward(obs)
            return torch.distributions.Categorical(logits=dist.logits * 0), \
                value

    actor = Tempered(Fixed([0.0, 50.0]))
    torch.manual_seed(0)
    act, _, _ = actor.step(*row(torch.zeros(1, 256, 4)), hx=(),
                           virtual=False)
    assert calls == ["forward"] and set(act.flatten().tolist()) == {0, 1}
    # a forward hook on a plain PolicyActor is honoured too
    actor = PolicyActor(Fixed([0.0, 1.0]))
    actor.register_forward_hook(lambda module, args, out: calls.append(
        "hook"))
    actor.step(*row(torch.zeros(1, 2, 4)), hx=(), virtual=False)
    assert calls == ["forward", "hook"]


class Float64Env(gymnasium.Env):
    """A float64 Box env (MuJoCo's observations): obs = [t, -t, 1] (plus
    1e-12, which float32 does not hold), two actions, episodes of 5
    steps."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (3,),
                                             np.float64)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 0.0, 1.0]), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.t, -self.t, 1.0]) + 1e-12
        return obs, 1.0, self.t == 5, False, {}


@pytest.mark.parametrize("policy_dtype", [torch.float32, torch.float64])
def test_policy_actor_casts_floating_observations_to_its_policy(
        policy_dtype):
    """float64 observations reach a float32 policy as float32 (and a
    float64 policy as they are); the fragment keeps the env's float64."""
    seen = []

    class Recording(nn.Linear):
        def forward(self, x):
            seen.append(x.dtype)
            return super().forward(x)

    actor = PolicyActor(Recording(3, 2).to(policy_dtype))
    with same.rollout(Float64Env, actor, 6, 2, entropy=0) as feed:
        batch = next(feed)
    assert batch.state.obs.dtype == torch.float64
    assert batch.state.obs[1, 0, 0] == 1.0 + 1e-12  # recorded as given
    assert set(seen) == {policy_dtype}
    assert batch.actor["logp"].dtype == policy_dtype


def test_policy_actor_leaves_integer_observations_and_agreeing_dtypes():
    actor = PolicyActor(nn.Linear(3, 2))
    obs = torch.zeros(1, 2, 3)
    assert actor._cast(obs) is obs  # float32 for a float32 policy: no copy
    pixels = torch.zeros(1, 2, 3, dtype=torch.uint8)
    assert actor._cast(pixels) is pixels
    nested = actor._cast({"x": obs.double(), "k": pixels})
    assert nested["x"].dtype == torch.float32 and nested["k"] is pixels


# -- continuous actions: a squashed Gaussian ---------------------------------

class GaussianPolicy(nn.Module):
    """A linear Gaussian over a Box, squashed into it (or plain)."""

    def __init__(self, low, high, squashed=True, n_obs=3):
        super().__init__()
        self.low, self.high, self.squashed = low, high, squashed
        self.mean = nn.Linear(n_obs, len(low))
        self.log_std = nn.Parameter(torch.zeros(len(low)))

    def forward(self, obs):
        mean, std = self.mean(obs), self.log_std.exp().expand(
            *obs.shape[:-1], -1)
        if self.squashed:
            return squashed_normal(mean, std, self.low, self.high)
        return torch.distributions.Independent(
            torch.distributions.Normal(mean, std), 1)


def test_a_squashed_gaussian_executes_what_it_records():
    """Through same.rollout over a Box(low, high) env: every recorded action
    lies inside the box, the env executed exactly it (nothing clipped),
    and ``logp`` is that action's joint log-probability under the policy,
    recomputed from the recorded observations; greedy in eval mode takes
    the squashed mean."""
    low, high = [-1.0, 0.0], [1.0, 4.0]
    envs = []

    def factory():
        env = SpacesEnv(gymnasium.spaces.Box(-5, 5, (3,), np.float32),
                        gymnasium.spaces.Box(np.array(low, np.float32),
                                   np.array(high, np.float32)),
                        lambda ep, t: np.full(3, (t % 7) / 7 - 0.5,
                                              np.float32), term_every=5)
        envs.append(env)
        return env

    torch.manual_seed(0)
    policy = GaussianPolicy(low, high)
    with torch.no_grad():
        policy.log_std.fill_(0.5)  # wide: a plain Gaussian would leave the box
    with same.rollout(factory, PolicyActor(policy), 16, 3,
                      entropy=0) as feed:
        batch = next(feed)
    act, moved = batch.state.act, acted(batch)
    inside = (act > torch.tensor(low)) & (act < torch.tensor(high))
    assert bool(inside[1:].all())
    # each env executed its column's recorded actions of rows 1..T, unclipped
    for j, env in enumerate(envs[-3:]):
        executed = np.stack(env.actions[:16])
        np.testing.assert_array_equal(executed, act[1:, j].numpy())
    with torch.no_grad():
        dist = policy(batch.state.obs[:-1])
        logp = dist.log_prob(act[1:])
    assert bool(moved[1:].all())
    torch.testing.assert_close(batch.actor["logp"][:-1], logp, atol=1e-4,
                               rtol=1e-4)
    # eval mode: the squashed mean
    actor = PolicyActor(policy).eval()
    obs = batch.state.obs[:1]
    greedy, _, _ = actor.step(*row(obs), hx=(), virtual=False)
    with torch.no_grad():
        mean = policy.mean(obs)
    lo, hi = torch.tensor(low), torch.tensor(high)
    torch.testing.assert_close(greedy, lo + (hi - lo) * (mean.tanh() + 1) / 2)


def test_a_plain_gaussian_records_what_it_sampled():
    """The unsquashed Gaussian of the same policy leaves the box; its logp
    is that of the recorded (sampled) action."""
    low, high = [-1.0, 0.0], [1.0, 4.0]
    policy = GaussianPolicy(low, high, squashed=False)
    with torch.no_grad():
        policy.log_std.fill_(1.0)
    torch.manual_seed(0)
    obs = torch.zeros(1, 256, 3)
    act, _, info = PolicyActor(policy).step(*row(obs), hx=(), virtual=False)
    assert bool((act < torch.tensor(low)).any())
    with torch.no_grad():
        torch.testing.assert_close(info["logp"], policy(obs).log_prob(act))


@pytest.mark.parametrize("low, high", [([-1.0], [float("inf")]),
                                       ([1.0], [1.0])])
def test_squashed_normal_refuses_bad_bounds(low, high):
    with pytest.raises(ValueError, match="finite bounds with low < high"):
        squashed_normal(torch.zeros(1), torch.ones(1), low, high)


def _squash_reference(x, mean, std, low, high):
    """The joint log-density of ``low + (high - low) * (tanh(x) + 1) / 2``
    for a draw ``x`` of ``Normal(mean, std)``, in float64 from the draw."""
    x, mean, std = x.double(), mean.double(), std.double()
    scale = (torch.tensor(high, dtype=torch.float64)
             - torch.tensor(low, dtype=torch.float64)) / 2
    logn = torch.distributions.Normal(mean, std).log_prob(x)
    # log |d tanh / dx| = log(1 - tanh(x)^2), stably
    log_det = 2 * (np.log(2.0) - x - nn.functional.softplus(-2 * x))
    return (logn - log_det - scale.log()).sum(-1)


@pytest.mark.parametrize("mean", [0.0, 1.5, 3.0, -4.0, 12.0, -20.0, 20.0])
def test_squashed_normal_log_prob_of_its_sample_is_exact(mean):
    """``log_prob`` of the value just sampled is that of the Gaussian draw
    it came from (to float32 rounding), at moderate means and saturated
    ones alike: never a NaN, never the imprecise ``atanh`` of a value
    rounded near a bound."""
    low, high = [-1.0, 0.2617, -3.0], [1.0, 4.9378, 0.5]
    mean = torch.full((64, 3), mean)
    std = torch.full((64, 3), 0.7)
    dist = squashed_normal(mean, std, low, high)
    torch.manual_seed(3)
    draw = torch.distributions.Normal(mean, std).sample()
    torch.manual_seed(3)
    act = dist.sample()
    logp = dist.log_prob(act)
    assert bool(torch.isfinite(logp).all())
    expected = _squash_reference(draw, mean, std, low, high)
    torch.testing.assert_close(logp.double(), expected, rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("mean", [-20.0, -9.0, 9.0, 20.0, 100.0])
def test_squashed_normal_saturated_samples_stay_strictly_inside(mean):
    """A tanh rounded to +-1 (or the rounding of the shift and scale)
    would put a sample on a bound or past it; every sample stays strictly
    inside the box, over many boxes, and the greedy action too."""
    gen = np.random.default_rng(0)
    low = np.concatenate([[0.2617, -1.0, np.pi / 12, -0.4, 1e-3],
                          gen.uniform(-5, 5, 59)]).astype(np.float32)
    high = (low + np.concatenate([[4.9378 - 0.2617, 2.0, 3.1, 0.8, 7.0],
                                  gen.uniform(1e-3, 9, 59)])
            ).astype(np.float32)
    mean, std = torch.full((32, 64), mean), torch.full((32, 64), 0.1)
    dist = squashed_normal(mean, std, low, high)
    act = dist.sample()
    lo, hi = torch.from_numpy(low), torch.from_numpy(high)
    assert bool(((act > lo) & (act < hi)).all())
    assert bool(torch.isfinite(dist.log_prob(act)).all())
    actor = PolicyActor(SaturatedPolicy(low, high, mean=float(mean[0, 0])))
    for mode in (actor.train(), actor.eval()):
        act, _, info = mode.step(*row(torch.zeros(1, 32, 3)), hx=(),
                                 virtual=False)
        assert bool(((act > lo) & (act < hi)).all())
        assert bool(torch.isfinite(info["logp"]).all())


class SaturatedPolicy(nn.Module):
    """A Gaussian over a Box whose mean is far past the squash's range."""

    def __init__(self, low, high, mean):
        super().__init__()
        self.low, self.high, self.mean = low, high, mean
        self.log_std = nn.Parameter(torch.full((len(low),), -2.3))

    def forward(self, obs):
        mean = torch.full((*obs.shape[:-1], len(self.low)), self.mean)
        return squashed_normal(mean, self.log_std.exp(), self.low,
                               self.high)


def test_a_saturated_squashed_gaussian_collects():
    """A policy pinned at a bound collects: its actions lie inside the box
    and its recorded ``logp`` is finite."""
    low, high = [-1.0, 0.2617], [1.0, 4.9378]

    def factory():
        return SpacesEnv(gymnasium.spaces.Box(-5, 5, (3,), np.float32),
                         gymnasium.spaces.Box(np.array(low, np.float32),
                                              np.array(high, np.float32)),
                         lambda ep, t: np.zeros(3, np.float32),
                         term_every=5)

    actor = PolicyActor(SaturatedPolicy(low, high, mean=20.0))
    with same.rollout(factory, actor, 8, 2, entropy=0) as feed:
        batch = next(feed)
    act = batch.state.act[1:]
    assert bool(((act > torch.tensor(low)) & (act < torch.tensor(high))
                 ).all())
    assert bool(torch.isfinite(batch.actor["logp"]).all())


@pytest.mark.parametrize("mean, std, error, match", [
    (torch.zeros(3, 2), torch.zeros(3, 2), ValueError, r"std > 0.*std=\[0"),
    (torch.zeros(3, 2), -torch.ones(2), ValueError, r"std > 0.*std=\[-1"),
    (torch.tensor([[float("nan"), 0.0]]), torch.ones(1, 2), ValueError,
     r"finite mean.*mean=\[nan"),
    (torch.tensor([[float("inf"), 0.0]]), torch.ones(1, 2), ValueError,
     r"finite mean.*mean=\[inf"),
    (torch.zeros(1, 2), torch.tensor([[float("inf"), 1.0]]), ValueError,
     r"finite std.*std=\[inf"),
    (torch.zeros(3, 2), torch.ones(3, 3), ValueError,
     r"std of mean's shape \(3, 2\).*got std of shape \(3, 3\)"),
    (torch.zeros(3, 3), torch.ones(3, 3), ValueError,
     r"mean of shape \(\.\.\., 2\).*got mean of shape \(3, 3\)"),
    ([0.0, 0.0], [1.0, 1.0], TypeError, r"mean as a floating tensor.*\[0"),
    (torch.zeros(2), [1.0, 1.0], TypeError, r"std as a floating tensor"),
    (torch.zeros(2, dtype=torch.long), torch.ones(2), TypeError,
     r"mean as a floating tensor, got a torch.int64 tensor"),
])
def test_squashed_normal_refuses_bad_gaussians(mean, std, error, match):
    with pytest.raises(error, match=match):
        squashed_normal(mean, std, [-1.0, 0.0], [1.0, 4.0])


def test_squashed_normal_refuses_bounds_of_other_shapes():
    with pytest.raises(ValueError, match=r"one shape \(D,\).*\(2,\) and "
                                         r"\(3,\)"):
        squashed_normal(torch.zeros(2), torch.ones(2), [0.0, 0.0],
                        [1.0, 1.0, 1.0])


@pytest.mark.parametrize("args, match", [
    ((None,), r"policy must be a torch.nn.Module .*got NoneType None"),
    ((lambda obs: obs,), r"policy must be a torch.nn.Module .*got function"),
    ((nn.Linear(3, 2), "no"),
     r"greedy_in_eval must be True or False, got str 'no'"),
    ((nn.Linear(3, 2), None),
     r"greedy_in_eval must be True or False, got NoneType None"),
])
def test_policy_actor_refuses_bad_arguments(args, match):
    with pytest.raises(TypeError, match=match):
        PolicyActor(*args)
    assert PolicyActor(nn.Linear(3, 2), np.bool_(False)).greedy_in_eval \
        is False
