"""Real envs under every generator: Atari's Pong in ALE's C++ vector env
(``rlplay[atari]``) and MuJoCo's HalfCheetah-v5 (``rlplay[mujoco]``), with
episodes cut short so that they end within a few fragments; each test is
skipped where its extra is not installed.

- ``same.rollout``, checked row by row against what the source itself
  returned (a wrapper records every step): row ``T`` is the next row 0,
  ``final`` is the observation each step produced (the true last frame
  where an episode ended), ``fin``/``truncated``/``rew``/``stepno`` and
  the episode statistics follow the source's flags, and, for ALE's
  next-step autoreset (no reset of one env alone), each end is followed
  by a lost call: a row no executed action led to (``acted`` false), the
  reset frame, no reward.
- ``single`` and ``multi`` (one worker) give the same fragments as
  ``same`` from the same entropy; ``multi`` with two workers keeps row
  ``T`` = next row 0 worker by worker, and its lost calls follow ends.
- ALE's worker threads are no child processes (what conftest's check of
  leaked children sees).
"""
import itertools
import os

import gymnasium
import numpy as np
import pytest
import torch

from generators import assert_fragments_equal, make, without_version
from procs import children
from rlplay.engine import BaseActorModule, acted
from rlplay.engine.nested import suply

from bounds import STEADY as BOUND, START  # the reasons in bounds.py

T = 8               # steps per fragment
N_FRAGMENTS = 6
N_ALE = 2           # envs of a Pong source (each takes a good part of a
#                     second to make and reset on a busy machine)
ALE_FRAMES = 60     # an Atari episode: 60 frames (about 15 steps of 4)
CHEETAH_STEPS = 7   # a HalfCheetah episode, truncated


# ------------------------------------------------------------- the sources --

class RecordedVector(gymnasium.vector.VectorWrapper):
    """A vector env that keeps what each ``step`` returned (copies)."""

    def __init__(self, env):
        super().__init__(env)
        self.calls = []

    def step(self, actions):
        obs, rew, terminated, truncated, info = self.env.step(actions)
        self.calls.append((obs.copy(), np.asarray(rew, np.float64),
                           terminated.copy(), truncated.copy()))
        return obs, rew, terminated, truncated, info


class Recorded(gymnasium.Wrapper):
    """A single env that keeps its reset observations and what each
    ``step`` returned (copies)."""

    def __init__(self, env):
        super().__init__(env)
        self.resets, self.steps = [], []

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.resets.append(obs.copy())
        return obs, info

    def step(self, action):
        obs, rew, terminated, truncated, info = self.env.step(action)
        self.steps.append((obs.copy(), float(rew), terminated, truncated))
        return obs, rew, terminated, truncated, info


def make_ale(n_envs=N_ALE):
    """Pong in ALE's vector env, episodes of :data:`ALE_FRAMES` frames."""
    from ale_py.vector_env import AtariVectorEnv
    return AtariVectorEnv("pong", num_envs=n_envs, num_threads=1,
                          max_num_frames_per_episode=ALE_FRAMES)


def make_recorded_ale():
    return RecordedVector(make_ale())


MADE = []  # the recorded cheetahs of the running test (same: in-process)


def make_cheetah():
    return gymnasium.make("HalfCheetah-v5", max_episode_steps=CHEETAH_STEPS)


def make_recorded_cheetah():
    env = Recorded(make_cheetah())
    MADE.append(env)
    return env


# --------------------------------------------------------------- actors --

class PixelActor(BaseActorModule):
    """A deterministic actor of Pong's six actions: the sum of the newest
    frame of the stack plus the step number, modulo 6."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        pixels = obs[..., -1, :, :].sum((-2, -1), dtype=torch.int64)
        return (pixels + stepno) % 6, (), {}


class CheetahActor(BaseActorModule):
    """A deterministic actor of HalfCheetah's six torques, in ``[-1,
    1]``, from the observation and the step number."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return torch.sin(3 * obs[..., :6] + stepno.unsqueeze(-1)).float(), \
            (), {}


def fragments(kind, factory, actor, n_envs, n=N_FRAGMENTS, **kwargs):
    """``n`` fragments (copies) of ``kind``: one worker for single and
    multi, one fragment per batch."""
    if kind != "same":
        kwargs = dict(timeout=BOUND, start_timeout=START, **kwargs)
    with make(kind, factory, actor, T, n_envs, n_actors=1, entropy=3,
              **kwargs) as feed:
        return feed, [suply(torch.clone, batch)
                      for batch in itertools.islice(feed, n)]


