"""Whole episodes rebuilt from fragments: the machinery of
:mod:`rlplay.engine.rollout.episodic` (whose docstring tells how episodes
are rebuilt and the layout of :class:`Episodes`): the episode batches, the
store of rows and :class:`Episodic`, the iterator over a generator of
fragments.
"""
import numbers
from typing import Any, NamedTuple

import numpy as np
import torch

from ..core.layout import check_count, episode_edges
from .lanes import Lanes
from ..nested import flatten, suply

__all__ = ["Episodes", "EpisodeMeta", "PaddedEpisodes", "Episodic",
           "MAX_LENGTH", "STATE_FORMAT", "check_state"]

MAX_LENGTH = 100_000
# the format of Episodic.state_dict()
STATE_FORMAT = "rlplay.episodes/1"


class EpisodeMeta(NamedTuple):
    """Where each of ``n`` episodes comes from, each ``(n,)`` int64: its
    ``worker``, ``env`` column, ``generation``, the versions of its first
    and last fragment (``version_first``, ``version_last``), the ``seq``
    of its first fragment (see ``episodic``)."""
    worker: Any
    env: Any
    generation: Any
    version_first: Any
    version_last: Any
    seq: Any


class PaddedEpisodes(NamedTuple):
    """:meth:`Episodes.padded`: time-major, padded
    with zeros; see :mod:`rlplay.engine.rollout.episodic`."""
    obs: Any
    act: Any
    rew: Any
    actor: Any
    env: Any
    env_mask: Any
    mask: Any
    terminated: Any
    truncated: Any
    hx: Any
    ret: Any
    length: Any
    meta: Any


class Episodes(NamedTuple):
    """``n`` whole episodes packed along time; see
    :mod:`rlplay.engine.rollout.episodic` for the layout."""
    obs: Any
    act: Any
    rew: Any
    actor: Any
    env: Any
    env_mask: Any
    terminated: Any
    truncated: Any
    hx: Any
    ret: Any
    length: Any
    meta: EpisodeMeta
    offsets: Any

    @property
    def n_episodes(self):
        """The number of episodes (``len()`` counts the fields, as for any
        named tuple)."""
        return len(self.length)

    def padded(self):
        """The same episodes time-major, padded with zeros to the longest
        (a :class:`PaddedEpisodes`)."""
        length = self.length.numpy()
        n, M = len(length), int(length.max(initial=0))
        # where each packed row goes: (time, episode)
        step_col = np.repeat(np.arange(n), length)
        step_t = np.arange(len(step_col)) - np.repeat(
            self.offsets[:-1].numpy(), length)
        state_col = np.repeat(np.arange(n), length + 1)
        state_t = np.arange(len(state_col)) - np.repeat(
            self.offsets[:-1].numpy() + np.arange(n), length + 1)

        def place(rows, t, col, packed):
            out = packed.new_zeros((rows, n) + packed.shape[1:])
            out[t, col] = packed
            return out

        mask = torch.zeros(M + 1, n, dtype=torch.bool)
        mask[state_t, state_col] = True
        return PaddedEpisodes(
            obs=suply(lambda x: place(M + 1, state_t, state_col, x),
                      self.obs),
            act=suply(lambda x: place(M + 1, step_t + 1, step_col, x),
                      self.act),
            rew=place(M + 1, step_t + 1, step_col, self.rew),
            actor=suply(lambda x: place(M + 1, step_t, step_col, x),
                        self.actor),
            env=suply(lambda x: place(M, step_t, step_col, x), self.env),
            env_mask=suply(lambda x: place(M, step_t, step_col, x),
                           self.env_mask),
            mask=mask, terminated=self.terminated, truncated=self.truncated,
            hx=self.hx, ret=self.ret, length=self.length, meta=self.meta)


class _Episode:
    """An episode being rebuilt: its row ranges in the store."""

    __slots__ = ("pieces", "rows", "first", "hx", "worker", "env",
                 "generation", "version_first", "seq", "version_last",
                 "terminated", "truncated", "ret")

    def __init__(self, first, hx, worker, env, generation, version, seq):
        self.pieces, self.rows, self.first = [], 0, first
        self.hx, self.worker, self.env = hx, worker, env
        self.generation = generation
        self.version_first, self.seq = version, seq

    def add(self, base, j, t0, t1):
        self.pieces.append((base, j, t0, t1))
        self.rows += t1 - t0 + 1


