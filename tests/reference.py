"""The brute-force reference of the generators' tests: a worker's fragments
collected in this process with the core loop alone (no generator, no
process, no shared memory), from the seeds the engine gives that worker's
generation."""
import numpy as np
import torch

from rlplay.engine.core import collect, prepare, startup
from rlplay.engine.envs import close_envs, make_envs
from rlplay.engine.nested import suply
from rlplay.engine.seeds import env_seed_sequences

__all__ = ["reference"]


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