def two_workers(factory, actor, n_envs, each=3, most=60):
    """Fragments (copies) of ``multi`` with two workers, one fragment per
    batch, until each worker has delivered ``each`` (a worker that started
    first may deliver many before the other's first: the buffers go to
    the worker that holds the fewest), at most ``most``."""
    got, count = [], {0: 0, 1: 0}
    with make("multi", factory, actor, T, n_envs, n_actors=2, entropy=3,
              timeout=BOUND, start_timeout=START) as feed:
        for batch in itertools.islice(feed, most):
            got.append(suply(torch.clone, batch))
            count[int(batch.meta.worker[0])] += 1
            if min(count.values()) >= each:
                return got
    raise AssertionError(f"fragments per worker after {most}: {count}")


def assert_continues(fragments):
    """Row ``T`` of each fragment is row 0 of the next one of the same
    worker (every field but the actor's, which has none here, and
    ``acted``, false at row 0 by definition)."""
    last = {}
    for f in fragments:
        worker = int(f.meta.worker[0])
        previous = last.get(worker)
        if previous is not None:
            assert int(f.meta.seq[0]) == int(previous.meta.seq[0]) + 1
            for field in ("state", "truncated", "final", "stats"):
                suply(lambda x, y: np.testing.assert_array_equal(x[0], y[-1]),
                      getattr(f, field), getattr(previous, field))
        last[worker] = f


# -------------------------------------------------------------- fixtures --

@pytest.fixture(scope="module")
def ale():
    return pytest.importorskip("ale_py.vector_env",
                               reason="needs rlplay[atari]")


@pytest.fixture(scope="module")
def mujoco():
    return pytest.importorskip("mujoco", reason="needs rlplay[mujoco]")


@pytest.fixture(scope="module")
def ale_same(ale):
    """What the recorded Pong source returned, and the fragments of
    ``same.rollout`` over it (no process: made once for the module)."""
    feed, got = fragments("same", make_recorded_ale, PixelActor(), N_ALE)
    return feed.envs.source.calls, got


@pytest.fixture(scope="module")
def cheetah_same(mujoco):
    """The recorded cheetahs (those made for the columns, and any other)
    and the fragments of ``same.rollout`` over them."""
    MADE.clear()
    _, got = fragments("same", make_recorded_cheetah, CheetahActor(), 4)
    made = list(MADE)
    MADE.clear()
    return made, got


# ------------------------------------------------------------------ Atari --

def test_ale_vector_env_in_same_follows_the_source_row_by_row(ale_same):
    """Every row is one call of the source: ``obs`` and ``final`` are the
    frames it returned (the true last frame where an episode ended: ALE
    resets on its next call); a row after an end is a lost call (the reset
    frame, ``fin``, no reward, ``stepno`` 0, ``acted`` false); elsewhere
    rewards, ends and truncations are the source's."""
    calls, got = ale_same
    assert_continues(got)
    ended = np.zeros(N_ALE, bool)  # the previous call ended the episode
    n_ends = n_lost = 0
    for k, f in enumerate(got):
        mask = acted(f)
        assert not mask[0].any()
        for t in range(1, T + 1):
            obs, rew, terminated, truncated = calls[k * T + t - 1]
            lost = torch.from_numpy(ended)
            np.testing.assert_array_equal(f.state.obs[t], obs)
            np.testing.assert_array_equal(f.final[t], obs)
            assert torch.equal(mask[t], ~lost)
            end = torch.from_numpy(terminated | truncated) & ~lost
            assert torch.equal(f.state.fin[t], end | lost)
            assert torch.equal(f.truncated[t],
                               torch.from_numpy(truncated & ~terminated)
                               & ~lost)
            assert torch.equal(f.state.rew[t], torch.where(
                lost, 0.0, torch.from_numpy(rew).float()))
            assert not f.state.stepno[t][lost].any()
            assert not f.stats.length[t][lost].any()
            # an episode's statistics at its end: its steps, lost call
            # not counted
            assert torch.equal(f.stats.length[t][end],
                               f.state.stepno[t - 1][end] + 1)
            n_ends += int(end.sum())
            n_lost += int(lost.sum())
            ended = (terminated | truncated) & ~ended
    assert n_ends >= 4 and n_lost >= 2


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_ale_vector_env_in_a_worker_equals_same(ale_same, kind):
    """One worker of single or multi: the fragments of ``same``, field for
    field (the parameter version aside), lost calls included."""
    _, want = ale_same
    _, got = fragments(kind, make_ale, PixelActor(), N_ALE, n=4)
    for x, y in zip(got, want):
        assert_fragments_equal(without_version(x), without_version(y))
    assert sum(int((~acted(f)[1:]).sum()) for f in got) > 0


