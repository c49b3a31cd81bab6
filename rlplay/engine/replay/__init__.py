"""Replay buffers, at their 0.1.0 path: :mod:`rlplay.engine.consumers.replay`
(re-exported here)."""
from ..consumers.replay import PrioritizedReplay, Replay, Sequences, Transitions

__all__ = ["Replay", "PrioritizedReplay", "Transitions", "Sequences"]
