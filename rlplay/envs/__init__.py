"""Environments that ship with rlplay.

- :class:`TorchCartPole`: Gymnasium's CartPole, batched in torch on any
  device (:mod:`.cartpole`), a torch-native source for
  :mod:`rlplay.engine.rollout` and a reference for its torch loop.
- :class:`JaxSource`, :class:`Gymnax`, :class:`JaxEnv`: batched JAX envs
  (gymnax's, or any that meets the :class:`JaxEnv` protocol) as
  torch-native sources through DLPack (:mod:`.jax_source`; needs JAX,
  ``pip install -e 'path/to/rlplay[jax]'``, imported when one of these
  names is first used).
- :class:`Brax`: a Brax env (any of its physics pipelines, MuJoCo's MJX
  among them) as a :class:`JaxEnv`, its last observations and time
  limits kept (:mod:`.brax_source`; needs Brax, in the same extra).
"""
from .cartpole import TorchCartPole

__all__ = ["TorchCartPole", "JaxSource", "Gymnax", "JaxEnv", "JaxStep",
           "Brax"]

_JAX_NAMES = ("JaxSource", "Gymnax", "JaxEnv", "JaxStep")


def __getattr__(name):
    # JAX takes seconds to import: only where its envs are used
    if name in _JAX_NAMES:
        from . import jax_source
        return getattr(jax_source, name)
    if name == "Brax":
        from . import brax_source
        return brax_source.Brax
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
