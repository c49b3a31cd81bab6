"""The subprocess evaluator: results, versions, eval mode, seeds, a
non-blocking protocol, arguments and resource hygiene (its faults are in
test_faults.py's matrix, its restarts in test_restarts.py)."""
import functools
import gc
import os

import numpy as np
import pytest
import torch
from torch import nn

from envs import CountingEnv

from rlplay.engine import BaseActorModule, evaluate
from rlplay.engine.envs import make_envs
from rlplay.engine.seeds import env_seed_sequences, seed_sequence
from rlplay.engine.rollout import Evaluation, Evaluator
from rlplay.engine.rollout.evaluate import EVAL_COLLECTOR
from rlplay.engine import RolloutTimeout, WorkerError

from bounds import FAULT as BOUND, START  # the reasons in bounds.py


class ShiftActor(BaseActorModule):
    """In eval mode ``act = (obs // 1000 + shift) % 5`` (the part over
    1000 comes from the env's seed); in train mode ``act = 0``."""

    def __init__(self, seeded=False):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(()), requires_grad=False)
        self.seeded = seeded

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        base = (obs[..., 0] // 1000).long() if self.seeded else \
            torch.zeros(obs.shape[:2], dtype=torch.long)
        action = (base + self.shift.long()) % 5
        if self.training:
            action = torch.zeros_like(action)
        return action, (), {}

    def reset(self, hx, at):
        return ()


class GatedEnv(CountingEnv):
    """A CountingEnv whose first step waits for a byte on a pipe: the test
    opens the gate (a handshake, not a sleep)."""

    def __init__(self, gate_fd, term_every=2):
        super().__init__(term_every=term_every)
        self.gate_fd, self.opened = gate_fd, False

    def step(self, action):
        if not self.opened:
            os.read(self.gate_fd, 1)
            self.opened = True
        return super().step(action)


def term4():
    return CountingEnv(term_every=4)


def test_results_versions_and_eval_mode():
    actor = ShiftActor().train()  # trains; evaluated in eval mode anyway
    with Evaluator(term4, actor, n_envs=2, n_episodes=5, entropy=0,
                   start_method="fork") as evaluator:
        assert evaluator.poll() is None
        results = []
        for shift in (1, 3):
            with torch.no_grad():
                actor.shift.fill_(shift)
            version = evaluator.submit(actor)
            results.append((version, evaluator.result()))
        assert evaluator.stats["evaluations"] == 2
    (v1, first), (v2, second) = results
    assert isinstance(first, Evaluation)
    assert (v1, first.version, v2, second.version) == (1, 1, 2, 2)
    assert np.array_equal(first.lengths, [4] * 5)
    assert np.array_equal(first.returns, [4.0 * 1] * 5)
    assert np.array_equal(second.returns, [4.0 * 3] * 5)
    assert first.returns.dtype == np.float64
    assert first.lengths.dtype == np.int64
    assert actor.training  # the learner's actor is left alone


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_seeds_are_the_runs(start_method):
    """The evaluator's episodes are those of core.evaluate on envs seeded
    from collector EVAL_COLLECTOR, fresh seeds for each evaluation."""
    entropy, n_envs, n_episodes = 11, 2, 4
    actor = ShiftActor(seeded=True).eval()
    with Evaluator(term4, actor, n_envs=n_envs, n_episodes=n_episodes,
                   entropy=entropy, start_method=start_method) as evaluator:
        got = []
        for _ in range(2):
            evaluator.submit(actor)
            got.append(evaluator.result())
    seeds = env_seed_sequences(seed_sequence(entropy), n_envs,
                               EVAL_COLLECTOR)
    envs = make_envs(term4, seeds)
    for result in got:
        returns, lengths = evaluate(envs, actor, n_episodes,
                                    seed_sequences=[ss.spawn(1)[0]
                                                    for ss in seeds])
        assert np.array_equal(result.returns, returns)
        assert np.array_equal(result.lengths, lengths)
    # the actions depend on the seeds, and these changed
    assert not np.array_equal(got[0].returns, got[1].returns)


def test_submit_does_not_wait():
    read_fd, write_fd = os.pipe()
    try:
        actor = ShiftActor()
        factory = functools.partial(GatedEnv, read_fd)
        with Evaluator(factory, actor, n_episodes=2, start_method="fork",
                       timeout=BOUND) as evaluator:
            version = evaluator.submit(actor)  # the gate is shut
            assert evaluator.pending
            assert evaluator.poll() is None
            with pytest.raises(RuntimeError, match="outstanding"):
                evaluator.submit(actor)
            with pytest.raises(RolloutTimeout):
                evaluator.result(timeout=0.2)
            assert evaluator.pending  # a timeout leaves the request there
            os.write(write_fd, b"x")
            result = evaluator.result()
            assert result.version == version and not evaluator.pending
            assert np.array_equal(result.lengths, [2, 2])
            with pytest.raises(RuntimeError, match="no evaluation"):
                evaluator.result()
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_bad_arguments():
    actor = ShiftActor()
    with pytest.raises(ValueError, match="n_episodes"):
        Evaluator(term4, actor, n_episodes=0)
    with pytest.raises(ValueError, match="n_envs"):
        Evaluator(term4, actor, n_envs=0)
    with pytest.raises(ValueError, match="start_method"):
        Evaluator(term4, actor, start_method="telepathy")
    evaluator = Evaluator(term4, actor, start_method="fork")
    evaluator.close()
    with pytest.raises(RuntimeError, match="closed"):
        evaluator.submit(actor)


def test_a_reward_that_is_not_a_number_is_a_clear_worker_error():
    """The evaluator's worker refuses a string reward as collection does,
    naming the reward and the env column, and the learner gets it."""
    from envs import BadRewardEnv
    actor = ShiftActor()
    factory = functools.partial(BadRewardEnv, "1.0", at=2, term_every=4)
    with Evaluator(factory, actor, n_envs=2, start_method="fork") as \
            evaluator:
        evaluator.submit(actor)
        with pytest.raises(WorkerError, match=r"env 0 step 1: the reward "
                                              r"must be a real number, got "
                                              r"str '1.0'") as info:
            evaluator.result(timeout=BOUND)
    assert info.value.exc_type is TypeError


def test_numpy_counts_are_accepted():
    # as by core.evaluate and the rollouts
    actor = ShiftActor()
    with Evaluator(term4, actor, n_envs=np.int64(2),
                   n_episodes=np.int64(3), start_method="fork") as evaluator:
        evaluator.submit(actor)
        assert evaluator.result(timeout=START).returns.shape == (3,)
    with pytest.raises(TypeError, match="n_episodes must be an int"):
        Evaluator(term4, actor, n_episodes=2.0)


def test_no_leaks():
    actor = ShiftActor()

    def cycle(i):
        evaluator = Evaluator(term4, actor, n_episodes=2,
                              start_method="fork")
        evaluator.submit(actor)
        if i % 2:
            evaluator.result()
            evaluator.close()
        del evaluator  # dropped, possibly in the middle of an evaluation

    cycle(0)
    gc.collect()
    fds = len(os.listdir("/proc/self/fd"))
    for i in range(20):
        cycle(i)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds + 2
