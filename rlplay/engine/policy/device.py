"""The actor on a device, behind the policy seam (:mod:`.local`).

:class:`DevicePolicy` offers the five methods of the seam for an actor
whose parameters live on ``device``, whatever device the rows of the
fragment live on (the host for numpy sources, a torch source's device
for the torch loop): each row the loop hands it (the state row ``t``,
``(1, B, ...)``: ``stepno``, ``obs``, ``act``, ``rew``, ``fin``) is moved
to ``device`` once, into a row of its own allocated there once, and the
actor is called on that copy; its action, ``info`` and ``hx`` come back
on ``device``, and the loop copies the action and ``info`` into the
fragment where it lives (a copy into host memory waits for the actor's
work: the env needs the action). ``hx`` stays on ``device`` from step to
step.

From the host to CUDA a row goes through page-locked staging memory with
a non-blocking copy: a copy from pageable memory is staged by the driver
and synchronises the stream anyway (CUDA runtime API, "API
synchronization behavior"); the staging copy is rewritten only once the
copy that read it last is done (an event). Within one device, a row is
still copied (a plain copy), so that an actor never holds a view of the
fragment.

:func:`~.choose.as_policy` picks the implementation: a
:class:`DevicePolicy` where the actor's parameters
(:func:`~rlplay.engine.devices.module_device`)
live elsewhere than the rows, or where a device is named explicitly; a
:class:`~.local.LocalPolicy` where they live together (the actor called
on the rows themselves).
"""
import torch

from ..devices import normal_device
from ..nested import suply
from ..shared import copy_
from .local import LocalPolicy

__all__ = ["DevicePolicy"]


class DevicePolicy(LocalPolicy):
    """The actor called on ``device``, its rows moved there once each (see
    the module docstring).

    Parameters
    ----------
    actor : BaseActorModule
    device : torch.device or str
        Where the actor runs: its parameters live there (not checked
        here: :mod:`rlplay.engine.rollout` checks it up front).

    Raises
    ------
    TypeError
        Not an actor, or not a device.
    RuntimeError
        A CUDA device where CUDA is absent.
    """

    def __init__(self, actor, device):
        super().__init__(actor)
        self.device = normal_device(device)
        # the device row, and the staging row with the event of the copy
        # that read it last (host rows to CUDA only)
        self._row = self._staging = self._read = None

    def _move(self, row):
        """``row`` (a :class:`~.layout.State` of tensors ``(1, B, ...)``)
        copied into this policy's row on ``device``."""
        target = self._row
        if target is None or target.fin.shape != row.fin.shape:
            target = self._row = suply(
                lambda x: torch.empty_like(x, device=self.device), row)
            self._staging = self._read = None
        if self.device.type != "cuda" or row.fin.device.type != "cpu":
            return copy_(target, row)
        if row.fin.is_pinned():  # page-locked already (pinned=True)
            return copy_(target, row, non_blocking=True)
        if self._staging is None:
            self._staging = suply(lambda x: torch.empty(
                x.shape, dtype=x.dtype, pin_memory=True), row)
        elif self._read is not None:
            self._read.synchronize()  # the last copy has read it
        copy_(self._staging, row)
        copy_(target, self._staging, non_blocking=True)
        self._read = torch.cuda.Event()
        self._read.record(torch.cuda.current_stream(self.device))
        return target

    def step(self, row, hx):
        return self.actor.step(*self._move(row), hx=hx, virtual=False)

    def checked_step(self, row, hx, act_like):
        return super().checked_step(self._move(row), hx, act_like)

    def lookahead(self, row, hx):
        return self.actor.step(*self._move(row), hx=hx, virtual=True)[2]

    def reset(self, hx, fin):
        # non-blocking to CUDA only: a non-blocking copy to the host may
        # be read before it lands
        return self.actor.reset(hx, fin.to(
            self.device, non_blocking=self.device.type == "cuda"))
