"""The env adapter: the only package that knows the Gymnasium (and
EnvPool, PettingZoo) API.

- :mod:`.spaces`: example leaves of spaces (what sizes the buffers),
  placeholders, a vectorised membership test, env info layouts;
- :mod:`.batch`: the env-batch interface that the core loops step
  (:class:`EnvBatch`: ``reset``, ``step``, ``close``; a step reports what
  happened, a :class:`Stepped`) and its implementation for a list of
  single envs (:class:`EnvList`);
- :mod:`.making`: making, checking, calling and closing single envs;
- :mod:`.vector`: its implementation for batched sources, a Gymnasium
  ``VectorEnv`` in any autoreset mode (:class:`VectorSource`), and
  :mod:`.envpool`, for an EnvPool env (:class:`EnvPoolSource`);
- :mod:`.agents`: its implementation for PettingZoo parallel envs, one
  column per (env, agent) (:class:`~.agents.AgentEnvs`; imported when a
  factory makes one, not here);
- :mod:`.torch_source`: its implementation for torch-native sources
  (:class:`TorchSource`, of kind ``"torch"``, stepped by the torch loop
  of :mod:`rlplay.engine.core`);
- :mod:`.sources`: making a batch from a factory (:func:`make_batch`),
  several sources side by side (:class:`EnvConcat`).
- :mod:`.control`: calling a method of every env between fragments
  (``call_envs``), for single envs, vector sources and PettingZoo envs.
"""
from .batch import (Cast, EnvBatch, EnvList, RowOut, Stepped, cast_problem,
                    render_refusal)
from .control import REFUSED_METHODS, check_method
from .rows import FEW_COLUMNS, put_at
from .making import (check_factory, check_step, close_envs, make_envs, reset,
                     reward)
from .sources import EnvConcat, as_batch, check_columns, make_batch
from .spaces import (box_clipper, format_value, info_example,
                     space_checker, space_example, space_placeholder)
from .envpool import EnvPoolSource, is_envpool
from .torch_source import TorchRow, TorchSource, TorchStepped, source_device
from .vector import VectorSource

__all__ = [
    "EnvBatch", "EnvList", "RowOut", "Stepped", "Cast", "cast_problem",
    "render_refusal", "check_factory",
    "check_step",
    "close_envs", "make_envs", "reset", "reward",
    "EnvConcat", "as_batch", "check_columns", "make_batch",
    "box_clipper", "format_value", "info_example", "space_checker",
    "space_example",
    "space_placeholder",
    "EnvPoolSource", "VectorSource", "is_envpool",
    "REFUSED_METHODS", "check_method",
    "TorchSource", "TorchRow", "TorchStepped", "source_device",
]

# what the other folders of rlplay import beyond __all__ (the import
# contract, tests/test_imports.py): the few-column row writes
__exports__ = ["FEW_COLUMNS", "put_at"]
