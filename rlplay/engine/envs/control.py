"""Env control: calling a method of every env of an env batch, between
fragments (what ``feed.call_envs(name, *args, **kwargs)`` of every
generator does, in every worker: see ``call_envs`` in
:mod:`rlplay.engine.rollout`).

Where the method is looked up, by source:

- a single Gymnasium env: through its wrappers (``get_wrapper_attr``, as
  Gymnasium's vector envs do), once per env, in column order;
- a ``SyncVectorEnv`` or an ``AsyncVectorEnv`` (under any vector
  wrappers): Gymnasium's ``VectorEnv.call`` of the unwrapped vector env,
  which calls the method of each of its envs (their own wrappers
  included);
- any other Gymnasium ``VectorEnv`` (a natively vectorized one, such as
  ``CartPoleVectorEnv``): its own method, once, for all its envs;
- a PettingZoo parallel env: its own method (looked up through
  PettingZoo's wrappers, else on its ``unwrapped`` env: an AEC env run in
  parallel), once per env for all its agents' columns, env after env;
- EnvPool: refused (:data:`ENVPOOL_REFUSAL`): its envs live in C++ and
  take no Python calls.

The envs' return values are dropped. A method that is missing, is not
callable, or raises is an :class:`~rlplay.engine.errors.EnvCallError`
naming the method and the env column (the columns of a vector source),
with the env's exception as its ``__cause__``.

``reset``, ``step`` and ``close`` are refused up front
(:func:`check_method`), as Gymnasium's ``AsyncVectorEnv.call`` refuses
them: a reset between fragments would break the rule that row 0 of a
fragment continues row ``T`` of the one before, and a step would be a
transition that no fragment records.
"""
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from ..errors import EnvCallError

__all__ = ["REFUSED_METHODS", "ENVPOOL_REFUSAL", "check_method", "call_env",
           "call_source", "call_parallel"]

# methods that call_envs never calls (see the module docstring)
REFUSED_METHODS = ("reset", "step", "close")

ENVPOOL_REFUSAL = ("{name} cannot take call_envs: EnvPool's envs run in C++ "
                   "and have no Python methods to call; change them through "
                   "the factory (a new rollout), or use Gymnasium envs")


def check_method(name):
    """Check the method ``name`` of a ``call_envs`` call; returns it.

    Raises
    ------
    TypeError
        ``name`` is not a str.
    ValueError
        Not an identifier, or one of :data:`REFUSED_METHODS`.
    """
    if not isinstance(name, str):
        raise TypeError(f"call_envs: name must be the name of a method of "
                        f"the envs (a str), got {type(name).__name__} "
                        f"{name!r}")
    if not name.isidentifier():
        raise ValueError(f"call_envs: name must be a method's name, got "
                         f"{name!r}")
    if name in REFUSED_METHODS:
        raise ValueError(
            f"call_envs: {name!r} is refused: rlplay resets and steps the "
            f"envs itself, and a {name}() between fragments would break the "
            f"fragments' continuity; have your method take effect at the "
            f"env's next reset instead")
    return name


def _called(name, args, kwargs):
    # "set_level(3)" for messages, arguments cut short
    shown = [repr(a) for a in args] + [f"{k}={v!r}"
                                       for k, v in kwargs.items()]
    text = ", ".join(shown)
    return f"{name}({text if len(text) <= 60 else text[:57] + '...'})"


def call_env(env, name, args, kwargs, column):
    """Call ``env``'s method ``name(*args, **kwargs)`` (looked up through
    its wrappers), for env column ``column``.

    Raises
    ------
    EnvCallError
        The method is missing, is not callable, or raised.
    """
    getter = getattr(env, "get_wrapper_attr", None)
    try:
        method = getattr(env, name) if getter is None else getter(name)
    except AttributeError:
        kind = type(getattr(env, "unwrapped", env)).__name__
        raise EnvCallError(f"env column {column} ({kind}) has no method "
                           f"{name!r} to call", method=name,
                           column=column) from None
    _call(method, name, args, kwargs, f"env column {column}", column)


def call_source(batch, name, args, kwargs, first=0):
    """Call the method ``name(*args, **kwargs)`` of every env of a vector
    source ``batch`` (a :class:`~.vector.VectorSource`, whose columns are
    numbered from ``first``), as the module docstring says.

    Raises
    ------
    EnvCallError
        The source refuses calls (EnvPool), or the method is missing, is
        not callable, or raised.
    """
    if batch.call_refusal is not None:
        raise EnvCallError(batch.call_refusal, method=name)
    base = batch.source.unwrapped
    where = (f"env columns {first}..{first + batch.n_envs - 1} "
             f"({batch.name})")
    if isinstance(base, (SyncVectorEnv, AsyncVectorEnv)):
        try:
            base.call(name, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported, with its cause
            raise EnvCallError(
                f"{_called(name, args, kwargs)} of {where}, through "
                f"VectorEnv.call, raised {type(exc).__name__}: {exc}",
                method=name) from exc
        return
    method = getattr(base, name, None)
    if method is None:
        raise EnvCallError(
            f"{where} is a natively vectorized env without a method "
            f"{name!r} (its own method is called, once for all its envs)",
            method=name)
    _call(method, name, args, kwargs, where, None)


def call_parallel(env, name, args, kwargs, first, n_agents):
    """Call the method ``name(*args, **kwargs)`` of a PettingZoo parallel
    ``env`` once, for its ``n_agents`` columns from ``first`` on.

    Raises
    ------
    EnvCallError
        The method is missing, is not callable, or raised.
    """
    base = getattr(env, "unwrapped", env)
    where = (f"env columns {first}..{first + n_agents - 1} (the "
             f"{type(base).__name__}'s agents)")
    # PettingZoo's parallel wrappers forward public names to the env they
    # wrap; aec_to_parallel's wrapper does not, hence the unwrapped env
    method = getattr(env, name, None)
    if method is None:
        method = getattr(base, name, None)
    if method is None:
        raise EnvCallError(f"{where} has no method {name!r} to call",
                           method=name)
    _call(method, name, args, kwargs, where, None)


def _call(method, name, args, kwargs, where, column):
    if not callable(method):
        raise EnvCallError(f"{where}: {name!r} is a "
                           f"{type(method).__name__}, not a method to call",
                           method=name, column=column)
    try:
        method(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported, with its cause
        raise EnvCallError(
            f"{_called(name, args, kwargs)} of {where} raised "
            f"{type(exc).__name__}: {exc}", method=name,
            column=column) from exc
