"""Double-buffered collection: one worker process fills one shared buffer
while the learner trains on the other (a barrier flip-flop).

Protocol
--------
The learner allocates two fragment buffers ``A`` and ``B`` in shared
memory, a shared copy of the actor's parameters (:class:`SharedParams`,
version ``v0``) and starts the worker. Fragment ``k`` goes to buffer
``k % 2`` and is collected with the parameters of version ``max(k - 1,
0)``: the policy lag is exactly one batch. ``v_k`` is what the learner's
actor holds at ``next()`` #k (counting from 0), that is after training on
fragments ``0 .. k - 1``::

    learner                                       worker
    -------                                       ------
    rollout(): probe env, A, B, v0,
               start the worker ────────────────► seed, make envs, reset
                                                  load v0, collect #0 → A
    next() #0: wait for "ready A" ◄──────────────  "ready A"
               yield A (#0, v0)                   load v0, collect #1 → B
    ...train on #0...                             (a free buffer: no wait)
    next() #1: wait for "ready B" ◄──────────────  "ready B"
               publish v1, hand A back ─────────► load v1, collect #2 → A
               yield B (#1, v0)
    ...train on #1...
    next() #2: wait for "ready A" ◄──────────────  "ready A"
               publish v2, hand B back ─────────► load v2, collect #3 → B
               yield A (#2, v1)

    next() #k, k ≥ 1: wait for "ready" of #k; publish v_k; hand back the
    buffer of #k-1, where the worker collects #k+1 with v_k; yield #k.

Set-up: the learner makes one probe env with the factory to size the
buffers, and closes it (a failure there is raised directly, as by
``same.rollout``). The worker makes its own ``n_envs`` envs with the seeds
``same.rollout`` gives its envs (collector 0 of ``entropy``), seeds its
global generators from that collector's sequence, and runs its CPU copy of
the actor on one torch thread.

Between two ``next()`` calls the learner owns the yielded buffer and the
worker the other one; they swap at ``next()``. The yielded batch is the
shared buffer itself and stays valid until the next ``next()`` (pass
``copy=True`` to keep batches).

Why publish only after "ready" of #k: the shared copy holds one version;
the worker loads ``v_{k-1}`` when it starts #k, which is before it reports
#k ready, so the learner may overwrite it with ``v_k`` then and not before.
Publishing earlier would let a slow worker load ``v_k`` for #k (no lag).

Waits: every learner wait is bounded (``timeout + start_timeout`` for
fragment 0, ``timeout`` for the others; ``timeout=None`` alone removes the
bound) and watches the worker's sentinel, so a worker that dies is reported
within a tenth of a second. The worker
waits for the learner as long as the learner lives (training takes what it
takes) and exits within a tenth of a second of the learner's death.

Errors: the worker catches every exception (factory, ``reset``, ``step``,
the actor) and sends an :class:`ErrorRecord`; the learner raises it as
:class:`WorkerError` with the worker's exception type, message and
traceback. A silent death raises :class:`WorkerDied` with the exit code or
signal name, an exhausted wait :class:`RolloutTimeout`. After any of them
the generator is closed, and every later ``next()`` raises the same error
again (never a silent end of iteration). ``close()`` by the user ends the
iteration (``StopIteration``).

Shutdown: ``close()``, leaving ``with`` or ``closing(...)``, dropping the
generator, or the interpreter's exit stops the worker in the order of
:mod:`rlplay.engine.utils.worker` (stop order, bounded join, ``SIGTERM``,
``SIGKILL``, close the pipe); the buffers are released with the generator
(a batch the learner still holds keeps its own memory alive).
"""
import functools
import itertools
import time
import weakref
from collections import namedtuple

import torch

from ..core import _check_counts, collect, episode_stats, startup
from ..envs import close_envs, make_envs
from ..seeds import (collector_seed_sequence, env_seed_sequences, seed_sequence)
from ..nested import suply
from ..shared import Aliased, Delivery, copy_
from ..utils import (Cloudpickled, ErrorRecord, LearnerLink, PackedTensors,
                     RolloutError, SharedParams, WorkerProcess,
                     check_timeouts, cpu_copy, first_timeout, get_context,
                     start_worker)
from ._base import Generator, probe_layout

__all__ = ["rollout", "Rollout", "TIMEOUT", "START_TIMEOUT",
           "SHUTDOWN_TIMEOUT"]

