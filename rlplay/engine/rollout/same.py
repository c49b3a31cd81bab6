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
made). ``close()`` closes the envs.
"""
import time

import torch

from ..core import (Fragment, _check_counts, collect, episode_stats,
                    prepare, startup)
from ..envs import close_envs, make_envs
from ..seeds import (collector_seed_sequence, env_seed_sequences)
from ..shared import Delivery
from ..seeds import torch_seed
from ._base import Generator

__all__ = ["rollout", "Rollout"]


class Rollout(Generator):
    """An endless iterator of fragments collected in this process.

    Use :func:`rollout` to make one. ``close()`` is idempotent; the object is
    a context manager too.

    Attributes
    ----------
    envs : list of gymnasium.Env
    buffer : Aliased
        The host buffer (numpy and torch views).
    stats : dict
        ``steps`` (env steps collected), ``batches``, ``time_collect``
        (seconds spent collecting), ``time_wall`` (seconds since the first
        ``next()`` began), ``steps_per_s`` (``steps / time_wall``: what the
        learner gets, training included), ``steps_per_s_collect``
        (``steps / time_collect``), ``time_learner_wait`` (here equal to
        ``time_collect``), ``time_worker_wait`` (0: no worker), and
        ``returns`` and ``lengths`` of the episodes that ended in the last
        batch.
    """

    def __init__(self, factory, actor, n_steps, n_envs, *, entropy=None,
                 sticky=False, env_info=None, final=True, device=None,
                 pinned=False, copy=False):
        self.delivery = Delivery(device, pinned, copy)
        _check_counts(n_steps, n_envs)  # before any env is made
        seeds = env_seed_sequences(entropy, int(n_envs))
        self.envs = make_envs(factory, seeds)
        self.actor, self.sticky = actor, sticky
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
        self.stats = {"steps": 0, "batches": 0, "time_collect": 0.0,
                      "time_wall": 0.0, "time_learner_wait": 0.0,
                      "time_worker_wait": 0.0, "steps_per_s": 0.0,
                      "steps_per_s_collect": 0.0, "returns": None,
                      "lengths": None}
        self._started = None
        self._closed = False

    def __next__(self):
        if self._closed:
            raise StopIteration
        tic = time.perf_counter()
        if self._started is None:
            self._started = tic
        self.delivery.wait()  # the buffer may still feed a device copy
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng)
            collect(self.actor, self.buffer, self.ctx, sticky=self.sticky,
                    version=self.stats["batches"])
            self._rng = torch.get_rng_state()
        toc = time.perf_counter()
        stats = self.stats
        stats["time_collect"] += toc - tic
        # in this process the learner waits for every fragment it gets
        stats["time_learner_wait"] = stats["time_collect"]
        stats["time_wall"] = toc - self._started
        T, B = self.buffer.npy.state.rew.shape
        stats["steps"] += (T - 1) * B
        stats["batches"] += 1
        stats["steps_per_s"] = stats["steps"] / max(stats["time_wall"], 1e-9)
        stats["steps_per_s_collect"] = stats["steps"] / max(
            stats["time_collect"], 1e-9)
        stats["returns"], stats["lengths"] = episode_stats(self.buffer.npy)
        return self.delivery(self.buffer.pyt)

    def close(self):
        """Close the envs; later ``next()`` calls stop the iteration."""
        if self._closed:
            return
        self._closed = True
        close_envs(self.envs)


def rollout(factory, actor, n_steps, n_envs, *, entropy=None, sticky=False,
            env_info=None, final=True, device=None, pinned=False,
            copy=False):
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
                   device=device, pinned=pinned, copy=copy)


# a fragment is a Fragment namedtuple; re-exported for the docs
_ = Fragment
