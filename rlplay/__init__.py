"""rlplay: Gymnasium envs and a PyTorch actor in, experience batches out."""
from . import engine
from .engine import (BaseActorModule, Fragment, PolicyActor, State,
                     episode_stats)

__version__ = "0.1.0"

__all__ = ["engine", "BaseActorModule", "PolicyActor", "Fragment", "State",
           "episode_stats", "__version__"]
