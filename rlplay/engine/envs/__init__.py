"""The env adapter: the only package that knows the Gymnasium API.

- :mod:`.spaces`: example leaves of spaces (what sizes the buffers),
  placeholders, a vectorised membership test, env info layouts;
- :mod:`.batch`: the env-batch interface that the core loops step
  (:class:`EnvBatch`: ``reset``, ``step``, ``close``), its implementation
  for a list of single envs (:class:`EnvList`), making, seeding and
  closing envs.
"""
from .batch import (EnvBatch, EnvList, RowOut, as_batch, cast_problem,
                    check_step, close_envs, make_batch, make_envs, reset,
                    reward)
from .spaces import (format_value, info_example, space_checker,
                     space_example, space_placeholder)

__all__ = [
    "EnvBatch", "EnvList", "RowOut", "as_batch", "cast_problem",
    "check_step", "close_envs", "make_batch", "make_envs", "reset",
    "reward",
    "format_value", "info_example", "space_checker", "space_example",
    "space_placeholder",
]
