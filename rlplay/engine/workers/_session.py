"""The worker side of every process-based generator: one session, one loop.

A :class:`Session` is one collector's work, whatever drives it: seed the
process's generators, rebuild the factory and the actor, make and reset the
envs, then fill fragment buffers (:func:`rlplay.engine.core.collect`) or
play evaluation episodes (:func:`rlplay.engine.core.evaluate`). A worker
process runs :func:`main`, which drives a session from the orders on its
pipe; a Ray actor (:mod:`rlplay.engine.rollout.cluster`) drives the same
session from method calls.

Messages (named types, never positional tuples)::

    learner ──► worker                      worker ──► learner
    Give(indices)   free buffers to fill    Ready(index, seq, version,
    Evaluate(request) one evaluation              waited, elapsed, control)
    CallEnvs(first, payloads) env calls     Result(request, returns, lengths,
    STOP            finish and exit               version, elapsed, video,
                                                  control)
                                            Failed(record, restartable)
                                            Bye(seq)

A collecting worker fills the buffers it holds in the order it got them,
loading the latest parameters before each fragment, and waits for a
``Give`` only when it holds none (and then as long as the learner lives).
An evaluating worker waits for an ``Evaluate``. Either applies the
``CallEnvs`` it received before its next fragment (evaluation), and says
how many calls it applied in all (:mod:`._control`).

Failures: everything a session raises is sent as :class:`Failed`, with the
worker's :class:`ErrorRecord` (type, message, traceback) and whether a
restart may help: an exception from the factory or the envs may be
transient, one raised by the actor or by rlplay's own checks of what the
actor and the envs return is a bug that a restart would repeat.

Orphans: a worker exits within about a second of the learner's death,
whatever it is doing (:func:`rlplay.engine.utils.mp.guard_parent`). It
runs in a process group of its own, and whatever its envs start ends with
it, however it ends (:func:`rlplay.engine.utils.mp.guard_group`).
"""
import multiprocessing
import multiprocessing.connection
import os
import time
from collections import deque

import numpy as np
import torch

from ..core import collect, evaluate, fragment_device, startup
from ..policy import as_policy
from ..envs import make_batch
from ..pool import views
from ..seeds import (collector_seed_sequence, env_seed_sequences,
                     next_reset_seeds, seed_worker)
from ..utils.mp import (POLL_INTERVAL, Cloudpickled, ErrorRecord,
                        guard_group, guard_parent, ignore_interrupts,
                        set_cpu_affinity)
from ..video import video_path, write_video
from ._control import CallEnvs, WorkerCalls
from ._grouped import GroupedEnvs, serve_groups
from ._messages import (STOP, Buffers, Bye, Evaluate, Failed, Give, Ready,
                        Result, SessionSpec, WorkerConfig)

__all__ = ["Give", "Evaluate", "STOP", "Ready", "Result", "Failed", "Bye",
           "SessionSpec", "Session", "WorkerConfig", "Buffers",
           "LearnerLink", "main"]

# the modules whose frames mark an exception as rlplay's own check
_RLPLAY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _ActorFailure:
    """Marks exceptions raised inside the actor's ``step`` and ``reset``."""

    def __init__(self, method):
        self.method = method

    def __call__(self, *args, **kwargs):
        try:
            return self.method(*args, **kwargs)
        except BaseException as exc:
            exc.__rlplay_actor__ = True
            raise


def _restartable(exc):
    # raised by the actor, or by rlplay's own checks (the innermost frame
    # is rlplay's): a bug that a new worker would only repeat
    if getattr(exc, "__rlplay_actor__", False):
        return False
    tb = exc.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return not path.startswith(_RLPLAY_DIR + os.sep)


