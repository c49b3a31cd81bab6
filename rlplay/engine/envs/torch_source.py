"""Torch-native batched sources: a ``VectorEnv`` (or an object with its
``step``/``reset`` contract) whose outputs are torch tensors on some
device, as an :class:`~.batch.EnvBatch` of ``num_envs`` columns of kind
``"torch"``, which the torch fragment loop
(:mod:`rlplay.engine.core.torch_loop`) steps.

What makes a source torch-native (:func:`source_device`): it has
``num_envs``, ``single_observation_space``, ``single_action_space``,
``reset`` and ``step``, and a ``device`` attribute (a ``torch.device``
or a string: Isaac Lab's envs, :class:`rlplay.envs.TorchCartPole`), or it
is one of Gymnasium's ``NumpyToTorch``/``JaxToTorch`` vector wrappers
(``device=None`` meaning the CPU), outermost or under other vector
wrappers.

Its interface is the torch loops': :meth:`TorchSource.start` resets
every column and writes the observations into a row of tensors;
:meth:`TorchSource.advance` steps every column with a tensor of actions
and writes a :class:`TorchRow` with torch operations, returning what
happened as tensors on the device (:class:`TorchStepped`): nothing here
reads a value of the device back to the host, so that no step waits for
the device. A source that ended an episode without giving its true last
observation is found out once per fragment, or evaluation
(:meth:`TorchSource.finish`).

Autoreset modes (the source's ``metadata["autoreset_mode"]``, Gymnasium's
``AutoresetMode``; next-step by default), each exact:

- ``SAME_STEP``: the source resets an ended env within the step; its true
  last observation comes in ``info["final_obs"]`` (ManiSkill's
  ``info["final_observation"]`` too): dense tensors laid out as the
  observations, read where the episode ended, with the mask
  ``info["_final_obs"]`` where given. A step that ended an episode
  without it (the key absent, or its mask false there) is an error at the
  end of the fragment, never an approximation (with ``final=False``
  nothing is read).
- ``DISABLED``: the source never resets on its own; rlplay calls
  ``reset(options={"reset_mask": ended})`` with the mask of the ended
  envs (a bool tensor on the source's device), and the row gets the reset
  observations there, ``final`` the last ones. On the host, only after a
  step that ended an episode (Gymnasium's vector envs refuse a mask
  without one); on another device after every step, the mask all false
  at most steps, so that no step waits for the device to tell whether an
  episode ended: such a source must accept that.
- ``NEXT_STEP``: the step returns the true last observation and the
  source resets the env on its next call, ignoring the action: that call
  is *lost*, laid out as for numpy sources
  (:mod:`rlplay.engine.core.layout`), its reward zeroed.

Seeding: as a numpy vector source
(:func:`~rlplay.engine.seeds.source_reset_seed`), the first reset gets
the seed of the first column's ``SeedSequence`` taken modulo ``2**31 -
num_envs`` (a list of each column's seeds where the source is a
``SyncVectorEnv`` or ``AsyncVectorEnv`` under a wrapper), so that a
source gives the same data for the same ``entropy`` whether it is
converted to torch or not.

Resetting some columns alone (:meth:`TorchSource.restart`, for episodes
that the episode loop cuts at ``max_steps``) is a same-step or disabled
source's ``reset(options={"reset_mask": mask})``, as disabled's resets; a
next-step source cannot (:attr:`~.batch.EnvBatch.can_reset_columns`).

A torch source gives every column of a worker (``n_envs`` equal to its
``num_envs``); it steps all its columns at every call (``sticky=True`` is
refused). Both loops of torch sources step it through this interface:
the fragment loop (:mod:`rlplay.engine.core.torch_loop`) and the episode
loop (:mod:`rlplay.engine.core.torch_episodes`, which
:func:`rlplay.engine.core.evaluate` and the ``Evaluator`` use).
"""
from typing import Any, NamedTuple

import torch
from gymnasium.vector import (AsyncVectorEnv, AutoresetMode, SyncVectorEnv,
                              VectorWrapper)

from ..nested import StructureError, check_structure, suply
from ..seeds import source_reset_seed
from .batch import SourceBatch
from .making import check_step
from .spaces import space_example

