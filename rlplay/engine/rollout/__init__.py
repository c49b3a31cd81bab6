"""Generators of fragments.

``same`` (in this process), ``single`` (one worker process, double
buffered), ``multi`` (many worker processes, a pool of shared buffers),
``cluster`` (Ray actors on a cluster; needs ``rlplay[cluster]``) and the
:class:`Evaluator` (evaluation in a worker process); :mod:`.episodic`
turns the fragments of any of them into whole episodes (and Minari
datasets). Each module opens
with its protocol and holds a class, ``Rollout``, and the function
``rollout`` that makes one and documents its parameters (its signature
lists every keyword it takes, for ``inspect.signature`` and ``help()``,
and its ``**kwargs`` are typed with ``Unpack`` of :class:`Keywords`,
:class:`WorkerKeywords` or :class:`PoolKeywords` for IDEs); what they
share lives in
the package's underscored modules, which docs/concepts/code-layout.md
maps.

Every generator takes ``factory, actor, n_steps``, then its env counts,
then these keywords (those it has: ``same`` has neither processes nor
timeouts; the :class:`Evaluator` collects no fragments), documented here
once:

==================  =========  =============================================
keyword             default    meaning
==================  =========  =============================================
``entropy``         ``None``   seeds the run reproducibly: every env, worker
                               and torch stream gets its own child of one
                               ``numpy.random.SeedSequence``
                               (:mod:`rlplay.engine.seeds`); ``None``: fresh
                               OS entropy. Each rank of a distributed run
                               (``torch.distributed``, ``torchrun``) draws
                               from a tree of its own, rank 0 from the
                               run's (:func:`~rlplay.engine.seeds.rank_root`)
``sticky``          ``False``  stop stepping an env for the rest of a
                               fragment once its episode ended (the frozen
                               rows: :mod:`rlplay.engine.core`)
``env_info``        ``None``   ``{key: example}``: the numeric env info keys
                               to record (``env`` and ``env_mask``)
``final``           ``True``   record the true last observation of every
                               episode (``final``)
``device``          ``None``   deliver batches on this device, through
                               non-blocking copies from page-locked memory;
                               refused up front without CUDA; ``None``:
                               where they are collected (the host, or a
                               torch-native source's device)
``pinned``          ``False``  deliver batches in page-locked host memory;
                               needs CUDA
``copy``            ``True``   yield a fresh batch each time, yours to keep
                               (``list(islice(feed, 3))`` holds three
                               batches); ``False``, the fast path: yield
                               the generator's reused batch, valid only
                               until the next ``next()`` (a copy costs
                               about 0.2% of collection on CartPole and 1
                               to 3% on 84x84x4 frames)
``check_spaces``    'first'    check actions and observations against their
                               spaces, and rewards for NaN, during each
                               worker's first fragment
                               (``'first'``), every step (``'always'``) or
                               never (``'never'``); ``Box`` actions reach
                               the env clipped into their bounds whatever
                               it says, and are recorded as the actor
                               chose them (:mod:`rlplay.engine.core`)
``start_method``    ``None``   ``'forkserver'`` (the default), ``'spawn'``
                               or ``'fork'``; under the first two a script
                               makes generators under
                               ``if __name__ == "__main__":``; not
                               ``'fork'`` in a process that called
                               ``ray.init`` (a forked worker may inherit
                               a lock of Ray's gRPC threads and hang)
``timeout``         60 s       the longest ``next()`` waits without news
                               from any worker, every wait inside it
                               included; ``None``: no deadline (the
                               liveness checks stay). The Evaluator's
                               default is 300 s: its worker is silent for a
                               whole evaluation
``start_timeout``   60 s       added to ``timeout`` while a worker starts
                               (the first batch, a replacement)
``shutdown_timeout`` 5 s       how long ``close()`` waits for the workers
                               before terminating them
``restarts``        0          the budget of worker replacements for the
                               run (see "When environments crash" in
                               docs/concepts/order-and-generations.md)
``restart_delay``   1 s        seconds before a replacement starts
``cpu_affinity``    ``None``   where the workers run: ``None`` (where the
                               OS puts them), ``'auto'`` (worker ``i`` on
                               the ``i``-th of the cores this process may
                               use, round robin; under ``torchrun``, of
                               this rank's share of them, apart from the
                               other ranks of the machine's:
                               ``LOCAL_RANK`` of ``LOCAL_WORLD_SIZE``,
                               :func:`~rlplay.engine.utils.rank_cores`) or
                               one set of cores per worker; applied in each
                               worker before it makes its envs, refused up
                               front where the platform has no affinity
                               call
``resume``          ``None``   a ``state_dict()`` of a generator of the
                               same kind and arguments: continue that run
                               (``meta.seq``, versions and
                               counters go on, envs are reset with seeds
                               of the resume's own branch); a state that
                               would shape the batch otherwise is refused
``actor_device``    ``None``   where the actor runs:
                               ``same``, where its parameters live (a
                               device given must be that one); the workers,
                               a copy on the CPU, or on this device (one
                               for all, or a list of one per worker;
                               CUDA refused up front without CUDA, under
                               ``fork``, for Ray workers without
                               ``num_gpus``); each row is moved there once
                               (:mod:`rlplay.engine.policy.device`); with
                               ``serve=True``, the inference server's one
                               device
``prefetch``        0          batches that a thread of the learner prepares
                               ahead (``single``: at most 1): it waits for
                               the fragments, collates them and copies the
                               batch to ``device`` (on a side CUDA stream)
                               while the caller trains; ``next()`` hands
                               out a batch ready on the caller's stream,
                               never one the caller holds. With
                               ``publish="next"``, a batch of ``multi`` or
                               ``cluster`` is then one publication further
                               behind (``single``'s lag stays exactly 1).
                               The thread, its versions and ``max_lag``:
                               docs/how-to/prefetch.md
``publish``         'next'     when the actor's parameters reach the
                               workers: at each ``next()`` (``'next'``),
                               or only when ``feed.publish()`` is called
                               (``'manual'``: after the optimiser's step,
                               every step or every ``k``); either way
                               ``meta.version`` counts the publications
``serve``           ``False``  ``multi`` only: one inference server runs
                               the actor for every worker on
                               ``actor_device`` (the CPU by default), in
                               batched calls on the rows of the shared
                               pool (indices only, through doorbells in
                               shared memory); the
                               workers step envs in ``groups`` groups, one
                               stepped while the server computes the
                               other's actions, and ``deadline`` chooses
                               lock-step (``None``) or deadline batching
                               (:mod:`.multi`; docs/how-to/serving.md)
==================  =========  =============================================

Every generator of fragments with workers (``single``, ``multi``,
``cluster``) also has ``publish()``: publish the actor's parameters (and
the ``call_envs`` calls made since) now, returning their version. ``same``
takes neither keyword: it collects with the caller's own actor, in the
caller's thread, between two ``next()`` calls; a thread collecting ahead
would run the actor while the optimiser writes it.

Every generator and the :class:`Evaluator` (and :mod:`.episodic` over
them) also have ``call_envs(name, *args, **kwargs)``: every env of every
worker calls its method ``name`` at that worker's next fragment boundary,
published with the parameters, stamped on every fragment as
``meta.control`` and applied again by replacements and resumed runs
(docs/how-to/changing-envs.md).

Timeouts and ``restart_delay`` are finite numbers of seconds (``None``
drops a deadline); bad values are refused up front, naming the argument,
before anything starts.

Every generator's ``stats`` (a dict of :data:`STATS_KEYS`), updated by
each ``next()``; the times and counts are *cumulative*, since the first
``next()`` (a resumed run goes on from its counters):

=========================  ==================================================
key                        meaning
=========================  ==================================================
``steps``, ``batches``     env steps (``T * B`` per batch) and batches
                           delivered
``time_wall``              seconds since the first ``next()`` began
``time_learner_wait``      seconds ``next()`` waited for data (with
                           ``prefetch``, the caller's wait alone)
``time_worker_wait``       seconds the workers waited for the learner,
                           *summed over workers*
``time_collect``           seconds the workers spent collecting what was
                           delivered, *summed over workers* (8 workers busy
                           for 1 s add 8 s)
``time_collate``           seconds spent copying fragments into batches
``steps_per_s``            ``steps / time_wall``: what the learner gets,
                           training included
``steps_per_s_collect``    ``steps / time_collect``: steps per
                           *worker*-second, the speed of one worker; with
                           ``n`` busy workers the learner may get up to
                           ``n`` times as many per second
``version``                the parameter version of the last ``next()``,
                           which publishes the actor's parameters,
                           *changed or not* (with ``publish="manual"``:
                           the ``publish()`` calls so far, and a
                           fragment's ``meta.version`` the publications
                           when its worker loaded the parameters):
                           ``same`` and ``single``
                           count the ``next()`` calls before it (21
                           batches without training end at version 20;
                           the first fragment is collected with the
                           actor as it is), ``multi`` and ``cluster``
                           those up to it (each ``next()`` publishes
                           before it waits: 21 end at 21, the first
                           fragments being of version 0);
                           ``meta.version`` of a fragment counts the
                           same way
``lag``                    the largest ``version - meta.version`` in the
                           last batch
``returns``, ``lengths``   of the episodes that ended in the last batch
``dropped``, ``restarts``  stale fragments dropped (``max_lag``), workers
                           replaced
``workers``                one dict of counts per worker
``served_calls``,          ``multi(serve=True)`` only: the server's calls
``served_rows``,           of the actor, the env rows they computed, the
``served_mean_rows``       rows of an average call (the batch size formed)
``time_serve_busy``,       ``multi(serve=True)`` only: the server's seconds
``time_serve_forward``     serving (gather, call, write back, answer) and
                           those in the actor's calls
=========================  ==================================================
"""
import importlib

from . import episodic, evaluate, multi, same, single
from ._base import STATS_KEYS, Keywords, PoolKeywords, WorkerKeywords
from .evaluate import Evaluation, Evaluator

__all__ = ["same", "single", "multi", "cluster", "episodic", "evaluate",
           "Evaluator", "Keywords", "WorkerKeywords", "PoolKeywords",
           "Evaluation", "STATS_KEYS"]


def __getattr__(name):
    # ``cluster`` imports Ray (when installed): only on first use
    if name == "cluster":
        return importlib.import_module(f"{__name__}.cluster")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
