"""The seeding tree of a run: one ``entropy``, a ``SeedSequence`` for
everything.

Every seed of a run is a child of one :class:`numpy.random.SeedSequence`
(the *root*, made from ``entropy``; fresh OS entropy when it is ``None``),
addressed by its ``spawn_key``, so that a child never depends on how many
siblings there are (collector 0 of a pool of 8 sees the seeds of a lone
collector)::

    root (entropy)
    ├── (i,)                collector i, generation 0: worker i of a pool,
    │   │                   the worker of ``single``, the caller of ``same``
    │   │                   (i = 0); its own state seeds the collector's
    │   │                   random, numpy and torch generators
    │   └── (i, j)          env j of that collector: reset seed, spaces;
    │       └── (i, j, e)   ... the e-th evaluation's resets (evaluator)
    ├── (EVAL_COLLECTOR,)   the evaluator's worker, laid out as a collector
    ├── (PROBE_COLLECTOR,)  the learner's probe env (sizes the buffers)
    ├── (RESTART_BRANCH,)   replacements of failed workers:
    │   └── (RESTART_BRANCH, i, g)      worker i, generation g >= 1,
    │       └── (RESTART_BRANCH, i, g, j)   laid out as a collector
    └── (RESUME_BRANCH,)    continuations of a stopped run:
        └── (RESUME_BRANCH, r)  the root of resume number r >= 1, with
                                the whole tree above beneath it

So a replacement never repeats the streams of the worker it replaces, nor
those of another worker, the probe or the evaluator, a continuation never
repeats a stream of the run before it (nor of another continuation of that
run), and a run with the same failures (and resumes) is reproducible.
"""
import random

import numpy as np
import torch

__all__ = [
    "PROBE_COLLECTOR",
    "EVAL_COLLECTOR",
    "RESTART_BRANCH",
    "RESUME_BRANCH",
    "seed_sequence",
    "resume_root",
    "collector_seed_sequence",
    "env_seed_sequences",
    "reset_seed",
    "shared_seed",
    "source_reset_seed",
    "next_reset_seeds",
    "torch_seed",
    "seed_worker",
]

# collector indices far from every worker's (0, 1, ...)
PROBE_COLLECTOR = 2**31 - 1
EVAL_COLLECTOR = 2**31 - 2
# the branch of the tree that replacement workers draw from
RESTART_BRANCH = 2**31 - 3
# the branch of the tree that continuations of a stopped run draw from
RESUME_BRANCH = 2**31 - 4
# a source that takes one seed for all its envs gets one below this bound
# less its number of envs (shared_seed)
SEED_BOUND = 2**31


def seed_sequence(entropy=None):
    """The run's root ``SeedSequence`` (fresh OS entropy when ``None``)."""
    if isinstance(entropy, np.random.SeedSequence):
        return entropy
    return np.random.SeedSequence(entropy)


def resume_root(entropy, resumes):
    """The root of resume number ``resumes`` of the run of ``entropy``: the
    run's own root for 0, the child ``(RESUME_BRANCH, resumes)`` of it
    otherwise (see the module docstring)."""
    root = seed_sequence(entropy)
    if resumes == 0:
        return root
    return _child(root, RESUME_BRANCH, resumes)


def _child(root, *key):
    return np.random.SeedSequence(root.entropy,
                                  spawn_key=(*root.spawn_key, *key),
                                  pool_size=root.pool_size)


def collector_seed_sequence(entropy, collector=0, generation=0):
    """The ``SeedSequence`` of collector ``collector`` (of its replacement
    number ``generation`` when ``generation >= 1``).

    Its own ``generate_state`` seeds the collector's global generators
    (:func:`seed_worker`); its children seed its envs.
    """
    root = seed_sequence(entropy)
    if generation == 0:
        return _child(root, collector)
    return _child(root, RESTART_BRANCH, collector, generation)


def env_seed_sequences(entropy, n_envs, collector=0, generation=0):
    """The ``SeedSequence`` of each env of collector ``collector`` (see
    :func:`collector_seed_sequence`)."""
    return collector_seed_sequence(entropy, collector, generation).spawn(
        n_envs)


def reset_seed(seq):
    """The integer seed an env is made and reset with, from its sequence
    (``None`` for ``None``)."""
    return None if seq is None else int(seq.generate_state(1)[0])


def shared_seed(seed, n_envs):
    """``seed`` for a source that seeds its ``n_envs`` envs with ``seed,
    seed + 1, ...`` as 32-bit signed ints (ALE's ``AtariVectorEnv``,
    EnvPool, which refuse a larger one): ``seed % (2**31 - n_envs)``, so
    that every env's seed fits.

    Examples
    --------
    >>> shared_seed(2**32 - 1, 4)  # a reset seed may reach 2**32 - 1
    7
    """
    return seed % (SEED_BOUND - n_envs)


def source_reset_seed(seqs, n_envs, seeds_each):
    """The ``seed=`` of a whole reset of a source of ``n_envs`` envs, the
    one rule for every kind of source (numpy or torch): each column's
    :func:`reset_seed` where the source takes a list (``seeds_each``:
    Gymnasium's ``SyncVectorEnv``, ``AsyncVectorEnv``), else the first
    column's, reduced by :func:`shared_seed`; ``None`` for ``None``."""
    if seqs is None:
        return None
    if seeds_each:
        return [reset_seed(seq) for seq in seqs]
    return shared_seed(reset_seed(seqs[0]), n_envs)


def next_reset_seeds(seqs):
    """The next child of each env's sequence: fresh, reproducible reset
    seeds for one more round of episodes (the evaluator's)."""
    return [seq.spawn(1)[0] for seq in seqs]


def torch_seed(seq):
    """The torch seed of a collector with this ``SeedSequence``."""
    state = seq.generate_state(2)
    return int(state[0]) ^ (int(state[1]) << 32)


def seed_worker(seq):
    """Seed ``random``, ``numpy`` and ``torch`` global generators of a
    process from its collector's ``SeedSequence``."""
    state = seq.generate_state(2)
    random.seed(int(state[0]))
    np.random.seed(int(state[1]) % 2**32)
    torch.manual_seed(torch_seed(seq))
