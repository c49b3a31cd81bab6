"""The real workloads of ``throughput.py``: Atari's Pong (84x84x4 uint8
frames, a Nature CNN sampling from a categorical) and MuJoCo's
HalfCheetah-v5 (17 floats, a 17-64-64-6 Gaussian MLP), collected by a
hand-written loop, rlplay's generators, Gymnasium's ``AsyncVectorEnv``,
EnvPool and the peers' collectors (Stable-Baselines3, TorchRL), all on the
same envs and the same actor. ``README.md`` here says what every row and
column measures.

Three sections, none in the script's default run (they are slow): ``atari``
(ALE's own vector env, ``AtariVectorEnv``), ``atari_gym`` (Gymnasium's
``AtariPreprocessing`` and ``FrameStackObservation`` over ``ALE/Pong-v5``:
the pipeline that SB3, TorchRL and ``AsyncVectorEnv`` step) and ``mujoco``;
``--only atari`` runs the first two, ``--only mujoco`` the last.

Beside its steps/s every row reports ``bytes_per_step``, the bytes of what
reaches the learner (rlplay's batch, the peer's batch, the loop's arrays)
over the env steps that it holds, and ``shm_per_worker``, the shared memory
each worker process writes into (``None`` where there is no worker).
ALE, MuJoCo, EnvPool, SB3 and TorchRL are imported only when a row runs; a
row whose package is missing or fails to set up is skipped with a note.
"""
import functools
from contextlib import closing

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv
from torch import nn

from harness import Row, timed, timed_in_processes, warm_workers
from rlplay.engine import FeedForwardActor, flatten
from rlplay.engine.rollout import same
from workloads import (N_ACTORS, Arrays, NatureCNN, clipper, hand_loop,
                       hand_vector_loop, n_cores, run_actor_alone,
                       run_envs_alone, run_hand, run_hand_vector,
                       run_source_alone, run_vector)

try:
    from rlplay.engine.rollout import multi, single
except ImportError:  # an older checkout
    single = multi = None

__all__ = ["N_REAL", "ALE_THREADS", "REAL_WORKLOADS", "PongActor",
           "GaussianActor", "make_ale", "make_pong", "make_pong_vec",
           "make_envpool_pong", "make_cheetah", "real_rows"]

N_REAL = 8            # envs per actor call
ATARI_STEPS = 32      # a fragment of 8 Pong envs: 7.1 MiB of observations
MUJOCO_STEPS = 128
ALE_THREADS = 1       # the C++ threads of each AtariVectorEnv: one core per
#                       process, as one torch thread
# the actor's floor: calls between two clock reads (the CNN takes ms a call)
ACTOR_CALLS = {"atari": 8, "atari_gym": 8, "mujoco": 64}


# ------------------------------------------------------------------ envs --

def make_ale(n_envs=N_REAL):
    """Pong in ALE's C++ vector env: frame skip 4, max-pool, 84x84
    grayscale, a stack of 4, no-op starts, clipped rewards; next-step
    autoreset (rlplay does not use its partial reset, which could hang in
    ale-py before 2026, so it loses a call at every episode end)."""
    from ale_py.vector_env import AtariVectorEnv
    return AtariVectorEnv("pong", num_envs=n_envs, num_threads=ALE_THREADS)


def make_pong():
    """One ``ALE/Pong-v5`` with Gymnasium's ``AtariPreprocessing`` (frame
    skip 4 over an env that skips none, max-pool, no-op starts, 84x84
    grayscale; rewards unclipped) and a ``FrameStackObservation`` of 4:
    ``(4, 84, 84)`` uint8, as the vector env's; no sticky actions, as
    there."""
    import ale_py
    gymnasium.register_envs(ale_py)
    return _wrap_pong(gymnasium.make("ALE/Pong-v5", frameskip=1,
                                     repeat_action_probability=0.0))


def _wrap_pong(env):
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation
    return FrameStackObservation(AtariPreprocessing(env), 4)


def make_pong_vec(n_envs=N_REAL):
    """:func:`make_pong`'s envs through ``gymnasium.make_vec`` (a
    ``SyncVectorEnv``, which resets one env alone: exact)."""
    import ale_py
    gymnasium.register_envs(ale_py)
    return gymnasium.make_vec("ALE/Pong-v5", n_envs,
                              vectorization_mode="sync", frameskip=1,
                              repeat_action_probability=0.0,
                              wrappers=[_wrap_pong])


