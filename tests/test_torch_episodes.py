"""The episode loop over torch-native sources (``core.evaluate``, the
``Evaluator``), on the CPU (and, skipped without CUDA, on a GPU).

- ``evaluate`` over :class:`rlplay.envs.TorchCartPole` gives the returns
  and lengths that it gives over Gymnasium's own CartPole driven with the
  same reset states and the same actor (see ``cartpoles.py``), exactly,
  in each autoreset mode, with and without ``max_steps``: next-step
  columns cut at ``max_steps`` drain (lost calls, no partial reset),
  same-step and disabled ones are reset alone (``reset_mask``).
- Reading whether a column plays on only every few steps (as on a GPU),
  and the actor behind a :class:`~rlplay.engine.core.DevicePolicy`,
  give the same; no row is converted to numpy while it plays (unchecked).
- Space checks raise the numpy loop's messages; recording, and a partial
  reset of a next-step source, are refused.
- The ``Evaluator`` over a ``TorchCartPole`` factory, with
  ``actor_device``, gives what ``evaluate`` gives in this process.
"""
import functools

import numpy as np
import pytest
import torch

from cartpoles import Balancer, counting, sync_reference, torch_cartpole, \
    vector_reference
from rlplay.engine.core import DevicePolicy, evaluate, torch_episodes
from rlplay.engine.envs import make_batch
from rlplay.engine.rollout import Evaluator
from rlplay.engine.rollout.evaluate import EVAL_COLLECTOR
from rlplay.engine.seeds import (env_seed_sequences, next_reset_seeds,
                                 reset_seed, seed_sequence)

from bounds import START, STEADY  # the reasons in bounds.py

B, LIMIT, N_EPISODES = 5, 20, 23
REFERENCES = {
    "NextStep": vector_reference,
    "SameStep": functools.partial(sync_reference, mode="SameStep"),
    "Disabled": functools.partial(sync_reference, mode="Disabled")}

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA")


class Wobbler(Balancer):
    """A deterministic recurrent actor that lets CartPole's pole fall now
    and then: episodes that end on their own (terminated, below the time
    limit of 20) and at the time limit; its actions depend on ``hx`` (the
    steps since its last reset), so a reset out of place changes them."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if hx is None:
            hx = torch.zeros(obs.shape[1], device=obs.device)
        hx = hx + 1
        push = (obs[..., 2] + 0.5 * obs[..., 3]) * self.w > 0
        act = (push ^ (obs[..., 1] > 0.1) ^ (hx % 9 == 0)).long()
        return act, hx, {}


def seeds(entropy=7):
    sequences = env_seed_sequences(seed_sequence(entropy), B, 0)
    # a numpy source that takes one seed for all its envs (the native
    # CartPoleVectorEnv) gets it modulo 2**31 - num_envs (vector.py), a
    # torch source as it is: the same below that bound
    assert reset_seed(sequences[0]) < 2**31 - B
    return sequences


def played(factory, actor=None, **kwargs):
    envs = make_batch(factory, seeds())
    try:
        return evaluate(envs, Wobbler() if actor is None else actor,
                        N_EPISODES, seed_sequences=seeds(), **kwargs)
    finally:
        envs.close()


def assert_same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape == (N_EPISODES,)
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("max_steps", [None, 12, 1])
@pytest.mark.parametrize("mode", REFERENCES)
def test_evaluate_equals_gymnasium(mode, max_steps):
    check = "always" if max_steps == 12 else "first"
    want = played(functools.partial(REFERENCES[mode], B, LIMIT),
                  max_steps=max_steps, check_spaces=check)
    got = played(functools.partial(torch_cartpole, B, LIMIT, mode=mode),
                 max_steps=max_steps, check_spaces=check)
    assert_same(got, want)
    lengths = got[1]
    bound = LIMIT if max_steps is None else max_steps
    assert (lengths == bound).any()  # time limits, or cuts
    if max_steps != 1:  # and episodes that ended on their own before
        assert (lengths < bound).sum() >= 5


def test_reading_every_few_steps_gives_the_same(monkeypatch):
    """As on a GPU, where the loop reads whether a column plays on only
    every POLL_STEPS steps: the steps after the last episode count for
    nothing."""
    factory = functools.partial(torch_cartpole, B, LIMIT, mode="NextStep")
    want = played(factory, max_steps=12)
    monkeypatch.setattr(torch_episodes, "_poll", lambda device: 7)
    assert_same(played(factory, max_steps=12), want)


def test_the_actor_behind_a_device_policy_gives_the_same():
    factory = functools.partial(torch_cartpole, B, LIMIT, mode="Disabled")
    want = played(factory, max_steps=12)
    assert_same(played(factory, DevicePolicy(Wobbler(), "cpu"),
                       max_steps=12), want)


def test_no_row_is_converted_while_it_plays(monkeypatch):
    calls, steps = counting(monkeypatch), []
    step = torch_episodes._Play.step

    def counted_step(self):
        before = len(calls)
        step(self)
        steps.append(len(calls) - before)
    monkeypatch.setattr(torch_episodes._Play, "step", counted_step)
    for mode in REFERENCES:
        calls.clear()
        played(functools.partial(torch_cartpole, B, LIMIT, mode=mode),
               max_steps=12, check_spaces="never")
        assert calls[-2:] == ["numpy", "numpy"]  # the results, at the end
    assert len(steps) > 3 * 50 and not any(steps)


class Stray(Wobbler):
    """Wobbler, whose action in env 3 at step count 4 is out of its
    space."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        act, hx, info = super().step(stepno, obs, act, rew, fin, hx=hx,
                                     virtual=virtual)
        act[0, 3] = torch.where(stepno[0, 3] == 4, 2, act[0, 3])
        return act, hx, info


