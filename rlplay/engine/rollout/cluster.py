"""A Ray cluster: Ray actors on any nodes fill fragments, which reach the
learner through Ray's object store; the learner collates them into batches.

Needs Ray (the ``cluster`` extra: ``pip install -e
'path/to/rlplay[cluster]'`` from rlplay's clone); importing this module does
not, calling :func:`rollout` does.

Protocol
--------
The learner sizes one fragment of ``B = n_per_actor`` envs from a probe
env (made by ``factory`` here and closed at once) and the actor, joins Ray
(see ``address``), puts the actor's parameters in the object store
(:class:`~rlplay.engine.workers.RayParams`, version ``v0``) and creates ``n_actors``
Ray actors. Worker ``i`` runs the worker session of :mod:`rlplay.engine.workers._session`
(seeded as collector ``i``: worker 0 sees the seeds of ``same.rollout``)
and fills a fragment buffer of its own, envs ``i * B .. (i + 1) * B - 1``.

A *request* is one call ``fill(params)`` of a worker; there are
``n_buffers`` of them, each in one of these places::

    queued or running (a worker) ─► ready (in the object store, then in
    the learner's queue) ─► collating (inside next()) ─► a new request ...

A worker runs its requests in order; each applies the ``call_envs`` calls
that the request carries (those the worker was not sent yet; see
``call_envs`` in :mod:`rlplay.engine.rollout`), loads the parameters that the request carries (from the object store, only when their version is not
the one it holds), collects the next fragment into its buffer and returns
it: Ray copies it into the object store (the learner reads it without a
copy on the same node, after one transfer from another node).

Timeline (``k`` counts batches, ``v_k`` is the version published by
``next()`` number ``k``)::

    learner                                    Ray actor i (any node)
    -------                                    ----------------------
    rollout(): probe env, join Ray, put v0 ──► seed, make envs, reset;
               start(), then the requests      start() returns its node
               (round robin)                   fill(v): load v if new,
                                               collect into its buffer
    next() #k: put v_k                     ◄── return the fragment
               wait for n_per_batch ready      run the next request ...
               (drop any with v < v_k - max_lag: request another)
               copy them into the batch
               one new request per fragment ─► fill(v_k) (queued)
               (copy the batch to the device)
               yield the batch
    ...train...                                collect while requests last
    close():   close() ──────────────────────► finish the queued fills,
               kill the actors (shut Ray         close the envs
               down if rlplay started it)

Order: a worker runs its requests in order, but Ray may show the learner
their results out of order (each reply travels on its own); the learner
takes a worker's results in the order of its requests
(:meth:`~rlplay.engine.workers.RemoteSupervisor.pump`), so its fragments reach the
batches in ``meta.seq`` order, as in :mod:`.multi`.

A new request goes to the worker that holds the fewest (the one whose
fragment was taken, on a tie): a fast worker collects more, a slow one
keeps its requests, and fragments are taken in the order they arrived.
The progress rule is ``multi``'s: ``n_buffers >= n_per_batch`` (more keeps
the workers busy while the learner trains, at the price of lag). The
version of a fragment is that of the request, so its lag counts the
batches published since the request was made. ``max_lag``, the batch,
``copy``, ``device`` and ``pinned`` are as in :mod:`.multi`, whose
learner's side (:class:`~._gather.Gather`) this generator holds too: only
the fleet (:class:`RayActors`) and the source of ready fragments differ
(:class:`RayRequests`).

Placement: before it creates an actor, the learner counts how many
workers the nodes of the cluster can hold, node by node, with what each
asks of Ray (``num_cpus``, ``num_gpus``, ``memory``, ``resources``;
:func:`placeable`). Ray would leave the others pending, never started, and
the first batch would wait for them until ``timeout``. A Ray that this
process started (``ray.init()`` without an address, or rlplay's own)
cannot grow, and such a request is refused with a ``ValueError``; a
cluster joined may have an autoscaler that adds nodes, and such a request
goes ahead with a ``RuntimeWarning`` (a ``ResourceWarning`` would be
hidden by Python's default warning filters).

Waits and errors: every wait is one ``ray.wait`` on every pending call
(start and fill) of every worker (:mod:`rlplay.engine.workers._ray`), bounded as in
:mod:`.multi` by ``timeout`` without news (plus ``start_timeout`` while a
worker has not delivered yet). A worker catches every exception of its
session and returns it, raised as
:class:`~rlplay.engine.errors.WorkerError` (type, message, remote
traceback); a call of an actor that died or became unreachable (killed,
its node lost) fails in Ray and is raised as
:class:`~rlplay.engine.errors.WorkerDied` naming the worker, its pid and
its node; no news within the bound is a
:class:`~rlplay.engine.errors.RolloutTimeout`. Any of them breaks the
rollout (see :mod:`._states`): the actors are killed at once. An actor
dies with its owner, the learner's Ray driver.

Restarts (``restarts=N``), as for :mod:`.multi`: rlplay kills the
failed actor and creates a new one (never Ray's ``max_restarts``, which
would rerun the constructor with the same seeds and repeat its first
fragments), of the next generation, which takes over the requests in
flight after ``restart_delay`` (the fragment being filled is lost) and
numbers its fragments on from the last one received.

Shutdown (``close()``, dropping the rollout): the ordered shutdown of
:class:`~rlplay.engine.workers.RemoteSupervisor` (close the envs, kill, wait until
Ray knows them dead and their processes on this machine have exited, all
within ``shutdown_timeout``); then Ray is shut
down if rlplay started it and no other rollout uses it.
"""
import itertools
import math
import warnings

