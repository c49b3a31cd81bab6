"""The benchmarks' workloads: envs, the actor, and the loops that rlplay
does not drive (the hand-written loop, Gymnasium's vector envs, the floors
of the envs alone and of the actor alone). See ``README.md`` here for what
each measures.
"""
import os
import time
from contextlib import closing

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from torch import nn

from harness import timed, warm_workers
from rlplay.engine import FeedForwardActor

__all__ = ["N_ENVS", "N_ACTORS", "N_CPUS", "BUSY_SECONDS", "ACTOR_CALLS",
           "N_VECTOR", "BusyEnv", "make_cartpole", "make_cartpole_vec",
           "make_envpool", "MLPActor", "GaussianActor", "PixelEnv",
           "NatureCNN", "CNNActor",
           "PIXEL_SHAPE", "WORKLOADS", "Arrays", "clipper", "random_actions",
           "hand_loop", "hand_vector_loop",
           "run_hand", "run_vector", "run_hand_vector", "run_bare_loop",
           "run_generator", "run_envs_alone", "run_source_alone",
           "run_actor_alone", "n_cores"]

N_ENVS = 8
N_ACTORS = 2                  # multi.rollout: N_ACTORS x N_ENVS // N_ACTORS
BUSY_SECONDS = 0.5e-3         # CPU time a busy env burns per step
ACTOR_CALLS = 64              # actor floor: calls between two clock reads
N_VECTOR = 64                 # envs per vector source (the vector section)
try:
    N_CPUS = len(os.sched_getaffinity(0))
except AttributeError:        # not on Linux
    N_CPUS = os.cpu_count() or 1


def n_cores(n_workers):
    """The cores ``n_workers`` processes can use here."""
    return min(n_workers, N_CPUS)


class BusyEnv(gymnasium.Env):
    """A CPU-bound env: each ``step`` burns ``busy`` seconds of CPU time.

    The wait is measured in this thread's CPU time, not wall time, so the
    env does the same work however loaded the machine is. Episodes are
    truncated after ``length`` steps; the observation is cheap to make.
    """

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, busy=BUSY_SECONDS, length=200):
        self.busy, self.length, self.t = busy, length, 0

    def _obs(self):
        return np.full(4, self.t / self.length, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        deadline = time.thread_time() + self.busy
        while time.thread_time() < deadline:
            pass
        self.t += 1
        return self._obs(), 1.0, False, self.t >= self.length, {}


def make_cartpole():
    return gymnasium.make("CartPole-v1")


def make_cartpole_vec(n_envs=N_VECTOR):
    """Gymnasium's own vectorised CartPole (next-step autoreset)."""
    return gymnasium.make_vec("CartPole-v1", num_envs=n_envs,
                              vectorization_mode="vector_entry_point")


def make_envpool(seed=None, n_envs=N_VECTOR):
    """EnvPool's CartPole (C++), seeded when made; ``ImportError`` where
    EnvPool is not installed."""
    import envpool
    return envpool.make_gymnasium("CartPole-v1", num_envs=n_envs,
                                  seed=0 if seed is None else seed % 2**31)


class MLPActor(FeedForwardActor):
    """The benchmarks' actor, a 4-64-64-2 MLP sampling from a categorical;
    :meth:`sample` is what every loop calls (rlplay's through ``act``)."""

    def __init__(self, n_obs=4, n_actions=2, n_hidden=64):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(n_obs, n_hidden), nn.Tanh(),
            nn.Linear(n_hidden, n_hidden), nn.Tanh(),
            nn.Linear(n_hidden, n_actions))

    def sample(self, obs):
        logits = self.mlp(obs)
        return torch.distributions.Categorical(logits=logits).sample()

    def act(self, obs):
        return self.sample(obs), {}


class GaussianActor(MLPActor):
    """The benchmarks' actor for continuous actions in [-1, 1]: an MLP
    whose outputs are the means of a Gaussian of scale 0.5, its samples
    clipped into the bounds."""

    def sample(self, obs):
        mean = self.mlp(obs)
        return torch.clamp(mean + 0.5 * torch.randn_like(mean), -1.0, 1.0)


PIXEL_SHAPE = (4, 84, 84)     # a stacked Atari observation (28,224 bytes)


class PixelEnv(gymnasium.Env):
    """A pixel env with Atari's observation layout and a cheap step.

    Observations are ``(4, 84, 84)`` uint8 frames taken in turn from a bank
    of ``n_frames`` random frames made at construction (the step itself
    costs next to nothing, so what is timed is the copies and the actor);
    six actions; episodes are truncated after ``length`` steps, so that the
    final observations are written now and then.
    """

    observation_space = spaces.Box(0, 255, PIXEL_SHAPE, np.uint8)
    action_space = spaces.Discrete(6)

    def __init__(self, length=400, n_frames=16):
        rng = np.random.default_rng(0)
        self.frames = rng.integers(0, 256, (n_frames, *PIXEL_SHAPE),
                                   dtype=np.uint8)
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.frames[0], {}

    def step(self, action):
        self.t += 1
        return (self.frames[self.t % len(self.frames)], 1.0, False,
                self.t >= self.length, {})


