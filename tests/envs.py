"""Tiny deterministic envs whose fragments have exact, predictable values,
and the envs that fail, stall or break the layout on purpose.

They live in an importable module (not conftest) so that worker processes
started with spawn or forkserver can unpickle them by reference.
"""
import functools
import multiprocessing
import os
import signal
import time

import gymnasium
import numpy as np
from gymnasium import spaces

from bounds import JOIN  # the reason in bounds.py


class CountingEnv(gymnasium.Env):
    """Observation = steps since reset + 100 * episode index + offset.

    The reward is the action (Discrete(5)); the episode terminates after
    ``term_every`` steps or is truncated at ``trunc_at`` steps, whichever
    comes first (None: never). ``info`` holds ``t`` (steps) on every step
    and ``done`` only at the end of an episode.
    """

    def __init__(self, term_every=None, trunc_at=None, offset=0.0):
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,),
                                            np.float32)
        self.action_space = spaces.Discrete(5)
        self.term_every, self.trunc_at, self.offset = (
            term_every, trunc_at, offset)
        self.n_episodes, self.t = -1, 0

    def _obs(self):
        return np.array([self.t + 100 * self.n_episodes + self.offset],
                        np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.offset = float(self.np_random.integers(1000)) * 1000
        self.n_episodes += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        terminated = (self.term_every is not None
                      and self.t % self.term_every == 0)
        truncated = self.trunc_at is not None and self.t >= self.trunc_at
        info = {"t": self.t}
        if terminated or truncated:
            info["done"] = 1.0
        return self._obs(), float(action), terminated, truncated, info


class StructuredEnv(gymnasium.Env):
    """Dict observations and Tuple actions, deterministic.

    obs = {"pos": [t, -t] float32, "flag": t % 2 (Discrete(2)),
           "pair": (MultiDiscrete([3, 4]) = [t % 3, t % 4],
                    MultiBinary(3) = bits of t)}
    act = (Discrete(3), Box(-1, 1, (2,))); reward = a0 + sum(a1).
    Terminates every 4 steps.
    """

    def __init__(self, term_every=4):
        self.observation_space = spaces.Dict({
            "pos": spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "flag": spaces.Discrete(2),
            "pair": spaces.Tuple((spaces.MultiDiscrete([3, 4]),
                                  spaces.MultiBinary(3))),
        })
        self.action_space = spaces.Tuple((
            spaces.Discrete(3), spaces.Box(-1.0, 1.0, (2,), np.float32)))
        self.term_every, self.t = term_every, 0

    def _obs(self):
        t = self.t
        return {"pos": np.array([t, -t], np.float32), "flag": t % 2,
                "pair": (np.array([t % 3, t % 4]),
                         np.array([(t >> k) & 1 for k in range(3)],
                                  np.int8))}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        a0, a1 = action
        self.t += 1
        return (self._obs(), float(a0) + float(np.sum(a1)),
                self.t % self.term_every == 0, False, {})


class FaultyEnv(CountingEnv):
    """A CountingEnv that fails on purpose, for the fault matrix.

    ``fault`` is one of ``"reset"`` (raise in reset), ``"step"`` (raise in
    step), ``"exit"`` (``os._exit(3)`` in step), ``"kill"`` (SIGKILL itself
    in step), ``"segfault"``; a step fault happens at the ``at``-th step
    since the env was made. Episodes terminate every ``term_every`` steps
    (``None``: never, so that ``at`` is a step of the first episode).
    """

    def __init__(self, fault, at=3, term_every=None):
        super().__init__(term_every=term_every, trunc_at=None)
        self.fault, self.at, self.steps = fault, at, 0

    def reset(self, *, seed=None, options=None):
        if self.fault == "reset":
            raise RuntimeError("reset failed on purpose")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps >= self.at:
            if self.fault == "step":
                raise ValueError("step failed on purpose")
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "segfault":
                import ctypes
                import faulthandler
                faulthandler.disable()  # no stack dump in the test log
                ctypes.string_at(0)
        return super().step(action)


def counting_factory(term_every=None, trunc_at=None):
    """A module-level factory (picklable by reference)."""
    return CountingEnv(term_every=term_every, trunc_at=trunc_at)


def mixed_factory(seed):
    """Half the envs (by their seed) terminate every 3 steps, all are
    truncated at 4: both kinds of episode end within a few fragments."""
    return CountingEnv(term_every=3 if seed % 2 else None, trunc_at=4)


# the numeric info keys of a CountingEnv, for ``env_info=``
ENV_INFO = {"t": 0, "done": 0.0}


def failing_factory():
    raise RuntimeError("factory failed on purpose")


class StallingEnv(CountingEnv):
    """Stalls (sleeps for a minute) from step 6 on."""

    def step(self, action):
        if self.t >= 5:
            time.sleep(60)
        return super().step(action)


class InPlaceEnv(gymnasium.Env):
    """Box(-inf, inf, (2,)) actions (or, with ``nested=True``,
    ``(Discrete(2), Box(-inf, inf, (2,)))``), unbounded so that collection
    clips nothing, that ``step`` clips *in place* (``np.clip(a, -1, 1,
    out=a)``), as some envs and wrappers do (not with ``clip=False``), and
    keeps: ``kept`` holds every action object it was
    given, ``seen`` a copy of each as it arrived. Observation = steps since
    reset; reward = the sum of the (clipped) action; never ends."""

    def __init__(self, nested=False, clip=True):
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,),
                                            np.float32)
        box = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = spaces.Tuple((spaces.Discrete(2), box)) \
            if nested else box
        self.nested, self.clip = nested, clip
        self.t, self.kept, self.seen = 0, [], []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        box = action[1] if self.nested else action
        self.kept.append(box)
        self.seen.append(np.array(box))
        if self.clip:
            np.clip(box, -1.0, 1.0, out=box)
        self.t += 1
        return (np.array([self.t], np.float32), float(box.sum()), False,
                False, {})


