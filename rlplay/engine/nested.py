"""Nested structures: containers of leaves walked in lock step.

Containers are ``dict`` (any :class:`~collections.abc.Mapping`, rebuilt as a
``dict`` in the key order of the first structure), ``list``, ``tuple`` and
``namedtuple`` (its type is preserved). ``None`` is an *empty container*: it
is returned as is, the function is never called on it, and the other
structures must hold ``None`` at the same place. This lets optional fields of
a fragment (say, no final observations) pass through every utility here.
Everything else is a leaf.

The first structure defines the shape of the result. A mismatch (a missing or
extra key, a different length, a container facing a leaf) raises
:class:`StructureError` (a ``ValueError``) or ``TypeError`` naming the path,
e.g. ``['obs']['image']``, and both sides. Nothing is ever trimmed silently.

These functions sit in the innermost loops of collection, so they are plain
recursive functions with no per-call validation beyond what is needed to
detect a mismatch; paths are only assembled when an error unwinds.
"""
from collections.abc import Mapping

__all__ = [
    "StructureError",
    "suply",
    "tuply",
    "getitem",
    "setitem",
    "flatten",
    "check_structure",
]


class StructureError(ValueError):
    """Two nested structures do not match."""


class _Mismatch(Exception):
    # internal: carries the reverse path up to the public entry point
    def __init__(self, message, exc_type):
        super().__init__(message)
        self.message, self.exc_type, self.path = message, exc_type, []


def _describe(obj):
    if isinstance(obj, Mapping):
        return f"{type(obj).__name__} with keys {list(obj.keys())!r}"
    if isinstance(obj, (list, tuple)):
        return f"{type(obj).__name__} of length {len(obj)}"
    return f"leaf of type {type(obj).__name__}"


def _is_container(obj):
    return obj is None or isinstance(obj, (Mapping, list, tuple))


def _raise(exc):
    path = "".join(f"[{key!r}]" for key in reversed(exc.path)) or "<root>"
    raise exc.exc_type(f"at {path}: {exc.message}") from None


def _apply(fn, tree, others, kwargs, star):
    # `star` selects fn(*leaves) (suply) or fn(leaves) (tuply)
    if tree is None:
        for other in others:
            if other is not None:
                raise _Mismatch(f"None vs {_describe(other)}", TypeError)
        return None

    if isinstance(tree, Mapping):
        n_keys = len(tree)
        for other in others:
            if not isinstance(other, Mapping):
                raise _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                                TypeError)
            if len(other) != n_keys or any(k not in other for k in tree):
                raise _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                                StructureError)
        result = {}
        for key, value in tree.items():
            try:
                result[key] = _apply(fn, value, [o[key] for o in others],
                                     kwargs, star)
            except _Mismatch as exc:
                exc.path.append(key)
                raise
        return result

    if isinstance(tree, (list, tuple)):
        n_items = len(tree)
        for other in others:
            if not isinstance(other, (list, tuple)):
                raise _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                                TypeError)
            if len(other) != n_items:
                raise _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                                StructureError)
        values = []
        for index, value in enumerate(tree):
            try:
                values.append(_apply(fn, value, [o[index] for o in others],
                                     kwargs, star))
            except _Mismatch as exc:
                exc.path.append(index)
                raise
        if type(tree) is list:
            return values
        if type(tree) is tuple:
            return tuple(values)
        if hasattr(tree, "_fields"):  # namedtuple
            return type(tree)(*values)
        return type(tree)(values)

    for other in others:
        if _is_container(other):
            raise _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                            TypeError)
    if star:
        return fn(tree, *others, **kwargs)
    return fn((tree, *others), **kwargs)


def suply(fn, tree, *others, **kwargs):
    """Apply ``fn`` to the leaves of ``tree`` and corresponding leaves.

    Parameters
    ----------
    fn : callable
        Called as ``fn(leaf, *other_leaves, **kwargs)``.
    tree : nested structure
        Defines the structure of the result.
    *others : nested structures
        Must have the same structure as ``tree``.

    Returns
    -------
    result : nested structure
        ``tree``'s structure with ``fn``'s results as leaves.

    Raises
    ------
    StructureError, TypeError
        On a mismatch; the message names the path and both sides.

    Examples
    --------
    >>> suply(lambda a, b: a + b, {"x": 1, "y": (2, 3)}, {"x": 10, "y": (20, 30)})
    {'x': 11, 'y': (22, 33)}
    """
    if not others and not kwargs:
        return _apply1(fn, tree)
    try:
        return _apply(fn, tree, others, kwargs, True)
    except _Mismatch as exc:
        _raise(exc)


def _apply1(fn, tree):
    # the common single-structure case, without the lock-step checks
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {k: _apply1(fn, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        values = [_apply1(fn, v) for v in tree]
        if type(tree) is list:
            return values
        if type(tree) is tuple:
            return tuple(values)
        if hasattr(tree, "_fields"):
            return type(tree)(*values)
        return type(tree)(values)
    if isinstance(tree, Mapping):
        return {k: _apply1(fn, v) for k, v in tree.items()}
    return fn(tree)


def tuply(fn, tree, *others, **kwargs):
    """Like :func:`suply`, but ``fn`` gets the tuple of corresponding leaves.

    Examples
    --------
    >>> tuply(sum, [1, {"a": 2}], [10, {"a": 20}])
    [11, {'a': 22}]
    """
    try:
        return _apply(fn, tree, others, kwargs, False)
    except _Mismatch as exc:
        _raise(exc)


def getitem(tree, index):
    """Index every leaf: ``suply(lambda x: x[index], tree)``.

    Examples
    --------
    >>> import numpy as np
    >>> getitem({"a": np.arange(3), "b": (np.arange(3) * 10,)}, 1)
    {'a': np.int64(1), 'b': (np.int64(10),)}
    """
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {k: getitem(v, index) for k, v in tree.items()}
    if isinstance(tree, (list, tuple, Mapping)):
        return _apply1(lambda leaf: leaf[index], tree)
    return tree[index]


def setitem(tree, index, value):
    """Write ``value`` into every leaf of ``tree`` at ``index``, in place.

    ``tree[index] = value`` leaf by leaf, for arrays or tensors. ``value``
    must have ``tree``'s structure; a mismatch raises as in :func:`suply`
    (a dict ``value`` with extra keys is a mismatch too).

    Examples
    --------
    >>> import numpy as np
    >>> buf = {"a": np.zeros(3), "b": (np.zeros(3, int),)}
    >>> setitem(buf, 1, {"a": 0.5, "b": (7,)})
    >>> buf["a"].tolist(), buf["b"][0].tolist()
    ([0.0, 0.5, 0.0], [0, 7, 0])
    """
    if not _is_container(tree):  # fast path: a single array
        if _is_container(value):
            _raise(_Mismatch(f"{_describe(tree)} vs {_describe(value)}",
                             TypeError))
        tree[index] = value
        return
    try:
        _apply(_setitem_leaf, tree, (value,), {"index": index}, True)
    except _Mismatch as exc:
        _raise(exc)


def _setitem_leaf(leaf, value, *, index):
    leaf[index] = value


def flatten(tree):
    """The leaves of ``tree`` in depth-first order, as a list.

    Examples
    --------
    >>> flatten({"a": 1, "b": (2, [3, None])})
    [1, 2, 3]
    """
    leaves = []
    _apply1(leaves.append, tree)
    return leaves


def check_structure(tree, *others):
    """Raise :class:`StructureError` or ``TypeError`` unless all match."""
    tuply(_noop, tree, *others)


def _noop(leaves):
    return None
