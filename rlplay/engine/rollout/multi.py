"""Many actors: worker processes fill a pool of shared fragment buffers and
the learner collates the ready ones into batches.

Protocol
--------
The learner sizes one fragment buffer of ``B = n_per_actor`` envs from a
probe env (made by ``factory`` here and closed at once) and the actor,
checks that ``n_buffers`` of them fit, allocates them in *one* shared
segment (:mod:`~rlplay.engine.workers._buffers`), makes a shared copy of the actor's parameters
(:class:`~rlplay.engine.workers.SharedParams`, version ``v0``) and starts ``n_actors``
workers, each running the worker loop of
:mod:`~rlplay.engine.workers._session`. Worker ``i`` steps envs ``i * B .. (i + 1) * B - 1``, seeded as
collector ``i`` (worker 0 sees the seeds of ``same.rollout``).

Each buffer is owned by one side at a time, and moves round this cycle::

    free (queued to a worker) ─► filling (that worker) ─► ready (queued to
    the learner) ─► collating (the learner, inside next()) ─► free ...

Timeline (``k`` counts batches, ``v_k`` is the version published by
``next()`` number ``k``)::

    learner                                     worker i
    -------                                     --------
    rollout(): probe env, pool, v0, workers ──► seed, make envs, reset
               hand out all buffer indices ───► Give[b, ...] (round robin)
                                                take b, load v, collect → b
    next() #k: publish v_k                 ◄──  Ready(b, seq, v)
               wait for n_per_batch ready       take b', load v', collect
               (drop any with v < v_k - max_lag: back to free)
               copy them into the batch
               hand their indices back ───────► Give[...] (queued)
               (copy the batch to the device)
               yield the batch
    ...train...                                 collect while buffers last,
                                                then wait for the learner
    close():   STOP ──────────────────────────► finish the fragment, Bye
               join, SIGTERM, SIGKILL, close the pipes, unmap the pool

The learner hands a freed buffer to the worker that holds the fewest, so a
fast worker gets more. A worker loads the latest parameters before each
fragment and records their version in ``meta.version``. The lag of a
fragment (``v_k`` minus its version) counts the batches published while it
was collected and while it waited for the learner, behind at most
``n_buffers - 1`` others; ``max_lag`` bounds it by dropping older ones.
The ``call_envs`` calls go down the pipes with each publication, and a
worker applies them before its next fragment (``call_envs`` in
:mod:`rlplay.engine.rollout`).

Order: a worker sends its ``Ready`` reports down its pipe in the order it
filled the buffers, and the learner takes arrivals in the order they came,
so a worker's fragments reach the learner in ``meta.seq`` order, across
batches and slot by slot within one; a stale fragment dropped by
``max_lag`` leaves its number out.

Progress rule: ``n_buffers >= n_per_batch``. The learner copies the
fragments into its own batch and hands their buffers back *before* it
yields, so it never holds a buffer while the caller trains: with at least
``n_per_batch`` buffers, whenever fewer than ``n_per_batch`` are ready the
others are with workers, which fill them, and a batch always forms.
With fewer, it never would. ``n_buffers >= n_per_batch + n_actors`` keeps
every worker busy while the learner collates, and more buffers let the
workers run further ahead (at the price of lag).

The batch is ``(1 + T, n_per_batch * B, ...)``: slot ``s`` (columns ``s * B
.. (s + 1) * B - 1``) holds one fragment; ``hx`` is concatenated along the
actor's ``hx_dim`` and ``meta`` along its only dimension. It is allocated
once, on the host (page-locked with ``pinned=True``) or, with a CUDA
``device``, on the device, filled through non-blocking copies from a
page-locked staging batch. The learner yields a fresh copy of it
(``copy=True``, the default), or with ``copy=False`` the batch itself,
reused, valid until the next ``next()``.

The learner's side of this protocol (publish, wait, drop, collate, hand
back, deliver) is :class:`~._gather.Gather`, a part that :class:`Rollout`
holds and shares with :mod:`.cluster`; its fleet is :class:`Processes`,
and the pool (:class:`~rlplay.engine.workers.SharedBuffers`) is its source
of ready fragments.

Waits and errors: ``timeout`` bounds the time ``next()`` waits without
news from any worker, every wait inside it included (the parameter lock,
which a worker killed while loading would never release, and the gather);
``start_timeout`` more while a worker starts (the first batch, a
replacement); ``timeout=None`` alone removes the bound. Every wait watches
every worker's sentinel and exit status (``waitpid``: a sentinel stays
silent while processes that the worker's env forked live), so a worker
that dies without a word is reported at once (within a tenth of a
second), whatever its env started, as :class:`~rlplay.engine.errors.WorkerDied` with its exit code or
signal. A worker catches every exception (factory, ``reset``, ``step``,
the actor) and reports it, raised as
:class:`~rlplay.engine.errors.WorkerError`; the factory's errors in the
learner's probe env are raised as they are; a timeout raises
:class:`~rlplay.engine.errors.RolloutTimeout`. Any of them breaks the
rollout (see :mod:`._states`): the workers are torn down at once and every
later ``next()`` raises the same error again, never a silent end. Workers
wait for the learner as long as it lives (training takes what it takes)
and die with it.

Restarts (``restarts=N``): a worker that dies, or whose factory or envs
raise, is replaced (see "When environments crash" in
docs/concepts/order-and-generations.md); the fragment it was filling
is discarded and its buffers go to the replacement, which starts from
resets with seeds of its own generation, loads the latest parameters and
numbers its fragments on from the last one received. Fragments received
before the failure are delivered as usual.

Prefetch and publication (``prefetch=``, ``publish=``): a thread of the
learner may run the wait, the collation and the device copy of the next
batches while the caller trains, and ``next()`` publish or leave that to
``feed.publish()``; what changes for the versions and ``max_lag`` is in
docs/how-to/prefetch.md (the protocol: ``rollout/_prefetch.py``).

Served inference (``serve=True``): the workers step envs only, and one
more process, the inference server, runs the actor for all of them on
``actor_device`` (:mod:`rlplay.engine.workers._server` draws its
timeline). In the timeline above, "collect → b" becomes: for each row,
ask the server (the indices of the row: buffer, row, env group, written
into a doorbell slot in shared memory that the server spins on,
:mod:`rlplay.engine.workers._doors`), which gathers the rows of every
worker that asked, calls the actor once on them (once per parameter
version), writes the actions, ``info`` and ``hx`` into the rows and
answers with the version in the slot; step the envs. A
worker's ``n_per_actor`` envs form ``groups`` groups, stepped in turn
while the server computes the other group's actions; ``deadline``
chooses the batching: lock-step, ``None`` (each group of every
collecting worker served together: the same batches in every run while
no worker waits for a buffer, so a sampling actor's draws repeat), or
seconds (a group as soon as every worker asked for it, else whatever has
arrived once the oldest request waited that long). The workers' own copy
of the actor makes ``hx`` at resets (``initial_hx``, ``reset``: they
must not depend on trained parameters). The server pins the latest
version when it serves a fragment's first request, for the whole
fragment (``meta.version``); it never loads parameters in the middle of
one (without ``max_lag``, a fragment that starts while the others run
with the version just before the latest takes theirs: one call a round).
It is supervised as the workers are (its error or death is raised
naming it, never restarted); a replaced worker's requests are dropped
and its replacement gets pipes of its own; ``stats`` counts the server's
calls and rows (``served_calls``, ``served_rows``, ``served_mean_rows``)
and its busy and forward seconds.

Shutdown (``close()``, leaving ``with``/``closing``, dropping the rollout,
the interpreter's exit): the supervisor's ordered shutdown, then the pool
is unmapped and the shared parameters dropped.
"""
from ..devices import worker_devices
from ..utils.mp import get_context
from ..workers import SharedBuffers
from ._base import PoolKeywords, Unpack, spell_out
from ._gather import Gather, Pooled
from ._served import Served, check_serving