from ..devices import worker_devices
from ..pool import layout
from ..workers import (WORKER_THREADS, Arrival, Buffers, Collation,
                       RayParams, ReadyQueue, RemoteSupervisor, WorkerConfig,
                       join, new_account, ray_options)
from ._base import PoolKeywords, Stats, Unpack, spell_out
from ._gather import Gather, Pooled

try:
    import ray
except ImportError:  # optional: Rollout() says how to install it
    ray = None

__all__ = ["rollout", "Rollout", "RayRequests", "RayActors", "placeable"]

# what a worker may ask of Ray (keywords of ray.remote's options), by the
# name of the resource in ray.cluster_resources()
_RESOURCE_OPTIONS = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


def _demand(options):
    """What one worker asks of Ray: ``{resource: amount}``, amounts > 0."""
    demand = {name: float(options.get(key) or 0)
              for key, name in _RESOURCE_OPTIONS.items()}
    demand.update((name, float(amount)) for name, amount
                  in (options.get("resources") or {}).items())
    return {name: amount for name, amount in demand.items() if amount > 0}


def placeable(nodes, demand):
    """How many workers that each ask ``demand`` (``{resource: amount}``)
    the ``nodes`` can hold together: on each node, as many as the scarcest
    resource allows (an actor runs on one node). ``nodes`` are the
    resources of each live node (``{resource: amount}``); ``math.inf``
    when nothing is asked.

    >>> placeable([{"CPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}], {"CPU": 1.0})
    3
    >>> placeable([{"CPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}],
    ...           {"CPU": 0.5, "GPU": 0.5})
    2
    """
    if not demand:
        return math.inf
    # a little slack, so that 1.0 / 0.1 counts 10 actors, not 9
    return sum(min(math.floor(node.get(name, 0.0) / amount + 1e-9)
                   for name, amount in demand.items()) for node in nodes)


def _cluster_fixed():
    """Whether this process started the Ray it is joined to (its head node),
    which no autoscaler grows; ``False`` when it cannot tell."""
    try:
        from ray._private import worker  # Ray's own record, not public API
        node = worker._global_node
    except (ImportError, AttributeError):
        return False
    return bool(getattr(node, "head", False))


def _check_placement(options, n_actors):
    """Refuse (a Ray that cannot grow), or warn of (a cluster joined), a
    request of ``n_actors`` workers that the cluster's nodes cannot hold
    together (see the module docstring)."""
    demand = _demand(options)
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    fits = placeable(nodes, demand)
    if fits >= n_actors:
        return
    total = ray.cluster_resources()
    each = ", ".join(f"{amount:g} {name}" for name, amount in demand.items())
    asked = ", ".join(f"{amount * n_actors:g} {name}"
                      for name, amount in demand.items())
    has = ", ".join(f"{total.get(name, 0):g} {name}" for name in demand)
    said = (f"n_actors={n_actors} workers ask Ray for {asked} ({each} each), "
            f"but the {len(nodes)} node(s) of this Ray cluster have {has}: "
            f"{fits} of the workers fit")
    cure = (f"use n_actors={fits} or fewer, ask less of each worker "
            f"(actor_options={{'num_cpus': ...}}), or join a larger cluster "
            f"(address=...)")
    if _cluster_fixed():
        raise ValueError(f"{said}, and a Ray started by this process does "
                         f"not grow; the others would never start: {cure}")
    warnings.warn(f"{said} now; the others wait until the cluster grows (an "
                  f"autoscaler), else the first batch times out: {cure}",
                  RuntimeWarning, stacklevel=5)