def make_envpool_pong(seed=None, n_envs=N_REAL):
    """EnvPool's Pong with the vector env's settings (one thread, no
    episodic life, clipped rewards), seeded when made."""
    import envpool
    return envpool.make("Pong-v5", env_type="gymnasium", num_envs=n_envs,
                        seed=0 if seed is None else seed % 2**31,
                        num_threads=ALE_THREADS, episodic_life=False,
                        reward_clip=True, repeat_action_probability=0.0)


def make_cheetah():
    return gymnasium.make("HalfCheetah-v5")


# ---------------------------------------------------------------- actors --

class PongActor(FeedForwardActor):
    """:class:`~workloads.NatureCNN` sampling from a categorical over
    Pong's six actions; :meth:`sample` (frames ``(N, 4, 84, 84)`` uint8 in,
    ``N`` actions out) is what every loop calls."""

    def __init__(self, n_actions=6):
        super().__init__()
        self.net = NatureCNN(n_actions)

    def sample(self, obs):
        logits, _ = self.net(obs)
        return torch.distributions.Categorical(logits=logits).sample()

    def act(self, obs):
        return self.sample(obs), {}


class GaussianActor(FeedForwardActor):
    """A 17-64-64-6 MLP (tanh) giving the mean of a diagonal Gaussian with
    a learned log-std; :meth:`sample` draws float32 actions, unclipped (the
    loops clip what the envs get, as rlplay does)."""

    def __init__(self, n_obs=17, n_actions=6, n_hidden=64):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(n_obs, n_hidden), nn.Tanh(),
            nn.Linear(n_hidden, n_hidden), nn.Tanh(),
            nn.Linear(n_hidden, n_actions))
        self.log_std = nn.Parameter(torch.full((n_actions,), -0.5))

    def sample(self, obs):
        mean = self.mlp(obs.to(torch.float32))  # MuJoCo gives float64
        return torch.distributions.Normal(mean, self.log_std.exp()).sample()

    def act(self, obs):
        return self.sample(obs), {}


class _Sample(nn.Module):
    """An actor's ``sample`` as a module, for TorchRL's
    ``TensorDictModule``."""

    def __init__(self, actor):
        super().__init__()
        self.actor = actor

    def forward(self, obs):
        return self.actor.sample(obs)


# name: (factory, n_steps of a fragment, envs per actor call, actor class)
REAL_WORKLOADS = {"atari": (make_ale, ATARI_STEPS, N_REAL, PongActor),
                  "atari_gym": (make_pong, ATARI_STEPS, N_REAL, PongActor),
                  "mujoco": (make_cheetah, MUJOCO_STEPS, N_REAL,
                             GaussianActor)}


# ---------------------------------------------------------------- memory --

def nbytes(tree):
    """The bytes of every tensor of a nested structure."""
    return sum(x.numel() * x.element_size() for x in flatten(tree))


@functools.cache
def _spaces(factory):
    """The single-env observation and action spaces of ``factory``'s
    envs (one made and closed)."""
    env = factory()
    try:
        return (getattr(env, "single_observation_space",
                        env.observation_space),
                getattr(env, "single_action_space", env.action_space))
    finally:
        env.close()


def arrays_bytes(factory, n_steps, n_envs=N_REAL):
    """Bytes per env step of the arrays the hand-written loops store."""
    obs_space, action_space = _spaces(factory)
    return Arrays(obs_space, n_steps, n_envs, action_space).nbytes / (
        n_steps * n_envs)


def obs_bytes(factory):
    """The bytes of one observation of ``factory``'s envs."""
    space = _spaces(factory)[0]
    return int(np.prod(space.shape)) * space.dtype.itemsize


def with_memory(run, bytes_per_step, shm_per_worker=None):
    """``run``'s result (a row's ``run``) with the two memory columns,
    each a function of nothing (``shm_per_worker=None``: no workers)."""
    def wrapped(seconds):
        result = run(seconds)
        if isinstance(result, str):
            return result
        return dict(result, bytes_per_step=bytes_per_step(),
                    shm_per_worker=shm_per_worker and shm_per_worker())
    return wrapped


# ------------------------------------------------------------------ rows --