class Session:
    """One collector's work: envs, actor, and the context of collection.

    Parameters
    ----------
    spec : SessionSpec
        Its factory and actor are :class:`~rlplay.engine.utils.mp.
        Cloudpickled` in a worker, the objects themselves in the caller's
        process (``same.rollout``).
    index : int
        The worker index recorded in ``meta.worker``; its envs are
        ``index * n_envs .. (index + 1) * n_envs - 1`` in ``meta.env``.
    collector : int
        Its place in the seeding tree (``index``, or the evaluator's).
    generation : int
        Its replacement number, recorded in ``meta.generation`` (seeds of
        their own for ``g >= 1``).
    seq : int
        The ``meta.seq`` of its first fragment.
    calls : sequence of bytes
        The ``call_envs`` calls to apply before the first reset.

    Attributes
    ----------
    stage : str
        What the session is doing, for error messages.
    calls : WorkerCalls
        The calls received and how many were applied (``meta.control``).
    actor, envs
    """

    def __init__(self, spec, index, collector, generation=0, seq=0,
                 calls=()):
        self.spec, self.index, self.collector = spec, index, collector
        self.generation, self.seq = generation, seq
        self.calls = WorkerCalls(calls)
        self.stage, self.envs, self.actor, self.ctx = "start-up", None, None, None
        self.version = None
        self.evaluations = 0
        # where it runs the actor (None: where its parameters live)
        self.device = None if spec.actor_device is None \
            else spec.actor_device[index]
        self.policy = None
        self.groups = None

    def start(self, threads=1, in_process=False, groups=None):
        """Rebuild the factory and the actor and make the envs: one batch,
        or (a served worker) ``groups`` equal groups of columns, each a
        batch of its own (:class:`~._grouped.GroupedEnvs`).

        A worker (``in_process=False``) also seeds its process's global
        generators from its collector's sequence, runs ``threads`` torch
        threads and marks its actor's exceptions (not restartable). In the
        caller's process the actor is the caller's own, left as it is.
        """
        spec = self.spec
        factory, actor = _loaded(spec.factory), _loaded(spec.actor)
        if not in_process:
            set_cpu_affinity(spec.cpu_affinity, self.index)
            torch.set_num_threads(threads)
            seed_worker(collector_seed_sequence(
                spec.entropy, self.collector, self.generation))
            actor.step = _ActorFailure(actor.step)
            actor.reset = _ActorFailure(actor.reset)
            if self.device is not None:  # a worker's copy, on its device
                actor.to(self.device)
        self.actor = actor
        self.seeds = env_seed_sequences(spec.entropy, spec.n_envs,
                                        self.collector, self.generation)
        self.stage = "the factory"
        self.groups = groups
        if groups is None:
            self.envs = make_batch(factory, self.seeds)
        else:
            size = spec.n_envs // groups
            self.envs = GroupedEnvs([])
            for g in range(groups):
                self.envs.batches.append(make_batch(
                    factory, self.seeds[g * size:(g + 1) * size]))
        self.stage = "start-up"

    def begin(self, buffer):
        """Reset the envs for collection into buffers laid out as
        ``buffer``, once the calls received are applied."""
        self.calls.apply(self)
        self.stage = "reset"
        first = self.index * self.spec.n_envs
        # the actor, called where it runs (see rlplay.engine.core.devices)
        self.policy = as_policy(self.actor, rows=fragment_device(self.envs),
                                device=self.device)
        self.ctx = startup(self.envs, self.policy, buffer, self.seeds,
                           worker=self.index,
                           env_ids=np.arange(first, first + self.spec.n_envs),
                           generation=self.generation, seq=self.seq)
        self.ctx.control = self.calls.applied

    def load(self, params, check=None, timeout=None):
        """Load the latest published parameters (if they changed)."""
        self.version = params.load(self.actor, self.version, check=check,
                                   timeout=timeout)
        return self.version

    def receive(self, order):
        """Keep the calls of a :class:`~._control.CallEnvs` order (else
        ``False``: not one)."""
        if isinstance(order, CallEnvs):
            self.calls.receive(order)
            return True
        return False

    def fill(self, buffer, version=None):
        """Apply the calls received, collect the next fragment into
        ``buffer``; returns the seconds it took."""
        self.calls.apply(self)
        self.stage = f"collect (fragment {self.ctx.seq})"
        tic = time.perf_counter()
        collect(self.policy, buffer, self.ctx, sticky=self.spec.sticky,
                version=self.version if version is None else version,
                check_spaces=self.spec.check_spaces,
                sparse_final=self.spec.sparse_final)
        return time.perf_counter() - tic

    def evaluate(self, n_episodes, max_steps, record=None, version=None):
        """Play ``n_episodes`` in eval mode from fresh resets; returns
        ``(returns, lengths, seconds, video)``: with ``record`` (a
        directory), env 0's first episode is rendered and written there
        as the video of parameter ``version`` (its path; else ``None``).
        The calls received are applied first."""
        self.calls.apply(self)
        self.stage = f"evaluation {self.evaluations}"
        self.actor.eval()
        if self.policy is None:
            # the actor, called where it runs, as in begin()
            self.policy = as_policy(self.actor,
                                    rows=fragment_device(self.envs),
                                    device=self.device)
        tic = time.perf_counter()
        frames = [] if record is not None else None
        returns, lengths = evaluate(
            self.envs, self.policy, n_episodes,
            seed_sequences=next_reset_seeds(self.seeds), max_steps=max_steps,
            on_frame=None if frames is None else frames.append)
        video = None
        if frames is not None:
            self.stage = f"evaluation {self.evaluations} (its video)"
            video = video_path(record, version)
            write_video(video, frames, self.fps)
        self.evaluations += 1
        return returns, lengths, time.perf_counter() - tic, video

    @property
    def fps(self):
        """Frames a second of a video: the render rate the env declares
        (``metadata["render_fps"]``), 30 if none."""
        env = getattr(self.envs, "envs", [None])[0]
        fps = getattr(env, "metadata", {}).get("render_fps") if env \
            is not None else None
        return fps if fps else 30

    def failure(self, exc):
        """The :class:`Failed` message for ``exc``."""
        return Failed(ErrorRecord(exc, self.stage), _restartable(exc))

    def close(self, quiet=True):
        """Close the envs (quietly by default: nobody listens to a closing
        worker)."""
        envs, self.envs, self.ctx = self.envs, None, None
        if envs is not None:
            envs.close(quiet=quiet)