def test_ale_vector_env_in_two_multi_workers(ale):
    """Two workers, each with its own source: row ``T`` = next row 0 per
    worker, and every lost call follows an end in the row before."""
    got = two_workers(make_ale, PixelActor(), N_ALE, each=4)
    assert_continues(got)
    n_lost = 0
    for f in got:
        lost = (~acted(f))[1:].nonzero().tolist()
        n_lost += len(lost)
        for t, j in lost:  # t indexes rows 1..T
            assert f.state.fin[t, j] and f.state.fin[t + 1, j]
            assert torch.equal(f.final[t, j], f.state.obs[t, j])
    assert n_lost > 0


def test_ale_threads_are_not_child_processes(ale):
    """ALE steps its envs on threads of this process: while they run,
    the walk of children that conftest's check uses finds none new (a
    thread is a task of this process, not a child)."""
    before_tasks = set(os.listdir("/proc/self/task"))
    before = children(os.getpid())
    env = ale.AtariVectorEnv("pong", num_envs=2, num_threads=2)
    try:
        env.reset(seed=0)
        env.step(np.zeros(2, np.int64))
        assert set(os.listdir("/proc/self/task")) - before_tasks
        assert children(os.getpid()) == before
    finally:
        env.close()


# ----------------------------------------------------------------- MuJoCo --

def test_halfcheetah_in_same_follows_each_env_step_by_step(cheetah_same):
    """Each column is one env: ``final`` holds every observation its steps
    returned, in order (the true last one where an episode was
    truncated), ``obs`` the reset observation there and ``final``
    elsewhere; every episode ends truncated after its
    :data:`CHEETAH_STEPS` steps, with its statistics; no lost call."""
    made, got = cheetah_same
    assert_continues(got)
    first = got[0].state.obs[0]
    # the columns' envs, by their first reset observation
    envs = [next(env for env in made if env.resets and np.array_equal(
        env.resets[0], first[j])) for j in range(4)]
    for j, env in enumerate(envs):
        resets = iter(env.resets[1:])
        steps = iter(env.steps)
        for f in got:
            assert bool(acted(f)[1:, j].all())
            for t in range(1, T + 1):
                obs, rew, terminated, truncated = next(steps)
                np.testing.assert_array_equal(f.final[t, j], obs)
                assert float(f.state.rew[t, j]) == np.float32(rew)
                assert bool(f.state.fin[t, j]) == (terminated or truncated)
                assert bool(f.truncated[t, j]) == truncated
                if truncated:
                    np.testing.assert_array_equal(f.state.obs[t, j],
                                                  next(resets))
                    assert int(f.stats.length[t, j]) == CHEETAH_STEPS
                    assert int(f.state.stepno[t, j]) == 0
                else:
                    assert torch.equal(f.state.obs[t, j], f.final[t, j])
                    assert int(f.stats.length[t, j]) == 0
    n_ends = sum(int(f.state.fin[1:].sum()) for f in got)
    assert n_ends == 4 * (N_FRAGMENTS * T // CHEETAH_STEPS)


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_halfcheetah_in_a_worker_equals_same(cheetah_same, kind):
    """One worker of single or multi: the fragments of ``same``, field for
    field (the parameter version aside)."""
    _, want = cheetah_same
    _, got = fragments(kind, make_cheetah, CheetahActor(), 4, n=4)
    for x, y in zip(got, want):
        assert_fragments_equal(without_version(x), without_version(y))
    assert sum(int(f.state.fin[1:].sum()) for f in got) > 0


def test_halfcheetah_in_two_multi_workers(mujoco):
    """Two workers: row ``T`` = next row 0 per worker; at an end ``final``
    is not the reset observation in ``obs``."""
    got = two_workers(make_cheetah, CheetahActor(), 4)
    assert_continues(got)
    for f in got:
        assert bool(acted(f)[1:].all())
        fin = f.state.fin[1:]
        assert fin.any()
        assert not (f.final[1:][fin] == f.state.obs[1:][fin]).all(-1).any()
