"""The statistics of a generator: :class:`Stats`, whose keys
(:data:`STATS_KEYS`) every generator shares and whose table in
:mod:`rlplay.engine.rollout` is the user's reference."""
import time

from ..core import episode_stats

__all__ = ["Stats", "STATS_KEYS"]

# the keys of every generator's stats
STATS_KEYS = frozenset({
    "steps", "batches", "time_collect", "time_wall", "time_learner_wait",
    "time_worker_wait", "time_collate", "steps_per_s", "steps_per_s_collect",
    "returns", "lengths", "dropped", "version", "lag", "restarts",
    "workers"})


class Stats(dict):
    """The statistics of a generator (a dict of :data:`STATS_KEYS`, whose
    table in :mod:`rlplay.engine.rollout` is the user's reference).

    ``steps`` (env steps delivered), ``batches``, ``time_wall`` (seconds
    since the first ``next()`` began), ``time_learner_wait`` (seconds
    ``next()`` waited for data), ``time_worker_wait`` (seconds, summed over
    workers, that they waited for the learner), ``time_collect`` (seconds,
    summed over workers, spent collecting what was delivered),
    ``time_collate`` (seconds spent copying fragments into batches),
    ``steps_per_s`` (``steps / time_wall``: what the learner gets,
    training included), ``steps_per_s_collect`` (``steps /
    time_collect``: per worker-second), ``returns`` and ``lengths`` of
    the episodes that ended in the last batch, ``version`` (the parameter
    version of the last ``next()``, changed parameters or not: the
    ``next()`` calls before it for ``same`` and ``single``, up to it for
    ``multi`` and ``cluster``), ``lag`` (the largest ``version -
    meta.version`` in the last batch), ``dropped`` (stale fragments
    dropped), ``restarts`` (workers replaced) and ``workers`` (one dict
    per worker). Times and counts are cumulative.
    """

    def __init__(self, workers=()):
        super().__init__(
            steps=0, batches=0, time_collect=0.0, time_wall=0.0,
            time_learner_wait=0.0, time_worker_wait=0.0, time_collate=0.0,
            steps_per_s=0.0, steps_per_s_collect=0.0, returns=None,
            lengths=None, dropped=0, version=0, lag=0, restarts=0,
            workers=list(workers))
        self._started, self._wall = None, 0.0

    def resumed(self, time_wall):
        """Go on from a stopped run's counters: ``time_wall`` (its
        seconds) is added to this part's."""
        self._wall = float(time_wall)

    def begin(self):
        """Mark the start of a ``next()``; returns ``perf_counter()``."""
        tic = time.perf_counter()
        if self._started is None:
            self._started = tic
        return tic

    def batch(self, npy, *, waited, collected, worker_waited=0.0,
              collated=0.0, version=0, lag=0):
        """Account for one batch ``npy`` (numpy views), delivered now."""
        T1, B = npy.state.rew.shape
        self["steps"] += (T1 - 1) * B
        self["batches"] += 1
        self["time_learner_wait"] += waited
        self["time_collect"] += collected
        self["time_worker_wait"] += worker_waited
        self["time_collate"] += collated
        self["time_wall"] = self._wall + time.perf_counter() - self._started
        self["steps_per_s"] = self["steps"] / max(self["time_wall"], 1e-9)
        self["steps_per_s_collect"] = self["steps"] / max(
            self["time_collect"], 1e-9)
        self["returns"], self["lengths"] = episode_stats(npy)
        self["version"], self["lag"] = version, lag