def rlplay_run(module, factory, actor, n_steps, *counts, n_workers=0):
    """A row's ``run``: ``module.rollout(factory, actor, n_steps, *counts,
    entropy=0)`` timed without training once each of its workers has
    delivered two fragments (:func:`~harness.warm_workers`), with the bytes
    per env step of its first batch and its workers' shared buffers (the
    pool, of ``SharedBuffers``, over the workers: each holds as many)."""
    def run(seconds):
        if module is None:
            return "not available (import failed)"
        feed = module.rollout(factory, actor, n_steps, *counts, entropy=0)
        with closing(feed):
            batch = next(feed)
            steps = n_steps * batch.state.fin.shape[1]
            # the source of ready fragments: a part of the supervision (an
            # attribute of the generator in older checkouts)
            source = getattr(getattr(feed, "_supervision", None), "source",
                             getattr(feed, "_source", None))
            pool = getattr(source, "segment", None)
            shm = None if not n_workers else (
                None if pool is None else pool.nbytes / n_workers)
            warm_workers(feed)
            return dict(timed(lambda: next(feed), steps, seconds),
                        bytes_per_step=nbytes(batch) / steps,
                        shm_per_worker=shm)
    return run


def run_sb3(factory, actor, n_steps, seconds, n_envs=N_REAL):
    """Stable-Baselines3's ``SubprocVecEnv`` of ``n_envs`` envs (one
    process each, observations through pipes), driven by ``actor`` into
    the hand loop's arrays, ``Box`` actions clipped as SB3's own loop
    does."""
    try:
        from stable_baselines3.common.vec_env import SubprocVecEnv
    except ImportError:
        return ("Stable-Baselines3 is not installed (pip install -e "
                "'.[bench]' in rlplay's clone)")
    try:
        venv = SubprocVecEnv([factory] * n_envs)
    except Exception as exc:  # noqa: BLE001 - a note; the other rows run
        return f"SubprocVecEnv failed to set up ({type(exc).__name__}: {exc})"
    try:
        buf = Arrays(venv.observation_space, n_steps, n_envs,
                     venv.action_space)
        clip = clipper(venv.action_space)
        buf.obs[0] = venv.reset()

        def fragment():
            obs, act, rew, done = buf.obs, buf.act, buf.rew, buf.done
            for t in range(n_steps):
                actions = actor.sample(buf.obs_pyt[t]).numpy()
                act[t] = actions
                obs[t + 1], rew[t], done[t], _ = venv.step(clip(actions))
            obs[0] = obs[n_steps]

        result = timed(fragment, n_steps * n_envs, seconds)
    finally:
        venv.close()
    return dict(result, bytes_per_step=buf.nbytes / (n_steps * n_envs),
                shm_per_worker=0)


def _torchrl_env(factory, n_envs):
    """A ``SerialEnv`` of ``n_envs`` of ``factory``'s envs (made in
    TorchRL's worker), ``Discrete`` actions as indices."""
    from torchrl.envs import SerialEnv
    return SerialEnv(n_envs, functools.partial(_torchrl_gym, factory))


def _torchrl_gym(factory):
    from torchrl.envs import GymWrapper
    return GymWrapper(factory(), categorical_action_encoding=True)