class SpacesEnv(gymnasium.Env):
    """Any spaces, scripted observations: ``obs(episode, t)`` gives the
    observation at step ``t`` of episode ``episode`` (``t = 0`` at reset).
    Reward 1; terminates after ``term_every`` steps (None: never);
    ``actions`` logs what ``step`` got."""

    def __init__(self, observation_space, action_space, obs, term_every=None):
        self.observation_space, self.action_space = (observation_space,
                                                      action_space)
        self.obs, self.term_every = obs, term_every
        self.episode, self.t, self.actions = -1, 0, []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self.obs(self.episode, 0), {}

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        terminated = self.term_every is not None and \
            self.t % self.term_every == 0
        return self.obs(self.episode, self.t), 1.0, terminated, False, {}


# --------------------------------------------- envs that fail once, or a few
# times, in the whole run, whichever process gets there first (restarts) --

def claim(markers):
    """The first of ``markers`` (paths) that this call creates, or
    ``None``: each is created atomically (``O_CREAT | O_EXCL``), so that
    it is claimed by exactly one call in all the processes of a run."""
    for marker in markers:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                             0o600))
        except FileExistsError:
            continue
        return marker
    return None


def in_worker(worker):
    """Whether this process is worker ``worker`` of a generator (its
    processes are named ``rlplay-<generator>-<worker>``)."""
    name = multiprocessing.current_process().name
    return name.startswith("rlplay-") and name.rsplit("-", 1)[1] == \
        str(worker)