@pytest.mark.parametrize("mode", REFERENCES)
def test_space_checks_raise_what_the_numpy_loop_raises(mode):
    messages = []
    for factory in (functools.partial(REFERENCES[mode], B, LIMIT),
                    functools.partial(torch_cartpole, B, LIMIT, mode=mode)):
        with pytest.raises(ValueError, match="env 3 step 4: ") as info:
            played(factory, Stray())
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_recording_and_a_partial_next_step_reset_are_refused():
    factory = functools.partial(torch_cartpole, B, LIMIT, mode="NextStep")
    with pytest.raises(TypeError, match="cannot render one env column"):
        played(factory, on_frame=print)
    envs = make_batch(factory, seeds())
    envs.start(torch.zeros(B, 4))
    with pytest.raises(ValueError, match="cannot reset some of its envs"):
        envs.restart(torch.zeros(B, 4), torch.ones(B, dtype=torch.bool))
    envs.close()


@pytest.mark.parametrize("actor_device", [None, "cpu"])
def test_the_evaluator_over_a_torch_source(actor_device):
    """Its worker's evaluations are those of core.evaluate over the same
    torch source seeded from collector EVAL_COLLECTOR."""
    entropy = 11
    factory = functools.partial(torch_cartpole, B, LIMIT, mode="NextStep")
    with Evaluator(factory, Wobbler(), n_envs=B, n_episodes=N_EPISODES,
                   max_steps=12, entropy=entropy, start_method="fork",
                   timeout=STEADY, start_timeout=START,
                   actor_device=actor_device) as evaluator:
        evaluator.submit(Wobbler())
        got = evaluator.result()
    sequences = env_seed_sequences(seed_sequence(entropy), B,
                                   EVAL_COLLECTOR)
    envs = make_batch(factory, sequences)
    want = evaluate(envs, Wobbler(), N_EPISODES, max_steps=12,
                    seed_sequences=next_reset_seeds(sequences))
    assert_same((got.returns, got.lengths), want)


def test_the_evaluators_actor_device_is_checked_up_front():
    factory = functools.partial(torch_cartpole, B, LIMIT)
    with pytest.raises(TypeError, match="actor_device must be a device"):
        Evaluator(factory, Wobbler(), n_envs=B, actor_device=3)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs CUDA"):
            Evaluator(factory, Wobbler(), n_envs=B, actor_device="cuda")


@needs_cuda
def test_on_a_gpu_the_actor_anywhere_gives_the_same():
    """A torch source on the GPU (its own random stream: no Gymnasium
    reference), read every POLL_STEPS steps: the actor there, and on the
    CPU behind a DevicePolicy, play the same episodes."""
    factory = functools.partial(torch_cartpole, B, LIMIT, mode="Disabled",
                                device="cuda")
    want = played(factory, Wobbler().cuda(), max_steps=12)
    assert_same(played(factory, DevicePolicy(Wobbler(), "cpu"),
                       max_steps=12), want)