class _Store:
    """The rows of the batches seen, by a running row number: row ``t`` of
    column ``j`` of the batch put at ``base`` is ``base + t * B + j``. A
    ring that grows when it would overwrite rows still held."""

    def __init__(self, leaves, n_slabs=4):
        rows, B = leaves[0].shape[:2]
        self.B, self.slab = B, rows * B
        self.capacity, self.next = self.slab * n_slabs, 0
        self.leaves = [np.empty((self.capacity,) + x.shape[2:], x.dtype)
                       for x in leaves]

    def put(self, leaves, keep):
        """Copy one batch's leaves (``(1 + T, B, ...)``, or ``(T, B, ...)``
        for per-step ones) in; ``keep`` is the first row still held.
        Returns the batch's base."""
        if self.next + self.slab - self.capacity > keep:
            self._grow(keep)
        base, at = self.next, self.next % self.capacity
        for dst, src in zip(self.leaves, leaves):
            n = src.shape[0] * self.B
            dst[at:at + n] = src.reshape((n,) + src.shape[2:])
        self.next += self.slab
        return base

    def _grow(self, keep):
        capacity = self.capacity
        while self.next + self.slab - capacity > keep:
            capacity *= 2
        start = keep - keep % self.slab
        leaves = [np.empty((capacity,) + x.shape[1:], x.dtype)
                  for x in self.leaves]
        for row in range(start, self.next, self.slab):
            old, new = row % self.capacity, row % capacity
            for dst, src in zip(leaves, self.leaves):
                dst[new:new + self.slab] = src[old:old + self.slab]
        self.leaves, self.capacity = leaves, capacity

    def take(self, k, rows):
        return self.leaves[k][rows % self.capacity]


def _parts(batch):
    """What episodes keep of a fragment, in the store's order."""
    return (batch.state.obs, batch.state.act, batch.state.rew, batch.final,
            batch.actor, batch.env, batch.env_mask)


def _none(j, row):
    return None


def _empty(j, row):
    return ()


def _env_count(hx, dim):
    return flatten(hx)[0].shape[dim]


def _numpy(x):
    x = x.detach()
    return (x if x.device.type == "cpu" else x.cpu()).numpy()


