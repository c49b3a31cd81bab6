"""The worker loop of a served rollout: env groups that step while the
inference server computes the other group's actions.

A worker of a served ``multi.rollout`` (:mod:`._server`) splits its
``n_envs`` columns into ``groups`` equal groups (:class:`GroupedEnvs`:
group ``g`` is columns ``g * n_envs / groups ..``, made from those
columns' seeds). Each group is an ordinary collection (:func:`~rlplay.
engine.core.startup`, :func:`~rlplay.engine.core.collect`) on a view of
its columns of each buffer, whose policy is a
:class:`~rlplay.engine.policy.ServedPolicy` on a doorbell slot and a pipe
of its own to the server (:mod:`._doors`): group 0 runs in the worker's
main thread, the others in threads of their own for the length of a
fragment, so that while the server computes one group's actions (its
thread waits for the answer, giving the GIL away at each turn of its
spin and while it sleeps) the worker steps another's envs. ``groups=1``
is plain lock-step.

Between fragments the loop is :func:`._session`'s (orders, buffers,
``Ready``), but for two things: a worker about to wait for a buffer tells
the server it is idle (:data:`~._doors.IDLE`: lock-step does not wait for
it), and the fragment's ``meta.version`` is the version the server pinned
for it (its first answer). A worker whose server is gone (its pipe at
EOF) sends nothing more and waits for the learner's ``STOP``: the learner
reports the server's death.
"""
import threading
import time
from collections import deque

import numpy as np

from ..core import collect, startup
from ..nested import suply
from ..policy import ServedPolicy, as_policy
from ..pool import views
from ..shared import Aliased
from ..utils.mp import POLL_INTERVAL
from ._doors import (ANS, BUFFER, FIRST_SLEEP, IDLE, KIND, REQ, SLEEPING,
                     VERSION, WRITING, count_of, fence, ring, spin)
from ._messages import LOOKAHEAD, STEP, Bye, Ready

__all__ = ["GroupedEnvs", "serve_groups", "ServerGone", "columns",
           "hx_slot"]


class ServerGone(Exception):
    """The inference server's end of a pipe is closed."""


class _Aborted(Exception):
    """Another group of this worker failed."""


class GroupedEnvs:
    """A worker's env batches, one per group, as one for the calls of
    :mod:`._control` and for closing."""

    def __init__(self, batches):
        self.batches = batches

    def call(self, name, args, kwargs):
        for batch in self.batches:
            batch.call(name, args, kwargs)

    def close(self, quiet=True):
        for batch in self.batches:
            batch.close(quiet=quiet)


class _Channel:
    """A group's doorbell slot and its end of the pipe to the server (the
    channel of a :class:`~rlplay.engine.policy.ServedPolicy`,
    :mod:`._doors`): a request is written into the slot and counted, its
    answer spun for, then slept for on the pipe; a sleep watches the
    learner, and the other groups' failure."""

    def __init__(self, conn, link, abort, doors, w, g, generation):
        self.conn, self.link, self.abort = conn, link, abort
        self.slot, self.header = doors.slot(w, g), doors.header
        self.generation, self.n, self.asked = generation, 0, None

    def _post(self, buffer, row, seq, kind):
        slot = self.slot
        slot[REQ] = WRITING  # the fields are not to be read
        slot[BUFFER:KIND + 1] = (buffer, row, seq, kind)
        self.n += 1
        count = count_of(self.generation, self.n)
        fence()
        slot[REQ] = count
        fence()
        if self.header[0] and not ring(self.conn):
            raise ServerGone("the inference server is gone")
        return count

    def ask(self, buffer, row, group, seq, virtual):
        self.asked = self._post(buffer, row, seq,
                                LOOKAHEAD if virtual else STEP)

    def _answered(self):
        return self.slot[ANS] == self.asked

    def answer(self):
        """The version that acted on the last request (once answered)."""
        slot, conn = self.slot, self.conn
        if not spin(self._answered):
            slot[SLEEPING] = 1
            fence()
            try:
                timeout = FIRST_SLEEP
                while not self._answered():
                    try:
                        if conn.poll(timeout):
                            conn.recv_bytes()
                            continue
                    except (EOFError, OSError):
                        raise ServerGone("the inference server is "
                                         "gone") from None
                    self.link.check()
                    if self.abort.is_set():
                        raise _Aborted()
                    timeout = min(2 * timeout, POLL_INTERVAL)
            finally:
                slot[SLEEPING] = 0
        return int(slot[VERSION])

    def idle(self, seq):
        self._post(0, 0, seq, IDLE)


def columns(buffer, cols, hx_dim):
    """The views of the columns ``cols`` (a slice) of a fragment
    ``buffer`` (``Aliased``): ``hx`` sliced along ``hx_dim``, ``meta``
    along its only axis."""
    def of(fragment):
        def col(x):
            return x[:, cols]
        return fragment._replace(
            state=suply(col, fragment.state),
            truncated=col(fragment.truncated),
            final=None if fragment.final is None else suply(
                col, fragment.final),
            actor=suply(col, fragment.actor), env=suply(col, fragment.env),
            env_mask=suply(col, fragment.env_mask),
            hx=suply(lambda x: x[(slice(None),) * hx_dim + (cols,)],
                     fragment.hx),
            stats=suply(col, fragment.stats),
            meta=suply(lambda x: x[cols], fragment.meta),
            acted=col(fragment.acted))
    return Aliased(of(buffer.npy), of(buffer.pyt))