class FlakyEnv(CountingEnv):
    """A CountingEnv (terminating every ``term_every`` steps) that fails
    at its ``at``-th step since it was made, in worker ``worker`` only,
    each time it claims one of ``markers`` (:func:`claim`): with one
    marker, once in the run; with ``n``, in ``n`` generations of the
    worker.

    ``fault``: ``"exit"`` (``os._exit(3)``), ``"kill"`` (SIGKILLs itself),
    ``"step"`` (raises ``ValueError``), ``"hang"`` (writes its pid to
    ``<marker>.pid`` and sleeps up to ``hang_for`` s, to be killed from
    outside), ``"obs"`` (returns an observation of the wrong shape, which
    rlplay's own checks refuse).
    """

    def __init__(self, fault, markers, at=6, worker=0, term_every=3,
                 hang_for=30.0):
        super().__init__(term_every=term_every)
        self.fault, self.markers, self.at = fault, tuple(markers), at
        self.worker, self.hang_for, self.steps = worker, hang_for, 0

    def step(self, action):
        self.steps += 1
        marker = None
        if self.steps == self.at and in_worker(self.worker):
            marker = claim(self.markers)
        if marker is not None:
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "step":
                raise ValueError("step failed on purpose")
            if self.fault == "hang":
                # say who hangs where (whole, by a rename) and wait
                with open(marker + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(marker + ".tmp", marker + ".pid")
                time.sleep(self.hang_for)
            if self.fault == "obs":
                super().step(action)
                return np.zeros(3, np.float32), 0.0, False, False, {}
        return super().step(action)


def flaky_factory(seed=None, *, failing_seeds=(), factory_markers=(),
                  **kwargs):
    """A :class:`FlakyEnv` (``kwargs``); the factory itself raises when
    the engine gives it one of ``failing_seeds`` (those of a later
    generation, say) and it claims one of ``factory_markers``."""
    if seed in failing_seeds and claim(factory_markers) is not None:
        raise RuntimeError("factory failed on purpose")
    return FlakyEnv(**kwargs)


class RandomCrashEnv(CountingEnv):
    """A CountingEnv (terminating every ``term_every`` steps) that crashes
    at random: after its first ``safe`` steps, each step crashes with
    probability ``rate`` (``os._exit``, a SIGKILL, or an exception, at
    random), drawn from a generator seeded with the ``seed`` its factory
    gets. Never within its first ``safe`` steps, so that a replacement
    delivers its first fragment (or two failures in a row would be a crash
    loop)."""

    def __init__(self, seed=None, rate=0.01, safe=8, term_every=3):
        super().__init__(term_every=term_every)
        self.rng = np.random.default_rng(seed)
        self.rate, self.safe, self.steps = rate, safe, 0

    def step(self, action):
        self.steps += 1
        if self.steps > self.safe and self.rng.random() < self.rate:
            kind = self.rng.integers(3)
            if kind == 0:
                os._exit(5)
            if kind == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            raise ConnectionError("the simulator went away on purpose")
        return super().step(action)


def random_crash_factory(seed=None, rate=0.01, safe=8, term_every=3):
    """A module-level factory of :class:`RandomCrashEnv` (takes ``seed=``)."""
    return RandomCrashEnv(seed, rate, safe, term_every)


# ----------------------------------- envs of tests/test_guarantees.py: they
# stall, fail at a known time, or start processes of their own, in worker
# processes only (the learner's probe env never steps) --

def worker_index():
    """This process's worker index, or ``None`` outside a generator's
    worker (its processes are named ``rlplay-<generator>-<worker>``)."""
    name = multiprocessing.current_process().name
    if not name.startswith("rlplay-"):
        return None
    return int(name.rsplit("-", 1)[1])


class StallEnv(CountingEnv):
    """A CountingEnv whose ``at``-th step since it was made stalls in a
    worker (``worker``: only in that one): it writes a file named after its
    pid in ``marker_dir`` (if given), then sleeps ``stall_for`` seconds
    and goes on."""

    def __init__(self, at=1, worker=None, marker_dir=None, stall_for=1000.0,
                 term_every=None):
        super().__init__(term_every=term_every)
        self.at, self.worker, self.marker_dir = at, worker, marker_dir
        self.stall_for, self.steps = stall_for, 0

    def _stalls(self):
        index = worker_index()
        return index is not None and self.worker in (None, index)

    def step(self, action):
        self.steps += 1
        if self.steps == self.at and self._stalls():
            if self.marker_dir is not None:
                path = os.path.join(self.marker_dir, str(os.getpid()))
                with open(path + ".tmp", "w") as f:
                    f.write(str(time.time()))
                os.replace(path + ".tmp", path)  # whole, or not at all
            time.sleep(self.stall_for)
        return super().step(action)


class StampedFailure(Exception):
    """Raised by :class:`LateErrorEnv`; its message ends with the
    ``time.time()`` at which it was raised."""


class LateErrorEnv(CountingEnv):
    """A CountingEnv that, in worker ``worker``, sleeps ``delay`` seconds
    at its ``at``-th step and raises :class:`StampedFailure` stamped with
    the time; in any other worker it stalls for good at step
    ``stall_others_at`` (``None``: never)."""

    def __init__(self, at, delay=0.3, worker=0, stall_others_at=None):
        super().__init__()
        self.at, self.delay, self.worker = at, delay, worker
        self.stall_others_at, self.steps = stall_others_at, 0

    def step(self, action):
        self.steps += 1
        index = worker_index()
        if index == self.worker and self.steps == self.at:
            time.sleep(self.delay)
            raise StampedFailure(f"failed on purpose at {time.time()!r}")
        if index not in (None, self.worker) and \
                self.steps == self.stall_others_at:
            time.sleep(1000.0)
        return super().step(action)


def stalling_factory(stall_for=1000.0):
    """A CountingEnv, after ``stall_for`` seconds in a worker (none in the
    learner)."""
    if worker_index() is not None:
        time.sleep(stall_for)
    return CountingEnv()


def _helper_main(conn):
    # an env's helper process (a simulator server, say): echoes until its
    # env ends it
    try:
        while True:
            conn.send(conn.recv())
    except (EOFError, OSError):
        pass


class HelperProcessEnv(CountingEnv):
    """A CountingEnv that starts a helper process (a ``multiprocessing``
    child, of the ``start_method`` context) when made and ends it in
    ``close()``; it writes the helper's pid to a file in ``pid_dir``."""

    def __init__(self, start_method, pid_dir):
        super().__init__()
        ctx = multiprocessing.get_context(start_method)
        self.conn, child = ctx.Pipe()
        self.helper = ctx.Process(target=_helper_main, args=(child,),
                                  name="env-helper")
        self.helper.start()
        child.close()
        path = os.path.join(pid_dir, str(self.helper.pid))
        with open(path, "w") as f:
            f.write(str(os.getpid()))

    def step(self, action):
        self.conn.send(self.t)  # the helper takes part in every step
        assert self.conn.recv() == self.t
        return super().step(action)

    def close(self):
        if self.helper is not None:
            self.conn.close()
            self.helper.terminate()
            self.helper.join(JOIN)
            self.helper = None
        super().close()


# ------------------------------- envs of the layout and error tests: info
# at episode ends, bad observations and rewards, the pre-1.0 step API,
# cycling episode lengths --

class EpisodeInfoEnv(CountingEnv):
    """A CountingEnv whose info has a nested ``episode`` entry at the end of
    an episode only: ``{"r": return, "l": length}`` (as Gymnasium's
    ``RecordEpisodeStatistics`` does)."""

    def reset(self, *, seed=None, options=None):
        self.ret = 0.0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        self.ret += rew
        if terminated or truncated:
            info["episode"] = {"r": self.ret, "l": self.t}
        return obs, rew, terminated, truncated, info


class BadShapeEnv(CountingEnv):
    """A CountingEnv (``Box`` of shape ``(1,)``) whose observation has shape
    ``(2,)`` at reset (``at=0``) or at step ``at`` of its first episode."""

    def __init__(self, at, **kwargs):
        super().__init__(**kwargs)
        self.at = at

    def _obs(self):
        obs = super()._obs()
        if self.n_episodes == 0 and self.t == self.at:
            return np.zeros(2, np.float32)
        return obs


class BadKeyEnv(StructuredEnv):
    """A StructuredEnv whose observation at reset (``at=0``) or at step
    ``at`` has ``"speed"`` instead of ``"flag"`` (or, with ``extra=True``,
    ``"speed"`` as well as ``"flag"``)."""

    def __init__(self, at, extra=False):
        super().__init__(term_every=100)
        self.at, self.extra = at, extra

    def _obs(self):
        obs = super()._obs()
        if self.t == self.at:
            obs["speed"] = 1.0
            if not self.extra:
                del obs["flag"]
        return obs


class OldStepEnv(CountingEnv):
    """``step`` returns Gymnasium's pre-1.0 4-tuple."""

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        return obs, rew, terminated or truncated, info


class CyclingEnv(CountingEnv):
    """A CountingEnv whose episodes terminate after ``lengths[i % n]``
    steps in episode ``i``, so that episode ends fall on different rows
    of successive fragments (truncation at ``trunc_at`` as before)."""

    def __init__(self, lengths, trunc_at=None):
        super().__init__(term_every=None, trunc_at=trunc_at)
        self.lengths = tuple(lengths)

    def step(self, action):
        length = self.lengths[self.n_episodes % len(self.lengths)]
        obs, rew, terminated, truncated, info = super().step(action)
        if self.t == length:
            terminated = True
            info["done"] = 1.0
        return obs, rew, terminated, truncated, info


class BadRewardEnv(CountingEnv):
    """A CountingEnv whose ``at``-th step returns ``reward`` as its reward
    (a string, say)."""

    def __init__(self, reward="1.0", at=2, **kwargs):
        super().__init__(**kwargs)
        self.reward, self.at, self.steps = reward, at, 0

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.steps == self.at:
            rew = self.reward
        return obs, rew, terminated, truncated, info


# ----------------------------------------------- batched sources (vector) --

class EndsEnv(CountingEnv):
    """A CountingEnv whose episodes end at steps that depend on its reset
    seed (the offset): terminated where ``(t + offset // 1000) % 7 == 0``,
    truncated at ``trunc_at`` steps; so that the columns of a batch end at
    different rows, by termination or by truncation."""

    def __init__(self, trunc_at=5):
        super().__init__(term_every=None, trunc_at=trunc_at)

    def step(self, action):
        obs, rew, terminated, truncated, info = super().step(action)
        if (self.t + int(self.offset) // 1000) % 7 == 0:
            terminated = True
            info["done"] = 1.0
        return obs, rew, terminated, truncated, info


def ends_vector(k=4, mode="same_step", asynchronous=False, shared=True,
                trunc_at=5):
    """A Gymnasium vector env of ``k`` :class:`EndsEnv` in autoreset
    ``mode`` (``SyncVectorEnv``, or ``AsyncVectorEnv`` with or without
    shared memory)."""
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
    fns = [lambda: EndsEnv(trunc_at=trunc_at)] * k
    mode = AutoresetMode[mode.upper()]
    if asynchronous:
        return AsyncVectorEnv(fns, shared_memory=shared, autoreset_mode=mode)
    return SyncVectorEnv(fns, autoreset_mode=mode)


class LateVectorEnv(gymnasium.vector.VectorEnv):
    """``k`` :class:`EndsEnv` as a native vector env with next-step
    autoreset and no partial reset (as Gymnasium's ``CartPoleVectorEnv``:
    ``reset`` takes one seed and resets every env, whatever its options).
    ``calls`` logs every step: the actions, and per env whether the call
    was a reset (the action ignored), the observation, reward and ends."""

    metadata = {"autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, k=4, trunc_at=5):
        from gymnasium.vector.utils import batch_space
        self.envs = [EndsEnv(trunc_at=trunc_at) for _ in range(k)]
        self.num_envs = k
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space,
                                             k)
        self.action_space = batch_space(self.single_action_space, k)
        self.autoreset = np.zeros(k, bool)
        self.calls = []

    def reset(self, *, seed=None, options=None):
        rng = np.random.default_rng(seed)
        seeds = rng.integers(2**31, size=self.num_envs)
        obs = [env.reset(seed=int(s))[0] for env, s in zip(self.envs, seeds)]
        self.autoreset[:] = False
        return np.stack(obs), {}

    def step(self, actions):
        actions = np.array(actions)
        out = []
        for j, env in enumerate(self.envs):
            if self.autoreset[j]:
                obs, _ = env.reset()
                out.append((obs, 0.0, False, False, True))
            else:
                obs, rew, term, trunc, _ = env.step(int(actions[j]))
                out.append((obs, rew, term, trunc, False))
        obs, rew, term, trunc, was_reset = (np.array(x) for x in zip(*out))
        self.calls.append(dict(actions=actions, obs=obs.copy(), rew=rew,
                               terminated=term, truncated=trunc,
                               reset=was_reset))
        self.autoreset = term | trunc
        return obs, rew.astype(np.float64), term, trunc, {}


def late_vector(k=4, trunc_at=5):
    return LateVectorEnv(k, trunc_at)


class EmptyVectorEnv(LateVectorEnv):
    """A :class:`LateVectorEnv` of no envs (``num_envs=0``): a source of no
    columns."""

    def __init__(self):
        from gymnasium.vector.utils import batch_space
        super().__init__(1)
        self.envs, self.num_envs, self.autoreset = [], 0, np.zeros(0, bool)
        self.observation_space = batch_space(self.single_observation_space,
                                             0)
        self.action_space = batch_space(self.single_action_space, 0)


# ------------------------------------------------------- whole episodes --

class VaryingEnv(CountingEnv):
    """A CountingEnv whose episode ``k`` (from 0) lasts ``1 + (5 * k +
    offset // 1000) % 11`` steps, truncated where ``k % 3 == 1`` and
    terminated otherwise: episodes of 1 to 11 steps, both kinds of end,
    different in every column."""

    def __init__(self):
        super().__init__(term_every=None, trunc_at=None)

    def length(self, k):
        return 1 + (5 * k + int(self.offset) // 1000) % 11

    def step(self, action):
        obs, rew, _, _, info = super().step(action)
        end = self.t >= self.length(self.n_episodes)
        truncated = end and self.n_episodes % 3 == 1
        if end:
            info["done"] = 1.0
        return obs, rew, end and not truncated, truncated, info


def varying_factory():
    return VaryingEnv()


class EndlessEnv(CountingEnv):
    """A CountingEnv that never ends in env column ``j`` = 0 of a same
    generator (its offset is the first seen) and ends every 3 steps in the
    others: made with ``endless=True`` or not."""

    def __init__(self, endless):
        super().__init__(term_every=None if endless else 3)


SOURCES = ["same_step", "disabled", "next_step", "late", "singles", "sticky"]


def source_factory(source):
    """``(factory, generator keywords)`` of CountingEnv-like columns from
    each kind of source (:data:`SOURCES`): a vector env in each autoreset
    mode, a lost-call native vector env, single envs, sticky single
    envs."""
    if source == "late":
        return late_vector, {}
    if source in ("singles", "sticky"):
        return EndsEnv, {"sticky": source == "sticky"}
    return functools.partial(ends_vector, mode=source), {}


class RenderEnv(CountingEnv):
    """:class:`CountingEnv` (terminating every ``term_every`` steps) that
    renders ``rgb_array`` frames of 8 x 8 pixels, all of value ``40 * obs
    % 256``; each render appends a line to the file ``log`` (when given),
    so that a test sees renders made in a worker."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode=None, term_every=4, log=None):
        super().__init__(term_every=term_every)
        self.render_mode, self.log = render_mode, log

    def render(self):
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{self.t}\n")
        if self.render_mode != "rgb_array":
            return None
        return np.full((8, 8, 3), 40 * int(self._obs()[0]) % 256, np.uint8)


def render_factory(log=None, term_every=4):
    """A factory without ``render_mode``: its envs render nothing."""
    return RenderEnv(term_every=term_every, log=log)


# ------------------------------------ envs whose processes hang (vector) --

class HangingEnv(CountingEnv):
    """A CountingEnv that notes its process (a file ``env-<pid>`` in
    ``marker_dir``) and, at its ``hang_at``-th step, notes that it hangs
    (``hung-<pid>``) and sleeps for good, unless ``marker_dir`` holds a
    file ``stop-hanging`` by then."""

    def __init__(self, marker_dir, hang_at=None):
        super().__init__()
        self.marker_dir, self.hang_at, self.steps = marker_dir, hang_at, 0
        open(os.path.join(marker_dir, f"env-{os.getpid()}"), "w").close()

    def step(self, action):
        self.steps += 1
        if self.steps == self.hang_at and not os.path.exists(
                os.path.join(self.marker_dir, "stop-hanging")):
            open(os.path.join(self.marker_dir, f"hung-{os.getpid()}"),
                 "w").close()
            while True:
                time.sleep(1000.0)
        return super().step(action)


def hanging_vector(marker_dir, k=2, hang_at=None):
    """A ``gymnasium.vector.AsyncVectorEnv`` of ``k`` :class:`HangingEnv`
    (its subprocesses of multiprocessing's default context: forked, on
    Linux), each one a process of its own."""
    from gymnasium.vector import AsyncVectorEnv
    return AsyncVectorEnv([functools.partial(HangingEnv, marker_dir,
                                             hang_at)] * k)


# ------------------------------------------------ envs under control calls --

class LevelEnv(gymnasium.Env):
    """An env whose observation carries its level: ``obs = [level, t]``
    (``t``: steps since the reset), changed by ``set_level(k)`` at once
    (``k < 0`` raises ``ValueError``); the reward is the action
    (Discrete(5)) and the episode terminates every ``term_every`` steps.
    ``levels`` lists every level it was set to, in order."""

    def __init__(self, term_every=3):
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,),
                                            np.float32)
        self.action_space = spaces.Discrete(5)
        self.term_every, self.level, self.t, self.levels = term_every, 0, 0, []

    def set_level(self, k):
        if k < 0:
            raise ValueError(f"no level {k}")
        self.level = k
        self.levels.append(k)

    def _obs(self):
        return np.array([self.level, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return (self._obs(), float(action), self.t % self.term_every == 0,
                False, {})


def level_vector(k=2):
    """A ``SyncVectorEnv`` of ``k`` :class:`LevelEnv` (same-step autoreset):
    ``call_envs`` reaches them through ``VectorEnv.call``."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    return SyncVectorEnv([LevelEnv] * k,
                         autoreset_mode=AutoresetMode.SAME_STEP)


# ------------------------------------------------- PettingZoo parallel envs

try:  # the base class where PettingZoo is installed (rlplay[pettingzoo])
    from pettingzoo import ParallelEnv as _ParallelBase
except ImportError:  # the tests that use these envs skip
    _ParallelBase = object


class AgentsEnv(_ParallelBase):
    """A deterministic PettingZoo parallel env of three agents whose
    lives differ by episode ``k`` (0, 1, ...; steps ``t`` since the reset):

    - ``"a"``: from the reset to step ``3 + k % 3``, terminated there;
    - ``"b"``: spawned by step ``1 + k % 2``, leaves at step ``5 + k % 2``,
      truncated when ``k`` is even, else terminated;
    - ``"c"``: from the reset to step ``6 + k % 3``, truncated when
      ``k % 3 == 1``, else terminated; the last to leave (with ``"b"``
      when both leave at step 6), which ends the env's episode.

    An agent's observation is ``offset + 1000 * k + 100 * (i + 1) + t``
    (``i`` its index, ``offset`` drawn from the reset seed), its reward
    the action it got plus ``i / 4``; an agent spawned by a step gets a
    reward of 0.5 there (which no action of its earned). ``infos[agent]``
    holds ``t``. A step must get exactly the live agents' actions.
    ``spaces_differ`` gives ``"c"`` a Discrete(3) action space.
    """

    metadata = {"name": "agents_v0"}
    render_mode = None

    def __init__(self, spaces_differ=False):
        self.possible_agents = ["a", "b", "c"]
        box = spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self._obs_spaces = dict.fromkeys(self.possible_agents, box)
        self._act_spaces = {agent: spaces.Discrete(5)
                            for agent in self.possible_agents}
        if spaces_differ:
            self._act_spaces["c"] = spaces.Discrete(3)
        self.offset, self.k, self.t = 0.0, -1, 0
        self.agents = []

    def observation_space(self, agent):
        return self._obs_spaces[agent]

    def action_space(self, agent):
        return self._act_spaces[agent]

    def lives(self, k=None):
        """``{agent: (spawn, end, truncated)}`` of episode ``k`` (the
        current one by default)."""
        k = self.k if k is None else k
        return {"a": (0, 3 + k % 3, False),
                "b": (1 + k % 2, 5 + k % 2, k % 2 == 0),
                "c": (0, 6 + k % 3, k % 3 == 1)}

    def _obs(self, agent):
        i = self.possible_agents.index(agent)
        return np.array([self.offset + 1000 * self.k + 100 * (i + 1)
                         + self.t], np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.offset = float(np.random.default_rng(seed).integers(100)
                                * 100_000)
        self.k, self.t = self.k + 1, 0
        self.agents = [agent for agent, (spawn, _, _) in self.lives().items()
                       if spawn == 0]
        return ({agent: self._obs(agent) for agent in self.agents},
                {agent: {} for agent in self.agents})

    def step(self, actions):
        if set(actions) != set(self.agents):
            raise AssertionError(f"actions for {sorted(actions)}, live "
                                 f"agents {sorted(self.agents)}")
        self.t += 1
        lives, t = self.lives(), self.t
        obs, rew, term, trunc, infos = {}, {}, {}, {}, {}
        spawned = [agent for agent, (spawn, _, _) in lives.items()
                   if spawn == t]
        for agent in self.agents + spawned:
            _, end, truncated = lives[agent]
            i = self.possible_agents.index(agent)
            obs[agent] = self._obs(agent)
            rew[agent] = (float(actions[agent]) + i / 4
                          if agent in actions else 0.5)
            term[agent] = end == t and not truncated
            trunc[agent] = end == t and truncated
            infos[agent] = {"t": float(t)}
        self.agents = [agent for agent in self.agents + spawned
                       if not (term[agent] or trunc[agent])]
        return obs, rew, term, trunc, infos

    def render(self):
        return None

    def close(self):
        pass

    @property
    def unwrapped(self):
        return self


def agents_factory(spaces_differ=False):
    return AgentsEnv(spaces_differ)


class BuggyAgentsEnv(AgentsEnv):
    """An AgentsEnv with a bug at step 3: ``"missing"`` leaves agent "c"
    out of the observations, ``"unflagged"`` removes agent "a" from
    ``agents`` without a flag (it terminates at step 3 of episode 0),
    ``"lingering"`` keeps it in ``agents`` after its termination."""

    def __init__(self, bug):
        super().__init__()
        self.bug = bug

    def step(self, actions):
        obs, rew, term, trunc, infos = super().step(actions)
        if self.t == 3:
            if self.bug == "missing":
                del obs["c"]
            elif self.bug == "unflagged":
                term["a"] = False
            else:
                self.agents.append("a")
        return obs, rew, term, trunc, infos


class AbsentAgentEnv(AgentsEnv):
    """An AgentsEnv whose agent ``"b"`` never spawns (it stays in
    ``possible_agents``): ``"a"`` and ``"c"`` live as in AgentsEnv."""

    def lives(self, k=None):
        lives = super().lives(k)
        lives["b"] = (-1, -1, False)  # no step spawns it, no reset has it
        return lives


def absent_agent_factory():
    return AbsentAgentEnv()


class LevelAgentsEnv(_ParallelBase):
    """:class:`LevelEnv` as a PettingZoo parallel env of agents ``"a"``
    and ``"b"``: each observes ``[level, t]``, gets its action as reward,
    and both terminate every ``term_every`` steps (the env then resets);
    ``set_level(k)`` changes the level at once (``k < 0`` raises
    ``ValueError``), ``levels`` lists every level it was set to."""

    metadata = {"name": "level_agents_v0"}
    render_mode = None

    def __init__(self, term_every=3):
        self.possible_agents = ["a", "b"]
        self._obs_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self._act_space = spaces.Discrete(5)
        self.term_every, self.level, self.t, self.levels = term_every, 0, 0, []
        self.agents = []

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def set_level(self, k):
        if k < 0:
            raise ValueError(f"no level {k}")
        self.level = k
        self.levels.append(k)

    def _obs(self):
        return {agent: np.array([self.level, self.t], np.float32)
                for agent in self.agents}

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return self._obs(), {agent: {} for agent in self.agents}

    def step(self, actions):
        assert sorted(actions) == sorted(self.agents), actions
        self.t += 1
        ended = self.t % self.term_every == 0
        obs = self._obs()
        rew = {agent: float(actions[agent]) for agent in self.agents}
        term = dict.fromkeys(self.agents, ended)
        trunc = dict.fromkeys(self.agents, False)
        infos = {agent: {} for agent in self.agents}
        if ended:
            self.agents = []
        return obs, rew, term, trunc, infos


class NoAgentsEnv(AgentsEnv):
    """An AgentsEnv without any possible agent (a source of no columns)."""

    def __init__(self):
        super().__init__()
        self.possible_agents = []
