"""The actor on a device, behind the policy seam (:mod:`.policy`).

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

:func:`as_policy` (in :mod:`.policy`) picks the implementation: a
:class:`DevicePolicy` where the actor's parameters (:func:`module_device`)
live elsewhere than the rows, or where a device is named explicitly; a
:class:`~.policy.LocalPolicy` where they live together (the actor called
on the rows themselves).
"""
import torch

from ..nested import suply
from ..shared import copy_
from .policy import LocalPolicy

__all__ = ["DevicePolicy", "as_device", "module_device", "normal_device"]


def as_device(device, name="device", *, alternative=""):
    """``device`` (a ``torch.device`` or a string) as a ``torch.device``,
    with no check that it is present.

    Raises
    ------
    TypeError
        Not a device, naming ``name`` (and ``alternative``, what else the
        argument may be, for the message).
    ValueError
        A string that names no device.
    """
    if isinstance(device, bool) or not isinstance(device, (str,
                                                           torch.device)):
        raise TypeError(f"{name} must be a device (a torch.device or a "
                        f"string such as 'cpu' or 'cuda:0'){alternative}, "
                        f"got {type(device).__name__} {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"{name}={device!r} is not a device: {exc}") from None


def normal_device(device, name="device"):
    """``device`` (a ``torch.device`` or a string such as ``'cuda'``) as a
    ``torch.device`` with its index where it is a CUDA device (``'cuda'``
    is the current one), so that two names of one device compare equal.

    Raises
    ------
    TypeError, ValueError
        Not a device, naming ``name`` (see :func:`as_device`).
    RuntimeError
        A CUDA device where CUDA is absent.
    """
    device = as_device(device, name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{name}={str(device)!r} needs CUDA, but "
                f"torch.cuda.is_available() is False (torch "
                f"{torch.__version__})")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def module_device(module, strict=True):
    """The device of ``module``'s parameters and buffers (``None`` when it
    has none, or, unless ``strict``, several).

    Raises
    ------
    ValueError
        They live on several devices (``strict``).
    """
    devices = {t.device for t in module.parameters()} | {
        t.device for t in module.buffers()}
    if len(devices) > 1 and not strict:
        return None
    if len(devices) > 1:
        raise ValueError(f"the actor's parameters and buffers live on "
                         f"several devices ({sorted(map(str, devices))}): "
                         f"rlplay runs it on one (actor.to(device))")
    return next(iter(devices), None)


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