# the longest the learner waits for one fragment (seconds)
TIMEOUT = 60.0
# extra time allowed for the worker's start-up before fragment 0 (seconds):
# a spawned interpreter imports torch, then the envs are made and reset
START_TIMEOUT = 60.0
# how long close() waits for the worker to stop on its own (seconds)
SHUTDOWN_TIMEOUT = 5.0

# the worker's collector index: its seeds are those of same.rollout's
COLLECTOR = 0

# orders and reports on the pipe
_GO, _READY = "go", "ready"

_Config = namedtuple(
    "_Config", "factory actor params buffers entropy n_envs sticky")


def _worker(conn, config):
    """The worker's side of the protocol in the module docstring."""
    link = LearnerLink(conn)
    envs, stage = [], "start-up"
    try:
        factory, actor = start_worker(
            collector_seed_sequence(config.entropy, COLLECTOR),
            config.factory, config.actor)
        buffers = [Aliased(suply(torch.Tensor.numpy, pack.tree), pack.tree)
                   for pack in config.buffers]
        seeds = env_seed_sequences(config.entropy, config.n_envs, COLLECTOR)
        stage = "the factory"
        envs = make_envs(factory, seeds)
        stage = "start-up (reset, initial hx)"
        version = config.params.load(actor, check=link.check)
        ctx = startup(envs, actor, buffers[0], seeds)
        for k in itertools.count():
            index = k % 2
            tic = time.perf_counter()
            if k >= 2:  # wait for the learner to hand buffer `index` back
                order = link.recv()
                if order is None:
                    return
                assert order == (_GO, index), order
            elif link.poll() and link.recv() is None:
                return
            waited = time.perf_counter() - tic
            stage = f"fragment {k}"
            version = config.params.load(actor, version, check=link.check)
            tic = time.perf_counter()
            collect(actor, buffers[index], ctx, sticky=config.sticky,
                    version=version)
            elapsed = time.perf_counter() - tic
            if not link.send((_READY, index, version, waited, elapsed)):
                return
    except BaseException as exc:  # noqa: B902 - everything goes to the learner
        link.send(ErrorRecord(exc, stage))
    finally:
        close_envs(envs, quiet=True)
        link.close()


