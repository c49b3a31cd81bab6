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
e.g. ``['obs']['image']``, and both sides, first structure first; between
mappings it lists the *missing* keys (in the first, not in the other) and the
*extra* ones. Nothing is ever trimmed silently. A ``list`` and a ``tuple`` of
the same length match each other.

These functions sit in the innermost loops of collection, so they are plain
recursive functions that dispatch on a per-type table (one dict lookup per
node instead of ``isinstance`` checks against the ``Mapping`` ABC), with no
validation beyond what is needed to detect a mismatch; paths are only
assembled when an error unwinds. A structure nested deeper than the
interpreter's recursion limit raises :class:`RecursionError`.
"""
from collections.abc import Mapping
from functools import partial

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


# Node kinds. Everything from _LIST on is a sequence. A _NAMEDTUPLE keeps
# the ``__new__`` that ``collections.namedtuple`` generated, which only packs
# its arguments, so it is rebuilt with ``tuple.__new__`` (a third of the
# cost); a _NEWTUPLE overrides ``__new__`` and is rebuilt by calling it.
_LEAF, _NONE, _DICT, _LIST, _TUPLE, _NAMEDTUPLE, _NEWTUPLE, _SEQUENCE = \
    range(8)

# kind by exact type, filled on first sight of a type; bounded so that types
# made on the fly (namedtuples built in a loop) cannot grow it forever
_KINDS = {type(None): _NONE, dict: _DICT, list: _LIST, tuple: _TUPLE}
_MAX_KINDS = 1024


def _kind_of(cls):
    if issubclass(cls, Mapping):
        kind = _DICT
    elif issubclass(cls, tuple):
        kind = _SEQUENCE
        if hasattr(cls, "_fields"):
            kind = _NAMEDTUPLE if _plain_new(cls) else _NEWTUPLE
    elif issubclass(cls, list):
        kind = _SEQUENCE
    else:
        kind = _LEAF
    if len(_KINDS) < _MAX_KINDS:
        _KINDS[cls] = kind
    return kind


def _plain_new(cls):
    # the class that defines the ``__new__`` in use is the one namedtuple
    # made (its namespace holds both ``__new__`` and ``_make``)
    for klass in cls.__mro__:
        if "__new__" in vars(klass):
            return klass is not tuple and "_make" in vars(klass)
    return False


def _rebuild(tree, kind, values):
    if kind == _LIST:
        return values
    if kind == _TUPLE:
        return tuple(values)
    if kind == _NAMEDTUPLE:
        return tuple.__new__(type(tree), values)
    if kind == _NEWTUPLE:
        return type(tree)(*values)
    return type(tree)(values)


def _describe(obj):
    if isinstance(obj, Mapping):
        return f"{type(obj).__name__} with keys {list(obj.keys())!r}"
    if isinstance(obj, (list, tuple)):
        return f"{type(obj).__name__} of length {len(obj)}"
    if obj is None:
        return "None"
    return f"leaf of type {type(obj).__name__}"


def _mismatch(tree, other, kind, okind):
    """The error for ``tree`` (of ``kind``) facing ``other``, or ``None``."""
    if kind == _DICT:
        if okind != _DICT:
            return _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                             TypeError)
        if tree.keys() == other.keys():
            return None
        missing = [k for k in tree if k not in other]
        extra = [k for k in other if k not in tree]
        detail = "; ".join(
            f"{what} {keys!r}" for what, keys in (
                ("missing keys", missing), ("extra keys", extra)) if keys)
        return _Mismatch(f"{_describe(tree)} vs {_describe(other)} "
                         f"({detail})", StructureError)
    if kind >= _LIST:
        if okind < _LIST:
            return _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                             TypeError)
        if len(tree) != len(other):
            return _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                             StructureError)
        return None
    if kind != okind:  # a leaf or None facing something else
        return _Mismatch(f"{_describe(tree)} vs {_describe(other)}",
                         TypeError)
    return None


def _raise(exc):
    path = "".join(f"[{key!r}]" for key in reversed(exc.path)) or "<root>"
    raise exc.exc_type(f"at {path}: {exc.message}") from None


def _map1(fn, tree):
    kind = _KINDS.get(type(tree))
    if kind is None:
        kind = _kind_of(type(tree))
    if kind == _LEAF:
        return fn(tree)
    if kind == _DICT:
        return {key: _map1(fn, value) for key, value in tree.items()}
    if kind == _NONE:
        return None
    return _rebuild(tree, kind, [_map1(fn, value) for value in tree])


def _map2(fn, tree, other):
    kind = _KINDS.get(type(tree))
    if kind is None:
        kind = _kind_of(type(tree))
    okind = _KINDS.get(type(other))
    if okind is None:
        okind = _kind_of(type(other))
    if kind == _LEAF and okind == _LEAF:
        return fn(tree, other)
    if kind == _DICT:
        if okind != _DICT or tree.keys() != other.keys():
            raise _mismatch(tree, other, kind, okind)
        result = {}
        try:
            for key, value in tree.items():
                result[key] = _map2(fn, value, other[key])
        except _Mismatch as exc:
            exc.path.append(key)
            raise
        return result
    error = _mismatch(tree, other, kind, okind)
    if error is not None:
        raise error
    if kind == _NONE:
        return None
    values = []
    try:
        for value, item in zip(tree, other):
            values.append(_map2(fn, value, item))
    except _Mismatch as exc:
        exc.path.append(len(values))
        raise
    return _rebuild(tree, kind, values)


def _mapn(fn, tree, others):
    kind = _KINDS.get(type(tree))
    if kind is None:
        kind = _kind_of(type(tree))
    for other in others:
        okind = _KINDS.get(type(other))
        if okind is None:
            okind = _kind_of(type(other))
        error = _mismatch(tree, other, kind, okind)
        if error is not None:
            raise error
    if kind == _LEAF:
        return fn(tree, *others)
    if kind == _NONE:
        return None
    if kind == _DICT:
        result = {}
        for key, value in tree.items():
            try:
                result[key] = _mapn(fn, value, [o[key] for o in others])
            except _Mismatch as exc:
                exc.path.append(key)
                raise
        return result
    values = []
    for index, value in enumerate(tree):
        try:
            values.append(_mapn(fn, value, [o[index] for o in others]))
        except _Mismatch as exc:
            exc.path.append(index)
            raise
    return _rebuild(tree, kind, values)


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
    if kwargs:
        fn = partial(fn, **kwargs)
    if not others:
        return _map1(fn, tree)
    try:
        if len(others) == 1:
            return _map2(fn, tree, others[0])
        return _mapn(fn, tree, others)
    except _Mismatch as exc:
        _raise(exc)


def tuply(fn, tree, *others, **kwargs):
    """Like :func:`suply`, but ``fn`` gets the tuple of corresponding leaves.

    Examples
    --------
    >>> tuply(sum, [1, {"a": 2}], [10, {"a": 20}])
    [11, {'a': 22}]
    """
    def call(*leaves):
        return fn(leaves, **kwargs)

    return suply(call, tree, *others)


def getitem(tree, index):
    """Index every leaf: ``suply(lambda x: x[index], tree)``.

    Examples
    --------
    >>> import numpy as np
    >>> getitem({"a": np.arange(3), "b": (np.arange(3) * 10,)}, 1)
    {'a': np.int64(1), 'b': (np.int64(10),)}
    """
    return _map1(lambda leaf: leaf[index], tree)


def setitem(tree, index, value):
    """Write ``value`` into every leaf of ``tree`` at ``index``, in place.

    ``tree[index] = value`` leaf by leaf, for arrays or tensors. ``value``
    must have ``tree``'s structure; a mismatch raises as in :func:`suply`
    (a dict ``value`` with extra keys is a mismatch too). Leaves written
    before a mismatch is found keep their new values.

    Examples
    --------
    >>> import numpy as np
    >>> buf = {"a": np.zeros(3), "b": (np.zeros(3, int),)}
    >>> setitem(buf, 1, {"a": 0.5, "b": (7,)})
    >>> buf["a"].tolist(), buf["b"][0].tolist()
    ([0.0, 0.5, 0.0], [0, 7, 0])
    """
    try:
        _setitem(tree, index, value)
    except _Mismatch as exc:
        _raise(exc)


def _kind(x):
    kind = _KINDS.get(type(x))
    return _kind_of(type(x)) if kind is None else kind


def _setitem(tree, index, value):
    kind, okind = _kind(tree), _kind(value)
    if kind == _LEAF and okind == _LEAF:
        tree[index] = value
        return
    if kind == _DICT:
        if okind != _DICT or tree.keys() != value.keys():
            raise _mismatch(tree, value, kind, okind)
        for key, leaf in tree.items():
            try:
                _setitem(leaf, index, value[key])
            except _Mismatch as exc:
                exc.path.append(key)
                raise
        return
    error = _mismatch(tree, value, kind, okind)
    if error is not None:
        raise error
    if kind != _NONE:
        position = 0
        try:
            for leaf, item in zip(tree, value):
                _setitem(leaf, index, item)
                position += 1
        except _Mismatch as exc:
            exc.path.append(position)
            raise


def flatten(tree):
    """The leaves of ``tree`` in depth-first order, as a list.

    Examples
    --------
    >>> flatten({"a": 1, "b": (2, [3, None])})
    [1, 2, 3]
    """
    leaves = []
    _flatten(tree, leaves)
    return leaves


def _flatten(tree, leaves):
    kind = _KINDS.get(type(tree))
    if kind is None:
        kind = _kind_of(type(tree))
    if kind == _LEAF:
        leaves.append(tree)
    elif kind == _DICT:
        for value in tree.values():
            _flatten(value, leaves)
    elif kind != _NONE:
        for value in tree:
            _flatten(value, leaves)


def check_structure(tree, *others):
    """Raise :class:`StructureError` or ``TypeError`` unless all match."""
    suply(_noop, tree, *others)


def _noop(*leaves):
    return None
