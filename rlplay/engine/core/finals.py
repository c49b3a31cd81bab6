"""``final`` where no episode ended: the observation itself (see
:mod:`.layout`). The rule of where, and the copy, written once for their
two users:

- the fragment loop (:func:`~.fragments.collect`), which fills a
  fragment's ``final`` in place once its last step is taken;
- the learner's collation of many workers' fragments
  (:class:`~rlplay.engine.workers.Collation`), which builds the
  batch's ``final`` from the batch's ``obs`` and the workers' true last
  observations alone, so that a worker need not write the copies (a
  fragment collected with ``sparse_final=True``: an Atari frame is then
  written once into the worker's row and twice into the batch, as ``obs``
  and as ``final``, instead of twice more).

A fragment's row 0 repeats the previous fragment's row ``T`` (its
``final`` included), whose transition is not in this fragment: both
users leave it as it is.
"""
import numpy as np

from ..nested import flatten

__all__ = ["obs_is_final", "copy_obs_to_final", "fill_final",
           "fill_final_from_obs", "FILL_BY_ROWS"]

# observations of at least this many bytes (a leaf's, one env's) are
# copied into `final` row by row: a masked np.copyto of Atari frames runs
# at a fifth of a plain copy's speed
FILL_BY_ROWS = 1024


def obs_is_final(fin, acted, sticky, out=None):
    """Where ``final`` is the observation itself: the ``(T, B)`` bool mask
    of rows ``1..T`` (``fin[1:]``, ``acted[1:]``) where no episode ended.

    A lost call (``fin`` without ``acted``) ended none; with ``sticky``, a
    frozen row (``fin``, never with lost calls) repeats the ``final`` of
    its end, which the loop wrote, so only rows that go on hold the
    observation."""
    if sticky:
        return np.logical_not(fin, out=out)
    out = np.logical_and(fin, acted, out=out)
    return np.logical_not(out, out=out)


def copy_obs_to_final(final, obs, keep):
    """``final[keep] = obs[keep]`` for one ``(T, B, ...)`` leaf of each
    and the ``(T, B)`` mask ``keep`` (from :func:`obs_is_final`)."""
    if obs.ndim == 2:
        np.copyto(final, obs, where=keep)
    elif obs.size == 0:
        return
    elif obs[0, 0].nbytes >= FILL_BY_ROWS:
        _fill_by_rows(final, obs, keep)
    elif final[0, 0].flags.c_contiguous and obs[0, 0].flags.c_contiguous:
        # each env's observation as one element: a mask broadcast over
        # the trailing axes makes the copy five to ten times slower
        np.copyto(_per_env(final), _per_env(obs), where=keep[..., None])
    else:
        np.copyto(final, obs, where=keep.reshape(
            *keep.shape, *[1] * (obs.ndim - 2)))


def _per_env(x):
    """``x``, ``(T, B, ...)`` with contiguous trailing axes, viewed as
    ``(T, B, 1)`` elements of a void dtype, one env's observation each."""
    return x.reshape(*x.shape[:2], -1).view(f"V{x[0, 0].nbytes}")


def fill_final(fragment, sticky, rows=slice(None), out=None):
    """Complete a fragment's ``final`` in place (numpy leaves): the
    observation itself in rows ``1..T`` (those of ``rows`` among them)
    where no episode ended; ``out``, a ``(T, B)`` bool scratch for the
    mask (its ``rows``)."""
    keep = obs_is_final(fragment.state.fin[1:][rows],
                        fragment.acted[1:][rows], sticky, out=out)
    for obs, final in zip(flatten(fragment.state.obs),
                          flatten(fragment.final)):
        copy_obs_to_final(final[1:][rows], obs[1:][rows], keep)


def fill_final_from_obs(fragment, sparse, out=None):
    """Complete the ``final`` of a fragment whose source left it to the
    loop (``final_is_obs``: an episode's last step returned its true last
    observation), in place: the observation in rows ``1..T``, or with
    ``sparse`` only where an episode ended and in row ``T``; ``out``, a
    ``(T, B)`` bool scratch for the mask."""
    pairs = list(zip(flatten(fragment.state.obs), flatten(fragment.final)))
    if not sparse:
        for obs, final in pairs:
            np.copyto(final[1:], obs[1:])
        return
    ended = np.logical_and(fragment.state.fin[1:], fragment.acted[1:],
                           out=out)
    for obs, final in pairs:
        copy_obs_to_final(final[1:], obs[1:], ended)
        np.copyto(final[-1], obs[-1])


def _fill_by_rows(final, obs, keep):
    """``final[keep] = obs[keep]``: plain copies of the runs of rows where
    ``keep`` holds for every column, a copy of the kept columns
    elsewhere."""
    start = 0
    for t in np.flatnonzero(~keep.all(1)).tolist():
        if start < t:
            final[start:t] = obs[start:t]
        cols = np.flatnonzero(keep[t])
        final[t, cols] = obs[t, cols]
        start = t + 1
    if start < len(final):
        final[start:] = obs[start:]
