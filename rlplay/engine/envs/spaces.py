"""Spaces: example leaves that size the buffers, placeholders, and a
vectorised membership test.

Spaces map to example leaves (zero arrays) that size the buffers: ``Box``,
``Discrete``, ``MultiDiscrete``, ``MultiBinary`` and ``Dict``/``Tuple``
nestings of them; :func:`space_placeholder` gives a valid element of a
space (what the first row of a fragment records as the action that led
there), and :func:`space_checker` a vectorised membership test of a batch
of elements (what collection runs on actions and observations, see
:func:`rlplay.engine.core.collect`). :func:`info_example` lays out the env
info keys a fragment records.
"""
import functools
import numbers

import numpy as np
from gymnasium import spaces

from ..nested import suply

__all__ = [
    "space_example",
    "space_placeholder",
    "space_checker",
    "box_clipper",
    "info_example",
    "format_value",
]


def space_example(space):
    """A nested structure of zero arrays laid out like a sample of ``space``.

    Raises
    ------
    TypeError
        For a space other than Box, Discrete, MultiDiscrete, MultiBinary,
        Dict and Tuple.
    """
    if isinstance(space, spaces.Dict):
        return {key: space_example(sub) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(space_example(sub) for sub in space.spaces)
    if isinstance(space, spaces.Discrete):
        return np.zeros((), dtype=space.dtype)
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete,
                          spaces.MultiBinary)):
        return np.zeros(space.shape, dtype=space.dtype)
    raise TypeError(f"unsupported space {space!r}: rlplay handles Box, "
                    f"Discrete, MultiDiscrete, MultiBinary, Dict and Tuple")


