"""Doorbells: the requests and answers of a served rollout, in shared
memory, waited for by a short spin before a sleep on a pipe.

A served step is a round trip between a worker and the inference server
(:mod:`._server`). Through a pipe alone, each side's wait is a sleep in the
kernel and a wake-up: about 30 µs a hand-over on an idle machine, and
longer on a busy one, twice per step. Here each env group of each worker
has a *slot* of a few integers in a shared array (:class:`Doors`): the
worker writes its request there and counts it (``req``); the server, which
spins over every slot's count, reads it, computes the actions and writes
the version that acted and the count it answers (``ans``); the worker
spins on ``ans``. A hand-over then costs about a microsecond.

A spin is short (:data:`SPIN_SECONDS`) and gives the core away at each
turn (``sched_yield``), so that a waiting side never starves the side it
waits for of a core; once it is spent, the waiting side says it sleeps
(its flag in the array: the server's in the header, a worker's in its
slot), looks once more, and sleeps on its pipe, where the other side rings
(one byte) when it sees the flag. The sleep is bounded: a ring lost to a
reordering of the two sides' stores and loads (each side stores, then
loads the other's flag) costs at most a short timeout, which doubles from
:data:`FIRST_SLEEP` up to :data:`~rlplay.engine.utils.mp.POLL_INTERVAL`;
a lock taken and released between the store and the load (:func:`fence`)
makes the loss unlikely.

A count is the worker's generation in its high 32 bits and the requests
of that generation in its low bits (from 1): the server serves only the
generation attached to a slot, and a replacement never takes an answer
meant for the worker it replaced. A worker sets the count to
:data:`WRITING` before it writes a request's fields, and the server takes
the fields only between two reads of the same count: it never reads
half of one request and half of the next (an idle worker posts its next
request without an answer between them).

Slot fields (int64): ``req`` (the last request's count), ``buffer``,
``row``, ``seq``, ``kind`` (:data:`~._messages.STEP`,
:data:`~._messages.LOOKAHEAD` or :data:`IDLE`: the worker holds no
buffer and asks nothing until its next fragment), ``ans`` (the last
answered count), ``version`` (the version that acted), ``sleeping`` (the
worker waits on its pipe).
"""
import os
import threading
import time

import numpy as np


__all__ = ["Doors", "IDLE", "WRITING", "SPIN_SECONDS", "FIRST_SLEEP",
           "fence", "spin", "count_of", "ring", "drain", "REQ", "BUFFER",
           "ROW", "SEQ", "KIND", "ANS", "VERSION", "SLEEPING"]

# a request that asks nothing: the worker holds no buffer
IDLE = 2
# a slot's count while the worker writes the fields of its next request
WRITING = -1
# the longest a side spins before it sleeps on its pipe
SPIN_SECONDS = 2e-3
# the first timeout of a sleep (doubled at each timeout)
FIRST_SLEEP = 1e-3

REQ, BUFFER, ROW, SEQ, KIND, ANS, VERSION, SLEEPING = range(8)
FIELDS = 8
HEADER = 8          # the header's fields: [0] the server sleeps

_lock = threading.Lock()
# gives the core away (where the platform has no sched_yield, a sleep of
# no time lets the GIL and the scheduler go to others)
_give_way = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


def fence():
    """A lock taken and released: an atomic read-modify-write, which
    orders this side's stores before its later loads (x86)."""
    with _lock:
        pass


def count_of(generation, n):
    """The count of request ``n`` (from 1) of a worker ``generation``."""
    return (int(generation) << 32) | int(n)


def spin(ready, seconds=SPIN_SECONDS):
    """``True`` once ``ready()`` is true, ``False`` after ``seconds`` of
    asking (the core given away between two asks)."""
    if ready():
        return True
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        _give_way()
        if ready():
            return True
    return False


class Doors:
    """The doorbell array of ``n_workers`` x ``groups`` slots, over a
    shared int64 buffer (:meth:`allocate`, sent to every process).

    Attributes
    ----------
    slots : np.ndarray, (n_workers * groups, FIELDS)
    header : np.ndarray, (HEADER,)
    """

    def __init__(self, raw, n_workers, groups):
        self.raw, self.n_workers, self.groups = raw, n_workers, groups
        flat = np.frombuffer(raw, dtype=np.int64)
        self.header = flat[:HEADER]
        self.slots = flat[HEADER:].reshape(n_workers * groups, FIELDS)

    @classmethod
    def allocate(cls, ctx, n_workers, groups):
        raw = ctx.RawArray("q", HEADER + n_workers * groups * FIELDS)
        return cls(raw, n_workers, groups)

    def __reduce__(self):
        return Doors, (self.raw, self.n_workers, self.groups)

    def slot(self, w, g):
        return self.slots[w * self.groups + g]


def ring(conn):
    """One byte on ``conn`` (``False`` if its other end is gone)."""
    try:
        conn.send_bytes(b"\x00")
        return True
    except OSError:
        return False


def drain(conn):
    """Read the rings waiting on ``conn``; ``False`` at its EOF."""
    try:
        while conn.poll():
            conn.recv_bytes()
        return True
    except (EOFError, OSError):
        return False