class Rollout(Generator):
    """An endless iterator of fragments collected by one worker process.

    Use :func:`rollout` to make one. It is a context manager, ``close()``
    is idempotent, and dropping it closes it too.

    Attributes
    ----------
    buffers : tuple of two Aliased
        The shared host buffers (numpy and torch views).
    process : multiprocessing.Process
        The worker.
    pid : int
        The worker's process id.
    stats : dict
        ``steps`` (env steps delivered), ``batches``, ``time_collect``
        (seconds the worker spent collecting), ``time_wall`` (seconds
        since the first ``next()`` began), ``time_learner_wait`` (seconds
        ``next()`` waited for a fragment, the worker's start-up included),
        ``time_worker_wait`` (seconds the worker waited for a buffer to be
        handed back), ``steps_per_s`` (``steps / time_wall``: what the
        learner gets, training and the worker's start-up included),
        ``steps_per_s_collect`` (``steps / time_collect``, the worker's
        rate), and ``returns`` and ``lengths`` of the episodes that ended
        in the last batch.
    """

    def __init__(self, factory, actor, n_steps, n_envs, *, entropy=None,
                 sticky=False, env_info=None, final=True, device=None,
                 pinned=False, copy=False, start_method=None,
                 timeout=TIMEOUT, start_timeout=START_TIMEOUT,
                 shutdown_timeout=SHUTDOWN_TIMEOUT):
        self.delivery = Delivery(device, pinned, copy)
        _check_counts(n_steps, n_envs)
        n_steps, n_envs = int(n_steps), int(n_envs)
        check_timeouts(timeout=timeout, start_timeout=start_timeout,
                       shutdown_timeout=shutdown_timeout)
        mp_ctx = get_context(start_method)
        entropy = seed_sequence(entropy)  # one root for the learner and worker
        self.actor, self.copy = actor, copy
        self.timeout, self.start_timeout = timeout, start_timeout
        self.shutdown_timeout = shutdown_timeout
        self._closed, self._error = False, None

        # the worker's actor, on the CPU; the buffers are sized with it in
        # this process, from a probe env the factory makes and we close
        worker_actor = cpu_copy(actor)
        shipped = (Cloudpickled(factory), Cloudpickled(worker_actor))
        layout = probe_layout(factory, worker_actor, n_steps, n_envs,
                              entropy, env_info=env_info, final=final)
        # two zero-filled buffers in shared memory, packed so that they
        # travel to the worker as a few file descriptors (see PackedTensors)
        packs = (PackedTensors(layout), PackedTensors(layout))
        self.buffers = tuple(Aliased(suply(torch.Tensor.numpy, pack.tree),
                                     pack.tree) for pack in packs)
        self.params = SharedParams(actor, mp_ctx)

        self.device = self.delivery.device
        # A page-locked staging copy of the shared buffer (shared memory is
        # not page-locked) feeds the device, and is the batch itself with
        # pinned=True (without copy=True, which copies the shared buffer
        # straight into a fresh pinned batch). The device copy could read
        # the shared buffer instead, and be waited for before the buffer
        # is handed back, but from pageable memory CUDA first synchronizes
        # the stream (CUDA runtime API, "API synchronization behavior"):
        # next() would wait for all the training queued on the GPU. The
        # staging copy costs one host memcpy (what the driver would do
        # anyway) and keeps the device copy asynchronous.
        staged = self.device is not None or (pinned and not copy)
        self._staging = (suply(lambda x: torch.empty(
            x.shape, dtype=x.dtype, pin_memory=True), layout)
            if staged else None)

        config = _Config(*shipped, self.params, packs, entropy, n_envs,
                         sticky)
        self._worker = WorkerProcess(mp_ctx, _worker, (config,),
                                     name="rlplay-single")
        self.process, self.pid = self._worker.process, self._worker.pid
        # runs close's shutdown when this object is collected or at exit
        self._finalizer = weakref.finalize(self, self._worker.close,
                                           shutdown_timeout)
        self._held = None  # the index of the buffer the learner holds
        self._started = None
        self.stats = {"steps": 0, "batches": 0, "time_collect": 0.0,
                      "time_wall": 0.0, "time_learner_wait": 0.0,
                      "time_worker_wait": 0.0, "steps_per_s": 0.0,
                      "steps_per_s_collect": 0.0, "returns": None,
                      "lengths": None}

    def __next__(self):
        # one step of the protocol in the module docstring
        if self._error is not None:
            raise self._error
        if self._closed:
            raise StopIteration
        k = self.stats["batches"]
        tic = time.perf_counter()
        if self._started is None:
            self._started = tic
        timeout = (first_timeout(self.timeout, self.start_timeout) if k == 0
                   else self.timeout)
        try:
            message = self._worker.recv(timeout, what=f"fragment {k}")
        except KeyboardInterrupt:
            raise  # nothing was consumed: next() may be called again
        except BaseException as exc:
            self._fail(exc)
            raise
        waited_here = time.perf_counter() - tic
        try:
            if isinstance(message, ErrorRecord):
                raise message.to_exception(worker=0)
            _, index, version, waited, elapsed = message
            assert index == k % 2 and version == max(k - 1, 0), message
            if k > 0:
                self.params.publish(self.actor, check=functools.partial(
                    self._worker.check_alive, "the parameter lock"))
                self._worker.send((_GO, self._held))
            self._held = index
            batch = self._deliver(self.buffers[index].pyt)
        except BaseException as exc:
            self._fail(exc)
            raise
        toc = time.perf_counter()
        stats = self.stats
        T, B = self.buffers[index].npy.state.rew.shape
        stats["steps"] += (T - 1) * B
        stats["batches"] += 1
        stats["time_collect"] += elapsed
        stats["time_worker_wait"] += waited
        stats["time_learner_wait"] += waited_here
        stats["time_wall"] = toc - self._started
        stats["steps_per_s"] = stats["steps"] / max(stats["time_wall"], 1e-9)
        stats["steps_per_s_collect"] = stats["steps"] / max(
            stats["time_collect"], 1e-9)
        stats["returns"], stats["lengths"] = episode_stats(
            self.buffers[index].npy)
        return batch

    def _deliver(self, pyt):
        """The batch to yield for the shared buffer ``pyt`` (see __init__
        on the staging copy)."""
        if self._staging is None:
            return self.delivery(pyt)
        # the last device copy must have read the staging memory first
        self.delivery.wait()
        return self.delivery(copy_(self._staging, pyt))

    def _fail(self, exc):
        # the protocol cannot resume after this: close, and keep saying why
        self._error = exc if isinstance(exc, Exception) else RolloutError(
            f"the rollout was closed by {type(exc).__name__} in next()")
        self.close()

    def close(self):
        """Stop the worker (see the module docstring); idempotent. Later
        ``next()`` calls end the iteration, or raise the error that closed
        the generator."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        self.delivery.wait()  # no device copy may read freed memory
        self.buffers = self.params = self._staging = None


def rollout(factory, actor, n_steps, n_envs, *, entropy=None, sticky=False,
            env_info=None, final=True, device=None, pinned=False,
            copy=False, start_method=None, timeout=TIMEOUT,
            start_timeout=START_TIMEOUT, shutdown_timeout=SHUTDOWN_TIMEOUT):
    """Collect fragments in one worker process, double-buffered.

    Takes the arguments of :func:`rlplay.engine.rollout.same.rollout`, and
    yields the same fragments (for the same ``entropy`` and parameters),
    collected one batch behind the learner's parameters.

    Parameters
    ----------
    factory : callable
        Builds one Gymnasium env. It is called once in this process, for a
        probe env that sizes the buffers and is closed at once (an
        exception there is raised here, as by ``same.rollout``), then
        ``n_envs`` times in the worker. Shipped with cloudpickle, so
        lambdas and closures work with every start method.
    actor : BaseActorModule
        The learner's actor (on any device). The worker runs a CPU copy,
        under ``torch.no_grad()``, and before each fragment loads the
        parameters and the train/eval mode the learner's actor had at the
        last ``next()``.
    n_steps : int
        ``T``, the steps per fragment.
    n_envs : int
        ``B``, the envs of the worker.
    entropy : int or SeedSequence, optional
        Seeds the run; the worker's envs get the seeds ``same.rollout``
        gives its envs, and its global generators are seeded from the
        collector's own sequence.
    sticky : bool
        Freeze an env for the rest of a fragment once its episode ended.
    env_info : dict, optional
        Env info keys to record, ``{key: example value}``.
    final : bool
        Record final observations.
    device : str or torch.device, optional
        Deliver batches on this device, through a pinned staging copy and a
        non-blocking copy; without CUDA a CUDA device raises
        ``RuntimeError`` here. The worker always runs on the CPU.
    pinned : bool
        Deliver batches in page-locked host memory (a copy of the shared
        buffer); needs CUDA.
    copy : bool
        Yield a fresh copy of each batch instead of the reused buffer.
    start_method : {'forkserver', 'spawn', 'fork'}, optional
        Default ``forkserver`` (see :func:`rlplay.engine.utils.get_context`).
    timeout : float or None
        The longest ``next()`` waits for a fragment while the worker lives
        (``None``: no deadline, as long as it lives).
    start_timeout : float or None
        Added to ``timeout`` for the first fragment, for the worker's
        start-up (``None`` adds nothing).
    shutdown_timeout : float
        How long ``close()`` waits for the worker before terminating it.

    Yields
    ------
    batch : Fragment of tensors, shape = (1 + T, B, ...)
        The shared buffer itself (or its pinned or device copy), valid until
        the next ``next()``, unless ``copy=True``. ``meta.version`` holds
        ``max(k - 1, 0)`` for the ``k``-th batch.

    Raises
    ------
    WorkerError
        The worker raised (``exc_type``, ``type_name``,
        ``remote_traceback`` tell what and where).
    WorkerDied
        The worker ended without a word (``exitcode``).
    RolloutTimeout
        No fragment within the bound while the worker lives.
    ValueError
        The actor's parameters and buffers changed in number since the
        start (they cannot be published).

    Examples
    --------
    >>> import functools, gymnasium, torch.nn as nn
    >>> from contextlib import closing
    >>> from rlplay.engine import PolicyActor
    >>> actor = PolicyActor(nn.Linear(4, 2))
    >>> factory = functools.partial(gymnasium.make, "CartPole-v1")
    >>> with closing(rollout(factory, actor, 16, 2, entropy=0)) as feed:
    ...     batches = [batch.meta.version[0].item() for batch in
    ...                itertools.islice(feed, 3)]
    >>> batches
    [0, 0, 1]
    """
    return Rollout(factory, actor, n_steps, n_envs, entropy=entropy,
                   sticky=sticky, env_info=env_info, final=final,
                   device=device, pinned=pinned, copy=copy,
                   start_method=start_method, timeout=timeout,
                   start_timeout=start_timeout,
                   shutdown_timeout=shutdown_timeout)
