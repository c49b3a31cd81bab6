"""Nested tensors packed into one flat shared-memory tensor per dtype.

With torch's default sharing strategy on Linux (``file_descriptor``) every
shared storage handed to another process travels as one file descriptor,
and ``forkserver`` passes at most 252 descriptors to a new process: an
actor with a few hundred parameters and buffers, or a fragment with many
leaves, would not start. :class:`PackedTensors` lays every leaf out in one
flat storage per dtype, pickles as those few storages and the layout, and
rebuilds the same views on the other side.
"""
import math

import torch

from ..nested import suply
from ..shared import copy_

__all__ = ["PackedTensors"]


class _Slot:
    # where a leaf lives in its dtype's flat tensor (a leaf for `suply`)
    def __init__(self, dtype, offset, shape):
        self.dtype, self.offset, self.shape = dtype, offset, shape


class PackedTensors:
    """A copy of nested CPU tensors in shared memory, one storage per dtype.

    Parameters
    ----------
    tree : nested tensors
        Their values are copied in (``None`` passes through).

    Attributes
    ----------
    tree : nested tensors
        Views of the flat storages laid out as ``tree``: writes through them
        are seen by every process that holds this object.
    """

    def __init__(self, tree):
        sizes = {}

        def plan(tensor):
            slot = _Slot(tensor.dtype, sizes.get(tensor.dtype, 0),
                         tuple(tensor.shape))
            sizes[tensor.dtype] = slot.offset + tensor.numel()
            return slot

        self.layout = suply(plan, tree)
        self.flats = {dtype: torch.zeros(size, dtype=dtype).share_memory_()
                      for dtype, size in sizes.items()}
        self.tree = self._views()
        copy_(self.tree, tree)

    def _views(self):
        def view(slot):
            size = math.prod(slot.shape)
            return self.flats[slot.dtype][slot.offset:slot.offset + size] \
                .view(slot.shape)
        return suply(view, self.layout)

    def __getstate__(self):
        # only the flat storages travel (one handle each), not every view
        return {"layout": self.layout, "flats": self.flats}

    def __setstate__(self, state):
        self.layout, self.flats = state["layout"], state["flats"]
        self.tree = self._views()
