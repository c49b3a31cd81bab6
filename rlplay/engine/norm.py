"""Running normalization, at its 0.1.0 path:
:mod:`rlplay.engine.consumers.norm` (re-exported here)."""
from .consumers.norm import RunningNorm

__all__ = ["RunningNorm"]