def hx_slot(hx, w, g, groups, out):
    """Worker ``w``'s group ``g`` slot of ``hx`` (torch views), in or
    ``out``, in the slots ``hx`` (:class:`~._messages.Buffers`, see
    :class:`~._messages.ServeLink`)."""
    segment, spec, stride = hx
    return views(segment.flat, spec,
                 (2 * (w * groups + g) + int(out)) * stride).pyt


class _Group:
    """One group's collection: its envs, its views of every buffer, its
    policy and context."""

    def __init__(self, g, session, envs, buffers, conn, link, abort, hx,
                 doors):
        spec, groups = session.spec, session.groups
        B = spec.n_envs // groups
        self.g, self.session, self.envs = g, session, envs
        self.cols = slice(g * B, (g + 1) * B)
        hx_dim = getattr(session.actor, "hx_dim", 1)
        self.buffers = [columns(buffer, self.cols, hx_dim)
                        for buffer in buffers]
        hx_in = hx_out = None
        if hx is not None:
            hx_in = hx_slot(hx, session.index, g, groups, False)
            hx_out = hx_slot(hx, session.index, g, groups, True)
        self.channel = _Channel(conn, link, abort, doors, session.index, g,
                                session.generation)
        self.policy = ServedPolicy(as_policy(session.actor), self.channel,
                                   self.buffers, g, hx_in, hx_out)
        self.ctx = None
        self.error = None

    def begin(self, index):
        session = self.session
        first = session.index * session.spec.n_envs
        self.ctx = startup(
            self.envs, self.policy, self.buffers[index],
            session.seeds[self.cols], worker=session.index,
            env_ids=np.arange(first, first + session.spec.n_envs)[self.cols],
            generation=session.generation, seq=session.seq)
        self.ctx.control = session.calls.applied

    def fill(self, index):
        spec = self.session.spec
        self.policy.seq = self.ctx.seq
        self.ctx.control = self.session.calls.applied
        collect(self.policy, self.buffers[index], self.ctx,
                sticky=spec.sticky, version=0,
                check_spaces=spec.check_spaces,
                sparse_final=spec.sparse_final)

    def run(self, index, abort):
        try:
            self.fill(index)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the loop
            self.error = exc
            abort.set()


def serve_groups(link, session, config):
    """A served worker's loop (see the module docstring and
    :func:`._session._serve_fragments`)."""
    segment, spec, stride = config.buffers
    buffers = [views(segment.flat, spec, i * stride)
               for i in range(segment.nbytes // stride)]
    serve = config.serve
    abort = threading.Event()
    groups = [_Group(g, session, session.envs.batches[g], buffers, conn,
                     link, abort, serve.hx, serve.doors)
              for g, conn in enumerate(serve.conn)]
    free = deque(config.free)
    try:
        session.calls.apply(session)
        session.stage = "reset"
        for group in groups:
            group.begin(free[0] if free else 0)
        while True:
            tic = time.perf_counter()
            while not free or link.poll():
                if not free:
                    groups[0].channel.idle(groups[0].ctx.seq)
                order = link.recv()
                if order is None:
                    link.send(Bye(groups[0].ctx.seq))
                    return
                if not session.receive(order):
                    free.extend(order.indices)
            index = free.popleft()
            waited = time.perf_counter() - tic
            seq = groups[0].ctx.seq
            session.calls.apply(session)
            session.stage = f"collect (fragment {seq})"
            tic = time.perf_counter()
            _fill(groups, index, abort, link)
            elapsed = time.perf_counter() - tic
            version = groups[0].policy.version
            buffers[index].npy.meta.version[:] = version
            if not link.send(Ready(index, seq, version, waited, elapsed,
                                   session.calls.applied)):
                return
    except ServerGone:
        # the learner reports the server's death; wait for its STOP
        while link.recv() is not None:
            pass


def _fill(groups, index, abort, link):
    """Fill buffer ``index``: group 0 here, the others in threads; the
    first group's error is raised (the others stop at their next wait)."""
    threads = [threading.Thread(target=group.run, args=(index, abort),
                                name=f"rlplay-group-{group.g}", daemon=True)
               for group in groups[1:]]
    for thread in threads:
        thread.start()
    try:
        groups[0].fill(index)
    except _Aborted:
        pass  # another group's error, raised below
    except BaseException:
        abort.set()
        raise
    for thread in threads:
        while thread.is_alive():
            thread.join(POLL_INTERVAL)
            link.check()
    errors = [group.error for group in groups[1:]
              if group.error is not None]
    for group in groups[1:]:
        group.error = None
    first = [e for e in errors if not isinstance(e, _Aborted)]
    if first or errors:
        raise (first or errors)[0]
