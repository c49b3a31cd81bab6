"""Buffers: numpy and torch views of one memory, shared or pinned.

Collection writes host data through numpy views (cheap scalar and row
assignment) while the actor and the learner read the very same memory as
torch tensors. :func:`aliased` allocates such pairs for a nested structure,
with extra leading dimensions (time, envs), optionally in shared memory (for
worker processes) or in page-locked memory (for fast host-to-device copies).
"""
from typing import Any, NamedTuple

import numpy as np
import torch

from .devices import check_device  # noqa: F401 (its home before)
from .nested import suply

__all__ = [
    "Aliased",
    "torchify",
    "numpify",
    "aliased",
    "copy_",
    "check_device",
]


class Aliased(NamedTuple):
    """Two views of one memory: ``npy`` (numpy) and ``pyt`` (torch)."""
    npy: Any
    pyt: Any


def _empty(shape, dtype, shared, pinned):
    if pinned:
        check_device(pinned=True)
    tensor = torch.empty(shape, dtype=dtype, pin_memory=pinned)
    if shared:
        # moves the storage to shared memory (an unlinked shm file on Linux),
        # so it can be handed to worker processes without copying
        tensor.share_memory_()
    return tensor


def _torch_dtype(dtype):
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def torchify(tree, *leading, shared=False, pinned=False, copy=False):
    """Turn nested arrays (or scalars) into torch tensors.

    Parameters
    ----------
    tree : nested structure of arrays, numpy scalars or numbers
    *leading : int
        Extra leading dimensions: each leaf becomes a new tensor of shape
        ``(*leading, *leaf.shape)`` filled with the leaf, broadcast.
    shared : bool
        Allocate in shared memory (for worker processes).
    pinned : bool
        Allocate in page-locked memory; needs CUDA (checked up front).
    copy : bool
        Always make a new tensor; otherwise, without ``leading``, ``shared``
        or ``pinned``, a numpy array is wrapped without copying.

    Returns
    -------
    nested torch tensors, shape = (*leading, ...)
    """
    if pinned:
        check_device(pinned=True)
    new = copy or shared or pinned or bool(leading)

    def leaf(value):
        array = np.asarray(value)
        if not new:
            return torch.from_numpy(array)
        tensor = _empty((*leading, *array.shape), _torch_dtype(array.dtype),
                        shared, pinned)
        tensor.numpy()[...] = array  # broadcast over the leading dims
        return tensor

    return suply(leaf, tree)


def numpify(tree, *leading):
    """Turn nested CPU tensors into numpy arrays sharing their memory.

    With ``leading`` dimensions each leaf becomes a new array of shape
    ``(*leading, *leaf.shape)`` filled with the leaf, broadcast. Tensors that
    require grad are detached; CUDA tensors are refused (``TypeError``).
    """
    def leaf(value):
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                raise TypeError(f"numpify needs CPU tensors, got a tensor "
                                f"on {value.device}")
            array = value.detach().numpy()
        else:
            array = np.asarray(value)
        if not leading:
            return array
        result = np.empty((*leading, *array.shape), dtype=array.dtype)
        result[...] = array
        return result

    return suply(leaf, tree)


def aliased(tree, *leading, shared=False, pinned=False):
    """Allocate numpy and torch views of the same new memory.

    Parameters
    ----------
    tree : nested structure of example leaves (arrays, tensors, scalars)
        Each leaf gives the trailing shape and the dtype.
    *leading : int
        Leading dimensions, e.g. ``(1 + T, B)``.
    shared, pinned : bool
        As in :func:`torchify`.

    Returns
    -------
    Aliased(npy, pyt)
        Two nested structures over one zero-filled memory: a write through
        one is visible through the other.

    Examples
    --------
    >>> buf = aliased({"obs": np.zeros(3, np.float32)}, 2, 4)
    >>> buf.npy["obs"][1, 2] = 5.0
    >>> float(buf.pyt["obs"][1, 2, 0])
    5.0
    """
    def leaf(value):
        if isinstance(value, torch.Tensor):
            shape, dtype = value.shape, value.dtype
        else:
            array = np.asarray(value)
            shape, dtype = array.shape, _torch_dtype(array.dtype)
        tensor = _empty((*leading, *shape), dtype, shared, pinned)
        tensor.zero_()
        return tensor

    pyt = suply(leaf, tree)
    return Aliased(suply(torch.Tensor.numpy, pyt), pyt)


def copy_(dst, src, non_blocking=False):
    """Copy nested tensors ``src`` into ``dst`` in place (``Tensor.copy_``)."""
    suply(lambda d, s: d.copy_(s, non_blocking=non_blocking), dst, src)
    return dst