class RayRequests:
    """The requests of the protocol: the protocol that the
    :class:`~rlplay.engine.workers.RemoteSupervisor` serves and the source of ready
    fragments of the learner's side (:class:`~._gather.Gather`): how many
    requests each worker holds, the fragments received and the ready queue.
    It holds no reference to the generator, so that dropping the generator
    closes it at once."""

    def __init__(self, spec, buffers, n_workers, n_buffers, run=None):
        self.spec, self.buffers = spec, buffers
        self.held = [len(range(w, n_buffers, n_workers))
                     for w in range(n_workers)]
        self.accounts = [new_account() for _ in range(n_workers)]
        self.ready = ReadyQueue(self.accounts, run)
        self.fragments, self.keys = {}, itertools.count()
        counters = {} if run is None else run.counters
        self.time_collect = counters.get("time_collect", 0.0)
        self.time_worker_wait = counters.get("time_worker_wait", 0.0)
        self.supervisor = self.params = None

    # the protocol (see workers._ray.RemoteSupervisor)
    def config(self, w, generation):
        """Worker ``w``'s start bundle: it numbers its fragments on from
        those received (from where the run it continues left off, when
        resumed)."""
        return WorkerConfig(
            spec=self.spec, index=w, collector=w, generation=generation,
            seq=self.ready.numbered_from(w), params=None,
            buffers=self.buffers, free=[], evaluation=None,
            threads=WORKER_THREADS)

    def on_started(self, w):
        for _ in range(self.held[w]):  # queued after its start()
            self._fill(w)

    def _fill(self, w):
        # a request: the parameters, and the calls that w was not sent
        self.supervisor.call(w, "fill", self.params,
                             self.supervisor.mail.take(w))

    def on_message(self, w, value):
        header, fragment = value
        key = next(self.keys)
        self.fragments[key] = fragment
        self.held[w] -= 1
        self.ready.push(Arrival(w, key, header.seq, header.version))
        self.time_collect += header.elapsed
        self.time_worker_wait += header.waited

    def on_lost(self, w):
        return int(self.held[w] > 0)  # the fragment being filled

    # the source of ready fragments (see _gather.Gather)
    def fragment(self, arrival):
        return Collation.sources(self.fragments.pop(arrival.index))

    def release(self, arrivals, supervisor):
        for arrival in arrivals:
            self._give(arrival.worker)

    def recycle(self, arrival, supervisor):
        del self.fragments[arrival.index]  # a stale fragment
        self._give(arrival.worker)

    def _give(self, origin):
        """One more request, to the worker that holds the fewest (``origin``
        on a tie); a worker being replaced makes it when it starts."""
        w = min(range(len(self.held)),
                key=lambda w: (self.held[w], w != origin))
        self.held[w] += 1
        if self.supervisor.running(w):
            self._fill(w)

    def close(self):
        self.fragments.clear()
        self.ready.close()


class RayActors:
    """The fleet of ``cluster`` (see :mod:`._gather`): Ray actors with
    the actor ``options``, on the cluster at ``address``, serving requests
    (:class:`RayRequests`)."""

    def __init__(self, options, address=None):
        self.options, self.address = options, address

    def devices(self, actor_device, n_actors):
        return worker_devices(actor_device, n_actors,
                              ray_options=self.options)

    def check_capacity(self, template, n_actors, n_buffers):
        """Nothing to check: the fragments travel through Ray's object
        store."""

    def start(self, supervision, actor, spec, template, n_actors, n_buffers,
              owner):
        setup = supervision.setup
        run, release = setup.run, join(self.address)
        try:
            _check_placement(self.options, n_actors)
            supervision.source = requests = RayRequests(
                ray.put(spec), Buffers(None, *layout(template)), n_actors,
                n_buffers, run)
            setup.count(Stats(requests.accounts))
            requests.params = supervision.params = RayParams(actor,
                                                             run.version)
            # the protocol calls its workers from on_started()
            requests.supervisor = RemoteSupervisor(
                n_actors, requests, options=self.options, release=release,
                owner=owner, run=run, calls=setup.calls, **setup.policy)
        except BaseException:
            release()  # no supervisor holds it yet
            supervision.close(graceful=False)
            raise
        supervision.supervise(lambda: requests.supervisor)


