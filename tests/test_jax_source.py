"""JAX envs as torch-native sources (:mod:`rlplay.envs.jax_source`), on the
CPU; skipped where JAX or gymnax is absent.

- A gymnax CartPole behind :class:`~rlplay.envs.JaxSource` collected by
  ``same.rollout`` gives, field for field, what a plain Python loop over
  the gymnax env itself gives with the same keys and actions (gymnax's
  own auto-resetting ``step``, one env at a time): observations, the true
  last observations, rewards, ends, time limits as truncations, step
  counts and episode statistics; a masked reset resets those envs alone,
  with the documented keys.
- Its fragments equal those of Gymnasium's CartPole (a ``SyncVectorEnv``
  in same-step autoreset under ``TimeLimit``, driven with gymnax's reset
  states) where their equations agree: the same ends, truncations,
  rewards and actions, the observations within float32 rounding (gymnax
  steps in float32, Gymnasium in float64).
- The consumers (episodes, Replay, returns, V-trace, RunningNorm) and
  the ``Evaluator`` take it, and Brax's sources
  (:class:`~rlplay.envs.Brax`, tests/brax_envs.py) as well, against
  their own reference; ``single`` (a spawned worker) and ``call_envs``
  (gymnax's parameters; Brax's in test_brax_source.py) take it.
- No host transfer during collection (gymnax's and Brax's): JAX's
  transfer guard disallows every implicit one, and no tensor is
  converted to numpy; on CUDA (where present) under torch's sync debug
  mode.
"""
import functools
import itertools

import numpy as np
import pytest
import torch

gymnax = pytest.importorskip("gymnax")
jax = pytest.importorskip("jax")

from cartpoles import Balancer, OracleSync, counting  # noqa: E402
from generators import assert_fragments_equal, without_version  # noqa: E402
from rlplay.engine import Replay, RunningNorm, acted, episode_stats  # noqa
from rlplay.engine.core import episode_edges, evaluate  # noqa: E402
from rlplay.engine.envs import TorchSource, make_batch  # noqa: E402
from rlplay.engine.nested import suply  # noqa: E402
from rlplay.engine.returns import gae, vtrace  # noqa: E402
from rlplay.engine.rollout import (Evaluator, episodic, same,  # noqa: E402
                                   single)
from rlplay.engine.rollout.evaluate import EVAL_COLLECTOR  # noqa: E402
from rlplay.engine.seeds import (env_seed_sequences,  # noqa: E402
                                 next_reset_seeds, seed_sequence)
from rlplay.envs import Gymnax, JaxSource  # noqa: E402

from bounds import START, STEADY  # noqa: E402 - the reasons in bounds.py

T, B, LIMIT = 12, 5, 15


@functools.lru_cache(maxsize=None)
def gymnax_cartpole(limit=LIMIT):
    """gymnax's CartPole and its parameters cut at ``limit`` steps, one
    object per limit: the sources over it share their compilations."""
    env, params = gymnax.make("CartPole-v1")
    return env, params.replace(max_steps_in_episode=limit)


@functools.lru_cache(maxsize=None)
def protocol_env(n_envs=B, limit=LIMIT):
    return Gymnax(*gymnax_cartpole(limit), num_envs=n_envs)


class Seeded(JaxSource):
    """A source that records the seeds of its full resets."""

    seeds = []

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            Seeded.seeds.append(seed)
        return super().reset(seed=seed, options=options)


