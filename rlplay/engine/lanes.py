"""Lanes, at their 0.1.0 path: :mod:`rlplay.engine.consumers.lanes`
(re-exported here)."""
from .consumers.lanes import Lanes

__all__ = ["Lanes"]
