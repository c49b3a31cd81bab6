"""How parameters reach the workers: publish, load, version.

The learner owns the actor it trains; workers run copies. Every backend
fulfils one small interface:

- ``publish(actor, ...) -> version``: the learner, between batches, makes
  the actor's current tensors and train/eval mode the latest version;
- ``load(actor, known, ...) -> version``: a worker, before a fragment,
  copies the latest tensors into its own actor unless it holds version
  ``known`` already, follows the mode, and returns the version, which the
  fragment records;
- ``version``: the number of publications so far (0 at creation).

:class:`SharedParams` fulfils it for worker processes on this machine: one
shared-memory :class:`~rlplay.engine.pool.Segment` holds the tensors (a
worker receives one file descriptor however many tensors the actor has),
beside a version counter, the mode and the pid of the process holding the
lock. :class:`RayParams` fulfils it for Ray actors
(:mod:`rlplay.engine.rollout.cluster`): one ``ray.put`` per version.

The actor's *code* travels separately (cloudpickled, so actors defined in
a notebook work); only the tensors travel here.
"""
import copy
import os

import numpy as np
import torch

from ..pool import check_capacity, layout, views, Segment
from ..utils.mp import LOCK_TIMEOUT, bounded_acquire

__all__ = ["SharedParams", "RayParams", "cpu_copy", "named_tensors",
           "check_like"]


def named_tensors(module):
    """``[(name, tensor), ...]``: parameters then buffers, in
    ``state_dict`` order."""
    return [(name, t) for name, t in module.state_dict(keep_vars=True).items()
            if isinstance(t, torch.Tensor)]