__all__ = ["rollout", "Rollout", "Processes"]


def _what(n_actors, n_buffers):
    return f"a pool of {n_buffers} buffers for {n_actors} workers"


class Processes:
    """The fleet of ``multi`` (see :mod:`._gather`): worker processes on
    this machine, started with ``start_method``, filling a pool of shared
    buffers (:class:`~rlplay.engine.workers.SharedBuffers`)."""

    def __init__(self, start_method=None):
        self.context = get_context(start_method)

    def devices(self, actor_device, n_actors):
        return worker_devices(actor_device, n_actors,
                              start_method=self.context.get_start_method())

    def check_capacity(self, template, n_actors, n_buffers):
        SharedBuffers.check_capacity(
            template, n_buffers, n_actors, what=_what(n_actors, n_buffers),
            start_method=self.context.get_start_method())

    def start(self, supervision, actor, spec, template, n_actors, n_buffers,
              owner):
        ctx, run = self.context, supervision.setup.run
        supervision.workers(ctx, n_actors, actor, lambda params: SharedBuffers(
            template, n_buffers, n_actors, spec, params,
            what=_what(n_actors, n_buffers),
            start_method=ctx.get_start_method(), run=run),
            name="rlplay-multi")


class Rollout(Pooled):
    """The generator that :func:`rollout` returns (documented there): its
    parts are the learner's side of the pool, ``_gather`` (a
    :class:`~._gather.Gather` of :class:`Processes`), and what that holds
    (``_setup``, ``delivery``, ``_supervision``)."""

    def __init__(self, factory, actor, n_steps, n_actors, n_per_actor,
                 n_buffers, n_per_batch, *, start_method=None, serve=False,
                 groups=1, deadline=None, **kwargs: Unpack[PoolKeywords]):
        check_serving(serve, groups, deadline, n_per_actor)
        fleet = Processes(start_method)
        if serve:
            fleet = Served(fleet, groups, deadline,
                           max_lag=kwargs.get("max_lag"))
        self._adopt(Gather(
            "multi", fleet, self, factory, actor, n_steps, n_actors,
            n_per_actor, n_buffers, n_per_batch, **kwargs))

    @property
    def process(self):
        """Worker 0's process object (``None`` between generations)."""
        return self._supervision.process


