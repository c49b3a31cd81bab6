"""JAX envs as torch-native sources: a batched functional JAX env stepped
with ``jax.jit`` where JAX put it, its outputs handed to torch through
DLPack without a copy, so that rlplay's torch loops (the fragment loop
of ``same``, ``single`` and ``multi``, the episode loop of ``evaluate``
and the ``Evaluator``) collect it as any torch source. (Workers must be
spawned, ``start_method="spawn"``: JAX does not survive a fork of a
process that runs it.)

Three pieces:

- :class:`JaxEnv`, the protocol a batched JAX env meets (gymnax, Brax
  and MJX-style envs fit it through a small adapter; rlplay ships
  gymnax's, :class:`Gymnax`, and Brax's, :class:`rlplay.envs.Brax` in
  :mod:`rlplay.envs.brax_source`): pure functions of
  a key, a state, a batch of actions and the env's parameters, which
  :class:`JaxSource` compiles once;
- :class:`JaxSource`, a Gymnasium ``VectorEnv`` in same-step autoreset
  whose outputs are torch tensors on the device of the JAX arrays (a
  torch-native source: it has ``device``); a factory returns it;
- :class:`Gymnax`, the protocol met by a gymnax ``Environment``.

The protocol (:class:`JaxEnv`)
------------------------------
``num_envs`` envs stepped together; ``single_observation_space`` and
``single_action_space`` are Gymnasium spaces of one env; ``params`` is a
pytree of arrays (or ``None``) handed to every call, so that changing it
(:meth:`JaxSource.set_params`) compiles nothing again.

``reset(key, params) -> (state, obs)``
    Every env reset, ``obs`` batched ``(num_envs, ...)``.
``step(key, state, action, params) -> JaxStep``
    Every env stepped with ``action`` (``(num_envs, ...)``), an env whose
    episode ends reset within the step (same-step autoreset):
    :class:`JaxStep` ``(state, obs, reward, terminated, truncated,
    final_obs)``, with ``obs`` the next observation (the reset one where
    an episode ended), ``terminated`` and ``truncated`` bool ``(num_envs,)``
    (a time limit is a truncation; an end that is both is a termination),
    and ``final_obs`` the true last observation, before the reset (equal to
    ``obs`` where no episode ended).

Both must be pure and traceable by ``jax.jit``. Brax's ``AutoResetWrapper``
and gymnax's ``step`` overwrite the last observation with the reset one:
an adapter steps the env without its auto-reset and resets it itself, as
:class:`Gymnax` does with gymnax's ``step_env``/``reset_env`` (and
:class:`~rlplay.envs.Brax` with Brax's bare env).

Keys
----
:class:`JaxSource` holds one key: ``reset(seed=s)`` makes it
``jax.random.key(s)``; every call (a reset, a step, a masked reset) then
splits it, ``key, sub = jax.random.split(key)``, and hands ``sub`` to the
env. :class:`Gymnax` splits that ``sub`` into one key per env
(``jax.random.split(sub, num_envs)``) and gives env ``j`` its key ``j``,
which it uses as gymnax's own ``Environment.reset`` and ``step`` do: so
a plain loop over one gymnax env with these keys is its reference.

No host round trip
------------------
The key, the state and the parameters stay on the device; the actions
come from torch through DLPack (integer actions cast to ``int32`` first
unless JAX runs in 64 bits), the outputs go to torch through DLPack, one
compiled call a step: nothing is read back to the host and nothing is
sent to the device per step (``jax.transfer_guard("disallow")`` holds
around a fragment).

Examples
--------
>>> import gymnax, torch
>>> env, params = gymnax.make("CartPole-v1")
>>> source = JaxSource(Gymnax(env, params, num_envs=3))
>>> obs, info = source.reset(seed=0)
>>> tuple(obs.shape), obs.dtype, source.device
((3, 4), torch.float32, device(type='cpu'))
>>> obs, rew, terminated, truncated, info = source.step(torch.ones(3, dtype=torch.int64))
>>> rew.tolist(), terminated.tolist(), sorted(info)
([1.0, 1.0, 1.0], [False, False, False], ['final_obs'])
"""
import functools
import numbers
from collections import namedtuple
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

try:
    import jax
    import jax.numpy as jnp
