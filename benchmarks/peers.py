"""The peers' vector envs as rows of ``throughput.py``'s ``cartpole`` and
``busy`` sections: Stable-Baselines3's ``SubprocVecEnv`` and PufferLib's
``Serial`` and ``Multiprocessing`` (pufferlib-core), over the section's
Gymnasium envs, driven by the same actor into the hand loop's arrays (one
actor call a step on the batch of observations, a torch view of the
arrays, its actions as a numpy array; under the harness's
``torch.no_grad()``). ``README.md`` here says what each row measures.

PufferLib's ``Multiprocessing`` runs here with one worker process that
steps every env of the row (8) into shared memory, the actor in this
process. Its processes spin-wait: the worker polls its flag without
sleeping for half a second after its last step, and this process polls
the workers' flags in ``recv`` without ever sleeping, so each takes a
whole core while the row runs. One worker is the most that a two-core
machine holds beside this process (PufferLib itself refuses more workers
than physical cores unless told to overwork them).

The peers are imported only when a row runs (PufferLib's import takes
seconds, and under ``forkserver`` every worker of the other rows would
pay it); a row whose package is missing is skipped with a note.
"""
import functools
import threading
from multiprocessing import connection

import numpy as np

from harness import timed
from workloads import N_ENVS, Arrays

__all__ = ["PUFFER_WORKERS", "run_sb3_vec", "run_puffer", "puffer_loop"]

# the worker processes of the Multiprocessing rows (their names say it)
PUFFER_WORKERS = 1
# how long close() waits for a worker it terminated, then for one it
# killed (seconds)
JOIN_SECONDS = 5.0
# how often the watch re-releases this process's wait once a worker died
# (seconds)
RELEASE_SECONDS = 0.01

PUFFER_MISSING = (
    "PufferLib is not installed (make test installs pufferlib-core, "
    "pinned in the Makefile, without its dependencies: its wheel pins "
    "another torch)")


def run_sb3_vec(factory, actor, n_steps, seconds, n_envs=N_ENVS):
    """Stable-Baselines3's ``SubprocVecEnv`` of ``n_envs`` envs (a process
    each, observations through pipes, same-step autoreset), its steps/s:
    ``real_workloads.run_sb3`` without the memory columns, which only the
    real sections print."""
    from real_workloads import run_sb3
    result = run_sb3(factory, actor, n_steps, seconds, n_envs)
    if isinstance(result, str):
        return result
    return {key: value for key, value in result.items()
            if key not in ("bytes_per_step", "shm_per_worker")}


def run_puffer(backend, factory, actor, n_steps, seconds, n_envs=N_ENVS,
               n_workers=PUFFER_WORKERS):
    """:func:`puffer_loop` timed for ``seconds``; why the row is skipped
    where PufferLib is not installed."""
    try:
        import pufferlib.vector  # noqa: F401 - the row needs it
    except ImportError:
        return PUFFER_MISSING
    fragment, close = puffer_loop(backend, factory, actor, n_steps, n_envs,
                                  n_workers)
    try:
        return timed(fragment, n_steps * n_envs, seconds)
    finally:
        close()


def puffer_loop(backend, factory, actor, n_steps, n_envs=N_ENVS,
                n_workers=PUFFER_WORKERS):
    """PufferLib's vector env ``backend`` (``"Serial"``: the envs in this
    process; ``"Multiprocessing"``: in ``n_workers`` processes that write
    into shared memory) over ``n_envs`` of ``factory``'s Gymnasium envs
    (each behind its ``GymnasiumPufferEnv``), reset with seeds ``0, 1,
    ...``, driven as the hand loop: ``(fragment, close)``, ``fragment()``
    collecting ``n_steps`` rows into preallocated arrays
    (``fragment.arrays``, :class:`~workloads.Arrays`), one ``send`` of the
    actions and one ``recv`` a row, whose observations, rewards and done
    flags it copies there.

    PufferLib resets an env on the step after its episode ended (the
    action of that step is dropped, its reward is 0), as a vector env with
    next-step autoreset does: every step counts as one, as in the rows
    over such envs."""
    import pufferlib.emulation
    import pufferlib.vector
    creator = functools.partial(pufferlib.emulation.GymnasiumPufferEnv,
                                env_creator=factory)
    kwargs = {"num_workers": n_workers} if backend == "Multiprocessing" \
        else {}
    vecenv = pufferlib.vector.make(creator, backend=backend,
                                   num_envs=n_envs, **kwargs)
    watch = _Watch(vecenv)
    try:
        probe = factory()
        buf = Arrays(probe.observation_space, n_steps, n_envs,
                     probe.action_space)
        probe.close()
        vecenv.async_reset(0)
        buf.obs[0] = watch.checked(vecenv.recv())[0]
    except BaseException:
        watch.close()
        raise

    def fragment():
        obs, act, rew, done = buf.obs, buf.act, buf.rew, buf.done
        for t in range(n_steps):
            actions = actor.sample(buf.obs_pyt[t]).numpy()
            act[t] = actions
            vecenv.send(actions)
            obs[t + 1], rew[t], terminated, truncated = watch.checked(
                vecenv.recv())[:4]
            np.logical_or(terminated, truncated, out=done[t])
        obs[0] = obs[n_steps]

    fragment.arrays = buf
    return fragment, watch.close


class _Watch:
    """Makes the death of a PufferLib worker process an error, not a hang.

    ``Multiprocessing.recv`` polls the workers' flags until they say done,
    with no bound: a worker that died would leave it polling forever. A
    thread waits here on the workers' sentinels; once one has ended, it
    sets every flag to done again and again, so that ``recv`` returns, and
    :meth:`checked` raises ``RuntimeError`` with the exit code. (A worker
    that lives but never answers still stalls ``recv``: the envs here
    cannot, and PufferLib's loop gives no hook to time it out.) ``close``
    closes the vector env, then joins its workers (it terminates them and
    does not wait), each wait bounded. Nothing to watch for ``Serial``."""

    def __init__(self, vecenv):
        import pufferlib.vector
        self.vecenv, self.dead = vecenv, None
        self.done_flag = pufferlib.vector.MAIN  # a worker's "done"
        self.processes = list(getattr(vecenv, "processes", ()))
        self.stop = threading.Event()
        self.thread = None
        if self.processes:
            self.thread = threading.Thread(target=self._watch, daemon=True)
            self.thread.start()

    def _watch(self):
        ended = connection.wait([p.sentinel for p in self.processes])
        if self.stop.is_set():  # close() ended them
            return
        process = next(p for p in self.processes if p.sentinel in ended)
        process.join(JOIN_SECONDS)
        self.dead = process.exitcode
        flags = self.vecenv.buf["semaphores"]
        while not self.stop.wait(RELEASE_SECONDS):
            flags[:] = self.done_flag

    def checked(self, received):
        """``received`` (what ``recv`` returned), once no worker died."""
        if self.dead is not None:
            raise RuntimeError(f"a PufferLib worker process died (exit code "
                               f"{self.dead})")
        return received

    def close(self):
        self.stop.set()
        self.vecenv.close()
        for process in self.processes:
            process.join(JOIN_SECONDS)
            if process.is_alive():
                process.kill()
                process.join(JOIN_SECONDS)
        if self.thread is not None:
            self.thread.join(JOIN_SECONDS)

