"""The env adapter: the only package that knows the Gymnasium (and
EnvPool) API.

- :mod:`.spaces`: example leaves of spaces (what sizes the buffers),
  placeholders, a vectorised membership test, env info layouts;
- :mod:`.batch`: the env-batch interface that the core loops step
  (:class:`EnvBatch`: ``reset``, ``step``, ``close``; a step reports what
  happened, a :class:`Stepped`) and its implementation for a list of
  single envs (:class:`EnvList`);
- :mod:`.making`: making, checking, calling and closing single envs;
- :mod:`.vector`: its implementations for batched sources, a Gymnasium
  ``VectorEnv`` in any autoreset mode (:class:`VectorSource`) and an
  EnvPool env (:class:`EnvPoolSource`);
- :mod:`.torch_source`: its implementation for torch-native sources
  (:class:`TorchSource`, of kind ``"torch"``, stepped by the torch loop
  of :mod:`rlplay.engine.core`);
- :mod:`.sources`: making a batch from a factory (:func:`make_batch`),
  several sources side by side (:class:`EnvConcat`).
"""
from .batch import Cast, EnvBatch, EnvList, RowOut, Stepped, cast_problem
from .making import (check_factory, check_step, close_envs, make_envs, reset,
                     reward)
from .sources import EnvConcat, as_batch, check_columns, make_batch
from .spaces import (box_clipper, format_value, info_example,
                     space_checker, space_example, space_placeholder)
from .torch_source import TorchRow, TorchSource, TorchStepped, source_device
from .vector import EnvPoolSource, VectorSource, is_envpool

__all__ = [
    "EnvBatch", "EnvList", "RowOut", "Stepped", "Cast", "cast_problem",
    "check_factory",
    "check_step",
    "close_envs", "make_envs", "reset", "reward",
    "EnvConcat", "as_batch", "check_columns", "make_batch",
    "box_clipper", "format_value", "info_example", "space_checker",
    "space_example",
    "space_placeholder",
    "EnvPoolSource", "VectorSource", "is_envpool",
    "TorchSource", "TorchRow", "TorchStepped", "source_device",
]