class NatureCNN(nn.Module):
    """The convolutional network of DQN's Nature paper over ``(4, 84, 84)``
    uint8 frames (scaled to [0, 1] here), with a policy head of
    ``n_actions`` logits and a value head."""

    def __init__(self, n_actions=6):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512), nn.ReLU())
        self.policy = nn.Linear(512, n_actions)
        self.value = nn.Linear(512, 1)

    def forward(self, frames):
        """``frames`` of shape ``(N, 4, 84, 84)`` uint8: logits ``(N,
        n_actions)`` and values ``(N,)``."""
        x = self.body(frames.float() / 255.0)
        return self.policy(x), self.value(x).squeeze(-1)


class CNNActor(FeedForwardActor):
    """A :class:`NatureCNN` sampling from a categorical; ``info`` holds the
    value and the log-probability of the sampled action."""

    def __init__(self, n_actions=6):
        super().__init__()
        self.net = NatureCNN(n_actions)

    def act(self, obs):
        logits, value = self.net(obs)
        dist = torch.distributions.Categorical(logits=logits)
        action = dist.sample()
        return action, {"value": value, "logp": dist.log_prob(action)}


# name: (factory, n_steps of a fragment, envs per actor call)
WORKLOADS = {"cartpole": (make_cartpole, 128, N_ENVS),
             "busy": (BusyEnv, 32, N_ENVS),
             "vector": (make_cartpole, 128, N_VECTOR)}


class Arrays:
    """Preallocated obs/act/rew/done of one fragment, for the loops that
    rlplay does not drive (``obs`` has the lookahead row ``T``); ``act``
    holds ``action_space``'s actions (``Discrete`` ones, as int64, where
    it is ``None``)."""

    def __init__(self, space, n_steps, n_envs, action_space=None):
        self.obs = np.zeros((n_steps + 1, n_envs, *space.shape), space.dtype)
        shape, dtype = ((), np.int64) if action_space is None or isinstance(
            action_space, spaces.Discrete) else (action_space.shape,
                                                 action_space.dtype)
        self.act = np.zeros((n_steps, n_envs, *shape), dtype)
        self.rew = np.zeros((n_steps, n_envs), np.float32)
        self.done = np.zeros((n_steps, n_envs), bool)
        self.obs_pyt = torch.from_numpy(self.obs)  # the same memory


    @property
    def nbytes(self):
        """The bytes of the four arrays."""
        return sum(x.nbytes for x in (self.obs, self.act, self.rew,
                                      self.done))


def clipper(space):
    """What the loops hand the envs from a batch of actions: ``Box`` ones
    clipped into ``space``, as rlplay and SB3 do (a Gaussian samples
    outside it), others as they are."""
    if isinstance(space, spaces.Box):
        low, high = space.low, space.high
        return lambda actions: np.clip(actions, low, high)
    return lambda actions: actions


def random_actions(space, n_steps, n_envs):
    """``n_steps`` lists of ``n_envs`` actions of ``space`` drawn up front
    (Python ints for ``Discrete``), for the floors of the envs alone."""
    rng = np.random.default_rng(0)
    if isinstance(space, spaces.Discrete):
        return [rng.integers(space.n, size=n_envs).tolist()
                for _ in range(n_steps)]
    return [list(rng.uniform(space.low, space.high, (
        n_envs, *space.shape)).astype(space.dtype)) for _ in range(n_steps)]


def hand_loop(factory, actor, n_steps, sample=None, n_envs=N_ENVS):
    """The hand-written loop over ``n_envs`` single envs: ``(fragment,
    close)``, ``fragment()`` collecting one fragment of ``n_steps`` rows
    into preallocated arrays; ``sample`` replaces ``actor.sample`` (the
    profile passes a clocked one)."""
    sample = actor.sample if sample is None else sample
    envs = [factory() for _ in range(n_envs)]
    buf = Arrays(envs[0].observation_space, n_steps, n_envs,
                 envs[0].action_space)
    clip = clipper(envs[0].action_space)
    for j, env in enumerate(envs):
        buf.obs[0, j], _ = env.reset(seed=j)

    def fragment():
        obs, act, rew, done = buf.obs, buf.act, buf.rew, buf.done
        for t in range(n_steps):
            actions = sample(buf.obs_pyt[t]).numpy()
            act[t] = actions
            obs_next, rew_t, done_t = obs[t + 1], rew[t], done[t]
            actions = clip(actions)  # ints for Discrete, rows for Box
            per_env = actions.tolist() if actions.ndim == 1 else actions
            for j, (env, a) in enumerate(zip(envs, per_env)):
                x, r, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    x, _ = env.reset()
                    done_t[j] = True
                else:
                    done_t[j] = False
                obs_next[j] = x
                rew_t[j] = r
        obs[0] = obs[n_steps]

    def close():
        for env in envs:
            env.close()
    return fragment, close