except ImportError:  # rlplay[jax] not installed: the classes say so
    jax = jnp = None

__all__ = ["JaxEnv", "JaxStep", "JaxSource", "Gymnax", "gymnax_space"]


class JaxStep(NamedTuple):
    """What :meth:`JaxEnv.step` returns, JAX arrays batched over the envs
    (see the module docstring): the new state, the next observations
    (reset ones where an episode ended), the rewards, the terminations and
    truncations (bool ``(num_envs,)``) and the true last observations."""
    state: Any
    obs: Any
    reward: Any
    terminated: Any
    truncated: Any
    final_obs: Any


class JaxEnv:
    """The protocol of a batched functional JAX env (see the module
    docstring); a class need not derive from it, only meet it.

    Attributes
    ----------
    num_envs : int
    single_observation_space, single_action_space : gymnasium.Space
    params : pytree of arrays, or None
    """

    num_envs = 1
    single_observation_space = single_action_space = None
    params = None

    def reset(self, key, params):
        """``(state, obs)``: every env reset with ``key``."""
        raise NotImplementedError

    def step(self, key, state, action, params):
        """A :class:`JaxStep`: every env stepped with ``action``."""
        raise NotImplementedError


class Gymnax(JaxEnv):
    """:class:`JaxEnv` for a gymnax ``Environment``: ``num_envs`` copies
    stepped with ``jax.vmap``.

    A step is gymnax's ``Environment.step`` for each env with its own key
    (``key_step, key_reset = split(key)``; ``step_env`` with the first,
    ``reset_env`` with the second, the reset taken where ``done``), with
    ``step_env``'s observation kept as the true last one. gymnax ends an
    episode at its time limit with ``done`` alone (``state.time >=
    params.max_steps_in_episode`` is part of ``is_terminal``); here an
    end at the limit is a truncation unless ``is_terminal`` holds without
    the limit (the env's parameters with ``max_steps_in_episode`` at its
    largest value), as Gymnasium's ``TimeLimit`` counts an end that is
    both a termination. An env without ``is_terminal`` has every end at
    the limit counted a truncation.

    Parameters
    ----------
    env : gymnax.environments.environment.Environment
    params : gymnax EnvParams, optional
        ``env.default_params`` by default; put on the device once, as
        arrays.
    num_envs : int
        At least 1.

    Raises
    ------
    TypeError, ValueError
        A bad ``num_envs`` or a space that has no Gymnasium counterpart.
    """

    def __init__(self, env, params=None, num_envs=1):
        _need_jax()
        self.num_envs = _count(num_envs, "num_envs")
        self.env = env
        params = env.default_params if params is None else params
        self.params = jax.tree.map(jnp.asarray, params)
        self.single_observation_space = gymnax_space(
            env.observation_space(params), "observation space")
        self.single_action_space = gymnax_space(
            env.action_space(params), "action space")
        self._reset = jax.vmap(env.reset_env, in_axes=(0, None))
        self._step = jax.vmap(self._step_one, in_axes=(0, 0, 0, None))

    def reset(self, key, params):
        obs, state = self._reset(jax.random.split(key, self.num_envs),
                                 params)
        return state, obs

    def step(self, key, state, action, params):
        return JaxStep(*self._step(jax.random.split(key, self.num_envs),
                                   state, action, params))

    def _step_one(self, key, state, action, params):
        # gymnax's Environment.step, the observation of step_env kept
        env = self.env
        key_step, key_reset = jax.random.split(key)
        obs_st, state_st, reward, done, _ = env.step_env(
            key_step, state, action, params)
        obs_re, state_re = env.reset_env(key_reset, params)
        state = jax.tree.map(lambda x, y: jax.lax.select(done, x, y),
                             state_re, state_st)
        obs = jax.lax.select(done, obs_re, obs_st)
        done = jnp.asarray(done, bool)
        at_limit = state_st.time >= params.max_steps_in_episode
        try:
            unlimited = params.replace(max_steps_in_episode=jnp.iinfo(
                jnp.asarray(params.max_steps_in_episode).dtype).max)
            terminal = jnp.asarray(env.is_terminal(state_st, unlimited),
                                   bool)
        except NotImplementedError:
            terminal = jnp.zeros((), bool)
        truncated = done & at_limit & ~terminal
        return (state, obs, jnp.asarray(reward, jnp.float32),
                done & ~truncated, truncated, obs_st)


