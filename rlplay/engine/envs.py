"""The Gymnasium adapter: the only module that knows the Gymnasium API.

Gymnasium 1.x: ``reset(seed=...)`` returns ``(obs, info)`` and ``step(act)``
returns ``(obs, reward, terminated, truncated, info)``. Spaces map to example
leaves (zero arrays) that size the buffers: ``Box``, ``Discrete``,
``MultiDiscrete``, ``MultiBinary`` and ``Dict``/``Tuple`` nestings of them.

Seeding (the tree is in :mod:`rlplay.engine.seeds`): each env is made
(with ``seed=`` when the factory takes it) and first reset with the seed
drawn from its own ``SeedSequence``, and its action and observation spaces
are seeded from the same one, so that sampling from them is reproducible.
"""
import inspect
import numbers

import gymnasium
import numpy as np
from gymnasium import spaces

from .nested import suply
from .seeds import reset_seed

__all__ = [
    "space_example",
    "make_envs",
    "info_example",
    "close_envs",
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