def run_hand(factory, actor, n_steps, seconds, sample=None, on_start=None,
             n_envs=N_ENVS):
    """:func:`hand_loop` timed for ``seconds``."""
    fragment, close = hand_loop(factory, actor, n_steps, sample, n_envs)
    try:
        return timed(fragment, n_steps * n_envs, seconds, on_start)
    finally:
        close()


def run_vector(vector_env, factory, actor, n_steps, seconds):
    """Gymnasium's ``vector_env`` class (same-step autoreset) over
    :data:`N_ENVS` envs, driven by the same actor into the same arrays."""
    venv = vector_env([factory] * N_ENVS,
                      autoreset_mode=AutoresetMode.SAME_STEP)
    return _run_venv(venv, actor, n_steps, seconds, N_ENVS)


def run_hand_vector(make_venv, actor, n_steps, seconds, n_envs=N_VECTOR):
    """The hand-written loop over a vector env (next-step autoreset, as
    it comes): one actor call and one step call per row, into the arrays."""
    return _run_venv(make_venv(), actor, n_steps, seconds, n_envs)


def hand_vector_loop(venv, actor, n_steps, n_envs=N_VECTOR):
    """The hand-written loop over the vector env ``venv``: ``(fragment,
    close)``, ``fragment()`` collecting one fragment of ``n_steps`` rows
    into preallocated arrays, one actor call and one step call per row."""
    buf = Arrays(venv.single_observation_space, n_steps, n_envs,
                 venv.single_action_space)
    clip = clipper(venv.single_action_space)
    buf.obs[0], _ = venv.reset(seed=0)

    def fragment():
        obs, act, rew, done = buf.obs, buf.act, buf.rew, buf.done
        for t in range(n_steps):
            actions = actor.sample(buf.obs_pyt[t]).numpy()
            act[t] = actions
            obs[t + 1], rew[t], terminated, truncated, _ = venv.step(
                clip(actions))
            np.logical_or(terminated, truncated, out=done[t])
        obs[0] = obs[n_steps]
    return fragment, venv.close


def hand_layout_loop(venv, actor, n_steps, n_envs=N_VECTOR):
    """The hand-written loop over the vector env ``venv`` (next-step
    autoreset, ``Discrete`` actions) that writes what a fragment of
    rlplay holds (``stepno``, ``obs``, ``act``, ``rew``, ``fin``,
    ``truncated``, ``final``, ``acted``, float64 returns and the episode
    statistics, lost calls marked): ``(fragment, close)``.

    Written as lean as I could, for one case: what the actor may read of
    a row (its ``stepno``, ``rew`` and ``fin``) is written in the loop,
    before the call that reads it, and the rest after the rows, in a few
    operations on the whole fragment. It calls the actor as the hand loop
    does (``sample`` on the rows' observations) and keeps no checks, no
    fresh copy of the batch and no ``meta``: a ceiling for a loop that
    delivers rlplay's layout, not a loop rlplay could run for every
    source and actor."""
    space = venv.single_observation_space
    T, B = n_steps, n_envs
    obs = np.zeros((T + 1, B, *space.shape), space.dtype)
    obs_pyt = torch.from_numpy(obs)
    act, stepno, length = (np.zeros((T + 1, B), np.int64) for _ in range(3))
    rew = np.zeros((T + 1, B), np.float32)
    fin, truncated, acted = (np.zeros((T + 1, B), bool) for _ in range(3))
    final = np.zeros_like(obs)
    ret_at = np.zeros((T + 1, B), np.float64)
    rew64 = np.zeros((T, B), np.float64)
    term, trunc = np.zeros((T, B), bool), np.zeros((T, B), bool)
    ret = np.zeros(B, np.float64)
    obs[0], _ = venv.reset(seed=0)
    fin[0] = True
    lost = []  # the columns whose next call the source resets

    def fragment():
        nonlocal lost
        for t in range(T):
            actions = actor.sample(obs_pyt[t]).numpy()
            act[t + 1] = actions
            obs[t + 1], rew64[t], term[t], trunc[t], _ = venv.step(actions)
            f, r, s = fin[t + 1], rew[t + 1], stepno[t + 1]
            np.logical_or(term[t], trunc[t], out=f)
            ended = f.nonzero()[0].tolist()
            for j in lost:
                f[j], rew64[t, j] = True, 0.0
            r[...] = rew64[t]
            np.add(stepno[t], 1, out=s)
            for j in ended + lost:
                s[j] = 0
            lost = ended
        # after the rows: flags, returns and statistics, final, row 0
        ends = term | trunc
        np.greater(trunc, term, out=truncated[1:])
        np.logical_not(fin[1:] & ~ends, out=acted[1:])
        ret_at.fill(0.0)
        length.fill(0)
        for t in range(T):
            np.add(ret, rew64[t], out=ret)
            ended = ends[t].nonzero()[0]
            if len(ended):
                ret_at[t + 1, ended] = ret[ended]
                length[t + 1, ended] = stepno[t, ended] + 1
                ret[ended] = 0.0
        final[...] = obs
        for x in (stepno, obs, act, rew, fin, truncated, final):
            x[0] = x[T]
    fragment.arrays = dict(stepno=stepno, obs=obs, act=act, rew=rew,
                           fin=fin, truncated=truncated, final=final,
                           acted=acted, ret=ret_at, length=length)
    return fragment, venv.close


