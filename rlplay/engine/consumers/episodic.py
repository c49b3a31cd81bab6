"""Whole episodes from any generator of fragments.

:func:`episodes` turns the fragments of any generator (``same``,
``single``, ``multi``, ``cluster``; single envs or vector sources) into
batches of ``n_episodes`` complete episodes, in the order they complete;
:func:`rlplay.engine.rollout.episodic.rollout` is the in-process
convenience (``episodes`` over ``same.rollout``); :func:`record` writes
the episodes of any generator into a Minari dataset (``rlplay[minari]``).

How episodes are rebuilt. Each env column of the run is a lane
(:class:`rlplay.engine.lanes.Lanes`: ``meta.worker`` and ``meta.env``); a
fragment continues its lane's open episode only when it is the lane's next
fragment (same ``meta.generation``, ``meta.seq`` one more). At a gap (a new
generation after a restart or a resume, a ``seq`` dropped by ``max_lag``,
missing or out of order) the open episode of that column is dropped, never
emitted (``stats["cut"]``), and the column waits for its next reset. Within
a fragment an episode starts at a row ``s`` that holds a reset observation
(``fin[s]``) followed by an executed action (:func:`rlplay.engine.core
.acted` at ``s + 1``) and ends at the first executed row ``e > s`` with
``fin[e]``; its last observation is ``final[e]``. Frozen rows (sticky
fragments) and the lost calls of next-step vector sources are not
transitions and never enter an episode.

What is held. Every batch is copied, once, into a store of rows (the
source's batches are views, reused after ``next()``); an episode is a list
of row ranges there until it is emitted. ``max_length`` bounds every
episode: an episode longer than ``max_length`` steps is dropped (counted in
``stats["too_long"]``) as soon as it passes the bound, and the rows it held
are released, so memory stays flat on envs whose episodes never end (about
``(n_lanes + n_episodes) * max_length`` rows at worst). Batches of
episodes hold whole episodes only; a task whose episodes are longer than
what fits in memory is for fragments.

The layout of :class:`Episodes`, ``n`` episodes of lengths ``L_i`` (the
actions taken), packed along time (``N = sum(L_i)`` steps):

=======================  ===============  ===================================
field                    shape            holds
=======================  ===============  ===================================
``obs``                  (N + n, ...)     the state rows ``0 .. L_i`` of
                                          each episode in turn: the reset
                                          observation to the true last one
``act``                  (N, ...)         step ``k``: the action taken at
                                          state ``k``
``rew``                  (N,) float32     step ``k``: the reward of that
                                          action
``actor``                (N, ...)         step ``k``: the actor's info at
                                          state ``k``
``env``                  (N, ...)         step ``k``: the numeric env info
                                          of that step (zero where absent)
``env_mask``             (N,) bool        per info key: present at step
                                          ``k``
``terminated``           (n,) bool        the episode ended by termination
``truncated``            (n,) bool        the episode ended by truncation
``hx``                   actor layout     the actor's state at the start of
                                          each episode (``n`` along the
                                          feed's ``hx_dim``); ``None``
                                          without ``actor=``
``ret``                  (n,) float64     the episode's return
``length``               (n,) int64       ``L_i``
``meta.worker``          (n,) int64       the worker that collected it
``meta.env``             (n,) int64       its env column (``meta.env`` of
                                          the fragments)
``meta.generation``      (n,) int64       and their ``meta.generation``
``meta.version_first``   (n,) int64       the parameter version of its
                                          first fragment
``meta.version_last``    (n,) int64       and of its last
``meta.seq``             (n,) int64       the ``meta.seq`` of its first
                                          fragment
``offsets``              (n + 1,) int64   episode ``i``'s steps are
                                          ``offsets[i]:offsets[i + 1]``,
                                          its state rows ``offsets[i] + i
                                          : offsets[i + 1] + i + 1``
=======================  ===============  ===================================

:meth:`Episodes.padded` gives the same data time-major, padded with zeros
to the longest episode ``M``, laid out as a fragment's rows are: ``obs``
``(M + 1, n, ...)``; ``act`` and ``rew`` ``(M + 1, n, ...)`` with row
``t`` the action and reward that led to state ``t`` (row 0 zero);
``actor`` ``(M + 1, n, ...)`` with row ``t`` the info at state ``t``
(rows ``0 .. L_i - 1``); ``env`` and ``env_mask`` ``(M, n, ...)`` with
row ``t`` the info of step ``t``; and ``mask`` ``(M + 1, n)``, true on
the state rows ``0 .. L_i``. Nested observations, actions and infos keep
their structure in both views. Everything is a CPU tensor.
"""
from ..core.layout import check_count
from ._episodes import (MAX_LENGTH, EpisodeMeta, Episodes, Episodic,
                        PaddedEpisodes, check_state)
from ._minari import record

__all__ = ["Episodes", "EpisodeMeta", "PaddedEpisodes", "Episodic",
           "episodes", "record"]


def episodes(feed, n_episodes, *, max_length=MAX_LENGTH, actor=None):
    """Batches of ``n_episodes`` whole episodes from a generator of
    fragments, in the order the episodes complete.

    Parameters
    ----------
    feed : iterable of Fragment
        Any generator of :mod:`rlplay.engine.rollout` (``same``,
        ``single``, ``multi``, ``cluster``), made with ``final=True`` (the
        default). Its batches may be views reused after ``next()``: what
        an episode needs is copied first.
    n_episodes : int
        Episodes per batch.
    max_length : int
        The longest episode kept (steps); a longer one is dropped and
        counted (``stats["too_long"]``), so that memory stays bounded.
    actor : BaseActorModule, optional
        The generator's actor: with it, ``hx`` holds each episode's
        starting state (the fragment's ``hx`` where the episode starts at
        row 0, else ``actor.reset``'s), stacked along the feed's
        ``hx_dim`` (every generator's; the actor's for a feed without
        one); without it ``hx`` is ``None``.

    Returns
    -------
    Episodic
        An iterator of :class:`Episodes` with ``stats`` and ``close()``
        (which closes ``feed``).

    Raises
    ------
    TypeError, ValueError
        A bad ``n_episodes``, ``max_length`` or ``actor`` (up front); a
        feed without ``final`` (at the first batch).
    """
    return Episodic(feed, n_episodes, max_length=max_length, actor=actor)
