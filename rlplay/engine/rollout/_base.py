"""What the generators share: iteration and ``with``, and sizing buffers
in the learner from a probe env."""
import torch

from ..core import prepare
from ..envs import close_envs, make_envs
from ..seeds import env_seed_sequences

__all__ = ["Closing", "Generator", "probe_layout", "PROBE_COLLECTOR"]

# the collector index whose seeds make the learner's probe env, far from
# every worker's index (0, 1, ...) and from the evaluator's
PROBE_COLLECTOR = 2**31 - 1


class Closing:
    """A context manager that calls ``self.close()`` on leaving ``with``."""

    def close(self):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Generator(Closing):
    """An iterator of batches (``__next__`` left to the subclass) that
    ``with`` closes."""

    def __iter__(self):
        return self


def probe_layout(factory, actor, n_steps, n_envs, entropy, *, env_info=None,
                 final=True):
    """Size a generator's buffers in the learner, from a probe env.

    Makes one env with ``factory`` (seeded as the env of collector
    :data:`PROBE_COLLECTOR` of ``entropy``), runs :func:`prepare` with the
    worker's ``actor`` and closes the env; a failure is raised here, as by
    ``same.rollout``. The actor's virtual call draws from a forked torch
    generator, so that making a rollout leaves the learner's random
    numbers alone.

    Returns
    -------
    Fragment of zero-filled CPU tensors, shape = (1 + n_steps, n_envs, ...)
        A template of one buffer (not shared).
    """
    probe = make_envs(factory, env_seed_sequences(entropy, 1,
                                                  PROBE_COLLECTOR))
    try:
        with torch.random.fork_rng(devices=[]):
            return prepare(probe[0], actor, n_steps, n_envs,
                           env_info=env_info, final=final).pyt
    finally:
        close_envs(probe)
