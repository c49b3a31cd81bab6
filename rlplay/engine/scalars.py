"""Training curves from a generator's ``stats``: :func:`log_stats` writes
them to a TensorBoard ``SummaryWriter`` (or to anything with its
``add_scalar(tag, value, global_step)``), and :func:`flat_scalars` gives
the same scalars as a flat dict (for ``wandb.log``, a CSV file, a print).

A stats dict is nested: the evaluator's ``last`` is a namedtuple of arrays,
and ``multi``'s ``workers`` a list of dicts. Both functions flatten it into
tags joined by ``/`` and keep only what a curve can show:

=======================================  ====================================
entry                                    written
=======================================  ====================================
a number (``int``, ``float``, ``bool``,  as a ``float``, under its path
numpy's scalars), a 0-d array or tensor
an array or tensor of one or more        each reduction of its values
dimensions (``returns``, ``lengths``)    (``mean`` by default) under
                                         ``path/name``; nothing while it is
                                         empty (no episode ended)
a ``dict`` (any ``Mapping``), ``list``,  flattened: by key, position or
``tuple`` or ``namedtuple``              field name
``None``, a string, any other object     skipped (``None`` is a value not
                                         known yet, ``last_cause`` a text)
=======================================  ====================================

An entry is classed by its dimensions, never by its length, so a tag keeps
its meaning from one batch to the next: ``returns`` is an array whether one
episode ended or ten. Neither function imports TensorBoard: rlplay needs
none of the writers it serves.
"""
import numbers
from collections.abc import Mapping

import numpy as np
import torch

__all__ = ["flat_scalars", "log_stats"]

# the reductions of an array entry by default: its mean
REDUCE = {"mean": np.mean}

# numpy dtypes (kinds) whose values are numbers a curve can show: booleans,
# signed and unsigned integers, floats
_NUMERIC_KINDS = "biuf"


def flat_scalars(stats, *, prefix="", reduce=None):
    """The scalars of a nested ``stats`` dict, flattened into tags.

    Parameters
    ----------
    stats : dict (any Mapping)
        A generator's ``stats``, an
        :class:`~rlplay.engine.rollout.Evaluator`'s, or a dict of the
        learner's own scalars (losses, a learning rate); nested dicts,
        lists, tuples and namedtuples are flattened (the table of
        :mod:`rlplay.engine.scalars`).
    prefix : str
        Put in front of every tag as it is, such as ``"rollout/"``
        (TensorBoard groups its charts by the part of a tag before the
        first ``/``).
    reduce : dict of str to callable, optional
        How an array entry becomes scalars: ``{name: fn}`` writes
        ``fn(values)`` under ``path/name``, ``values`` a flat float64
        numpy array that is never empty. By default ``{"mean": np.mean}``;
        ``{}`` skips arrays.

    Returns
    -------
    scalars : dict of str to float
        ``{tag: value}`` in the order of ``stats``.

    Raises
    ------
    TypeError
        ``stats`` is not a Mapping, ``prefix`` not a string, ``reduce`` not
        a dict of names to callables, or a reduction returned no number.
    ValueError
        ``stats`` holds a container inside itself (a cycle), a number too
        large for a float (``10**400``), or two entries that make one tag
        (``{'a/b': 1, 'a': {'b': 2}}``), naming the tag.

    Examples
    --------
    >>> import numpy as np
    >>> stats = {"steps": 2048, "returns": np.array([9.0, 11.0]),
    ...          "lengths": np.array([], dtype=int), "last_cause": None,
    ...          "workers": [{"restarts": 0}]}
    >>> flat_scalars(stats, prefix="rollout/")
    {'rollout/steps': 2048.0, 'rollout/returns/mean': 10.0, \
'rollout/workers/0/restarts': 0.0}
    >>> flat_scalars({"returns": np.array([9.0, 11.0])},
    ...              reduce={"min": np.min, "max": np.max})
    {'returns/min': 9.0, 'returns/max': 11.0}
    """
    if not isinstance(stats, Mapping):
        raise TypeError(f"stats must be a dict (a Mapping) of numbers, "
                        f"arrays and nested containers, got "
                        f"{type(stats).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    reduce = _check_reduce(reduce)
    scalars = {}
    _flatten(stats, prefix, reduce, scalars, top=True)
    return scalars


def log_stats(writer, stats, step, *, prefix="", reduce=None):
    """Write the scalars of ``stats`` with ``writer.add_scalar``.

    Parameters
    ----------
    writer : object with ``add_scalar(tag, value, global_step)``
        A ``torch.utils.tensorboard.SummaryWriter``, tensorboardX's, or any
        object with that method (the W&B TensorBoard sync picks up what a
        SummaryWriter writes).
    stats : dict (any Mapping)
        As :func:`flat_scalars` takes it: a generator's ``stats``, an
        evaluator's, or the learner's own scalars.
    step : int
        The ``global_step`` of every scalar written, such as
        ``feed.stats["steps"]`` (env steps) or a batch count.
    prefix, reduce
        As :func:`flat_scalars` takes them.

    Returns
    -------
    scalars : dict of str to float
        What was written, ``{tag: value}``, in the order written.

    Raises
    ------
    TypeError
        ``writer`` has no ``add_scalar`` method, ``step`` is not an integer
        (a ``bool`` is refused), or as :func:`flat_scalars` raises; nothing
        is written then.

    Examples
    --------
    >>> class Printer:
    ...     def add_scalar(self, tag, value, global_step):
    ...         print(tag, value, global_step)
    >>> written = log_stats(Printer(), {"loss": 0.25, "lr": 1e-3}, 1024,
    ...                     prefix="train/")
    train/loss 0.25 1024
    train/lr 0.001 1024
    """
    if not callable(getattr(writer, "add_scalar", None)):
        raise TypeError(f"writer must have an add_scalar(tag, value, "
                        f"global_step) method, as a torch.utils.tensorboard"
                        f".SummaryWriter has, got {type(writer).__name__}")
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step must be an int (the global step), got "
                        f"{type(step).__name__}")
    scalars = flat_scalars(stats, prefix=prefix, reduce=reduce)
    step = int(step)
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, step)
    return scalars