class Episodic:
    """An iterator of :class:`Episodes` over a generator of fragments
    (:func:`~.episodic.episodes` makes one).

    ``stats`` counts ``emitted`` episodes, those ``cut`` by a gap in
    their lane (never emitted), those dropped as ``too_long``, the
    ``batches`` read, and the lanes' ``new``/``generation``/``missing``/
    ``disorder`` columns (:class:`~rlplay.engine.lanes.Lanes`).
    """

    def __init__(self, feed, n_episodes, *, max_length=MAX_LENGTH,
                 actor=None):
        check_count("n_episodes", n_episodes)
        check_count("max_length", max_length)
        if actor is not None and not callable(getattr(actor, "reset", None)):
            raise TypeError(f"actor must be the generator's actor (with a "
                            f"reset method) or None, got "
                            f"{type(actor).__name__}")
        self.feed, self.n_episodes = feed, n_episodes
        self.max_length, self.actor = max_length, actor
        # where the env axis of each hx leaf is: the feed's (every
        # generator's), else the actor's, for a plain iterable of fragments
        self.hx_dim = getattr(feed, "hx_dim", None)
        if self.hx_dim is None:
            self.hx_dim = getattr(actor, "hx_dim", 1)
        self._it = None
        self._lanes = Lanes()
        self._store = self._structure = None
        self._open, self._done = {}, []
        self._stats = dict.fromkeys(
            ("emitted", "cut", "too_long", "batches"), 0)

    @property
    def stats(self):
        """Counters (a new dict): see the class docstring."""
        return {**self._stats, **self._lanes.counts}

    @property
    def held_rows(self):
        """The rows the store can hold now (it grows only to keep the
        episodes open or waiting: bounded by ``max_length``)."""
        return 0 if self._store is None else self._store.capacity

    def __iter__(self):
        return self

    def __next__(self):
        while len(self._done) < self.n_episodes:
            if self._it is None:
                self._it = iter(self.feed)
            self._read(next(self._it))
        return self._emit()

    def state_dict(self):
        """The counters, the lanes followed and the generator's own
        ``state_dict()`` (``"feed"``; ``None`` for a feed without one), for
        a continuation: resume the generator from ``state["feed"]`` and
        call :meth:`load_state_dict` on the new :class:`Episodic` (or pass
        ``resume=state`` to :func:`~.episodic.rollout`). Episodes open at
        the time are not part of it: the continuation's envs start from
        resets."""
        feed_state = getattr(self.feed, "state_dict", None)
        return {"format": STATE_FORMAT,
                "feed": None if feed_state is None else feed_state(),
                "stats": dict(self._stats), "lanes": self._lanes.state_dict()}

    def load_state_dict(self, state):
        """Go on counting from :meth:`state_dict` (before the first
        ``next()``); the lanes know each worker's last fragment, so the
        continuation's first ones count as a new generation."""
        check_state(state, "state")
        if self._it is not None:
            raise RuntimeError("load_state_dict() goes before the first "
                               "next()")
        self._stats.update(state["stats"])
        self._lanes.load_state_dict(state["lanes"])

    def call_envs(self, name, /, *args, **kwargs):
        """The generator's ``call_envs`` (every env calls its method
        ``name`` between fragments; returns the call's number)."""
        return self.feed.call_envs(name, *args, **kwargs)

    def close(self):
        """Close the generator of fragments (when it has ``close``)."""
        close = getattr(self.feed, "close", None)
        if close is not None:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ reading --

    def _first(self, batch):
        if batch.final is None:
            raise ValueError(
                "episodes need the true last observation of each episode: "
                "make the generator with final=True (the default)")
        self._structure = _parts(batch)
        self._store = _Store([_numpy(x) for x in flatten(self._structure)])
        # the leaves of each part of the structure
        sizes = [len(flatten(part)) for part in self._structure]
        ends = np.cumsum(sizes).tolist()
        self._ranges = [range(a, b) for a, b in zip([0] + ends[:-1], ends)]

    def _keep(self):
        firsts = [ep.first for ep in self._open.values()]
        firsts += [ep.first for ep in self._done]
        return min(firsts, default=self._store.next)

    def _read(self, batch):
        if self._store is None:
            self._first(batch)
        self._stats["batches"] += 1
        store = self._store
        base = store.put([_numpy(x) for x in flatten(_parts(batch))],
                         self._keep())
        meta = batch.meta
        lanes, continues = self._lanes.follow(meta)
        edges = episode_edges(batch)
        edges = type(edges)(*map(_numpy, edges))
        T = edges.ends.shape[0] - 1
        ends = edges.ends
        # step row t starts an episode whose reset observation is row t - 1
        # (a start at row T is left to the next fragment)
        starts = edges.starts[:-1]
        # the events of each column in row order, an end before a start at
        # the same row: key = 2 * (j * (T + 1) + row) (+ 1 for a start)
        e_t, e_j = np.nonzero(ends)
        s_t, s_j = np.nonzero(starts)
        keys = np.concatenate([2 * (e_j * (T + 1) + e_t),
                               2 * (s_j * (T + 1) + s_t) + 1])
        keys.sort()
        events = keys.tolist()
        terminated, truncated = edges.terminated, edges.truncated
        ret = _numpy(batch.stats.ret)
        worker = _numpy(meta.worker).tolist()
        env = _numpy(meta.env).tolist()
        version = _numpy(meta.version).tolist()
        seq = _numpy(meta.seq).tolist()
        generation = _numpy(meta.generation).tolist()
        hx = self._hx_source(batch, s_t)
        lanes = lanes.tolist()
        continues = continues.tolist()
        opened, done, stats = self._open, self._done, self._stats
        max_rows = self.max_length + 1
        k, n_events = 0, len(events)
        for j in range(len(lanes)):
            lane = lanes[j]
            ep = opened.pop(lane, None)
            # a continued episode goes on from row 0 (which repeats row T
            # of the previous fragment but for the actor's info, there a
            # lookahead's: an open episode leaves row T to the next one)
            at = 0
            if ep is not None and not continues[j]:
                stats["cut"] += 1
                ep = None
            while k < n_events and events[k] >> 1 < (j + 1) * (T + 1):
                key = events[k]
                k += 1
                row = (key >> 1) - j * (T + 1)
                if key & 1:  # a start: row holds the reset observation
                    if ep is not None:  # never left open by the layout
                        stats["cut"] += 1
                    ep = _Episode(base + row * store.B + j,
                                  hx(j, row), worker[j], env[j],
                                  generation[j], version[j], seq[j])
                    at = row
                elif ep is not None:  # an end
                    ep.add(base, j, at, row)
                    if ep.rows > max_rows:
                        stats["too_long"] += 1
                    else:
                        ep.version_last = version[j]
                        ep.terminated = bool(terminated[row, j])
                        ep.truncated = bool(truncated[row, j])
                        ep.ret = float(ret[row, j])
                        done.append(ep)
                    ep = None
            if ep is not None:
                ep.add(base, j, at, T - 1)
                # its rows so far are its steps so far (row T, left to the
                # next fragment, is one more): it is too long as soon as
                # its steps pass max_length
                if ep.rows > self.max_length:
                    stats["too_long"] += 1
                else:
                    opened[lane] = ep

    def _hx_source(self, batch, s_t):
        """``hx(j, row)``: the actor's state where column ``j`` starts an
        episode at ``row`` (its state at row 0, or a reset one)."""
        hx = batch.hx
        if self.actor is None:
            return _none
        if isinstance(hx, tuple) and not hx:
            return _empty
        dim = self.hx_dim
        reset = []

        def at(j, row):
            if row == 0:
                source = hx
            else:
                if not reset:
                    n = _env_count(hx, dim)
                    with torch.no_grad():
                        reset.append(self.actor.reset(
                            hx, torch.ones(n, dtype=torch.bool)))
                source = reset[0]
            return suply(lambda h: h.select(dim, j).detach().cpu().clone(),
                         source)
        return at

    # ----------------------------------------------------------- emitting --

    def _emit(self):
        n = self.n_episodes
        eps, self._done = self._done[:n], self._done[n:]
        self._stats["emitted"] += n
        store = self._store
        pieces = np.array([p for ep in eps for p in ep.pieces], np.int64)
        base, j, t0, t1 = pieces.T
        lens = t1 - t0 + 1
        total = int(lens.sum())
        before = np.concatenate([[0], np.cumsum(lens)[:-1]])
        rows = (np.repeat(base + t0 * store.B + j - store.B * before, lens)
                + store.B * np.arange(total))
        n_rows = np.array([ep.rows for ep in eps], np.int64)
        ends = np.cumsum(n_rows)
        last = rows[ends - 1]
        not_first = np.ones(total, bool)
        not_first[ends - n_rows] = False
        not_last = np.ones(total, bool)
        not_last[ends - 1] = False
        step_rows, info_rows = rows[not_first], rows[not_last]

        def take(part, where):
            return [store.take(k, where) for k in self._ranges[part]]

        def build(part, leaves):
            it = iter([torch.from_numpy(x) for x in leaves])
            return suply(lambda _: next(it), self._structure[part])

        obs = take(0, rows)
        for leaf, final in zip(obs, take(3, last)):
            leaf[ends - 1] = final
        length = n_rows - 1
        hx = None
        if eps[0].hx is not None:
            dim = self.hx_dim
            hx = suply(lambda *hs: torch.stack(hs, dim), eps[0].hx,
                       *[ep.hx for ep in eps[1:]])
        ints = lambda name: torch.tensor([getattr(ep, name) for ep in eps],
                                         dtype=torch.int64)
        flags = lambda name: torch.tensor([getattr(ep, name) for ep in eps])
        return Episodes(
            obs=build(0, obs), act=build(1, take(1, step_rows)),
            rew=build(2, take(2, step_rows)),
            actor=build(4, take(4, info_rows)),
            env=build(5, take(5, info_rows)),
            env_mask=build(6, take(6, info_rows)),
            terminated=flags("terminated"), truncated=flags("truncated"),
            hx=hx,
            ret=torch.tensor([ep.ret for ep in eps], dtype=torch.float64),
            length=torch.from_numpy(length),
            meta=EpisodeMeta(worker=ints("worker"), env=ints("env"),
                             generation=ints("generation"),
                             version_first=ints("version_first"),
                             version_last=ints("version_last"),
                             seq=ints("seq")),
            offsets=torch.from_numpy(np.concatenate([[0],
                                                     np.cumsum(length)])))


