"""Parameters shared between the learner's actor and the workers' copies.

The learner owns the actor it trains. A :class:`SharedParams` holds a copy
of its parameters and buffers in shared memory, a version counter and the
train/eval mode, all guarded by one lock:

- the learner calls :meth:`SharedParams.publish` between batches: it copies
  the actor's current tensors in and bumps the version;
- a worker calls :meth:`SharedParams.load` before each fragment: if the
  version moved, it copies the tensors out into its own actor (so they stay
  fixed while it collects) and follows the mode; it returns the version,
  which the fragment records.

The actor's *code* travels separately (cloudpickled, so actors defined in a
notebook work); only the tensors travel through shared memory, handed over
with the worker's start arguments.
"""
import contextlib
import copy
import time

import torch

from .mp import POLL_INTERVAL, RolloutTimeout
from .packed import PackedTensors

__all__ = ["SharedParams", "bounded_acquire", "cpu_copy", "LOCK_TIMEOUT"]

# the longest a lock is waited for when no liveness check is given (seconds)
LOCK_TIMEOUT = 60.0


def _tensors(module):
    # parameters then buffers, in a fixed order (state_dict order)
    return [t for t in module.state_dict(keep_vars=True).values()
            if isinstance(t, torch.Tensor)]


class SharedParams:
    """A shared-memory copy of an actor's parameters, with a version.

    Parameters
    ----------
    actor : torch.nn.Module
        The learner's actor (on any device).
    ctx : multiprocessing context
        Where the lock and counters are made.

    Attributes
    ----------
    version : int
        The number of :meth:`publish` calls so far (0 at creation).
    """

    def __init__(self, actor, ctx):
        # one storage per dtype, so that a worker receives a few file
        # descriptors however many tensors the actor has (see .packed)
        self._packed = PackedTensors([t.detach().to("cpu")
                                      for t in _tensors(actor)])
        self.tensors = self._packed.tree
        self._version = ctx.Value("q", 0)  # carries the lock
        self._training = ctx.Value("b", int(actor.training))

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["tensors"]  # views, rebuilt from the packed storages
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.tensors = self._packed.tree

    @property
    def version(self):
        # an aligned int64 read; taking the lock here could wait on a
        # worker that died holding it
        return self._version.value

    @torch.no_grad()
    def publish(self, actor, check=None, timeout=LOCK_TIMEOUT):
        """Copy ``actor``'s tensors in, bump and return the version.

        ``check()`` is called every poll while the lock is held elsewhere
        and should raise when the holder is dead; a live holder that keeps
        it over ``timeout`` seconds raises :class:`RolloutTimeout` (see
        :func:`bounded_acquire`).
        """
        sources = _tensors(actor)
        if len(sources) != len(self.tensors):
            raise ValueError("the actor's parameters and buffers changed "
                             "since the rollout started")
        with bounded_acquire(self._version.get_lock(), check, timeout):
            for dst, src in zip(self.tensors, sources):
                dst.copy_(src.detach())
            self._training.value = int(actor.training)
            self._version.value += 1
            return self._version.value

    @torch.no_grad()
    def load(self, actor, known=None, check=None, timeout=LOCK_TIMEOUT):
        """Copy the shared tensors into ``actor`` unless its version is
        ``known`` already; set its mode. Returns the version loaded.

        ``check`` and ``timeout`` as in :meth:`publish`."""
        with bounded_acquire(self._version.get_lock(), check, timeout):
            version = self._version.value
            if version != known:
                for dst, src in zip(_tensors(actor), self.tensors):
                    dst.copy_(src)
            training = bool(self._training.value)
        if actor.training != training:
            actor.train(training)
        return version


@contextlib.contextmanager
def bounded_acquire(lock, check=None, timeout=LOCK_TIMEOUT):
    """Hold ``lock``, calling ``check()`` every poll while waiting for it.

    A process killed while holding a ``multiprocessing`` lock never releases
    it: ``check`` (which raises when the other side is dead) turns what
    would be a hang into an error. A holder that lives but keeps the lock
    longer than ``timeout`` seconds (stopped, stalled) raises
    :class:`RolloutTimeout`.
    """
    deadline = time.monotonic() + timeout
    while not lock.acquire(timeout=POLL_INTERVAL):
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise RolloutTimeout(f"a shared lock was held for more than "
                                 f"{timeout} s by a live process")
    try:
        yield
    finally:
        lock.release()


def cpu_copy(actor):
    """A CPU deep copy of ``actor`` for a worker (gradients dropped)."""
    clone = copy.deepcopy(actor).cpu()
    for param in clone.parameters():
        param.requires_grad_(False)
    return clone
