"""Brax envs (and MuJoCo's MJX through Brax's ``mjx`` backend) as
batched JAX envs for :class:`~rlplay.envs.JaxSource`: :class:`Brax` meets
the :class:`~rlplay.envs.JaxEnv` protocol for a Brax ``Env``.

Brax's training wrappers (``brax.envs.training.wrap``: ``VmapWrapper``,
``EpisodeWrapper``, ``AutoResetWrapper``) batch the env, cut its episodes
at a time limit and reset the envs that are done, writing the first
observation of the next episode over the last one of the ended episode.
:class:`Brax` does their work itself, keeping the last observation:

- **batching**: ``jax.vmap`` of the env's ``reset`` and ``step`` over
  ``num_envs`` copies, as ``VmapWrapper``;
- **time limit**: Brax's ``EpisodeWrapper`` semantics. A step of
  :class:`Brax` is ``action_repeat`` steps of the env with the same
  action (rewards summed, the ``done`` of the last one), and counts
  ``action_repeat`` steps of the env: the episode ends at the first step
  whose count reaches ``episode_length`` (``params.episode_length``, a
  count of the env's own steps, so an episode lasts
  ``ceil(episode_length / action_repeat)`` steps of :class:`Brax`, each
  of ``action_repeat * env.dt`` seconds). An end there is Brax's
  ``truncation`` (``truncated``) unless the env's ``done`` holds too,
  which Brax counts a termination (``terminated``) as Gymnasium's
  ``TimeLimit`` does;
- **resets**: an env whose episode ended is reset within the step
  (same-step autoreset), its last observation kept in ``final_obs``.

Keys: every call of :class:`~rlplay.envs.JaxSource` hands :class:`Brax`
one key, split into one per env (``jax.random.split(key, num_envs)``);
env ``j`` is reset with its key ``j`` (Brax's ``step`` takes no key), as
``VmapWrapper(env, batch_size=num_envs).reset(key)`` resets them: a loop
over one env at a time with these keys is its reference
(``tests/test_brax_source.py``).

Parameters worth setting between fragments: the time limit,
``call_envs("set_params", episode_length=...)``. Brax's physical
parameters (its ``System``, ``env.sys``) are constants of the compiled
step, not arguments: a change of them is a new env.
"""
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from .jax_source import JaxEnv, JaxStep, _count, _need_jax, jax, jnp

try:
    from brax import envs as brax_envs
    from brax.envs.wrappers import training as brax_training
except ImportError:  # rlplay[jax] without Brax: the class says so
    brax_envs = brax_training = None

__all__ = ["Brax", "BraxParams"]


class BraxParams(NamedTuple):
    """The parameters of :class:`Brax` handed to every compiled call
    (``JaxSource.set_params`` changes them, compiling nothing again)."""
    episode_length: Any
    """int32 scalar: the time limit, in steps of the env (Brax's
    ``EpisodeWrapper`` counts ``action_repeat`` a step)."""


