"""Prefetching: the learner's side of a generator prepares the next batch
in a background thread while the caller trains on the current one
(``prefetch=``), and the publication of the parameters apart from
``next()`` (``publish=``, ``feed.publish()``).

The part: :class:`Prefetch`, held as ``prefetch`` by the learner's side
of ``single`` (its generator) and of ``multi`` and ``cluster``
(:class:`~._gather.Gather`): the publication (:meth:`Prefetch.publish`,
``publish()`` of the generators: :func:`publish`), the batches' parts in
turn, and with ``prefetch > 0`` the thread (:class:`Prefetcher`). The
thread drives that learner's side (the *steps*), which offers

- ``_arrive()``: wait (bounded, watching every worker) for what the next
  batch needs (``single``: the ready fragment; ``multi``, ``cluster``:
  ``n_per_batch`` of them, none older than the latest publication minus
  ``max_lag``);
- ``_collate(arrived)``: copy them into a batch, hand the workers their
  buffers back (never after the hand-out: see "Progress" below) and make
  the batch to hand out (a fresh one, the device copy); returns a
  :class:`Prepared`;
- ``_advance(arrived)``: what ``next()`` does before it hands a batch
  out: the publication (``publish="next"``), the buffer that ``single``
  held handed back;
- ``_hand_out(prepared, waited)``: the fragments counted delivered, the
  statistics; returns the batch;
- ``_what()``: the batch being prepared, for messages;

and its :class:`~._supervised.Supervision`, whose waits call
``between()`` (:meth:`Prefetcher.between`) between two slices.

Timeline (``prefetch=1``)::

    caller (the learner)                     prefetch thread
    --------------------                     ---------------
    next() #0: start the thread ───────────► prepare #0: wait for the
               wait for #0                   fragments, collate, hand
                                             their buffers back, copy to
                                             the device (side stream)
                                        ◄─── #0 prepared
               hand-out #0 (run by the  ───► publish, count #0 delivered,
               thread, the caller waits)     stats
               sync the streams, yield #0    prepare #1 ...
    ...train on #0...                        (...waits, collates #1)
    publish() (publish="manual") ──────────► publish now (between two
                                             waits), the caller waits
    next() #1: #1 prepared (else wait)
               hand-out #1 ────────────────► ...
    close():   stop ───────────────────────► leaves its wait at once
               join (shutdown_timeout)       ends
               then the generator's own close

One thread touches the workers: every call of the caller that does (the
hand-out, ``publish()``, ``poll()``, ``state_dict()``) is a command that
the thread runs between two of its waits while the caller waits for it,
under the caller's current CUDA stream; a wait of the thread wakes for a
command at once (a pipe among the pipes that a
:class:`~rlplay.engine.workers.Supervisor` waits on; Ray's waits in
slices of ``INTERRUPT_SLICE``, 5 ms, of
:class:`~rlplay.engine.workers.RemoteSupervisor`). Before the first ``next()`` (and
without prefetch) the caller runs them itself.

Batches: a prepared batch is never one that the caller holds. A fresh
batch (``copy=True``) is new memory; with ``copy=False`` the generator's
reused batch is one of ``prefetch + 1`` in turn (the caller's, and
``prefetch`` prepared ahead; ``single``'s shared buffer, when it is the
batch, is one of its two), each valid until the next ``next()``, as
without prefetch: the thread prepares a batch in the turn of the one
handed out ``prefetch + 1`` batches before only once the next one was
handed out. A batch on a CUDA device is copied on a side stream of the
thread; the hand-out makes the caller's current stream wait for that
copy and records the batch's memory as used by that stream, and a copy
into a reused batch waits for the work that the caller's stream had
queued when it last called ``next()``.

Versions: a batch is prepared while the caller trains on the one before,
so with ``publish="next"`` (each ``next()`` publishes) its fragments were
taken against the publication before the one of the ``next()`` that hands
it out: its parameters are one publication further behind than without
prefetch. ``max_lag`` is applied as each fragment is taken into the
batch, against the latest publication then; the ``lag`` of a batch
(``stats``) is counted at its hand-out, and is at most ``max_lag`` plus
the publications made while it waited to be handed out (one with
``publish="next"`` and ``prefetch=1``).

Progress: ``single`` hands a buffer back at the next ``next()`` (its
lag of exactly one publication), so one batch ahead is all it can
prepare (``prefetch`` at most 1). ``multi`` and ``cluster`` hand buffers
back as soon as they are collated, and prepare up to ``prefetch``
batches ahead with the pool's progress rule unchanged.

Errors: an exception raised while a batch is prepared (a worker died, a
timeout) takes that batch's place, and the ``next()`` that would have
returned it raises it; the generator breaks as without prefetch (its
close stops the thread first). The thread prepares nothing more after an
error.

Shutdown: ``close()`` (and a break) tells the thread to stop, wakes it,
and joins it within ``shutdown_timeout`` before the generator stops its
workers; the thread holds no reference to the generator between two
preparations, so dropping the generator closes it as without prefetch.
"""
import collections
import contextlib
import os
import threading
import time
import weakref
from typing import Any, NamedTuple

