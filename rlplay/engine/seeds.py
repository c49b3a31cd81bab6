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
    ├── (RESUME_BRANCH,)    continuations of a stopped run:
    │   └── (RESUME_BRANCH, r)  the root of resume number r >= 1, with
    │                           the whole tree above beneath it
    └── (RANK_BRANCH,)      the other ranks of a distributed run:
        └── (RANK_BRANCH, k)    the root of rank k >= 1, with the whole
                                tree above (resumes included) beneath it

So a replacement never repeats the streams of the worker it replaces, nor
those of another worker, the probe or the evaluator, a continuation never
repeats a stream of the run before it (nor of another continuation of that
run), and a run with the same failures (and resumes) is reproducible.

Many learners (``torch.distributed``, one generator per rank): the
generators make their root with :func:`rank_root`, so the same
``entropy`` on every rank gives each rank a tree of its own, and no two
ranks collect the same data. Rank 0 keeps the run's own root: a run of
one process (a world of 1) is the tree above, as it was, and rank 0 of a
world of ``n`` collects what that run collects. A rank's tree does not
depend on the world size. The rank is :func:`current_rank`'s:
``torch.distributed``'s once its process group is initialised, else the
``RANK`` that launchers such as ``torchrun`` set, else 0. Under a launcher
of your own, pass ``entropy=rank_root(entropy, rank)`` in each process.
A checkpoint (``state_dict()``) records its rank and is resumed by the
same rank only (the ``resume=`` keyword of every generator).
"""
import numbers
import os
import random

import numpy as np
import torch

__all__ = [
    "PROBE_COLLECTOR",
    "EVAL_COLLECTOR",
    "RESTART_BRANCH",
    "RESUME_BRANCH",
    "RANK_BRANCH",
    "seed_sequence",
    "resume_root",
    "current_rank",
    "rank_root",
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
# the branch of the tree that the ranks >= 1 of a distributed run draw from
RANK_BRANCH = 2**31 - 5
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


def current_rank():
    """This process's ``(rank, world_size)`` in a distributed run.

    ``torch.distributed``'s (default group) once
    :func:`torch.distributed.init_process_group` was called; else the
    ``RANK`` and ``WORLD_SIZE`` of the environment, which ``torchrun`` (and
    ``torch.distributed``'s ``env://`` initialisation) use, when both are
    set; else ``(0, 1)``.

    Raises
    ------
    ValueError
        ``RANK`` or ``WORLD_SIZE`` set but not an int, ``WORLD_SIZE`` below
        1, or ``RANK`` outside ``[0, WORLD_SIZE)``; the message names the
        variable and its value.
    """
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1
    rank = _environ_int("RANK", 0)
    world_size = _environ_int("WORLD_SIZE", 1)
    if rank >= world_size:
        raise ValueError(f"the environment's RANK={rank} must be below its "
                         f"WORLD_SIZE={world_size}")
    return rank, world_size


def _environ_int(name, least):
    value = os.environ[name]
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"the environment's {name} must be an int, got "
                         f"{value!r}") from None
    if number < least:
        raise ValueError(f"the environment's {name} must be at least "
                         f"{least}, got {value!r}")
    return number


def rank_root(entropy=None, rank=None):
    """The root of rank ``rank``'s part of the run of ``entropy``: the
    run's own root for rank 0, the child ``(RANK_BRANCH, rank)`` of it
    otherwise (see the module docstring). ``rank=None``: this process's
    (:func:`current_rank`).

    The generators make their root with it, so under ``torch.distributed``
    (or ``torchrun``) pass the run's ``entropy`` as it is; pass
    ``entropy=rank_root(entropy, rank)`` where your own launcher numbers
    the processes.

    Raises
    ------
    ValueError, TypeError
        ``rank`` not an int of at least 0 (or :func:`current_rank`'s).

    Examples
    --------
    >>> rank_root(42, 0) is not None
    True
    >>> rank_root(42, 1).spawn_key == (RANK_BRANCH, 1)
    True
    """
    if rank is None:
        rank, _ = current_rank()
    elif isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TypeError(f"rank must be an int, got {rank!r}")
    elif rank < 0:
        raise ValueError(f"rank must be at least 0, got {rank!r}")
    root = seed_sequence(entropy)
    if rank == 0:
        return root
    return _child(root, RANK_BRANCH, int(rank))


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
