"""Generators of fragments: ``same`` (in this process)."""
from . import same

__all__ = ["same"]

# one worker process, double-buffered; evaluation in a worker process
from . import single, evaluate  # noqa: E402
from .evaluate import Evaluation, Evaluator  # noqa: E402

__all__ += ["single", "evaluate", "Evaluator", "Evaluation"]

# many worker processes, a pool of shared buffers collated into batches
from . import multi  # noqa: E402

__all__ += ["multi"]