def run_torchrl(factory, actor, n_steps, seconds, n_workers=N_ACTORS,
                n_per_worker=N_REAL // N_ACTORS):
    """TorchRL's ``MultiSyncCollector`` (``MultiSyncDataCollector`` in
    older TorchRL): ``n_workers`` processes, each stepping a ``SerialEnv`` of
    ``n_per_worker`` ``GymWrapper`` envs with a copy of ``actor`` (one
    torch thread), a batch of ``n_steps`` steps of every env. A worker
    puts what it collected in shared memory: its share of the batch."""
    try:
        from tensordict.nn import TensorDictModule
        from torchrl import collectors
    except ImportError:
        return ("TorchRL is not installed (pip install -e "
                "'.[bench]' in rlplay's clone)")
    collector_class = getattr(collectors, "MultiSyncCollector", None) or \
        getattr(collectors, "MultiSyncDataCollector")
    policy = TensorDictModule(_Sample(actor), in_keys=["observation"],
                              out_keys=["action"])
    frames = n_steps * n_workers * n_per_worker
    try:
        collector = collector_class(
            [functools.partial(_torchrl_env, factory, n_per_worker)]
            * n_workers, policy, frames_per_batch=frames, total_frames=-1)
    except Exception as exc:  # noqa: BLE001 - a note; the other rows run
        return (f"{collector_class.__name__} failed to set up "
                f"({type(exc).__name__}: {exc})")
    try:
        batches = iter(collector)
        first = next(batches)
        size = nbytes(list(first.values(True, True)))
        result = timed(lambda: next(batches), frames, seconds)
    finally:
        collector.shutdown()
    return dict(result, bytes_per_step=size / frames,
                shm_per_worker=size / n_workers)


def real_rows(section):
    """The :class:`Row` list of a real section: floors, then the table."""
    factory, n_steps, n_envs, actor_class = REAL_WORKLOADS[section]
    actor = actor_class()
    n_per_actor = n_envs // N_ACTORS
    n2 = n_cores(N_ACTORS)
    # the source an rlplay row steps: one of n envs (None: single envs)
    source = {"atari": make_ale, "atari_gym": make_pong_vec}.get(section)
    # single envs, for the actor's floor and the peers
    single_env = make_cheetah if section == "mujoco" else make_pong

    def of(n):  # a factory of n columns (one source where there is one)
        return factory if source is None else functools.partial(source, n)

    def row(name, run, ceiling):
        return Row(f"{section}/{name}", run, "row", ceiling)

    def floor(name, run):
        return Row(f"{section}/floor.{name}", run, "floor")

    def hand_in_processes(n):  # the hand loop of n envs in N_ACTORS copies
        def build():
            if source is make_ale:
                return hand_vector_loop(make_ale(n), actor, n_steps, n)
            return hand_loop(factory, actor, n_steps, n_envs=n)
        return row(f"hand.parallel.{N_ACTORS}x{n}", lambda s: (
            timed_in_processes(build, n_steps * n, s, N_ACTORS)),
            f"{n2}x{n}")

    hand_bytes = functools.partial(arrays_bytes, single_env, n_steps)
    if source is make_ale:
        envs_alone = functools.partial(run_source_alone, make_ale, n_steps,
                                       n_envs=n_envs)
        hand = functools.partial(run_hand_vector, make_ale, actor, n_steps,
                                 n_envs=n_envs)
    else:
        envs_alone = functools.partial(run_envs_alone, factory, n_steps)
        hand = functools.partial(run_hand, factory, actor, n_steps)
    table = [
        floor("envs", envs_alone),
        floor(f"actor.{n_envs}", lambda s: run_actor_alone(
            single_env, actor, n_envs, s, ACTOR_CALLS[section])),
        floor(f"actor.{n_per_actor}", lambda s: run_actor_alone(
            single_env, actor, n_per_actor, s, ACTOR_CALLS[section])),
        row("hand", with_memory(hand, hand_bytes), f"1x{n_envs}"),
        # the hand loop in N_ACTORS processes at once, nothing delivered:
        # the measured ceiling of the rows of as many workers
        hand_in_processes(n_per_actor),
        hand_in_processes(n_envs),
        row("same.rollout", rlplay_run(same, of(n_envs), actor, n_steps,
                                       n_envs), f"1x{n_envs}"),
        row("single.rollout", rlplay_run(single, of(n_envs), actor, n_steps,
                                         n_envs, n_workers=1), f"1x{n_envs}"),
        # equal envs: 2 workers x n_envs / 2 (one fragment per worker)
        row("multi.rollout", rlplay_run(
            multi, of(n_per_actor), actor, n_steps, N_ACTORS, n_per_actor,
            2 * N_ACTORS, N_ACTORS, n_workers=N_ACTORS),
            f"{n2}x{n_per_actor}"),
        # equal actor calls: 2 workers x n_envs, as same.rollout's
        row(f"multi.rollout.{N_ACTORS}x{n_envs}", rlplay_run(
            multi, of(n_envs), actor, n_steps, N_ACTORS, n_envs,
            2 * N_ACTORS, N_ACTORS, n_workers=N_ACTORS), f"{n2}x{n_envs}"),
    ]
    if section == "atari":
        table.append(row("same.rollout.envpool",
                         envpool_run(actor, n_steps, n_envs), f"1x{n_envs}"))
        return table
    table += [
        # each worker writes its env's observation into the shared array
        row("AsyncVectorEnv", with_memory(
            lambda s: run_vector(AsyncVectorEnv, factory, actor, n_steps, s),
            hand_bytes, lambda: obs_bytes(single_env)), "async"),
        row("sb3.SubprocVecEnv",
            lambda s: run_sb3(factory, actor, n_steps, s), "async"),
        row(f"torchrl.MultiSyncCollector.{N_ACTORS}x{n_per_actor}",
            lambda s: run_torchrl(factory, actor, n_steps, s),
            f"{n2}x{n_per_actor}"),
    ]
    return table


def envpool_run(actor, n_steps, n_envs):
    """``same.rollout`` over EnvPool's Pong (one source of ``n_envs``);
    skipped where EnvPool is not installed."""
    def run(seconds):
        try:
            make_envpool_pong(n_envs=1).close()
        except ImportError:
            return ("EnvPool is not installed (pip install -e "
                    "'.[envpool]' in rlplay's clone)")
        return rlplay_run(same, functools.partial(make_envpool_pong,
                                                  n_envs=n_envs),
                          actor, n_steps, n_envs)(seconds)
    return run
