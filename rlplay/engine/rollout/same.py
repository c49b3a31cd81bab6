"""Same-process collection: fragments are collected between ``next()`` calls.

Protocol::

    learner (the only process)
    next() ─► collect fragment k into the buffer with the current actor
          ─► (copy to the device / to a fresh batch, if asked)
          ─► yield fragment k ─► learner trains ─► next() ...

There is one buffer; the yielded batch is a fresh copy of it (``copy=True``,
the default), or with ``copy=False`` the buffer itself, valid until the
next ``next()``.
The actor samples from a torch random stream of the rollout's own, seeded
from ``entropy`` and swapped in around each collection, so the same
``entropy`` repeats the same fragments and the caller's generator is left
alone. The policy lag is zero: fragment ``k`` is collected with the parameters the
actor has when ``next()`` is called, and ``meta.version`` records ``k``, the
number of batches yielded before it. Errors in the factory, the envs or the
actor are raised directly in the caller (a failed set-up closes the envs it
made); an error, or Ctrl-C, inside ``next()`` breaks the generator, and
later calls raise it again (see :mod:`._states`). ``close()`` closes the
envs.

The collection is the worker session of every other generator
(:class:`~rlplay.engine.workers.Session`, collector 0, generation 0), driven here in
the caller's process: seeding, ``meta`` and the env batch are made as a
worker makes them.
"""
import contextlib
import time

import torch

from ..core import check_sticky, fragment_device, prepare
from ..devices import module_device, same_device
from ..seeds import collector_seed_sequence, torch_seed
from ..workers import Session, SessionSpec
from ._base import (Delivery, Keywords, Lifecycle, SetUp, Stats, Unpack,
                    spell_out)
from ._calls import call_envs
from ._resume import buffer_layout

__all__ = ["rollout", "Rollout"]


class Rollout(Lifecycle):
    """The generator that :func:`rollout` returns (documented there). Its
    parts: the set-up (``_setup``, a :class:`~._base.SetUp`), the worker
    session that it drives in this process (``session``), its torch random
    stream (``_stream``) and the delivery (``delivery``)."""

    def __init__(self, factory, actor, n_steps, n_envs, *, entropy=None,
                 sticky=False, env_info=None, final=True, device=None,
                 pinned=False, copy=True, check_spaces="first",
                 resume=None, actor_device=None):
        self._setup = setup = SetUp(
            "same", actor, dict(n_steps=n_steps, n_envs=n_envs, sticky=sticky),
            [("n_steps", n_steps, 1), ("n_envs", n_envs, 1)],
            entropy=entropy, resume=resume, sticky=sticky,
            check_spaces=check_spaces)
        run = setup.run
        self.actor, self.hx_dim = actor, getattr(actor, "hx_dim", 1)
        self.delivery = Delivery(device, pinned, copy)
        self.device = self.delivery.device
        entropy = run.entropy  # one root for envs and actor
        device = same_device(actor, actor_device)
        self.session = Session(SessionSpec(
            factory=factory, actor=actor, entropy=entropy, n_envs=int(n_envs),
            sticky=sticky, check_spaces=check_spaces,
            actor_device=None if device is None else (device,)), index=0,
            collector=0, generation=run.generation[0], seq=run.seq[0],
            calls=setup.calls.payloads)
        self._seq = run.seq[0]
        self.session.start(in_process=True)
        self.envs = self.session.envs
        setup.calls.refusal = self.envs.call_refusal
        try:
            if sticky:
                check_sticky(self.envs)
            # the fragments are written where the envs write them (a torch
            # source's device; else the host)
            home = fragment_device(self.envs)
            self._stream = _Stream(actor, device, home)
            # sizing calls the actor virtually: keep that off every stream
            with self._stream.apart():
                self.buffer = prepare(
                    self.envs, actor, n_steps, n_envs, env_info=env_info,
                    final=final, device=home,
                    pinned=self.delivery.host_pinned and home is None)
            setup.lay_out(buffer_layout(self.buffer.pyt,
                                        self.envs.observation_space,
                                        self.envs.action_space))
            # the actor samples from a torch stream of its own, seeded from
            # the run's entropy exactly as a worker process seeds its
            # global one, so that same and single collect the same data
            with self._stream.seeded(torch_seed(collector_seed_sequence(
                    entropy, 0, run.generation[0]))):
                self.session.begin(self.buffer)
        except BaseException:
            try:
                self.session.close(quiet=False)
            except Exception:  # noqa: BLE001 - the set-up error wins
                pass
            raise
        self.stats = setup.count(Stats())

    call_envs = call_envs

    def __iter__(self):
        return self

    def __next__(self):
        return self._guarded(self._next, stop=StopIteration)

    def _next(self):
        stats = self.stats
        tic = stats.begin()
        self.delivery.wait()  # the buffer may still feed a device copy
        calls, session = self._setup.calls, self.session
        calls.publish()  # applied by fill(), before the fragment
        session.receive(calls.since(len(session.calls.payloads)))
        with self._stream.seeded():
            self.session.fill(self.buffer, version=stats["batches"])
        self._seq = self.session.ctx.seq
        elapsed = time.perf_counter() - tic
        # in this process the learner waits for every fragment it gets
        stats.batch(self.buffer.pyt if self.buffer.npy is None
                    else self.buffer.npy, waited=elapsed, collected=elapsed,
                    version=stats["batches"])
        return self.delivery(self.buffer.pyt)

    def state_dict(self):
        """What rlplay owns of this run, for ``resume=`` (see
        ``resume`` in :mod:`rlplay.engine.rollout`, and "Long runs" in the
        docs): the seeding tree's place, the next ``meta.seq``,
        the generation, the counters; the version to go on from is the
        number of batches yielded. Valid in any state (after ``close()``
        too)."""
        return self._setup.state(self.stats["batches"],
                                 [(self._seq, self.session.generation, 0)])

    def _close(self, graceful):
        """Close the envs."""
        self.delivery.close()
        self.session.close(quiet=not graceful)  # called once