class Rollout(Pooled):
    """The generator that :func:`rollout` returns (documented there): its
    parts are those of :class:`~.multi.Rollout`, ``_gather`` (a
    :class:`~._gather.Gather`) of :class:`RayActors`."""

    def __init__(self, factory, actor, n_steps, n_actors, n_per_actor,
                 n_buffers, n_per_batch, *, address=None, actor_options=None,
                 **kwargs: Unpack[PoolKeywords]):
        if ray is None:
            raise ImportError("cluster.rollout needs Ray: pip install -e "
                              "'path/to/rlplay[cluster]' (rlplay's clone "
                              "with its cluster extra), or pip install "
                              "'ray>=2.40'")
        self._adopt(Gather(
            "cluster", RayActors(ray_options(actor_options), address), self,
            factory, actor, n_steps, n_actors, n_per_actor, n_buffers,
            n_per_batch, **kwargs))

    @property
    def nodes(self):
        return self._supervision.supervisor.nodes


def rollout(factory, actor, n_steps, n_actors, n_per_actor, n_buffers,
            n_per_batch, *, address=None, actor_options=None,
            **kwargs: Unpack[PoolKeywords]):
    """Collect fragments in ``n_actors`` Ray actors, on any nodes of a Ray
    cluster, and yield batches of ``n_per_batch`` of them.

    Returns a :class:`Rollout`. Takes the arguments of
    :func:`rlplay.engine.rollout.multi.rollout` with the same meanings (but
    ``start_method``: Ray starts the workers), a worker being a Ray actor
    and ``n_buffers`` the number of requests in flight (see the module
    docstring); the keywords that every generator shares are documented
    once, in :mod:`rlplay.engine.rollout`. And these:

    Parameters
    ----------
    address : str, optional
        The Ray cluster to join (``ray.init(address=...)``, e.g.
        ``"10.0.0.1:6379"``) unless this process has joined one already.
        ``None``: the cluster that ``RAY_ADDRESS`` names, else a new local
        one for this machine. Ray is shut down on ``close()`` only if
        rlplay started it (and no other rollout uses it).
    actor_options : dict, optional
        Options of each worker's Ray actor (``num_cpus``, ``resources``,
        ``scheduling_strategy``, ``runtime_env``...; ``max_restarts`` is
        refused: see ``restarts``); by default one CPU each, spread over
        the nodes. ``n_actors`` workers that the nodes cannot hold
        together are refused up front by a Ray started by this process
        (see the module docstring). The factory and the actor travel
        cloudpickled: the packages they use must exist on every node or
        come in a ``runtime_env``.

    Returns
    -------
    feed : Rollout
        An endless iterator of batches, as ``multi``'s: slot ``s`` holds
        one fragment; a fresh batch, or with ``copy=False`` a reused one,
        valid until the next ``next()``.

    Raises
    ------
    ImportError
        Ray is not installed.
    ValueError, TypeError, RuntimeError
        As ``multi``; also bad ``actor_options``, and more workers than a
        Ray started by this process can hold.
    WorkerError, WorkerDied, RolloutTimeout
        From ``next()``: see the module docstring.

    Notes
    -----
    The attributes of ``feed``: ``params`` (the published parameters,
    ``None`` once closed), ``version`` (the parameter version at the last
    ``next()``), ``publish()`` (publish the actor's parameters now),
    ``pids`` and ``nodes`` (each worker's process id
    and Ray node id, ``None`` until it has started), ``hx_dim`` and
    ``stats`` (as ``multi``'s; each worker's dict also holds its
    ``node``).

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
                   n_buffers, n_per_batch, address=address,
                   actor_options=actor_options, **kwargs)


spell_out(rollout, Gather.__init__)
spell_out(Rollout.__init__, Gather.__init__)
