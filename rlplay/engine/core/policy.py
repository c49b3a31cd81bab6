"""The policy seam, at its 0.1.0 path: it lives in
:mod:`rlplay.engine.policy` (this module re-exports it)."""
from ..policy import FeedForwardPolicy, LocalPolicy, as_policy, fill_lookahead

__all__ = ["LocalPolicy", "FeedForwardPolicy", "as_policy",
           "fill_lookahead"]
