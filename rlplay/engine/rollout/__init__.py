"""Generators of fragments.

``same`` (in this process), ``single`` (one worker process, double
buffered), ``multi`` (many worker processes, a pool of shared buffers),
``cluster`` (Ray actors on a cluster; needs ``rlplay[cluster]``) and the
:class:`Evaluator` (evaluation in a worker process). Their modules open
with their protocols; what they share lives in the underscored modules
(:mod:`._base`, :mod:`._collector`, :mod:`._supervisor`,
:mod:`._delivery`, :mod:`._buffers`, :mod:`._batch`, :mod:`._params`,
:mod:`._remote`).
"""
import importlib

from . import evaluate, multi, same, single
from ._base import STATS_KEYS
from .evaluate import Evaluation, Evaluator

__all__ = ["same", "single", "multi", "cluster", "evaluate", "Evaluator",
           "Evaluation", "STATS_KEYS"]


def __getattr__(name):
    # ``cluster`` imports Ray (when installed): only on first use
    if name == "cluster":
        return importlib.import_module(f"{__name__}.cluster")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