def check_state(state, name):
    """Refuse what is not an :meth:`Episodic.state_dict` (of
    :data:`STATE_FORMAT`), or one with an entry missing or of another
    type, naming ``name`` and the entry.

    Raises
    ------
    TypeError
        Not such a state, or an entry of another type.
    ValueError
        An entry missing.
    """
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise TypeError(f"{name} must be an Episodic's state_dict(), got "
                        f"{type(state).__name__}")
    entries = (("feed", (dict, type(None)),
                "the generator's state_dict() (None for a feed without "
                "one)"),
               ("stats", dict, "a dict of the episode counters"),
               ("lanes", dict, "a dict of the lanes followed"))
    for key, types, what in entries:
        if key not in state:
            raise ValueError(f"{name}[{key!r}] is missing: an Episodic's "
                             f"state_dict() holds it ({what})")
        if not isinstance(state[key], types):
            raise TypeError(f"{name}[{key!r}] must be {what}, got "
                            f"{state[key]!r}")
    for key, value in state["stats"].items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name}['stats'][{key!r}] must be an int (a "
                            f"count of episodes or batches), got {value!r}")
    lanes = state["lanes"]
    for key, types, what in (("keys", (list, tuple), "a list"),
                             ("last", (list, tuple), "a list"),
                             ("counts", dict, "a dict")):
        if not isinstance(lanes.get(key), types):
            raise TypeError(f"{name}['lanes'][{key!r}] must be {what}, got "
                            f"{lanes.get(key)!r}")