import torch

from ..devices import module_device
from ..errors import RolloutError
from ..nested import flatten
from ..utils.mp import POLL_INTERVAL
from ._base import SHUTDOWN_TIMEOUT, Deadline
from ._states import Status

__all__ = ["Prefetch", "Prefetcher", "Prepared", "publish",
           "PUBLISH_MODES", "check_prefetch", "check_publish"]

# the modes of publish=: each next() publishes, or only feed.publish()
PUBLISH_MODES = ("next", "manual")


def check_prefetch(prefetch, limit=None):
    """``prefetch``, a whole number of batches of at least 0 (at most
    ``limit``).

    Raises
    ------
    TypeError, ValueError
        Naming the argument and the value given.
    """
    if isinstance(prefetch, bool) or not isinstance(prefetch, int):
        raise TypeError(f"prefetch must be an int (batches prepared "
                        f"ahead; 0: none), got {prefetch!r}")
    if prefetch < 0 or (limit is not None and prefetch > limit):
        most = "" if limit is None else f" and at most {limit}"
        raise ValueError(f"prefetch must be at least 0{most}, got "
                         f"{prefetch!r}")
    return prefetch


def check_publish(publish):
    """``publish``, one of :data:`PUBLISH_MODES`.

    Raises
    ------
    ValueError
        Naming the argument and the value given.
    """
    if not isinstance(publish, str) or publish not in PUBLISH_MODES:
        raise ValueError(f"publish must be one of {PUBLISH_MODES} (each "
                         f"next() publishes the actor's parameters, or "
                         f"only feed.publish()), got {publish!r}")
    return publish


class Prepared(NamedTuple):
    """A batch prepared for the hand-out (by ``_collate``)."""

    batch: Any      # what next() returns
    npy: Any        # its numpy views, for the statistics
    arrived: Any    # what the generator waited for (its arrivals)
    collated: float  # seconds spent collating and copying it
    oldest: int     # the oldest meta.version in it
    event: Any = None  # the end of its copy on the side stream


class _Stopped(BaseException):
    """Raised in the thread, inside a wait, when it is told to stop."""


class _Failure(NamedTuple):
    exc: BaseException


class _Command:
    """A call of the caller that the thread runs."""

    def __init__(self, call, stream):
        self.call, self.stream = call, stream
        self.done, self.result, self.exc = False, None, None

    def run(self):
        try:
            with _on(self.stream):
                self.result = self.call()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller
            self.exc = exc


def _on(stream):
    return contextlib.nullcontext() if stream is None \
        else torch.cuda.stream(stream)