__all__ = ["TorchSource", "TorchRow", "TorchStepped", "source_device"]


class TorchRow(NamedTuple):
    """What one step of a torch source writes: tensors on
    its device, the env axis first, as :class:`~.batch.RowOut` (``obs``,
    ``final`` nested; ``fin``, ``truncated`` bool ``(B,)``; ``info``,
    ``info_mask`` dicts). Every field is written at every step (``final``,
    ``truncated`` may be ``None``: not recorded)."""
    obs: Any
    fin: Any
    truncated: Any
    final: Any
    info: Any
    info_mask: Any


class TorchStepped(NamedTuple):
    """What happened in one step of a torch source,
    tensors on its device, shape ``(B,)``.

    rew : tensor
        The rewards as the source gave them (0 at lost calls).
    ended : bool tensor
        An executed action ended the column's episode.
    lost : bool tensor or None
        The call was lost (next-step autoreset); ``None``: the source loses
        none.
    """
    rew: Any
    ended: Any
    lost: Any

_CONVERTERS = ("NumpyToTorch", "JaxToTorch")


def _converter(made):
    cls = type(made)
    return cls.__name__ in _CONVERTERS and cls.__module__.startswith(
        "gymnasium.wrappers")


def source_device(made):
    """The device whose tensors ``made`` returns, when it is a torch-native
    source (see the module docstring); else ``None``."""
    if not all(hasattr(made, name) for name in (
            "num_envs", "single_observation_space", "single_action_space",
            "reset", "step")):
        return None
    layer = made
    while layer is not None:
        device = getattr(layer, "device", None)
        if _converter(layer):
            return torch.device("cpu" if device is None else device)
        if isinstance(device, (str, torch.device)):
            return torch.device(device)
        layer = layer.env if isinstance(layer, VectorWrapper) else None
    return None


