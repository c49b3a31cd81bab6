"""Single Gymnasium envs: making, checking, calling and closing them.

A factory is checked to be one (:func:`check_factory`), called once per
``SeedSequence`` (:func:`make_envs`, with ``seed=`` where it takes it) and
what it returns checked to be a Gymnasium env; :func:`reset`,
:func:`check_step` and :func:`reward` check what an env's ``reset`` and
``step`` return; :func:`close_envs` closes a list of envs.
"""
import inspect
import numbers

import gymnasium
import numpy as np

from ..seeds import reset_seed

__all__ = ["make_envs", "check_factory", "close_envs", "reset",
           "check_step", "reward"]


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
    check_factory(factory)
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


def check_factory(factory):
    """Check that ``factory`` is callable, with a hint for an env made
    already or an env id given in its place.

    Raises
    ------
    TypeError
        Naming what was given and, for an env or an env id, the factory
        to pass instead.

    Examples
    --------
    >>> check_factory("CartPole-v1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: factory must be callable ... functools.partial(gymnasium.make, 'CartPole-v1')
    """
    if callable(factory):
        return
    hint = ""
    if isinstance(factory, str):
        hint = (f": pass a function that makes the env, such as "
                f"functools.partial(gymnasium.make, {factory!r})")
    elif hasattr(factory, "step") and hasattr(factory, "reset"):
        spec = getattr(getattr(factory, "unwrapped", factory), "spec", None)
        name = getattr(spec, "id", None) or "ENV_ID"
        hint = (f" (rlplay makes and seeds its own envs, several of them, "
                f"in each worker): pass a function that makes one instead "
                f"of an env, such as functools.partial(gymnasium.make, "
                f"{name!r})")
    raise TypeError(f"factory must be callable and return a Gymnasium env, "
                    f"got {type(factory).__name__}{hint}")


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