class Prefetcher:
    """The prefetch thread of a generator (see the module docstring).

    Parameters
    ----------
    steps : object
        The learner's side of the generator (see the module docstring);
        held by a weak reference: dropping it stops the thread.
    part : Prefetch
        Whose :meth:`~Prefetch.hand_out` the hand-out runs (a weak
        reference).
    depth : int
        Batches prepared ahead (``prefetch``, at least 1).
    supervision : Supervision
        Whose waits the thread's commands interrupt.
    device : torch.device, optional
        The CUDA device of the batches (a side stream there), or ``None``.
    actor_device : torch.device, optional
        Where the actor lives: commands run under the caller's current
        stream of that device, when it is a CUDA one.
    join_timeout : float
        How long :meth:`stop` waits for the thread (``None``: no bound).
    name : str
        The thread's name.
    """

    def __init__(self, steps, part, depth, supervision, *, device=None,
                 actor_device=None, join_timeout=None, name="rlplay"):
        # weak references: a thread holds no reference to the generator's
        # parts, so that dropping the generator frees them (and stops its
        # workers) at once, with no cycle left for the collector
        self._part = weakref.ref(part)
        self.depth, self.name = depth, name
        self.join_timeout = join_timeout
        self._steps = weakref.ref(steps)
        self._cv = threading.Condition()
        self._ready = collections.deque()  # Prepared, or a _Failure
        self._commands = collections.deque()
        self._handing = 0  # batches taken by the caller, not yet handed out
        self._stopping = self._failed = False
        self._thread = None
        self.device = device if device is not None and \
            device.type == "cuda" else None
        self.actor_device = actor_device if actor_device is not None and \
            actor_device.type == "cuda" else None
        self._side = self._released = None
        # the pipe that wakes the thread's waits on worker pipes
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._supervisor = supervision.supervisor
        self._supervisor.interrupt = self._wake_r
        supervision.between = self.between
        # dropping the generator stops the thread (which holds no
        # reference to it between two preparations)
        weakref.finalize(steps, self.stop)

    # ----------------------------------------------------------- caller --
    @property
    def running(self):
        return self._thread is not None and self._thread.is_alive()

    def start(self):
        """Start the thread (once)."""
        if self._thread is None:
            if self.device is not None:
                self._side = torch.cuda.Stream(self.device)
            self._thread = threading.Thread(target=self._main,
                                            name=self.name, daemon=True)
            self._thread.start()

    def prepared(self):
        """How many batches are prepared, not handed out."""
        with self._cv:
            return sum(not isinstance(item, _Failure)
                       for item in self._ready)

    def next(self):
        """The next batch (the caller's ``next()``): its wait, then its
        hand-out run by the thread."""
        steps = self._steps()
        part = self._part()
        tic = part.stats.begin()
        self.start()
        with self._cv:
            while not self._ready:
                if not self._thread.is_alive():
                    raise RolloutError(f"the prefetch thread {self.name} "
                                       f"ended")
                self._cv.wait(POLL_INTERVAL)
            item = self._ready.popleft()
            if isinstance(item, _Failure):
                raise item.exc
            self._handing += 1
        if self.device is not None:
            # what the caller's stream queued so far may read the batch
            # handed out before: a copy into its turn waits for it
            self._released = torch.cuda.Event()
            self._released.record(torch.cuda.current_stream(self.device))
        try:
            waited = time.perf_counter() - tic
            batch = self.run(lambda: part.hand_out(steps, item, waited))
        finally:
            with self._cv:
                self._handing -= 1
                self._cv.notify_all()
        if self.device is not None:
            self._synchronized(batch, item)
        return batch

    def _synchronized(self, batch, item):
        # the caller's stream waits for the copy made on the side stream,
        # and the caching allocator learns that the caller's stream uses
        # that memory (torch.Tensor.record_stream)
        current = torch.cuda.current_stream(self.device)
        current.wait_event(item.event)
        for leaf in flatten(batch):
            if leaf.device == self.device:
                leaf.record_stream(current)

    def run(self, call):
        """``call()`` run by the thread between two of its waits (by the
        caller itself while no thread runs); returns what it returns, or
        raises what it raises."""
        if not self.running or self._stopping or \
                threading.current_thread() is self._thread:
            return call()
        stream = None if self.actor_device is None \
            else torch.cuda.current_stream(self.actor_device)
        command = _Command(call, stream)
        with self._cv:
            self._commands.append(command)
            self._cv.notify_all()
        self._wake()
        with self._cv:
            while not command.done:
                if not self._thread.is_alive():
                    raise RolloutError(f"the prefetch thread {self.name} "
                                       f"ended before it ran a call")
                self._cv.wait(POLL_INTERVAL)
        if command.exc is not None:
            raise command.exc
        return command.result

    def stop(self):
        """Tell the thread to stop, wake it and join it (bounded); then
        close the pipe. Idempotent. Returns whether the thread ended (or
        was never started); in the thread itself (the generator dropped
        there), it only tells it."""
        with self._cv:
            self._stopping = True
            self._ready.clear()
            self._cv.notify_all()
        thread = self._thread
        if thread is threading.current_thread():
            return False
        if thread is not None and thread.is_alive():
            self._wake()
            thread.join(self.join_timeout)
            if thread.is_alive():
                return False  # a daemon: the pipe stays for it
        if self._wake_w is not None:
            self._supervisor.interrupt = None
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = None
        return True

    def _wake(self):
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError, TypeError):
            pass  # a full pipe wakes it already (closed: nothing to wake)

    # ----------------------------------------------------------- thread --
    def between(self):
        """Called by the generator's waits between two slices: in the
        thread, run the commands waiting and raise :class:`_Stopped` when
        told to stop; elsewhere, nothing."""
        if threading.current_thread() is not self._thread:
            return
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            with self._cv:
                if self._stopping:
                    raise _Stopped
                if not self._commands:
                    return
                command = self._commands.popleft()
            self._done(command)

    def _done(self, command):
        command.run()
        with self._cv:
            command.done = True
            self._cv.notify_all()

    def _main(self):
        try:
            while True:
                with self._cv:
                    while not (self._stopping or self._commands or (
                            not self._failed and len(self._ready)
                            + self._handing < self.depth)):
                        self._cv.wait()
                    if self._stopping:
                        return
                    command = self._commands.popleft() \
                        if self._commands else None
                if command is not None:
                    self._done(command)
                    continue
                item = self._prepare()
                if item is None:
                    return
                with self._cv:
                    self._failed = isinstance(item, _Failure)
                    self._ready.append(item)
                    self._cv.notify_all()
        finally:
            with self._cv:
                self._stopping = True
                for command in self._commands:  # never run: say so
                    command.exc = RolloutError(
                        f"the prefetch thread {self.name} stopped")
                    command.done = True
                self._commands.clear()
                self._cv.notify_all()

    def _prepare(self):
        """One batch prepared (``None``: stopped)."""
        steps = self._steps()
        if steps is None:
            return None
        try:
            with _on(self._side):
                if self._released is not None:
                    self._side.wait_event(self._released)
                arrived = steps._arrive()
                prepared = steps._collate(arrived)
                if self._side is not None:
                    event = torch.cuda.Event()
                    event.record(self._side)
                    prepared = prepared._replace(event=event)
            return prepared
        except _Stopped:
            return None
        except BaseException as exc:  # noqa: BLE001 - raised by next()
            return _Failure(exc)


