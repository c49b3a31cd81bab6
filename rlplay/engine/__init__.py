"""The collection engine: nested structures, buffers, core loops."""
from .actor import (BaseActorModule, FeedForwardActor, PolicyActor,
                    check_actor)
from .distributions import squashed_normal
from .errors import (CapacityError, EnvCallError, RemoteTraceback,
                     RolloutError, RolloutTimeout, WorkerDied, WorkerError)
from .core import (Context, EpisodeEdges, EpisodeStats, Fragment, Meta,
                   State, acted, collect, columns, env_axes, episode,
                   episode_edges, episode_stats, evaluate, prepare, startup)
from .nested import (StructureError, check_structure, flatten, getitem,
                     setitem, suply, tuply)
from .consumers import (PrioritizedReplay, Replay, RunningNorm, Sequences,
                        Transitions)
from .returns import VTrace, frozen, gae, n_step, returns, vtrace
from .scalars import flat_scalars, log_stats
from .shared import Aliased, aliased, numpify, torchify

__all__ = [
    "BaseActorModule", "FeedForwardActor", "PolicyActor", "check_actor", "squashed_normal",
    "CapacityError", "EnvCallError", "RemoteTraceback", "RolloutError",
    "RolloutTimeout",
    "WorkerDied", "WorkerError",
    "Context", "EpisodeEdges", "EpisodeStats", "Fragment", "Meta", "State",
    "acted", "collect", "columns", "env_axes", "episode", "episode_edges",
    "episode_stats",
    "evaluate", "prepare", "startup",
    "StructureError", "check_structure", "flatten", "getitem", "setitem",
    "suply", "tuply",
    "RunningNorm",
    "PrioritizedReplay", "Replay", "Sequences", "Transitions",
    "VTrace", "frozen", "gae", "n_step", "returns", "vtrace",
    "flat_scalars", "log_stats",
    "Aliased", "aliased", "numpify", "torchify",
]
