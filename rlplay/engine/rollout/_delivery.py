"""Delivery: how a generator hands a host batch to the learner.

One small interface for every target (the host buffer itself, a fresh
copy, page-locked memory, a CUDA device) and every source (a buffer of the
learner's own, a batch that a torch source wrote on its device): a new
target is a change here, not a keyword in every generator.

A generator whose workers write into (pageable) shared memory copies a
fragment into a host batch of its own first (a
:class:`~rlplay.engine.workers.Collation`, page-locked where a device is asked for): from
pageable memory CUDA first synchronizes the stream (CUDA runtime API, "API
synchronization behavior"), so ``next()`` would wait for all the training
queued on the GPU; the page-locked copy costs one host memcpy (what the
driver would do anyway) and keeps the device copy asynchronous.
"""
import torch

from ..core import check_flag
from ..devices import check_device, normal_device
from ..nested import flatten, suply
from ..shared import copy_

__all__ = ["Delivery"]


class Delivery:
    """How a generator hands a host batch to the learner.

    As a fresh copy each time (``copy=True``, the default, page-locked
    when ``pinned``); as it is (``device=None``, ``copy=False``: the
    caller's buffer, reused); or on a CUDA ``device``, copied from
    page-locked host memory with non-blocking copies into a fresh device
    batch (or, with ``copy=False``, a reused one).

    A non-blocking copy reads the host memory after the call returns: the
    generator must call :meth:`wait` before it writes that memory again
    (the next fragment, the next collation), or the device batch could
    receive part of the next one.

    A batch that a torch source wrote on its device is delivered there
    (``device=None``, or that device): as it is with ``copy=False`` (no
    copy at all), a fresh copy there with ``copy=True``; ``device='cpu'``
    brings it to the host.

    Parameters
    ----------
    device : str or torch.device, optional
        ``'cpu'`` counts as none for host batches.
    pinned : bool
    copy : bool

    Raises
    ------
    TypeError
        ``pinned`` or ``copy`` not a bool.
    RuntimeError
        Up front, when CUDA is asked for and absent (:func:`check_device`).
    """

    def __init__(self, device=None, pinned=False, copy=True):
        pinned, copy = check_flag("pinned", pinned), check_flag("copy", copy)
        device = check_device(device, pinned)
        self.device = None if device is None or device.type == "cpu" \
            else normal_device(device)
        # 'cpu' named: a batch on a device (a torch source's) comes over
        self.to_host = device is not None and device.type == "cpu"
        self.pinned, self.copy = pinned, copy
        self._target, self._copied = None, None

    @property
    def fresh_host(self):
        """Whether each batch is a fresh one on the host (``copy=True``,
        no device): a generator that assembles its batch may build it
        there at once, instead of calling this delivery on a reused one."""
        return self.device is None and self.copy

    @property
    def host_pinned(self):
        """Whether the host batch should live in page-locked memory."""
        return self.pinned or self.device is not None

    def wait(self):
        """Block until the last non-blocking copy has read its source."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None

    def __call__(self, host):
        """The batch to yield for ``host``, a host batch (nested tensors)
        that the generator rewrites only after :meth:`wait`, or a batch
        that a torch source wrote on its device (:meth:`_from_device`)."""
        where = flatten(host)[0].device
        if where.type != "cpu":
            return self._from_device(host, where)
        if self.device is None:
            if not self.copy:
                return host
            if not self.pinned:  # one call a leaf, not two
                return suply(_clone, host)
            return suply(lambda x: torch.empty(
                x.shape, dtype=x.dtype, pin_memory=True).copy_(x), host)
        target = self._target
        if target is None or self.copy:
            target = suply(lambda x: torch.empty_like(x, device=self.device),
                           host)
            if not self.copy:
                self._target = target
        copy_(target, host, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record(torch.cuda.current_stream(self.device))
        return target


    def _from_device(self, batch, where):
        """A batch on device ``where``: itself where it is asked for there
        (``device=None``, or that device) and ``copy=False``, a fresh copy
        there with ``copy=True``; else copied to the host (``device='cpu'``,
        page-locked with ``pinned``) or to the device asked for."""
        if (self.device is None and not self.to_host) or \
                self.device == where:
            return suply(torch.clone, batch) if self.copy else batch
        if self.device is None:
            return suply(lambda x: x.to("cpu").pin_memory() if self.pinned
                         else x.to("cpu"), batch)
        return suply(lambda x: x.to(self.device), batch)

    def close(self):
        """Wait for the copies in flight."""
        self.wait()
        self._target = None


def _clone(x):
    return x.clone(memory_format=torch.contiguous_format)