class Tipper(Balancer):
    """:class:`~cartpoles.Balancer` in the odd columns; the even ones
    always push right, and their poles fall before the time limit."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        act, hx, info = super().step(stepno, obs, act, rew, fin, hx=hx,
                                     virtual=virtual)
        act = act.clone()
        act[..., ::2] = 1
        return act, hx, info


def jax_cartpole(n_envs=B, limit=LIMIT):
    """The factory of the tests (module level: spawned workers import
    it)."""
    return JaxSource(protocol_env(n_envs, limit))


def fragments(factory, n=4, n_envs=B, actor=None, **kwargs):
    with same.rollout(factory, actor or Balancer(), T, n_envs, entropy=7,
                      **kwargs) as feed:
        return [suply(torch.clone, b) for b in itertools.islice(feed, n)]


# ------------------------------------------------- a plain gymnax loop --

def plain_loop(seed, actions, limit=LIMIT):
    """What a plain loop over one gymnax env at a time gives with the keys
    of :class:`JaxSource` and :class:`Gymnax` (their docstrings) and the
    actions ``(T, B)``: per step, the observations gymnax's ``step`` gives
    (reset ones after an end), the true last ones (its ``step_env`` with
    the same key, compiled as ``step`` is: eager operations may round
    differently), rewards, ``done``, and whether the end was the time
    limit without the pole falling or the cart leaving."""
    env, params = gymnax_cartpole(limit)
    n = actions.shape[1]
    step_env = jax.jit(env.step_env)
    key = jax.random.key(seed)
    key, sub = jax.random.split(key)
    states, obs0 = [], []
    for k in jax.random.split(sub, n):
        obs, state = env.reset(k, params)
        states.append(state)
        obs0.append(np.asarray(obs))
    rows = []
    for a in actions:
        key, sub = jax.random.split(key)
        row = {name: [] for name in ("obs", "final", "rew", "done", "limit")}
        for j, k in enumerate(jax.random.split(sub, n)):
            action = int(a[j])
            obs, state, rew, done, _ = env.step(k, states[j], action, params)
            key_step, _ = jax.random.split(k)
            last, state_st, *_ = step_env(key_step, states[j], action,
                                              params)
            x, theta = float(last[0]), float(last[2])
            fell = abs(x) > params.x_threshold or \
                abs(theta) > params.theta_threshold_radians
            states[j] = state
            row["obs"].append(np.asarray(obs))
            row["final"].append(np.asarray(last))
            row["rew"].append(float(rew))
            row["done"].append(bool(done))
            row["limit"].append(bool(done) and not fell
                                and int(state_st.time) >= limit)
        rows.append({name: np.array(value) for name, value in row.items()})
    return np.stack(obs0), rows


def test_fragments_equal_a_plain_gymnax_loop():
    Seeded.seeds.clear()
    frags = fragments(lambda: Seeded(protocol_env()), n=3, actor=Tipper())
    assert len(Seeded.seeds) == 1
    actions = torch.cat([f.state.act[1:] for f in frags]).numpy()
    obs0, rows = plain_loop(Seeded.seeds[0], actions)
    state = torch.cat([frags[0].state.obs[:1]] + [f.state.obs[1:]
                                                  for f in frags]).numpy()
    final = torch.cat([f.final[1:] for f in frags]).numpy()
    rew = torch.cat([f.state.rew[1:] for f in frags]).numpy()
    fin = torch.cat([f.state.fin[1:] for f in frags]).numpy()
    truncated = torch.cat([f.truncated[1:] for f in frags]).numpy()
    stepno = torch.cat([f.state.stepno[1:] for f in frags]).numpy()
    length = torch.cat([f.stats.length[1:] for f in frags]).numpy()
    ret = torch.cat([f.stats.ret[1:] for f in frags]).numpy()
    np.testing.assert_array_equal(state[0], obs0)
    steps = np.zeros(B, np.int64)
    for t, row in enumerate(rows):
        np.testing.assert_array_equal(state[t + 1], row["obs"])
        np.testing.assert_array_equal(final[t], row["final"])
        np.testing.assert_array_equal(rew[t], row["rew"])
        np.testing.assert_array_equal(fin[t], row["done"])
        np.testing.assert_array_equal(truncated[t], row["limit"])
        steps = np.where(row["done"], 0, steps + 1)
        np.testing.assert_array_equal(stepno[t], steps)
        ended = np.asarray(row["done"])
        np.testing.assert_array_equal(length[t] > 0, ended)
        # a reward of 1 a step: the return is the length
        np.testing.assert_array_equal(ret[t], length[t])
        assert not (final[t][~ended] != state[t + 1][~ended]).any()
    assert 0 < truncated.sum() < fin.sum()  # both kinds of ends
    assert (length[truncated] == LIMIT).all()


def test_a_factory_gives_a_torch_source_of_every_column():
    with same.rollout(jax_cartpole, Balancer(), T, B) as feed:
        assert isinstance(feed.envs, TorchSource)
        assert feed.envs.mode.name == "SAME_STEP"
    with pytest.raises(ValueError, match="n_envs=8 columns from a torch"):
        same.rollout(jax_cartpole, Balancer(), T, 8)
    with pytest.raises(TypeError, match="JaxEnv protocol"):
        JaxSource(object())
    with pytest.raises(TypeError, match="num_envs must be an int"):
        Gymnax(*gymnax_cartpole(), num_envs=2.0)
    with pytest.raises(ValueError, match="num_envs must be at least 1"):
        Gymnax(*gymnax_cartpole(), num_envs=0)


def test_a_masked_reset_resets_those_envs_alone():
    """``reset(options={"reset_mask": mask})``: the envs of the mask get
    the reset observations of the next key (the documented schedule), the
    others keep theirs and step on from their own state."""
    env, params = gymnax_cartpole()
    source = jax_cartpole()
    source.reset(seed=5)
    push = torch.ones(B, dtype=torch.int64)
    before, *_ = source.step(push)
    before = before.clone()
    key = jax.random.split(jax.random.split(jax.random.key(5))[0])[0]
    mask = torch.tensor([True, False, True, False, False])
    obs, info = source.reset(options={"reset_mask": mask})
    key, sub = jax.random.split(key)
    fresh = [env.reset(k, params) for k in jax.random.split(sub, B)]
    for j in np.flatnonzero(mask.numpy()):
        np.testing.assert_array_equal(obs[j].numpy(), fresh[j][0])
    assert torch.equal(obs[~mask], before[~mask]) and info == {}
    # the next step starts the reset envs from their reset states
    after, *_ = source.step(push)
    _, sub = jax.random.split(key)
    keys = jax.random.split(sub, B)
    for j in np.flatnonzero(mask.numpy()):
        want, *_ = env.step(keys[j], fresh[j][1], 1, params)
        np.testing.assert_array_equal(after[j].numpy(), want)
    with pytest.raises(ValueError, match="reset_mask must have shape"):
        source.reset(options={"reset_mask": torch.ones(3, dtype=bool)})


# ------------------------------------------------ Gymnasium's CartPole --

class GymnaxOracle:
    """The reset states a :class:`JaxSource` over :class:`Gymnax`'s
    CartPole of ``n`` envs draws (the keys of their docstrings), as numpy
    float64 ``(4, n)`` blocks: at a full reset, and at every step (each
    env's reset key of the step)."""

    def __init__(self, n):
        env, params = gymnax_cartpole()
        self.n, self.key, self.block = n, None, None

        def draw(key, fresh):
            key, sub = jax.random.split(key)
            keys = jax.random.split(sub, n)
            if not fresh:  # each env's reset key of the step
                keys = jax.vmap(lambda k: jax.random.split(k)[1])(keys)
            return key, jax.vmap(lambda k: env.reset_env(k, params)[0])(keys)

        self._draw = jax.jit(draw, static_argnums=1)

    def start(self, seed):
        return self._block(jax.random.key(int(seed)), True)

    def advance(self):
        return self._block(self.key, False)

    def _block(self, key, fresh):
        self.key, obs = self._draw(key, fresh)
        self.block = np.asarray(obs, np.float64).T
        return self.block


def gymnasium_reference(n_envs=B):
    return OracleSync(n_envs, LIMIT, "SameStep", oracle=GymnaxOracle(n_envs))


def test_gymnax_cartpole_equals_gymnasiums():
    """The same ends, truncations, rewards, actions, step counts and
    statistics; observations within float32 rounding of float64."""
    got = fragments(jax_cartpole, n=4, actor=Tipper())
    want = fragments(gymnasium_reference, n=4, actor=Tipper())
    for g, w in zip(got, want):
        for field in ("stepno", "act", "rew", "fin"):
            assert torch.equal(getattr(g.state, field),
                               getattr(w.state, field)), field
        assert torch.equal(g.truncated, w.truncated)
        assert torch.equal(g.stats.ret, w.stats.ret)
        assert torch.equal(g.stats.length, w.stats.length)
        torch.testing.assert_close(g.state.obs, w.state.obs, rtol=1e-4,
                                   atol=1e-5)
        torch.testing.assert_close(g.final, w.final, rtol=1e-4, atol=1e-5)
    ends = sum(int(episode_edges(f).ends[1:].sum()) for f in got)
    truncations = sum(int(f.truncated[1:].sum()) for f in got)
    assert 0 < truncations < ends


# ------------------------------------------------------------ consumers --

FAMILIES = ["gymnax", "brax"]


def family(name):
    """``(factory, reference, actor)`` of a family of JAX sources:
    gymnax's CartPole against Gymnasium's, Brax's inverted pendulum
    against a plain loop over Brax (tests/brax_envs.py; skipped where
    Brax is absent). Both observe 4 numbers."""
    if name == "gymnax":
        return jax_cartpole, gymnasium_reference, Tipper
    pytest.importorskip("brax")
    import brax_envs
    return brax_envs.brax_pendulum, brax_envs.brax_reference, \
        brax_envs.Nudger


@pytest.fixture(scope="module", params=FAMILIES)
def collected(request):
    """Fragments of a JAX source and of its reference (gymnax's next
    observations within float32 rounding of Gymnasium's, Brax's equal to
    its loop's: the consumers are compared on what is exact, and on
    values within tolerance)."""
    factory, reference, actor = family(request.param)
    return (fragments(factory, n=6, actor=actor()),
            fragments(reference, n=6, actor=actor()))


def test_episodes_over_it_equal_gymnasiums(collected):
    got, want = collected
    got_eps = list(episodic.episodes(iter(got), 6, max_length=64))
    want_eps = list(episodic.episodes(iter(want), 6, max_length=64))
    assert len(got_eps) == len(want_eps) >= 3
    for g, w in zip(got_eps, want_eps):
        assert torch.equal(g.ret, w.ret) and torch.equal(g.act, w.act)
        assert g.obs.shape == w.obs.shape
        torch.testing.assert_close(g.obs, w.obs, rtol=1e-4, atol=1e-5)


def test_replay_samples_what_the_fragments_say(collected):
    got, _ = collected
    replay = Replay(1000, seed=0)
    for f in got:
        replay.extend(f)
    sample = replay.sample(64, n_step=3, gamma=0.9)
    assert sample.obs.shape == (64, 4)
    # every sampled observation is one the source gave
    seen = torch.cat([f.state.obs.reshape(-1, 4) for f in got])
    assert all((seen == row).all(-1).any() for row in sample.obs)


def test_returns_and_vtrace_over_it(collected):
    got, want = collected
    for g, w in zip(got, want):
        value = torch.zeros(T + 1, B)  # the same values on both sides
        args = (g.state.rew, g.state.fin, g.truncated, value,
                torch.ones(T + 1, B))
        adv = gae(*args, gamma=0.99, lam=0.95, mask=~acted(g))
        ref = gae(w.state.rew, w.state.fin, w.truncated, value,
                  torch.ones(T + 1, B), gamma=0.99, lam=0.95,
                  mask=~acted(w))
        assert torch.equal(adv, ref) and adv.shape == (T, B)
        logp = torch.full((T + 1, B), -0.5)
        v_got = vtrace(*args, target_logp=logp, behaviour_logp=logp,
                       gamma=0.99)
        v_want = vtrace(w.state.rew, w.state.fin, w.truncated, value,
                        torch.ones(T + 1, B), target_logp=logp,
                        behaviour_logp=logp, gamma=0.99)
        suply(lambda x, y: torch.testing.assert_close(x, y, rtol=0, atol=0),
              tuple(v_got), tuple(v_want))


def test_running_norm_over_it(collected):
    got, want = collected
    norms = [RunningNorm((4,)), RunningNorm((4,))]
    for g, w in zip(got, want):
        norms[0].update_from(g)
        norms[1].update_from(w)
    assert int(norms[0].count) == int(norms[1].count) == sum(
        int(acted(f)[1:].sum()) for f in got)
    torch.testing.assert_close(norms[0].mean, norms[1].mean, rtol=1e-4,
                               atol=1e-5)


def test_call_envs_sets_gymnax_params_between_fragments():
    """``call_envs("set_params", ...)`` changes the time limit of every env
    from the next fragment on, stamped as ``meta.control``."""
    with same.rollout(jax_cartpole, Balancer(), T, B, entropy=3) as feed:
        first = suply(torch.clone, next(feed))
        assert feed.call_envs("set_params", max_steps_in_episode=4) == 1
        second = suply(torch.clone, next(feed))
        third = suply(torch.clone, next(feed))
    assert not first.truncated.any()
    assert torch.all(first.meta.control == 0)
    assert torch.all(second.meta.control == 1)
    # the envs past 4 steps truncate at their first step, then every 4
    ends = second.truncated[1:]
    assert ends[0].all() and (second.stats.length[1][ends[0]] > 4).all()
    assert (second.stats.length[2:][ends[1:]] == 4).all()
    assert (third.stats.length[1:][third.truncated[1:]] == 4).all()
    assert third.truncated.sum() >= 2 * B


@pytest.mark.parametrize("name", FAMILIES)
def test_evaluate_and_the_evaluator(name):
    """The Evaluator's worker (spawned) plays what core.evaluate plays
    over the same source seeded from collector EVAL_COLLECTOR; episodes
    cut at max_steps reset their envs alone (a masked reset)."""
    entropy, n_episodes = 11, 12
    factory, _, actor = family(name)
    factory = functools.partial(factory, B, 30)
    sequences = env_seed_sequences(seed_sequence(entropy), B,
                                   EVAL_COLLECTOR)
    envs = make_batch(factory, sequences)
    want = evaluate(envs, actor(), n_episodes, max_steps=20,
                    seed_sequences=next_reset_seeds(sequences))
    envs.close()
    returns, lengths = want
    assert len(lengths) == n_episodes and max(lengths) <= 20
    with Evaluator(factory, actor(), n_envs=B, n_episodes=n_episodes,
                   max_steps=20, entropy=entropy, start_method="spawn",
                   timeout=STEADY, start_timeout=START) as evaluator:
        evaluator.submit(actor())
        got = evaluator.result()
    np.testing.assert_array_equal(got.returns, returns)
    np.testing.assert_array_equal(got.lengths, lengths)


def test_single_equals_same():
    """A spawned worker (JAX does not survive a fork of a process that
    runs it) collects what ``same`` collects (``multi``'s workers run the
    same session: test_torch_source.py checks it over a torch source)."""
    want = fragments(jax_cartpole, n=2)
    with single.rollout(jax_cartpole, Balancer(), T, B, entropy=7,
                        start_method="spawn", timeout=STEADY,
                        start_timeout=START) as feed:
        got = [suply(torch.clone, b) for b in itertools.islice(feed, 2)]
    for g, w in zip(got, want):
        assert_fragments_equal(without_version(g), without_version(w))


# ---------------------------------------------------- no host transfer --

@pytest.mark.parametrize("name", FAMILIES)
def test_no_host_transfer_during_collection(monkeypatch, name):
    """After the first fragment (its space checks read one host copy),
    JAX's transfer guard refuses every implicit transfer between host and
    device, and no tensor is converted to numpy or read as a number."""
    factory, _, actor = family(name)
    with same.rollout(factory, actor(), T, B, entropy=1,
                      check_spaces="first") as feed:
        next(feed)
        calls = counting(monkeypatch)
        for name in ("item", "tolist"):
            method = getattr(torch.Tensor, name)

            def counted(self, *args, method=method, name=name, **kwargs):
                calls.append(name)
                return method(self, *args, **kwargs)
            monkeypatch.setattr(torch.Tensor, name, counted)
        with jax.transfer_guard("disallow"):
            for batch in itertools.islice(feed, 3):
                pass
        assert calls == []
        assert batch.state.fin[1:].any()  # episodes ended meanwhile


def test_the_transfer_guard_would_see_a_transfer():
    """The guard above is not blind: a Python number handed to a compiled
    step is a host-to-device transfer, refused."""
    step = jax.jit(lambda x, y: x * y)
    x = jax.numpy.ones(3)
    with jax.transfer_guard("disallow"):
        with pytest.raises(Exception, match="Disallowed host-to-device"):
            step(x, 2.0)


def _jax_gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", FAMILIES)
def test_no_sync_per_step_on_cuda(name):
    """On a GPU (JAX's and torch's), a fragment collected under torch's
    sync debug mode "error": no step waits for the device."""
    device = _jax_gpu()
    if device is None:
        pytest.skip("JAX has no GPU here")
    _, _, actor = family(name)
    if name == "gymnax":
        env = protocol_env()
    else:
        import brax_envs
        env = brax_envs.brax_pendulum_env()

    def factory():
        return JaxSource(env, device=device)

    actor = actor().to("cuda")
    with same.rollout(factory, actor, T, B, entropy=1,
                      check_spaces="never", copy=False) as feed:
        next(feed)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for batch in itertools.islice(feed, 3):
                pass
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert batch.state.obs.device.type == "cuda"