def _loaded(obj):
    return obj.load() if isinstance(obj, Cloudpickled) else obj


class LearnerLink:
    """The worker's end of the pipe, watching that the learner lives.

    The learner is gone when the pipe reaches EOF, when the parent
    process's sentinel fires (see :func:`multiprocessing.parent_process`),
    or when this process was re-parented.
    """

    def __init__(self, conn):
        self.conn = conn
        parent = multiprocessing.parent_process()
        self.sentinels = [conn] + ([parent.sentinel] if parent is not None
                                   and parent.sentinel is not None else [])
        self.ppid = os.getppid()

    def alive(self):
        """Whether the learner seems alive (cheap; checked every poll)."""
        return os.getppid() == self.ppid

    def check(self):
        """Raise ``SystemExit`` if the learner is gone (for waits that are
        not on the pipe)."""
        if not self.alive():
            raise SystemExit("the learner is gone")

    def poll(self):
        """Whether an order (or the learner's end) is waiting; never
        waits."""
        return bool(multiprocessing.connection.wait(self.sentinels, 0)) \
            or not self.alive()

    def recv(self):
        """The learner's next order, or ``None`` on :data:`STOP` or when
        the learner is gone; no deadline (the learner trains as long as it
        likes), but it ends within :data:`POLL_INTERVAL` of its death."""
        while True:
            ready = multiprocessing.connection.wait(self.sentinels,
                                                    POLL_INTERVAL)
            if self.conn in ready:
                try:
                    order = self.conn.recv()
                except (EOFError, OSError):
                    return None
                return None if order == STOP else order
            if ready or not self.alive():
                return None  # the parent's sentinel fired

    def send(self, message):
        """Send ``message``; ``False`` if the learner is gone."""
        try:
            self.conn.send(message)
            return True
        except (OSError, EOFError):
            return False

    def close(self):
        self.conn.close()


def main(conn, config, pdeathsig=True):
    """A worker process's entry point (the protocol in the docstring)."""
    guard_group()  # first: it forks, before any thread starts
    guard_parent(pdeathsig)
    ignore_interrupts()
    link = LearnerLink(conn)
    session = Session(config.spec, config.index, config.collector,
                      config.generation, config.seq, config.calls)
    segment = None if config.buffers is None else config.buffers.segment
    if config.evaluation is not None and config.evaluation.record is not None:
        # it renders frames, never a window: SDL (pygame, the renderer of
        # Gymnasium's classic-control envs) needs no display then
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        if config.serve is not None:  # a served worker steps envs only
            session.start(config.threads, groups=config.serve.groups)
            serve_groups(link, session, config)
            return
        session.start(config.threads)
        if config.evaluation is None:
            _serve_fragments(link, session, config)
        else:
            _serve_evaluations(link, session, config)
    except BaseException as exc:  # noqa: BLE001 - reported to the learner
        link.send(session.failure(exc))
    finally:
        session.close()
        if segment is not None:
            segment.close()
        link.close()


def _serve_fragments(link, session, config):
    segment, spec, stride = config.buffers
    buffers = [views(segment.flat, spec, i * stride)
               for i in range(segment.nbytes // stride)]
    free = deque(config.free)
    session.begin(buffers[free[0] if free else 0])
    while True:
        tic = time.perf_counter()
        # wait only when no buffer is held; take orders as they come
        while not free or link.poll():
            order = link.recv()
            if order is None:
                link.send(Bye(session.ctx.seq))
                return
            if not session.receive(order):
                free.extend(order.indices)
        index = free.popleft()
        waited = time.perf_counter() - tic
        session.stage = f"collect (fragment {session.ctx.seq})"
        version = session.load(config.params, check=link.check)
        elapsed = session.fill(buffers[index], version)
        if not link.send(Ready(index, session.ctx.seq - 1, version, waited,
                               elapsed, session.calls.applied)):
            return


def _serve_evaluations(link, session, config):
    spec = config.evaluation
    pending = spec.pending
    while True:
        if pending is not None:  # a replacement replays the lost request
            order, pending = Evaluate(pending), None
        else:
            session.stage = "waiting"
            order = link.recv()
            if order is None:
                return
            if session.receive(order):
                continue
        session.stage = f"evaluation {order.request}"
        version = session.load(config.params, check=link.check)
        returns, lengths, elapsed, video = session.evaluate(
            spec.n_episodes, spec.max_steps, spec.record, version)
        if not link.send(Result(order.request, returns, lengths, version,
                                elapsed, video, session.calls.applied)):
            return
