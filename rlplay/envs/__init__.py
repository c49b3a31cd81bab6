"""Environments that ship with rlplay.

- :class:`TorchCartPole`: Gymnasium's CartPole, batched in torch on any
  device (:mod:`.cartpole`), a torch-native source for
  :mod:`rlplay.engine.rollout` and a reference for its torch loop.
"""
from .cartpole import TorchCartPole

__all__ = ["TorchCartPole"]