class Brax(JaxEnv):
    """:class:`~rlplay.envs.JaxEnv` for a Brax ``Env``: ``num_envs``
    copies stepped with ``jax.vmap``, Brax's time limit and auto-reset
    done here so that the last observation of an episode is kept (see the
    module docstring).

    Parameters
    ----------
    env : brax.envs.Env or str
        A Brax env without Brax's ``VmapWrapper`` (nor
        ``DomainRandomizationVmapWrapper``), ``EpisodeWrapper`` or
        ``AutoResetWrapper`` (other wrappers are fine), or the name of a
        registered one (``"halfcheetah"``), made with
        ``brax.envs.get_environment(env, backend=backend, **kwargs)``.
    num_envs : int
        At least 1.
    episode_length : int
        The time limit in steps of the env (Brax's ``EpisodeWrapper``);
        1000 by default, as ``brax.envs.training.wrap``.
    action_repeat : int
        Steps of the env per step, with the same action (at least 1).
    backend : str, optional
        Brax's physics pipeline (``"generalized"``, ``"positional"``,
        ``"spring"`` or ``"mjx"``, MuJoCo's MJX) of an env made by name;
        for an env given, ``None`` or the env's own backend.
    **kwargs
        Of ``brax.envs.get_environment``, for an env made by name.

    Raises
    ------
    TypeError
        An ``env`` that is not a Brax env or is wrapped by one of the
        wrappers above; a bad count.
    ValueError
        A count below 1, or a ``backend`` that differs from a given env's.
    """

    def __init__(self, env, num_envs=1, episode_length=1000, action_repeat=1,
                 backend=None, **kwargs):
        _need_brax()
        self.num_envs = _count(num_envs, "num_envs")
        episode_length = _count(episode_length, "episode_length")
        self.action_repeat = _count(action_repeat, "action_repeat")
        if isinstance(env, str):
            if backend is not None:
                kwargs["backend"] = backend
            env = brax_envs.get_environment(env, **kwargs)
        elif not isinstance(env, brax_envs.Env):
            raise TypeError(f"env must be a Brax Env or the name of one, got "
                            f"{type(env).__name__} {env!r}")
        elif kwargs:
            raise TypeError(f"keyword arguments {sorted(kwargs)} make an env "
                            f"by name; env is already a "
                            f"{type(env).__name__}")
        elif backend is not None and backend != env.backend:
            raise ValueError(f"backend={backend!r} differs from the env's "
                             f"own, {env.backend!r}")
        _refuse_training_wrappers(env)
        self.env = env
        self.params = BraxParams(jnp.asarray(episode_length, jnp.int32))
        first = jax.eval_shape(env.reset, jax.random.key(0))
        self.single_observation_space = _obs_space(first.obs)
        size = env.action_size
        self.single_action_space = spaces.Box(-1.0, 1.0, (size,), np.float32)
        self._reset = jax.vmap(self._reset_one)
        self._step = jax.vmap(self._step_one, in_axes=(0, 0, 0, None))

    @property
    def backend(self):
        """The env's physics pipeline (Brax's ``env.backend``)."""
        return self.env.backend

    # ------------------------------------------------------- the protocol --
    def reset(self, key, params):
        state, obs = self._reset(jax.random.split(key, self.num_envs))
        return state, obs

    def step(self, key, state, action, params):
        return JaxStep(*self._step(jax.random.split(key, self.num_envs),
                                   state, action, params))

    def _reset_one(self, key):
        state = self.env.reset(key)
        return (state, jnp.zeros((), jnp.int32)), state.obs

    def _step_one(self, key, state, action, params):
        # EpisodeWrapper's step and AutoResetWrapper's, without the latter
        # writing the reset observation over the last one
        env_state, steps = state
        env_state = env_state.replace(done=jnp.zeros_like(env_state.done))
        if self.action_repeat == 1:
            env_state = self.env.step(env_state, action)
            reward = env_state.reward
        else:
            def repeat(s, _):
                s = self.env.step(s, action)
                return s, s.reward

            env_state, rewards = jax.lax.scan(repeat, env_state, (),
                                              self.action_repeat)
            reward = jnp.sum(rewards, axis=0)
        steps = steps + self.action_repeat
        terminated = jnp.asarray(env_state.done) != 0
        truncated = (steps >= params.episode_length) & ~terminated
        ended = terminated | truncated
        (fresh, zero), _ = self._reset_one(key)

        def where(new, old):
            return jnp.where(ended, new, old)

        last = env_state.obs
        env_state = jax.tree.map(where, fresh, env_state)
        steps = jnp.where(ended, zero, steps)
        return ((env_state, steps), env_state.obs,
                jnp.asarray(reward, jnp.float32), terminated, truncated, last)


def _refuse_training_wrappers(env):
    wrappers = (brax_training.VmapWrapper, brax_training.EpisodeWrapper,
                brax_training.AutoResetWrapper,
                brax_training.DomainRandomizationVmapWrapper)
    inner = env
    while isinstance(inner, brax_envs.Wrapper):
        if isinstance(inner, wrappers):
            raise TypeError(f"env must be a Brax env without Brax's "
                            f"VmapWrapper, EpisodeWrapper and "
                            f"AutoResetWrapper (rlplay.envs.Brax does "
                            f"their work; AutoResetWrapper overwrites the "
                            f"last observation), got one wrapped in "
                            f"{type(inner).__name__}")
        inner = inner.env


def _obs_space(obs):
    """The Gymnasium space of one env's observation (its shape and dtype):
    a ``Box`` without bounds, or a ``Dict`` of them."""
    if isinstance(obs, dict):
        return spaces.Dict({key: _obs_space(value)
                            for key, value in obs.items()})
    dtype = np.dtype(obs.dtype)
    return spaces.Box(-np.inf, np.inf, tuple(obs.shape), dtype)


def _need_brax():
    _need_jax()
    if brax_envs is None:
        raise ImportError("rlplay.envs.Brax needs Brax: pip install -e "
                          "'path/to/rlplay[jax]' (from a clone of rlplay)")
