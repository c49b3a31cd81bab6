"""The brute-force reference of the generators' tests: a worker's fragments
collected in this process with the core loop alone (no generator, no
process, no shared memory), from the seeds the engine gives that worker's
generation."""
import numpy as np
import torch

from rlplay.engine.core import collect, prepare, startup
from rlplay.engine.envs import close_envs, make_envs
from rlplay.engine.nested import suply
from rlplay.engine.seeds import env_seed_sequences, reset_seed

__all__ = ["reference", "brute_episodes", "column_seeds"]


def reference(factory, actor, n_steps, n_envs, entropy, *, worker=0, count,
              env_info=None, generation=0, seq=0, final=True):
    """Fragments ``seq .. seq + count - 1`` of worker ``worker`` as its
    generation ``generation`` collects them from its start.

    Parameters
    ----------
    factory, actor
        The generator's (``actor`` deterministic, or seeded as the
        worker's).
    n_steps, n_envs : int
        ``T``, and the ``B`` envs of one worker (its env ids are
        ``worker * B .. (worker + 1) * B - 1``).
    entropy : int or None
        The generator's ``entropy``: the envs get the seeds of
        ``env_seed_sequences(entropy, n_envs, worker, generation)``.
    worker, generation, seq : int
        Recorded in ``meta.worker``, ``meta.generation`` and (for the
        first fragment) ``meta.seq``: a replacement starts from resets and
        goes on from the last ``meta.seq`` received.
    count : int
        How many fragments.
    env_info, final
        As the generator's.

    Returns
    -------
    fragments : list of Fragment
        Torch copies, ``meta.version`` 0.
    """
    seeds = env_seed_sequences(entropy, n_envs, worker, generation)
    envs = make_envs(factory, seeds)
    try:
        buffer = prepare(envs[0], actor, n_steps, n_envs, env_info=env_info,
                         final=final)
        ctx = startup(envs, actor, buffer, seeds, worker=worker,
                      env_ids=np.arange(worker * n_envs,
                                        (worker + 1) * n_envs),
                      generation=generation, seq=seq)
        fragments = []
        for _ in range(count):
            collect(actor, buffer, ctx)
            fragments.append(suply(torch.clone, buffer.pyt))
    finally:
        close_envs(envs)
    return fragments


# ---------------------------------------------------- brute-force episodes --

def brute_episodes(env, seed, count, *, hx_first, hx_reset):
    """The first ``count`` episodes of ``env`` reset with ``seed``, one step
    at a time, under CountingActor's policy (``act = (x + stepno) % 5``,
    ``hx`` adds ``(x, stepno)`` at every state, ``info`` = ``value = x / 2``
    and that ``hx``)."""
    episodes = []
    obs, _ = env.reset(seed=seed)
    hx = np.array(hx_first, np.float32)
    while len(episodes) < count:
        ep = dict(obs=[obs[0]], act=[], rew=[], value=[], h=[], t=[],
                  done=[], hx=hx.copy())
        k = 0
        while True:
            x = float(obs[0])
            hx = hx + np.array([x, k], np.float32)
            act = (int(x) + k) % 5
            ep["act"].append(act)
            ep["value"].append(x * 0.5)
            ep["h"].append(hx.copy())
            obs, rew, terminated, truncated, info = env.step(act)
            ep["rew"].append(rew)
            ep["t"].append(info["t"])
            ep["done"].append(info.get("done", 0.0))
            ep["obs"].append(obs[0])
            k += 1
            if terminated or truncated:
                ep.update(terminated=terminated, truncated=truncated,
                          length=k, ret=float(sum(ep["rew"])))
                break
        episodes.append(ep)
        obs, _ = env.reset()
        hx = np.array(hx_reset, np.float32)
    return episodes


def column_seeds(entropy, n_envs, worker=0, generation=0):
    return [reset_seed(ss) for ss in
            env_seed_sequences(entropy, n_envs, worker, generation)]