def rollout(factory, actor, n_steps, n_actors, n_per_actor, n_buffers,
            n_per_batch, *, start_method=None, serve=False, groups=1,
            deadline=None, **kwargs: Unpack[PoolKeywords]):
    """Collect fragments in ``n_actors`` worker processes and yield batches
    of ``n_per_batch`` of them.

    Returns a :class:`Rollout`: an endless iterator and a context manager;
    ``close()`` is idempotent, and dropping it (or the interpreter's exit)
    closes it. The keywords that every generator shares (``entropy``,
    ``sticky``, ``env_info``, ``final``, ``device``, ``pinned``,
    ``copy``, ``check_spaces``, the timeouts, ``restarts``,
    ``restart_delay``, ``cpu_affinity``, ``resume``, ``prefetch``,
    ``publish``) are documented once,
    in :mod:`rlplay.engine.rollout`; ``start_method`` there too; those of
    this generator alone are below.

    Parameters
    ----------
    factory : callable
        Builds one Gymnasium env (with ``seed=`` if it accepts it); called
        ``n_per_actor`` times in each worker and once here, for a probe env
        that sizes the buffers. Closures and lambdas travel by cloudpickle.
    actor : BaseActorModule
        The learner's actor (on any device); each worker runs a CPU copy
        under ``torch.no_grad()``, loading its parameters and train/eval
        mode before each fragment. Its ``hx_dim`` tells the env dimension
        of ``hx`` leaves.
    n_steps : int
        ``T``, the steps per fragment.
    n_actors : int
        Worker processes.
    n_per_actor : int
        ``B``, the envs each worker steps together.
    n_buffers : int
        Shared fragment buffers in the pool, at least ``n_per_batch`` (see
        the progress rule in the module docstring).
    n_per_batch : int
        Fragments collated into one batch.
    max_lag : int, optional
        Drop fragments collected with a parameter version older than the
        current one minus ``max_lag`` (``0``: only fragments collected with
        the parameters of this very ``next()``); counted in ``stats``.
    serve, groups, deadline : bool, int, float or None
        Served inference (the module docstring): one server runs the
        actor for every worker; ``groups`` env groups per worker, stepped
        in turn; ``deadline``, lock-step (``None``) or seconds.

    Returns
    -------
    feed : Rollout
        An endless iterator of batches, ``Fragment`` of tensors of shape
        ``(1 + T, n_per_batch * B, ...)``: slot ``s`` (env columns ``s * B
        .. (s + 1) * B - 1``) holds one fragment, and ``meta`` tells its
        worker, envs, sequence number, generation and parameter version.
        Each batch is fresh, yours to keep; with ``copy=False`` it is
        reused, valid until the next ``next()``.

    Raises
    ------
    ValueError, TypeError
        Bad counts (including ``n_buffers < n_per_batch``), or an actor
        whose outputs do not fit the envs.
    TypeError
        ``actor`` is not an actor.
    RuntimeError
        ``device='cuda'`` or ``pinned=True`` without CUDA.
    CapacityError
        The pool does not fit in ``/dev/shm`` or in the file-descriptor
        limit.
    WorkerError, WorkerDied, RolloutTimeout
        From ``next()``: see the module docstring.

    Notes
    -----
    The attributes of ``feed``: ``params`` (the shared copy of the actor's
    parameters, ``None`` once closed), ``version`` (the parameter version
    at the last ``next()``), ``publish()`` (publish the actor's
    parameters now), ``pids`` (the workers' process ids,
    of their current generation), ``hx_dim`` (the actor's: ``hx`` is
    collated along it) and ``stats`` (the keys of
    :data:`rlplay.engine.rollout.STATS_KEYS`, documented there; per worker
    in ``workers`` the fragments ``received``, ``delivered``, ``dropped``,
    ``discarded`` (received, undelivered at close), ``collected`` (its own
    count, once it stopped cleanly), ``restarts``, ``lost`` and
    ``last_cause``).

    Examples
    --------
    >>> import functools, gymnasium, torch.nn as nn
    >>> from contextlib import closing
    >>> from rlplay.engine import PolicyActor
    >>> actor = PolicyActor(nn.Linear(4, 2))
    >>> factory = functools.partial(gymnasium.make, "CartPole-v1")
    >>> feed = rollout(factory, actor, 16, n_actors=2, n_per_actor=2,
    ...                n_buffers=4, n_per_batch=2, entropy=0)
    >>> with closing(feed):
    ...     batch = next(feed)
    >>> tuple(batch.state.obs.shape)
    (17, 4, 4)
    """
    return Rollout(factory, actor, n_steps, n_actors, n_per_actor,
                   n_buffers, n_per_batch, start_method=start_method,
                   serve=serve, groups=groups, deadline=deadline, **kwargs)


spell_out(rollout, Gather.__init__)
spell_out(Rollout.__init__, Gather.__init__)
