"""Returns, GAE, the n-step sum and V-trace, at their 0.1.0 path:
:mod:`rlplay.engine.consumers.returns` (re-exported here)."""
from .consumers.returns import (VTrace, frozen, gae, n_step, returns,
                                terminated, vtrace)

__all__ = ["returns", "gae", "n_step", "terminated", "frozen", "VTrace",
           "vtrace"]