def check_like(names, expected, actor):
    """The tensors of ``actor``, checked against the ``expected`` shapes
    and dtypes of the tensors ``names``.

    Raises
    ------
    ValueError
        A tensor is missing, extra, or of another shape or dtype; the
        message names it (an actor of another architecture).
    """
    given = named_tensors(actor)
    if [name for name, _ in given] != list(names):
        missing = sorted(set(names) - {name for name, _ in given})
        extra = sorted({name for name, _ in given} - set(names))
        raise ValueError(
            f"the actor's parameters and buffers do not match the ones the "
            f"generator was made with (missing: {missing or 'none'}, extra: "
            f"{extra or 'none'}): publish an actor of the same architecture")
    for (name, tensor), (shape, dtype) in zip(given, expected):
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise ValueError(
                f"the actor's {name!r} is {tuple(tensor.shape)} {tensor.dtype}"
                f", but the generator was made with {tuple(shape)} {dtype}: "
                f"publish an actor of the same architecture")
    return [tensor for _, tensor in given]


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
        The number of :meth:`publish` calls so far, plus ``version`` (0
        by default; a resumed run's starts where it left off).
    tensors : list of tensors
        Views of the shared copy, in :func:`named_tensors` order.
    """

    def __init__(self, actor, ctx, version=0):
        named = named_tensors(actor)
        self.names = [name for name, _ in named]
        self.expected = [(tuple(t.shape), t.dtype) for _, t in named]
        sources = [t.detach().to("cpu") for _, t in named]
        self._spec, nbytes = layout(sources)
        what = "the actor's shared parameters"
        check_capacity(nbytes, what=what)
        self.segment = Segment.create(nbytes, what=what)
        self.tensors = views(self.segment.flat, self._spec).pyt
        with torch.no_grad():
            for dst, src in zip(self.tensors, sources):
                dst.copy_(src)
        # a plain lock (not the default RLock), which another process may
        # release: see recover()
        self._version = ctx.Value("q", version, lock=ctx.Lock())
        self._training = ctx.Value("b", int(actor.training), lock=False)
        self._holder = ctx.Value("q", 0, lock=False)  # pid holding the lock

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["tensors"]  # views, rebuilt from the segment
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.tensors = views(self.segment.flat, self._spec).pyt

    @property
    def version(self):
        # an aligned int64 read; taking the lock here could wait on a
        # worker that died holding it
        return self._count.value

    @property
    def _count(self):
        # the raw counter: the synchronized wrapper's ``.value`` takes the
        # (non-reentrant) lock itself, which we hold when writing
        return self._version.get_obj()

    def _locked(self, check, timeout):
        return bounded_acquire(self._version.get_lock(), check,
                               LOCK_TIMEOUT if timeout is None else timeout,
                               on_acquire=self._hold)

    def _hold(self, held):
        self._holder.value = os.getpid() if held else 0

    @torch.no_grad()
    def publish(self, actor, check=None, timeout=None):
        """Copy ``actor``'s tensors in, bump and return the version.

        ``check()`` is called every poll while the lock is held elsewhere
        and should raise when the holder is dead; a live holder that keeps
        it over ``timeout`` seconds (default
        :data:`~rlplay.engine.utils.mp.LOCK_TIMEOUT`) raises
        :class:`~rlplay.engine.errors.RolloutTimeout`.

        Raises
        ------
        ValueError
            ``actor`` is of another architecture (names the tensor); the
            shared copy is left as it was.
        """
        sources = check_like(self.names, self.expected, actor)
        with self._locked(check, timeout):
            for dst, src in zip(self.tensors, sources):
                dst.copy_(src.detach())
            self._training.value = int(actor.training)
            self._count.value += 1
            return self._count.value

    @torch.no_grad()
    def load(self, actor, known=None, check=None, timeout=None):
        """Copy the shared tensors into ``actor`` unless its version is
        ``known`` already; set its mode. Returns the version loaded.

        ``check`` and ``timeout`` as in :meth:`publish`."""
        with self._locked(check, timeout):
            version = self._count.value
            if version != known:
                for (_, dst), src in zip(named_tensors(actor), self.tensors):
                    dst.copy_(src)
            training = bool(self._training.value)
        if actor.training != training:
            actor.train(training)
        return version

    def recover(self, pid):
        """Release the lock if the process ``pid`` (which died) held it;
        returns whether it did. A lock held by a dead process is never
        released otherwise, and a copy it was making is moot: the tensors
        are written by the learner only."""
        if pid and self._holder.value == pid:
            self._holder.value = 0
            self._version.get_lock().release()
            return True
        return False

    def close(self):
        """Unmap the shared copy (views still alive keep it mapped) and let
        go of the lock; idempotent. Under spawn and forkserver the lock is
        a named semaphore in ``/dev/shm``, unlinked when its last reference
        goes: dropped here, it goes with ``close()``, not with the
        generator that holds this object."""
        self.tensors = None
        self.segment.close()
        self._version = self._holder = self._training = None


class RayParams:
    """An actor's parameters in a Ray object store, with a version.

    :meth:`publish` puts the actor's tensors (on the CPU, as numpy arrays
    where numpy has their dtype, so that Ray ships them without pickling
    them) and its train/eval mode with one ``ray.put``. Pickled (into each
    request to a worker) it carries only the version and a reference to
    that object, wrapped in a list so that Ray hands the reference itself
    to the worker instead of fetching the object for every request:
    :meth:`load` fetches it only when the worker holds another version.
    Ray's reference counting keeps an old version alive while a request
    that carries it is pending. Needs ``ray`` initialised.

    Parameters
    ----------
    actor : torch.nn.Module
        The learner's actor (on any device).

    Attributes
    ----------
    version : int
        The number of :meth:`publish` calls so far, plus ``version`` (0
        by default; a resumed run's starts where it left off).
    """

    def __init__(self, actor, version=0):
        named = named_tensors(actor)
        self.names = [name for name, _ in named]
        self.expected = [(tuple(t.shape), t.dtype) for _, t in named]
        self.version = version
        self._put([t for _, t in named], actor.training)

    def __getstate__(self):
        return {"version": self.version, "_ref": self._ref}

    def _put(self, tensors, training):
        import ray
        state = [_portable(t.detach().cpu()) for t in tensors]
        self._ref = [ray.put((training, state))]

    def publish(self, actor, check=None, timeout=None):
        """Put ``actor``'s tensors and mode, bump and return the version
        (``check`` and ``timeout`` as in :meth:`SharedParams.publish`, moot
        here: nothing is locked).

        Raises
        ------
        ValueError
            ``actor`` is of another architecture (names the tensor).
        """
        self._put(check_like(self.names, self.expected, actor),
                  actor.training)
        self.version += 1
        return self.version

    @torch.no_grad()
    def load(self, actor, known=None, check=None, timeout=None):
        """Copy the published tensors and mode into ``actor`` (on the CPU)
        unless its version is ``known`` already; returns the version.
        ``timeout`` bounds the fetch (``ray.get``)."""
        if self.version == known:
            return known
        import ray
        training, state = ray.get(self._ref[0], timeout=timeout)
        for (_, dst), src in zip(named_tensors(actor), state):
            if isinstance(src, torch.Tensor):
                dst.copy_(src)
            else:  # read-only memory of the object store
                np.copyto(dst.detach().numpy(), src)
        if actor.training != training:
            actor.train(training)
        return self.version

    def close(self):
        """Drop the reference to the latest version."""
        self._ref = None


def _portable(tensor):
    # numpy travels through Ray's object store without a pickled copy
    try:
        return tensor.numpy()
    except TypeError:  # a dtype numpy lacks (bfloat16...)
        return tensor.clone()


def cpu_copy(actor):
    """A CPU deep copy of ``actor`` for a worker (gradients dropped)."""
    clone = copy.deepcopy(actor).cpu()
    for param in clone.parameters():
        param.requires_grad_(False)
    return clone