def gymnax_space(space, what="space"):
    """The Gymnasium space of a gymnax space (``Discrete``, ``Box``,
    ``Dict``, ``Tuple``).

    Raises
    ------
    TypeError
        Another kind of space, naming ``what`` and its type.
    """
    name = type(space).__name__
    if name == "Discrete":
        return spaces.Discrete(int(space.n))
    if name == "Box":
        dtype = np.dtype(space.dtype)
        shape = tuple(space.shape)
        low = np.broadcast_to(np.asarray(space.low, dtype), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype), shape)
        return spaces.Box(low, high, shape, dtype)
    if name == "Dict":
        return spaces.Dict({key: gymnax_space(sub, f"{what}[{key!r}]")
                            for key, sub in space.spaces.items()})
    if name == "Tuple":
        return spaces.Tuple([gymnax_space(sub, f"{what}[{i}]")
                             for i, sub in enumerate(space.spaces)])
    raise TypeError(f"the {what} is a gymnax {name}, which has no "
                    f"Gymnasium counterpart here (Discrete, Box, Dict, "
                    f"Tuple)")


class JaxSource(VectorEnv):
    """A :class:`JaxEnv` as a torch-native Gymnasium ``VectorEnv``, in
    same-step autoreset (see the module docstring).

    ``step`` returns torch tensors on :attr:`device`, sharing the JAX
    arrays' memory (DLPack), and the true last observations in
    ``info["final_obs"]`` (dense, equal to the observations where no
    episode ended). ``reset(options={"reset_mask": mask})`` resets the
    envs of ``mask`` (a bool tensor of ``num_envs``) alone, the others
    keeping their observations.

    Parameters
    ----------
    env : JaxEnv
    device : jax.Device, optional
        Where the key, state and parameters live (``jax.devices()[0]``
        by default).

    Raises
    ------
    TypeError, ValueError
        An ``env`` that does not meet the protocol, or a device that is
        neither the CPU nor CUDA.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env, device=None):
        _need_jax()
        for name in ("num_envs", "single_observation_space",
                     "single_action_space", "reset", "step"):
            if not hasattr(env, name):
                raise TypeError(f"env must meet the JaxEnv protocol (num_envs,"
                                f" single_observation_space, "
                                f"single_action_space, reset, step), got "
                                f"{type(env).__name__} without {name!r}")
        self.env = env
        self.num_envs = _count(env.num_envs, "env.num_envs")
        self.jax_device = jax.devices()[0] if device is None else device
        self.device = _torch_device(self.jax_device)
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = batch_space(self.single_observation_space,
                                             self.num_envs)
        self.action_space = batch_space(self.single_action_space,
                                        self.num_envs)
        self.params = jax.device_put(getattr(env, "params", None),
                                     self.jax_device)
        self._casts = _action_casts(self.single_action_space)
        self._key = self._state = self._obs = None
        self._calls = _compiled()

    # --------------------------------------------------- the VectorEnv --
    def reset(self, *, seed=None, options=None):
        """Reset every env (the key made from ``seed``, an int or the first
        of a list; a fresh one from the OS where none was made yet), or
        with ``options={"reset_mask": mask}`` those of ``mask``; returns
        ``(obs, {})``, torch tensors."""
        mask = None if not options else options.get("reset_mask")
        if mask is not None and self._state is not None:
            mask = _to_jax(torch.as_tensor(mask, dtype=torch.bool,
                                           device=self.device))
            if mask.shape != (self.num_envs,):
                raise ValueError(f"reset_mask must have shape "
                                 f"({self.num_envs},), got "
                                 f"{tuple(mask.shape)}")
            self._key, self._state, self._obs = self._calls.reset_some(
                self.env, self._key, self._state, self._obs, mask, self.params)
            return _to_torch(self._obs), {}
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        if seed is None and self._key is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        if seed is not None:
            self._key = jax.device_put(jax.random.key(int(seed)),
                                       self.jax_device)
        self._key, self._state, self._obs = self._calls.reset_all(
            self.env, self._key, self.params)
        return _to_torch(self._obs), {}

    def step(self, action):
        """Step every env with ``action`` (torch tensors on :attr:`device`):
        ``(obs, reward, terminated, truncated, {"final_obs": ...})``, torch
        tensors there."""
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        action = self._casts(action)
        (self._key, self._state, self._obs, reward, terminated, truncated,
         final) = self._calls.step(self.env, self._key, self._state,
                                   action, self.params)
        return (_to_torch(self._obs), _to_torch(reward),
                _to_torch(terminated), _to_torch(truncated),
                {"final_obs": _to_torch(final)})

    def set_params(self, **changes):
        """Change fields of the env's parameters (a gymnax ``EnvParams``,
        a flax or ``dataclasses`` dataclass, a namedtuple): for every env,
        from the next step on, compiled as before (``call_envs("set_params",
        max_steps_in_episode=100)``)."""
        params = self.params
        if hasattr(params, "replace"):
            params = params.replace(**changes)
        elif hasattr(params, "_replace"):
            params = params._replace(**changes)
        else:
            import dataclasses
            params = dataclasses.replace(params, **changes)
        # the same dtypes as before: nothing to compile again
        params = jax.tree.map(lambda new, old: jnp.asarray(new, old.dtype),
                              params, self.params)
        self.params = jax.device_put(params, self.jax_device)

    def close(self, **kwargs):
        self._key = self._state = self._obs = None


# ------------------------------------------------------------------ helpers

def _need_jax():
    if jax is None:
        raise ImportError("rlplay.envs.jax_source needs JAX and gymnax: "
                          "pip install -e 'path/to/rlplay[jax]' (from a "
                          "clone of rlplay)")


@functools.lru_cache(maxsize=None)
def _compiled():
    """The compiled calls of every source, made at the first one:
    compiled once per env object (a static argument), whatever the sources
    over it, so that sources made over one env share their compilations."""

    def reset_all(env, key, params):
        key, sub = jax.random.split(key)
        state, obs = env.reset(sub, params)
        return key, state, obs

    def reset_some(env, key, state, obs, mask, params):
        key, sub = jax.random.split(key)
        fresh_state, fresh_obs = env.reset(sub, params)

        def where(new, old):
            return jnp.where(mask.reshape(mask.shape + (1,) * (
                jnp.ndim(old) - 1)), new, old)

        return (key, jax.tree.map(where, fresh_state, state),
                jax.tree.map(where, fresh_obs, obs))

    def step(env, key, state, action, params):
        key, sub = jax.random.split(key)
        out = env.step(sub, state, action, params)
        return (key, out.state, out.obs,
                jnp.asarray(out.reward, jnp.float32),
                jnp.asarray(out.terminated, bool),
                jnp.asarray(out.truncated, bool), out.final_obs)

    return _Compiled(*[jax.jit(fn, static_argnums=0)
                       for fn in (reset_all, reset_some, step)])


_Compiled = namedtuple("_Compiled", "reset_all reset_some step")


def _count(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got "
                        f"{type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


def _torch_device(device):
    """The torch device of a JAX device (the CPU, or a CUDA GPU by its
    index among the visible ones)."""
    platform = device.platform
    if platform == "cpu":
        return torch.device("cpu")
    if platform in ("gpu", "cuda"):
        return torch.device("cuda", device.local_hardware_id)
    raise ValueError(f"device must be a CPU or CUDA device of JAX, got "
                     f"{device!r} ({platform})")


def _to_torch(tree):
    """JAX arrays as torch tensors sharing their memory (DLPack)."""
    return jax.tree.map(torch.from_dlpack, tree)


def _to_jax(tensor):
    return jnp.from_dlpack(tensor)


def _action_casts(space):
    """``cast(act)``: torch actions as JAX arrays on their device, leaf by
    leaf; integer leaves as ``int32`` and float ones as ``float32``
    unless JAX runs in 64 bits (a cast on the device, then DLPack)."""
    if jax.config.jax_enable_x64:
        narrow = {}
    else:
        narrow = {torch.int64: torch.int32, torch.float64: torch.float32}

    def leaf(act):
        dtype = narrow.get(act.dtype)
        return _to_jax(act if dtype is None else act.to(dtype))

    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return lambda act: jax.tree.map(leaf, act, is_leaf=lambda x:
                                        isinstance(x, torch.Tensor))
    return leaf
