"""Replay buffers, at their 0.1.0 path:
:mod:`rlplay.engine.consumers.replay.buffer` (re-exported here)."""
from ..consumers.replay.buffer import PrioritizedReplay, Replay

__all__ = ["Replay", "PrioritizedReplay"]