class _Stream:
    """The rollout's own torch random stream: the CPU generator's state,
    and that of each CUDA device where the actor or the envs run, swapped
    in around each collection (:meth:`seeded`), so that the caller's
    generators are left alone."""

    def __init__(self, actor, device, home):
        devices = {device, home}
        if device is None:
            devices.add(module_device(actor, strict=False))
        self.devices = sorted({d.index or 0 for d in devices
                               if d is not None and d.type == "cuda"})
        self.states = None

    @contextlib.contextmanager
    def apart(self):
        """Calls that leave every stream as it was."""
        with torch.random.fork_rng(devices=self.devices):
            yield

    @contextlib.contextmanager
    def seeded(self, seed=None):
        """The stream swapped in (first seeded with ``seed``)."""
        with torch.random.fork_rng(devices=self.devices):
            if seed is not None:
                torch.manual_seed(seed)
            else:
                torch.set_rng_state(self.states[0])
                for index, state in zip(self.devices, self.states[1:]):
                    torch.cuda.set_rng_state(state, index)
            yield
            self.states = [torch.get_rng_state()] + [
                torch.cuda.get_rng_state(index) for index in self.devices]


def rollout(factory, actor, n_steps, n_envs, **kwargs: Unpack[Keywords]):
    """Collect fragments in this process, one per ``next()``.

    Returns a :class:`Rollout`: an endless iterator and a context manager;
    ``close()`` is idempotent.
    The keywords every generator shares (``entropy``, ``sticky``,
    ``env_info``, ``final``, ``device``, ``pinned``, ``copy``,
    ``check_spaces``, ``resume``) are documented once, in
    :mod:`rlplay.engine.rollout`.

    Parameters
    ----------
    factory : callable
        Builds one Gymnasium env; called ``n_envs`` times (with ``seed=``
        if it accepts it).
    actor : BaseActorModule
        Runs where its parameters live (``actor_device``, if given, must
        name that device; see :mod:`rlplay.engine.devices`), each row of observations
        moved there once (:mod:`rlplay.engine.core.devices`), under
        ``torch.no_grad()``, in its current mode, drawing from a torch
        random stream of the rollout's own (seeded from ``entropy`` as a
        worker of ``single`` seeds its global one); the caller's global
        torch generators are left untouched.
    n_steps : int
        ``T``, the steps per fragment.
    n_envs : int
        ``B``, the envs stepped together.

    Returns
    -------
    feed : Rollout
        An endless iterator of batches, ``Fragment`` of tensors of shape
        ``(1 + T, B, ...)``: each a fresh copy of the buffer (on
        ``device``, if given), yours to keep; with ``copy=False`` the
        buffer itself (or its reused device copy), valid until the next
        ``next()``. The buffer lives where the envs write: the host, or
        the device of a torch-native source (its fragments are written
        there by the torch loop, :mod:`rlplay.engine.core.torch_loop`,
        and delivered there unless ``device`` names another).

    Notes
    -----
    The attributes of ``feed``: ``envs`` (the :class:`EnvBatch`),
    ``buffer`` (the host buffer, numpy and torch views), ``hx_dim`` (the
    actor's: the env dimension of ``hx`` leaves, which the consumers of
    batches read) and ``stats`` (the
    keys of :data:`rlplay.engine.rollout.STATS_KEYS`, documented there;
    here ``time_learner_wait`` equals ``time_collect``,
    ``time_worker_wait``, ``lag``, ``dropped`` and ``restarts`` are 0 and
    ``workers`` is empty).

    Examples
    --------
    >>> import functools, gymnasium, torch.nn as nn
    >>> from contextlib import closing
    >>> from rlplay.engine import PolicyActor
    >>> actor = PolicyActor(nn.Linear(4, 2))
    >>> factory = functools.partial(gymnasium.make, "CartPole-v1")
    >>> with closing(rollout(factory, actor, 16, 2, entropy=0)) as feed:
    ...     batch = next(feed)
    >>> tuple(batch.state.obs.shape)
    (17, 2, 4)
    """
    return Rollout(factory, actor, n_steps, n_envs, **kwargs)


spell_out(rollout, Rollout.__init__)
