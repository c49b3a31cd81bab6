"""The Gymnasium adapter: the only module that knows the Gymnasium API.

Gymnasium 1.x: ``reset(seed=...)`` returns ``(obs, info)`` and ``step(act)``
returns ``(obs, reward, terminated, truncated, info)``. Spaces map to example
leaves (zero arrays) that size the buffers: ``Box``, ``Discrete``,
``MultiDiscrete``, ``MultiBinary`` and ``Dict``/``Tuple`` nestings of them;
:func:`space_placeholder` gives a valid element of a space (what the first
row of a fragment records as the action that led there), and
:func:`space_checker` a vectorised membership test of a batch of elements
(what collection runs on actions and observations, see
:func:`rlplay.engine.core.collect`).

Seeding (the tree is in :mod:`rlplay.engine.seeds`): each env is made
(with ``seed=`` when the factory takes it) and first reset with the seed
drawn from its own ``SeedSequence``, and its action and observation spaces
are seeded from the same one, so that sampling from them is reproducible.
"""
import functools
import inspect
import numbers

import gymnasium
import numpy as np
from gymnasium import spaces

from .nested import suply
from .seeds import reset_seed

__all__ = [
    "space_example",
    "space_placeholder",
    "space_checker",
    "make_envs",
    "info_example",
    "close_envs",
    "reward",
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
        actions without them: a Gaussian policy samples outside the bounds
        of its ``Box`` and Gymnasium's continuous envs clip what they get.

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


def _format_value(value):
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
        return (f"{name}{at} holds {_format_value(value[index])} at "
                f"{list(index)}, outside {where}")
    if nan:
        return f"{name}{at} holds nan, outside {where}"
    return f"{name}{at} {_format_value(value)} is outside {where}"


def _accepts_seed(factory):
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    # only an explicit `seed` parameter: `gymnasium.make(**kwargs)` would
    # forward it to the env's constructor, which may not take it
    return "seed" in params and params["seed"].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def make_envs(factory, seed_sequences):
    """Build one env per seed sequence with ``factory`` and check each.

    A factory with an explicit ``seed`` parameter receives its env's integer seed too.
    The spaces of each env are seeded from its sequence.

    Raises
    ------
    TypeError
        ``factory`` is not callable or returns something that is not a
        Gymnasium environment (no ``reset``/``step``/spaces).
    Exception
        Whatever ``factory`` raises, as it is. Envs already made are
        closed first.
    """
    if not callable(factory):
        raise TypeError(f"factory must be callable and return a Gymnasium "
                        f"env, got {type(factory).__name__}")
    pass_seed = _accepts_seed(factory)
    envs = []
    try:
        for ss in seed_sequences:
            seed = reset_seed(ss)
            env = factory(seed=seed) if pass_seed else factory()
            _check_env(env, factory)
            env.action_space.seed(seed)
            env.observation_space.seed(seed)
            envs.append(env)
    except BaseException:
        # the envs made so far would leak otherwise; the original error wins
        try:
            close_envs(envs)
        except Exception:  # noqa: BLE001
            pass
        raise
    return envs


def close_envs(envs, quiet=False):
    """Close every env, even if some ``close()`` raise: the first error is
    re-raised once all were tried, unless ``quiet`` (a worker that is
    ending: nobody listens any more)."""
    error = None
    for env in envs:
        try:
            env.close()
        except Exception as exc:  # noqa: BLE001 - re-raised below
            error = error or exc
    if error is not None and not quiet:
        raise error


def _check_env(env, factory):
    missing = [name for name in ("reset", "step", "observation_space",
                                 "action_space") if not hasattr(env, name)]
    if missing or not isinstance(env.observation_space, gymnasium.Space) \
            or not isinstance(env.action_space, gymnasium.Space):
        raise TypeError(f"factory {factory!r} returned {type(env).__name__}, "
                        f"which is not a Gymnasium env (missing or invalid: "
                        f"{missing or 'spaces'})")


def reset(env, seed=None):
    """``env.reset(seed=seed)``, checked to return ``(obs, info)``."""
    result = env.reset(seed=seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"{type(env).__name__}.reset() must return "
                        f"(obs, info) as in Gymnasium 1.x, got "
                        f"{type(result).__name__}")
    return result


def check_step(env, result):
    """Check a ``step`` result is Gymnasium 1.x's 5-tuple; return it."""
    if not (isinstance(result, tuple) and len(result) == 5):
        raise TypeError(f"{type(env).__name__}.step() must return (obs, "
                        f"reward, terminated, truncated, info) as in "
                        f"Gymnasium 1.x, got {type(result).__name__} of "
                        f"length {len(result) if isinstance(result, tuple) else '?'}")
    return result


def reward(value, j, t):
    """``value``, the reward env ``j`` returned at step ``t``, as a Python
    float: a real number (Python's or numpy's, a 0-d or one-element numeric
    array too).

    Raises
    ------
    TypeError
        Anything else (a string, ``None``, an array of several values),
        naming the env column and the step.
    """
    if type(value) is float:
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, np.ndarray):
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 \
            and value.dtype.kind in "biuf":
        return float(value.reshape(()))
    raise TypeError(f"env {j} step {t}: the reward must be a real number, "
                    f"got {type(value).__name__} {value!r}")


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