def _check_reduce(reduce):
    if reduce is None:
        return REDUCE
    if not isinstance(reduce, Mapping) or not all(
            isinstance(name, str) and callable(fn)
            for name, fn in reduce.items()):
        raise TypeError(f"reduce must be a dict of names (str) to callables, "
                        f"such as {{'mean': numpy.mean}}, got {reduce!r}")
    return reduce


def _flatten(tree, path, reduce, scalars, top=False, above=()):
    # ``path`` is the tag so far: the prefix, then the keys joined by "/"
    # (the first key joins the prefix as it is); ``above``, the ids of the
    # containers on the way here (a container inside itself is a cycle)
    join = "" if top else "/"
    if isinstance(tree, (Mapping, list, tuple)):
        if id(tree) in above:
            raise ValueError(f"stats holds a container inside itself, at "
                             f"{path!r}: a cycle has no flat tags")
        above = (*above, id(tree))
    if isinstance(tree, Mapping):
        items = tree.items()
    elif isinstance(tree, tuple) and hasattr(tree, "_fields"):
        items = zip(tree._fields, tree)
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        _leaf(tree, path, reduce, scalars)
        return
    for key, value in items:
        _flatten(value, f"{path}{join}{key}", reduce, scalars, above=above)


def _put(scalars, tag, value):
    if tag in scalars:
        raise ValueError(f"two entries of stats make the tag {tag!r} (a key "
                         f"with a '/' in it, such as {{'a/b': ...}} beside "
                         f"{{'a': {{'b': ...}}}}, or beside an array's "
                         f"reduction): rename one of them")
    try:
        scalars[tag] = float(value)
    except OverflowError:
        raise ValueError(f"the number at {tag!r} is too large for a float "
                         f"(its tag's scalar): {str(value)[:20]}... with "
                         f"{len(str(value))} digits") from None


def _leaf(value, tag, reduce, scalars):
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return
        # a copy on the host in float64 (bfloat16 has no numpy dtype)
        value = value.detach().to("cpu", torch.float64).numpy()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _NUMERIC_KINDS:
            return
        if value.ndim == 0:
            _put(scalars, tag, value)
        elif value.size:
            values = value.astype(np.float64).ravel()
            for name, fn in reduce.items():
                _put(scalars, f"{tag}/{name}", _number(fn(values), tag, name))
    elif isinstance(value, (numbers.Real, np.bool_)):
        _put(scalars, tag, value)


def _number(result, tag, name):
    try:
        return float(result)
    except (TypeError, ValueError):
        raise TypeError(f"reduce[{name!r}] must return a number, returned "
                        f"{type(result).__name__} for {tag!r}") from None
