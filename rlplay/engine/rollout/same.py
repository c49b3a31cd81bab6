"""Same-process collection: fragments are collected between ``next()`` calls.

Protocol::

    learner (the only process)
    next() ─► collect fragment k into the buffer with the current actor
          ─► (copy to the device / to a fresh batch, if asked)
          ─► yield fragment k ─► learner trains ─► next() ...

There is one buffer; the yielded fragment is a view of it and stays valid
until the next ``next()`` (pass ``copy=True`` to get a fresh batch each time).
The actor samples from a torch random stream of the rollout's own, seeded
from ``entropy`` and swapped in around each collection, so the same
``entropy`` repeats the same fragments and the caller's generator is left
alone. The policy lag is zero: fragment ``k`` is collected with the parameters the
actor has when ``next()`` is called, and ``meta.version`` records ``k``, the
number of batches yielded before it. Errors in the factory, the envs or the
actor are raised directly in the caller (a failed set-up closes the envs it
made); an error, or Ctrl-C, inside ``next()`` breaks the generator, and
later calls raise it again (see :mod:`._base`). ``close()`` closes the
envs.
"""
import time

import torch

from ..core import collect, prepare, startup
from ..envs import close_envs, make_envs
from ..seeds import (collector_seed_sequence, env_seed_sequences,
                     seed_sequence, torch_seed)
from ._base import Generator, Stats, check_arguments
from ._delivery import Delivery

__all__ = ["rollout", "Rollout"]


class Rollout(Generator):
    """An endless iterator of fragments collected in this process.

    Use :func:`rollout` (which documents the arguments). ``close()`` is
    idempotent; the object is a context manager too.

    Attributes
    ----------
    envs : list of gymnasium.Env
    buffer : Aliased
        The host buffer (numpy and torch views).
    stats : dict
        The keys of :class:`~._base.Stats`; here ``time_learner_wait``
        equals ``time_collect``, ``time_worker_wait``, ``lag``,
        ``dropped`` and ``restarts`` are 0 and ``workers`` is empty.
    """

    def __init__(self, factory, actor, n_steps, n_envs, *, entropy=None,
                 sticky=False, env_info=None, final=True, device=None,
                 pinned=False, copy=False, check_spaces="first"):
        # before any env is made
        check_arguments(actor, counts=[("n_steps", n_steps, 1),
                                       ("n_envs", n_envs, 1)],
                        sticky=sticky, check_spaces=check_spaces)
        self.delivery = Delivery(device, pinned, copy)
        entropy = seed_sequence(entropy)  # one root for envs and actor
        seeds = env_seed_sequences(entropy, int(n_envs))
        self.envs = make_envs(factory, seeds)
        self.actor, self.sticky = actor, sticky
        self.check_spaces = check_spaces
        try:
            # sizing calls the actor virtually: keep that off every stream
            with torch.random.fork_rng(devices=[]):
                self.buffer = prepare(self.envs[0], actor, n_steps, n_envs,
                                      env_info=env_info, final=final,
                                      pinned=self.delivery.host_pinned)
            # the actor samples from a torch stream of its own, seeded from
            # the run's entropy exactly as a worker process seeds its
            # global one, so that same and single collect the same data
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(torch_seed(
                    collector_seed_sequence(entropy, 0)))
                self.ctx = startup(self.envs, actor, self.buffer, seeds)
                self._rng = torch.get_rng_state()
        except BaseException:
            try:
                close_envs(self.envs)
            except Exception:  # noqa: BLE001 - the set-up error wins
                pass
            raise
        self.device = self.delivery.device
        self.stats = Stats()

    def _next(self):
        stats = self.stats
        tic = stats.begin()
        self.delivery.wait()  # the buffer may still feed a device copy
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng)
            collect(self.actor, self.buffer, self.ctx, sticky=self.sticky,
                    version=stats["batches"], check_spaces=self.check_spaces)
            self._rng = torch.get_rng_state()
        elapsed = time.perf_counter() - tic
        # in this process the learner waits for every fragment it gets
        stats.batch(self.buffer.npy, waited=elapsed, collected=elapsed,
                    version=stats["batches"])
        return self.delivery(self.buffer.pyt)

    def _close(self, graceful):
        """Close the envs."""
        self.delivery.close()
        close_envs(self.envs, quiet=not graceful)  # called once


def rollout(factory, actor, n_steps, n_envs, *, entropy=None, sticky=False,
            env_info=None, final=True, device=None, pinned=False,
            copy=False, check_spaces="first"):
    """Collect fragments in this process, one per ``next()``.

    Parameters
    ----------
    factory : callable
        Builds one Gymnasium env; called ``n_envs`` times (with ``seed=``
        if it accepts it).
    actor : BaseActorModule
        Runs on the CPU, under ``torch.no_grad()``, in its current mode.
    n_steps : int
        ``T``, the steps per fragment.
    n_envs : int
        ``B``, the envs stepped together.
    entropy : int, optional
        Seeds the run reproducibly: the envs and their spaces (see
        :mod:`rlplay.engine.envs`) and a torch random stream of the
        rollout's own, which the actor draws from while it collects (as a
        worker of ``single.rollout`` seeded with the same ``entropy`` does);
        the caller's global torch generator is left untouched.
    sticky : bool
        Freeze an env for the rest of a fragment once its episode ended.
    env_info : dict, optional
        Env info keys to record, ``{key: example value}``.
    final : bool
        Record final observations.
    device : str or torch.device, optional
        Deliver batches on this device (copied non-blocking from pinned host
        memory); a CUDA device without CUDA raises ``RuntimeError``.
    pinned : bool
        Collect into page-locked host memory; needs CUDA.
    copy : bool
        Yield a fresh copy of each batch instead of the reused buffer.
    check_spaces : {'first', 'always', 'never'}
        Check actions and observations against their spaces during the
        first fragment (default), on every step, or never (see
        :func:`rlplay.engine.core.collect`).

    Yields
    ------
    batch : Fragment of tensors, shape = (1 + T, B, ...)
        The buffer itself (or its device copy), valid until the next
        ``next()``, unless ``copy=True``.

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
    return Rollout(factory, actor, n_steps, n_envs, entropy=entropy,
                   sticky=sticky, env_info=env_info, final=final,
                   device=device, pinned=pinned, copy=copy,
                   check_spaces=check_spaces)

