"""An EnvPool env as an :class:`~.batch.EnvBatch` (see :mod:`.vector` for
the mapping of a batched source): next-step autoreset with a partial
reset, so the layout is exact; seeded when made."""
import numpy as np
from gymnasium.vector import AutoresetMode

from .control import ENVPOOL_REFUSAL
from .vector import VectorSource, _pair, _take

__all__ = ["EnvPoolSource", "is_envpool"]


def is_envpool(source):
    """Whether ``source`` is an EnvPool env (checked without importing
    EnvPool)."""
    return type(source).__module__.startswith("envpool") or any(
        cls.__module__.startswith("envpool") for cls in type(source).__mro__)


class EnvPoolSource(VectorSource):
    """An EnvPool env (synchronous: ``batch_size == num_envs``) as an
    :class:`~.batch.EnvBatch` of ``num_envs`` columns: next-step autoreset,
    with a partial reset (``reset(env_id)``), so the mapping is exact;
    seeded when it is made."""

    def __init__(self, source, name="the EnvPool env"):
        config = getattr(getattr(source, "spec", None), "config", None)
        k = getattr(config, "num_envs", None)
        batch = getattr(config, "batch_size", k)
        if k is None or batch != k:
            raise ValueError(
                f"{name} steps {batch} of its {k} envs per call (asynchronous"
                f" EnvPool): rlplay needs them all, batch_size == num_envs")
        self._set_up(source, name, k, source.observation_space,
                     source.action_space, AutoresetMode.NEXT_STEP,
                     seeds_each=False, partial=True,
                     copy_actions=False)  # copied in by its C++ side
        self.call_refusal = ENVPOOL_REFUSAL.format(name=name)

    def _reset_all(self, seeds):
        # seeded when made: EnvPool's reset takes no seed that reseeds
        return _pair(self.source.reset(), self.name, "reset()")

    def _reset_columns(self, at, seeds=None):
        obs, _ = _pair(self.source.reset(np.asarray(at, np.int32)),
                       self.name, "reset()")
        self._forget_pending(at)
        return _take(obs, list(range(len(at))), len(at), self.name)