def _run_venv(venv, actor, n_steps, seconds, n_envs):
    """Time fragments of ``venv`` driven by ``actor`` into the arrays (one
    actor call and one step call per row); closes ``venv``."""
    fragment, close = hand_vector_loop(venv, actor, n_steps, n_envs)
    try:
        return timed(fragment, n_steps * n_envs, seconds)
    finally:
        close()


def run_source_alone(make_venv, n_steps, seconds, n_envs=N_VECTOR):
    """A vector source stepped alone with random actions drawn up front
    (it resets its envs itself); nothing stored."""
    venv = make_venv()
    venv.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = [rng.integers(venv.single_action_space.n, size=n_envs)
               for _ in range(n_steps)]

    def fragment():
        for actions_t in actions:
            venv.step(actions_t)

    try:
        return timed(fragment, n_steps * n_envs, seconds)
    finally:
        venv.close()


def run_bare_loop(make_venv, actor, n_steps, seconds, n_envs=N_VECTOR):
    """The actor and a vector source called one after the other, each on
    the other's output, nothing stored: what one core does with both when
    they share its caches (the floors time each alone)."""
    venv = make_venv()
    obs, _ = venv.reset(seed=0)

    def fragment():
        x = obs
        for _ in range(n_steps):
            actions = actor.sample(torch.from_numpy(x).unsqueeze(0))[0]
            x = venv.step(actions.numpy())[0]

    try:
        return timed(fragment, n_steps * n_envs, seconds)
    finally:
        venv.close()


def run_generator(feed, steps_per_batch, seconds, on_start=None):
    """Time an rlplay generator's batches (no training) once each of its
    workers has delivered two fragments (:func:`~harness.warm_workers`);
    closes it."""
    with closing(feed):
        warm_workers(feed)
        return timed(lambda: next(feed), steps_per_batch, seconds, on_start)


def run_envs_alone(factory, n_steps, seconds):
    """:data:`N_ENVS` envs stepped with random actions drawn up front,
    reset when an episode ends; nothing stored."""
    envs = [factory() for _ in range(N_ENVS)]
    for j, env in enumerate(envs):
        env.reset(seed=j)
    actions = random_actions(envs[0].action_space, n_steps, N_ENVS)

    def fragment():
        for actions_t in actions:
            for env, a in zip(envs, actions_t):
                _, _, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    env.reset()

    try:
        return timed(fragment, n_steps * N_ENVS, seconds)
    finally:
        for env in envs:
            env.close()


def run_actor_alone(factory, actor, n_envs, seconds, calls=ACTOR_CALLS):
    """One batched ``actor.step`` for ``n_envs`` envs on a fixed
    observation (their reset observations), ``calls`` times between two
    clock reads."""
    envs = [factory() for _ in range(n_envs)]
    obs = np.stack([env.reset(seed=j)[0] for j, env in enumerate(envs)])
    for env in envs:
        env.close()
    row = (torch.zeros((1, n_envs), dtype=torch.int64),
           torch.from_numpy(obs).unsqueeze(0),
           torch.zeros((1, n_envs), dtype=torch.int64),
           torch.zeros((1, n_envs), dtype=torch.float32),
           torch.zeros((1, n_envs), dtype=torch.bool))

    def fragment():
        for _ in range(calls):
            actor.step(*row, hx=(), virtual=False)

    return timed(fragment, calls * n_envs, seconds)
