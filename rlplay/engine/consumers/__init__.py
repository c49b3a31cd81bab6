"""What learners build from the batches of any generator; no generator
knows them, and they read the layout (:mod:`rlplay.engine.core.layout`)
and the foundation only.

- :mod:`.lanes`: each env column followed across batches
  (:class:`Lanes`), never across a gap;
- :mod:`.episodic`: whole episodes (:class:`Episodic`, :func:`episodes`)
  and their Minari datasets (:func:`record`), with :mod:`._episodes` and
  :mod:`._minari`;
- :mod:`.replay`: replay buffers (:class:`Replay`,
  :class:`PrioritizedReplay`);
- :mod:`.returns`: returns, GAE, the n-step sum, V-trace;
- :mod:`.norm`: running normalization of observations
  (:class:`RunningNorm`).

Their 0.1.0 paths (``rlplay.engine.replay``, ``rlplay.engine.returns``,
``rlplay.engine.norm``, ``rlplay.engine.lanes``,
``rlplay.engine.rollout.episodic``) re-export them.
"""
from ._episodes import MAX_LENGTH, check_state
from .episodic import (EpisodeMeta, Episodes, Episodic, PaddedEpisodes,
                       episodes, record)
from .lanes import Lanes
from .norm import RunningNorm
from .replay import PrioritizedReplay, Replay, Sequences, Transitions
from .returns import VTrace, frozen, gae, n_step, returns, terminated, vtrace

__all__ = ["Episodes", "EpisodeMeta", "PaddedEpisodes", "Episodic",
           "episodes", "record", "Lanes", "RunningNorm", "Replay",
           "PrioritizedReplay", "Transitions", "Sequences", "returns", "gae",
           "n_step", "terminated", "frozen", "VTrace", "vtrace"]

# what the other folders of rlplay import beyond __all__ (the import
# contract, tests/test_imports.py)
__exports__ = ["MAX_LENGTH", "check_state"]