class TorchSource(SourceBatch):
    """A torch-native source of ``num_envs`` columns (see the module
    docstring).

    Parameters
    ----------
    source
        The source (see :func:`source_device`).
    device : torch.device
        Where its tensors live.
    name : str
        How messages call it.

    Raises
    ------
    ValueError
        An autoreset mode that is not one of Gymnasium's.
    """

    kind = "torch"
    can_freeze = False

    def __init__(self, source, device, name="the torch source"):
        self.source, self.name = source, name
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            # named by its index, as the tensors made there are
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        # reading a mask on another device than the host waits for it
        self._off_host = device.type != "cpu"
        self.n_envs = int(source.num_envs)
        self.observation_space = source.single_observation_space
        self.action_space = source.single_action_space
        mode = getattr(source, "metadata", {}).get(
            "autoreset_mode", AutoresetMode.NEXT_STEP)
        try:
            self.mode = AutoresetMode(mode)
        except ValueError:
            raise ValueError(f"{name} declares autoreset_mode {mode!r}, not "
                             f"one of Gymnasium's AutoresetMode") from None
        self.can_reset_columns = self.mode is not AutoresetMode.NEXT_STEP
        # next-step: a row's final observation is its observation (the true
        # last one where an episode ended, the reset one at a lost call):
        # :meth:`advance` leaves ``final`` to the loop, one copy a fragment
        self.final_is_obs = self.mode is AutoresetMode.NEXT_STEP
        base = getattr(source, "unwrapped", source)
        self.seeds_each = isinstance(base, (SyncVectorEnv, AsyncVectorEnv))
        self._example = space_example(self.observation_space)
        self._single = not isinstance(self._example, (dict, list, tuple))
        # next-step autoreset: the columns whose next call is lost;
        # same-step: the columns that ended without a final observation
        self._pending = self._missing = None
        self._checked = False

    # ---------------------------------------------- the torch loop's API --
    def start(self, obs_out, seeds=None):
        """Reset every column (with the first column's seed of ``seeds``,
        or each one's), writing the observations into ``obs_out`` (nested
        tensors ``(B, ...)``)."""
        seed = source_reset_seed(seeds, self.n_envs, self.seeds_each)
        obs, _ = _pair(self.source.reset(seed=seed), self.name)
        self._write(obs_out, obs, "reset()")
        self._pending = torch.zeros(self.n_envs, dtype=torch.bool,
                                    device=self.device)
        # only same-step sources can miss a final observation
        self._missing = torch.zeros_like(self._pending) \
            if self.mode is AutoresetMode.SAME_STEP else None

    def advance(self, act, out):
        """Step every column with ``act`` (a tensor the source may keep)
        and write the row ``out`` (a :class:`TorchRow`; its ``final`` not
        where :attr:`final_is_obs`); returns a :class:`TorchStepped`."""
        result = self.source.step(act)
        try:
            obs, rew, terminated, truncated, info = result
        except (TypeError, ValueError):
            check_step(self.source, result)  # raises a clear TypeError
            raise
        terminated = self._flags(terminated, "terminated")
        truncated = self._flags(truncated, "truncated")
        rew = self._rewards(rew)
        ended = terminated | truncated
        lost = None
        # (bool a > b is a & ~b, in one operation)
        if self.mode is AutoresetMode.NEXT_STEP:
            lost = self._pending
            torch.logical_or(ended, lost, out=out.fin)
            ended = self._pending = ended > lost
            rew = rew.masked_fill(lost, 0)
            if out.truncated is not None:
                torch.gt(truncated, terminated | lost, out=out.truncated)
        else:
            out.fin.copy_(ended)
            if out.truncated is not None:
                torch.gt(truncated, terminated, out=out.truncated)
        self._write(out.obs, obs, "step()")
        if self.mode is AutoresetMode.SAME_STEP:
            if out.final is not None:
                self._finals(out, obs, info, ended)
        elif out.final is not None and not self.final_is_obs:
            _copy_tree(out.final, out.obs)  # the true last observations
        if self.mode is AutoresetMode.DISABLED:
            self._reset_masked(out.obs, ended)
        if out.info:
            self._infos(out, info, ended, lost)
        return TorchStepped(rew, ended, lost)

    def restart(self, obs_out, mask):
        """Reset the columns of ``mask`` (a bool tensor ``(B,)`` on the
        device) alone, with ``reset(options={"reset_mask": mask})``, and
        write their observations into ``obs_out`` (nested tensors ``(B,
        ...)``) there: as a disabled source's resets after a step (see the
        module docstring), so on another device than the host whatever
        ``mask`` holds. The source must honour the mask, as Gymnasium's
        vector envs and :class:`rlplay.envs.TorchCartPole` do in every
        mode (one whose ``reset`` ignores ``options`` would reset all its
        envs).

        Raises
        ------
        ValueError
            A next-step source: it cannot reset a column alone.
        """
        if not self.can_reset_columns:
            raise ValueError(f"{self.name} cannot reset some of its envs "
                             f"alone (next-step autoreset)")
        self._reset_masked(obs_out, mask)

    def _reset_masked(self, obs_out, mask):
        # on the host only where an env is to be reset: Gymnasium's vector
        # envs refuse a mask without one
        if self._off_host or bool(mask.any()):
            reset, _ = _pair(self.source.reset(options={
                "reset_mask": mask}), self.name)
            _where_tree(obs_out, mask, reset, obs_out)

    def finish(self):
        """The end of a fragment, or of an evaluation: raise where a
        same-step source ended an episode without its true last
        observation (one read of the device).

        Raises
        ------
        ValueError
            Naming the envs.
        """
        if self._missing is not None and bool(self._missing.any()):
            cols = torch.nonzero(self._missing).flatten().tolist()
            self._missing.zero_()
            raise ValueError(
                f"{self.name} (same-step autoreset) ended the episodes of "
                f"envs {cols} without their true last observation in "
                f"info['final_obs'] (or info['final_observation']) where "
                f"info['_final_obs'] holds: rlplay never approximates it; "
                f"use a source that gives it (Isaac Lab: "
                f"compute_final_obs=True), or final=False")

    # ------------------------------------------------------------ writes --
    def _write(self, dst, obs, what):
        if self._single and isinstance(obs, torch.Tensor) and \
                obs.shape == dst.shape:
            dst.copy_(obs)
            return
        if not self._checked:
            try:
                check_structure(dst, obs)
                suply(_check_shape, dst, obs)
            except (StructureError, TypeError, ValueError) as exc:
                raise type(exc)(
                    f"{self.name} {what}: the observations do not match the "
                    f"observation space batched num_envs={self.n_envs} "
                    f"times: {exc}") from None
            self._checked = True
        _copy_tree(dst, obs)

    def _finals(self, out, obs, info, ended):
        final, mask = _final_channel(info)
        if final is None:  # none ended, or one is missing: known later
            self._missing |= ended
            _copy_tree(out.final, out.obs)
            return
        if mask is not None:
            self._missing |= ended & ~torch.as_tensor(mask,
                                                      device=self.device)
        try:
            _where_tree(out.final, ended, final, out.obs)
        except (StructureError, TypeError, ValueError, RuntimeError) as exc:
            raise type(exc)(f"{self.name} step(): info['final_obs'] does "
                            f"not match the observations: {exc}") from None

    def _infos(self, out, info, ended, lost):
        final_info = info.get("final_info") \
            if self.mode is AutoresetMode.SAME_STEP else None
        for key, dst in out.info.items():
            if key not in info:
                continue
            value, present = info[key], info.get(f"_{key}")
            if isinstance(final_info, dict) and key in final_info:
                value = _where_leaf(ended, final_info[key], value)
            where = torch.ones(self.n_envs, dtype=torch.bool,
                               device=self.device) if present is None \
                else torch.as_tensor(present, device=self.device)
            if lost is not None:
                where = where & ~lost
            try:
                suply(lambda d, v: d.copy_(_where_leaf(where, v, d)), dst,
                      value)
            except (StructureError, TypeError, ValueError,
                    RuntimeError) as exc:
                raise type(exc)(f"env info [{key!r}] does not match its "
                                f"spec: {exc}") from None
            out.info_mask[key].copy_(where)

    def _flags(self, value, what):
        if not isinstance(value, torch.Tensor) or value.shape != (
                self.n_envs,):
            shape = tuple(getattr(value, "shape", ())) or type(value).__name__
            raise ValueError(f"{self.name}.step() returned {what} {shape}, "
                             f"expected a tensor of shape ({self.n_envs},)")
        return value if value.dtype == torch.bool else value.bool()

    def _rewards(self, value):
        if not isinstance(value, torch.Tensor) or value.shape != (
                self.n_envs,):
            shape = tuple(getattr(value, "shape", ())) or type(value).__name__
            raise ValueError(f"{self.name}.step() returned rewards {shape}, "
                             f"expected a tensor of shape ({self.n_envs},)")
        return value

    # --------------------------------------------- the numpy interface --
    def reset(self, obs_out, seeds=None, at=None, *, t=None,
              check_casts=False):
        raise TypeError(f"{self.name} returns torch tensors: the torch "
                        f"loops step it (start, advance, restart), not the "
                        f"numpy ones")

    step = reset