class Prefetch:
    """The publication and the prefetching of a generator's learner's side
    (see the module docstring), the part that it holds as ``prefetch``.

    Parameters
    ----------
    steps : object
        The learner's side (see the module docstring; only the thread
        uses it, through a weak reference).
    supervision : Supervision
        The supervision of the generator's workers.
    actor : BaseActorModule
        The learner's actor, which :meth:`publish` publishes.
    stats : Stats
        The generator's statistics.
    depth : int
        ``prefetch`` (checked): 0, no thread.
    mode : str
        ``publish`` (checked).
    turns : list of (Collation or None, Delivery)
        The parts of a batch, used in turn (:meth:`turn`): one, or with
        ``prefetch`` and ``copy=False``, ``prefetch + 1`` (see "Batches"
        in the module docstring).
    kind : str
        The generator's kind, in the thread's name.
    join_timeout : float or None
        How long :meth:`stop` waits for the thread (``None``:
        ``SHUTDOWN_TIMEOUT``).
    """

    def __init__(self, steps, supervision, actor, stats, depth, mode, turns,
                 *, kind, join_timeout=None):
        self.supervision, self.actor, self.stats = supervision, actor, stats
        self.mode, self.turns, self._turn = mode, turns, 0
        self.published = None  # the version of the last publication
        self.thread = None if not depth else Prefetcher(
            steps, self, depth, supervision, device=turns[0][1].device,
            actor_device=module_device(actor, strict=False),
            join_timeout=SHUTDOWN_TIMEOUT if join_timeout is None
            else join_timeout, name=f"rlplay-{kind}-prefetch")

    def turn(self):
        """The collation and delivery of the batch to prepare now."""
        turns = self.turns
        if len(turns) == 1:
            return turns[0]
        self._turn += 1
        return turns[(self._turn - 1) % len(turns)]

    def command(self, call, *args):
        """``call(*args)``, run by the prefetch thread while it runs (see
        the module docstring), else here."""
        if self.thread is None:
            return call(*args)
        return self.thread.run(lambda: call(*args))

    def publish(self, deadline=None):
        """Publish the actor's parameters (bounded by ``deadline``, else
        a new one); returns their version."""
        supervision = self.supervision
        supervisor = supervision.supervisor
        deadline = Deadline(supervision.bound()) if deadline is None \
            else deadline
        self.published = supervision.publish(
            self.actor, lambda: supervisor.check("a publication"),
            deadline.lock_timeout())
        return self.published

    def version(self):
        """The publications so far (the last one's version)."""
        params = self.supervision.params
        if params is not None:
            return params.version
        return self.stats["version"] if self.published is None \
            else self.published

    def hand_out(self, steps, prepared, waited):
        """The hand-out of a prefetched batch (run by the thread): the
        workers' news first (a death is reported at once, as ``next()``
        without prefetch does), then the steps' ``_advance`` and
        ``_hand_out``."""
        self.supervision.supervisor.pump(0, steps._what())
        steps._advance(prepared.arrived)
        return steps._hand_out(prepared, waited)

    def stop(self):
        """Stop the thread (bounded), before anything it uses goes; then
        wait for the device copies of the other turns."""
        if self.thread is not None:
            self.thread.stop()
        for _, delivery in self.turns[1:]:
            delivery.close()


def publish(self):
    """Publish the actor's parameters (its tensors and train/eval mode)
    and the ``call_envs`` calls made since, to the workers, now.

    Each worker loads the latest publication before its next fragment,
    whose ``meta.version`` is then the number of publications so far (a
    resumed run's included). With ``publish="next"`` (the default) every
    ``next()`` publishes too; with ``publish="manual"`` only this does:
    call it after the optimiser's step (every step, or every ``k``), so
    that the workers never read parameters that the optimiser is writing
    (with ``prefetch``, the thread never publishes on its own). See
    docs/how-to/prefetch.md.

    Returns
    -------
    version : int
        The version published.

    Raises
    ------
    RuntimeError
        The generator is closed (or the error that broke it).
    ValueError
        The actor's parameters and buffers changed since the start.
    WorkerDied, RolloutTimeout
        A worker died holding the parameters' lock, or a live one held it
        too long; the generator breaks, as in ``next()``.
    """
    if self.status is Status.BROKEN:
        raise self._error
    if self.status is Status.CLOSED:
        raise RuntimeError(f"publish: the {type(self).__name__} is closed")
    part = self._prefetch
    return self._guarded(part.command, part.publish)