def space_placeholder(space):
    """A valid element of ``space``, laid out as :func:`space_example`: the
    element nearest zero, leaf by leaf.

    Zero where zero belongs to the space, else the nearest bound: ``start``
    for ``Discrete(n, start)`` with ``start > 0``, ``low`` for a ``Box``
    whose ``low`` is above zero, ``high`` where ``high`` is below zero (per
    element of a ``Box`` or ``MultiDiscrete``); all zeros for
    ``MultiBinary``. Collection records it as the action of rows that no
    action led to (the reset row of the first fragment).

    Raises
    ------
    TypeError
        For an unsupported space, as :func:`space_example`.

    Examples
    --------
    >>> space_placeholder(spaces.Discrete(3, start=1))
    array(1)
    >>> space_placeholder(spaces.Box(np.float32([-1, 1]), np.float32(2)))
    array([0., 1.], dtype=float32)
    """
    if isinstance(space, spaces.Dict):
        return {key: space_placeholder(sub)
                for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(space_placeholder(sub) for sub in space.spaces)
    example = space_example(space)  # raises for unsupported spaces
    if isinstance(space, spaces.Discrete):
        low, high = space.start, space.start + space.n - 1
    elif isinstance(space, spaces.MultiDiscrete):
        low, high = space.start, space.start + space.nvec - 1
    elif isinstance(space, spaces.Box):
        low, high = space.low, space.high
    else:  # MultiBinary
        return example
    return np.asarray(np.clip(example, low, high), dtype=space.dtype)


def space_checker(space, name="the value", space_name="the space", *,
                  box_bounds=True):
    """A vectorised membership test for batches of elements of ``space``.

    The cheap part of ``space.contains``, for many elements at once:
    ``Discrete`` and ``MultiDiscrete`` values within ``[start, start + n)``
    (and integral, for float input), ``MultiBinary`` values 0 or 1, ``Box``
    values free of NaN and within ``[low, high]``, ``Dict`` and ``Tuple``
    leaf by leaf. Shapes and dtypes are not checked: a batch laid out by
    :func:`space_example` is assumed.

    Parameters
    ----------
    space : gymnasium.Space
        Box, Discrete, MultiDiscrete, MultiBinary, or Dict/Tuple nestings.
    name, space_name : str
        How messages call a value and the space, e.g. ``"the actor's
        action"`` and ``"the action space"``.
    box_bounds : bool
        Check ``Box`` bounds (NaN is checked either way). Collection checks
        actions without them: it clips them into their ``Box`` first
        (:func:`box_clipper`).

    Returns
    -------
    check : callable
        ``check(batch)`` takes nested arrays laid out as the space, shape =
        ``(N, *space.shape)`` per leaf, and returns ``None`` when every
        element belongs to the space, else ``(i, message)`` for the first
        element ``i`` that does not, e.g. ``(3, "the value 7 is outside the
        space Discrete(3)")``.

    Raises
    ------
    TypeError
        For an unsupported space, as :func:`space_example`.

    Examples
    --------
    >>> check = space_checker(spaces.Discrete(3), "the action",
    ...                       "the action space")
    >>> check(np.array([0, 2, 1])) is None
    True
    >>> check(np.array([0, 2, 7]))
    (2, 'the action 7 is outside the action space Discrete(3)')
    """
    space_example(space)  # raises for unsupported spaces
    leaves = []
    _leaf_tests(space, (), leaves, box_bounds)

    def check(batch):
        for path, leaf, test in leaves:
            x = batch
            for key in path:
                x = x[key]
            x = np.asarray(x)
            bad = test(x)
            if bad is not None and bad.any():
                flat = bad.reshape(len(x), -1).any(1)
                i = int(np.flatnonzero(flat)[0])
                return i, _outside(name, space_name, path, leaf, x[i],
                                   bad[i])
        return None

    return check


def box_clipper(space):
    """The actions that the envs get: batches of actions with their ``Box``
    leaves clipped into their bounds, as new arrays.

    A Gaussian policy samples outside the bounds of its ``Box``, and not
    every env clips what it gets (MuJoCo's HalfCheetah computes its control
    cost on the action as given), so collection gives the envs every
    action clipped into its ``Box``, and records the action that the actor
    chose, whose log-probability the actor computed (as Stable-Baselines3
    and CleanRL store the sampled action and clip the env's copy). NaN is
    left as it is, for the space checks to report.

    Parameters
    ----------
    space : gymnasium.Space
        Box, Discrete, MultiDiscrete, MultiBinary, or Dict/Tuple nestings.

    Returns
    -------
    clipped : callable or None
        ``clipped(batch)``: nested arrays laid out as the space, shape =
        ``(N, *space.shape)`` per leaf, the ``Box`` leaves clipped into
        arrays of the clipper's own, reused by its next call (no
        allocation per step: the env batch copies what each env gets),
        the others as they are (``batch`` is left unchanged); ``None``
        where ``space`` has no ``Box`` with a finite bound (nothing to
        clip).

    Examples
    --------
    >>> clipped = box_clipper(spaces.Box(-1.0, 1.0, (2,), np.float32))
    >>> actions = np.array([[0.5, -13.0], [2.0, 1.0]], np.float32)
    >>> clipped(actions)
    array([[ 0.5, -1. ],
           [ 1. ,  1. ]], dtype=float32)
    >>> actions[0, 1]
    np.float32(-13.0)
    >>> nested = box_clipper(spaces.Tuple((spaces.Discrete(2), spaces.Box(
    ...     0.0, 1.0, (1,), np.float32))))
    >>> nested((np.array([1]), np.array([[2.5]], np.float32)))
    (array([1]), array([[1.]], dtype=float32))
    >>> box_clipper(spaces.Discrete(3)) is None
    True
    """
    space_example(space)  # raises for unsupported spaces
    return _clipper(space)


def _clipper(space):
    """``box_clipper``'s function for ``space`` (``None``: nothing to
    clip in it)."""
    if isinstance(space, spaces.Box):
        if not (np.isfinite(space.low).any() or np.isfinite(space.high).any()):
            return None
        low, high, scratch = space.low, space.high, {}

        def clipped(x):  # into an array of its own, reused from call to call
            out = scratch.get((x.shape, x.dtype))
            if out is None:
                out = scratch[x.shape, x.dtype] = np.empty_like(x)
            return np.clip(x, low, high, out=out)

        return clipped
    if isinstance(space, spaces.Dict):
        parts = {key: _clipper(sub) for key, sub in space.spaces.items()}
        if all(part is None for part in parts.values()):
            return None
        return lambda x: {key: x[key] if part is None else part(x[key])
                          for key, part in parts.items()}
    if isinstance(space, spaces.Tuple):
        parts = [_clipper(sub) for sub in space.spaces]
        if all(part is None for part in parts):
            return None
        return lambda x: tuple(v if part is None else part(v)
                               for part, v in zip(parts, x))
    return None


def _leaf_tests(space, path, leaves, box_bounds):
    """Append ``(path, leaf space, test)`` per leaf; ``test(x)`` returns the
    elementwise mask of bad values (or ``None`` for nothing to check)."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _leaf_tests(sub, (*path, key), leaves, box_bounds)
    elif isinstance(space, spaces.Tuple):
        for k, sub in enumerate(space.spaces):
            _leaf_tests(sub, (*path, k), leaves, box_bounds)
    elif isinstance(space, spaces.Discrete):
        leaves.append((path, space, functools.partial(
            _outside_range, low=space.start, high=space.start + space.n - 1)))
    elif isinstance(space, spaces.MultiDiscrete):
        leaves.append((path, space, functools.partial(
            _outside_range, low=space.start,
            high=space.start + space.nvec - 1)))
    elif isinstance(space, spaces.MultiBinary):
        leaves.append((path, space, _not_binary))
    elif isinstance(space, spaces.Box):
        low = high = None
        if box_bounds:
            # an infinite bound checks nothing: skip the comparison
            low = None if np.isneginf(space.low).all() else space.low
            high = None if np.isposinf(space.high).all() else space.high
        leaves.append((path, space, functools.partial(
            _outside_box, low=low, high=high)))


def _outside_range(x, low, high):
    bad = (x < low) | (x > high)
    if x.dtype.kind in "fc":  # not integral (NaN included)
        bad |= x != np.floor(x)
    return bad


def _not_binary(x):
    return (x != 0) & (x != 1)


def _outside_box(x, low, high):
    bad = np.isnan(x) if x.dtype.kind in "fc" else None
    for bound, op in ((low, np.less), (high, np.greater)):
        if bound is not None:
            out = op(x, bound)
            bad = out if bad is None else bad | out
    return bad


def format_value(value):
    """A short display of an array (or number) for messages."""
    value = np.asarray(value)
    if value.ndim == 0:
        return repr(value.item())
    return np.array2string(value, separator=", ", threshold=8, edgeitems=2)


def _outside(name, space_name, path, leaf, value, bad):
    """The message for ``value`` (one element of ``leaf``, at ``path`` of
    the space) whose elementwise mask of bad values is ``bad``."""
    at = "".join(f"[{key!r}]" for key in path)
    where = (f"{space_name} {leaf!r}" if not path
             else f"{leaf!r}, at {at} of {space_name}")
    value = np.asarray(value)
    nan = value.dtype.kind in "fc" and bool(np.isnan(value).any())
    if value.size > 8:
        index = tuple(int(k) for k in np.argwhere(np.asarray(bad))[0])
        return (f"{name}{at} holds {format_value(value[index])} at "
                f"{list(index)}, outside {where}")
    if nan:
        return f"{name}{at} holds nan, outside {where}"
    return f"{name}{at} {format_value(value)} is outside {where}"


def info_example(spec):
    """Example leaves for recording env ``info`` keys.

    Parameters
    ----------
    spec : dict or None
        ``{key: example}``: the info keys to record and an example value of
        each (a number, an array or a nested dict of them), giving shape and
        dtype. Python ``bool``, ``int`` and ``float`` examples map to
        ``bool``, ``int64`` and ``float32``. ``None`` records nothing.
    """
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise TypeError(f"env info spec must be a dict of example values, "
                        f"got {type(spec).__name__}")

    def leaf(value):
        if isinstance(value, bool):
            return np.zeros((), bool)
        if isinstance(value, numbers.Integral):
            return np.zeros((), np.int64)
        if isinstance(value, numbers.Real):
            return np.zeros((), np.float32)
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"env info values must be numeric, got "
                            f"{array.dtype} for {value!r}")
        return np.zeros(array.shape, array.dtype)

    return suply(leaf, spec)