# ------------------------------------------------------------------ helpers

def _pair(result, name):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"{name}.reset() must return (obs, info) as in "
                        f"Gymnasium 1.x, got {type(result).__name__}")
    return result


def _check_shape(dst, src):
    if not isinstance(src, torch.Tensor):
        raise TypeError(f"got {type(src).__name__}, expected a tensor")
    if src.shape != dst.shape:
        raise ValueError(f"got shape {tuple(src.shape)}, expected "
                         f"{tuple(dst.shape)}")


def _copy_tree(dst, src):
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    else:
        suply(torch.Tensor.copy_, dst, src)


def _where_leaf(mask, a, b):
    """``where(mask, a, b)`` with the ``(B,)`` mask broadcast over the
    trailing dimensions."""
    a = torch.as_tensor(a, device=mask.device)
    return torch.where(mask.view(-1, *[1] * (a.dim() - 1)), a, b)


def _where_tree(out, mask, a, b):
    """``out = where(mask, a, b)`` leaf by leaf (``out`` may be ``b``)."""
    if isinstance(out, torch.Tensor):
        out.copy_(_where_leaf(mask, a, b))
    else:
        suply(lambda o, x, y: o.copy_(_where_leaf(mask, x, y)), out, a, b)


def _final_channel(info):
    """The final observations of a same-step step and their mask
    (``None``: not given)."""
    for key in ("final_obs", "final_observation"):
        if key in info:
            return info[key], info.get(f"_{key}")
    return None, None
