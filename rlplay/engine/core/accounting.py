"""One episode accounting, kept by the core loops for their env columns.

An env batch reports what happened in a step (a
:class:`~rlplay.engine.envs.Stepped`: the columns that ended, the lost
calls) and writes the rewards as its envs gave them, float64, into its
``RowOut.rew`` (in a fragment, that step's row of a ``(T, B)`` scratch
the loop keeps; in the episode loop, :attr:`Accounts.rew`); it keeps no
accounts. The accounts of the episodes under way are kept here, once, for
both loops:

- running returns: each stepped column's reward added to its entry, in
  the order the envs gave them, so that a return is the float64 sum of
  the rewards, not of their float32 records; a lost call adds nothing
  (its reward is 0);
- running lengths, the steps an episode took;
- in a fragment (:func:`~.fragments.collect`), the step counts
  ``state.stepno``, each row's counted on from the row before as the step
  that leads to it is taken (0 where a new episode starts: after an end
  or a lost call), and the episode statistics of the rows where episodes
  end. The loop writes what the actor may read of a row (its rewards and
  step counts) as the rows are collected (:meth:`Accounts.record`), and
  the returns and statistics after them, in order, in a few operations a
  row (:meth:`Accounts.settle`); a sticky fragment, whose frozen columns
  are not stepped, keeps them step by step (:meth:`Accounts.add`,
  :meth:`Accounts.end`).

:func:`~.episodes.evaluate` counts steps itself (:meth:`Accounts.count`),
as its columns may play on uncounted (an episode cut at ``max_steps`` on a
source that cannot reset a column alone) and closes the episodes it
returns (:meth:`Accounts.close`).

The torch loops keep the same accounts as tensors on a torch source's
device, with masks where these take lists of columns, so that no step
reads the device back: the fragment loop (:mod:`.torch_loop`) in its
fragment's rows, the episode loop (:mod:`.torch_episodes`) in a
:class:`TorchAccounts`.
"""
import numpy as np
import torch

from ..envs.rows import FEW_COLUMNS, put_at

__all__ = ["Accounts", "TorchAccounts"]


class Accounts:
    """The accounts of the episodes under way in ``n_envs`` env columns
    (see the module docstring).

    Attributes
    ----------
    rew : ndarray of float64, shape = (n_envs,)
        The rewards of the last step, as the envs gave them: the env
        batch's ``RowOut.rew``.
    ret : ndarray of float64, shape = (n_envs,)
        The running return of each column's episode.
    length : ndarray of int64, shape = (n_envs,)
        The running length of each column's episode (in a fragment: as of
        its last row, once it is collected).
    """

    def __init__(self, n_envs):
        self.rew = np.zeros(n_envs, np.float64)
        self.ret = np.zeros(n_envs, np.float64)
        self.length = np.zeros(n_envs, np.int64)

    # ------------------------------------------------- the fragment loop --
    # (``steps`` and ``steps_next``: the step counts, ``state.stepno``, of
    # a fragment's row t and row t + 1, views the loop keeps)
    def record(self, rew, rew_row, steps, steps_next):
        """The step from row ``t`` of every column: its rewards ``rew``
        (float64, as the envs gave them) into ``rew_row`` (the fragment's
        float32 row ``t + 1``); row ``t + 1``'s step counts one on from row
        ``t``'s (0 where a new episode starts: set by the loop). The
        returns and the statistics wait for :meth:`settle`, after the
        rows."""
        rew_row[...] = rew
        np.add(steps, 1, steps_next)

    def settle(self, rew, ended, ret_rows, length_rows, steps):
        """The rows of a fragment are collected (with :meth:`record`):
        their rewards ``rew`` (``(T, B)`` float64) added to the running
        returns row after row, in order (each return the same float64 sum
        as :meth:`add` makes), starting from 0 again after each end; the
        return and length of each episode that ended into the statistics
        ``ret_rows``, ``length_rows`` (rows ``1..T``), where ``ended``
        (``(T, B)`` bool: an executed action ended an episode at row
        ``t + 1``); ``steps``, the step counts of rows ``0..T - 1``."""
        run = np.empty_like(rew)
        ret = self.ret
        rows_ended = ended.any(axis=1).tolist()
        for t, any_ended in enumerate(rows_ended):
            np.add(ret, rew[t], out=run[t])
            # after an end the column's next episode starts from 0
            ret = np.where(ended[t], 0.0, run[t]) if any_ended else run[t]
        self.ret[...] = ret
        np.copyto(ret_rows, run, where=ended)
        # an episode's length is its step count plus its last step
        np.add(steps, 1, out=length_rows, where=ended)

    # (sticky fragments, whose frozen columns are not stepped, keep their
    # accounts step by step)
    def add(self, rew, rew_row, steps, steps_next, live=None):
        """The step from row ``t`` of the columns ``live`` (all by
        default): its rewards ``rew`` into ``rew_row`` (the fragment's
        float32 row ``t + 1``) and onto the running returns; row ``t + 1``'s
        step counts one on from row ``t``'s (:meth:`end` and :meth:`lose`
        set 0 where a new episode starts)."""
        ret = self.ret
        if live is None:
            self.record(rew, rew_row, steps, steps_next)
            ret += rew
        else:  # sticky: the frozen columns were not stepped
            rew_row[live] = rew[live]
            ret[live] += rew[live]
            steps_next[live] = steps[live] + 1

    def end(self, ended, steps, steps_next, ret_row, length_row):
        """The episodes of the columns ``ended`` ended at row ``t + 1``:
        their return and length into ``ret_row`` and ``length_row`` (the
        statistics of that row); their new episodes count from 0 there."""
        ret = self.ret
        if len(ended) > FEW_COLUMNS:
            ended = np.array(ended)  # cheaper than indexing by a list
            ret_row[ended] = ret[ended]
            length_row[ended] = steps[ended] + 1
            ret[ended] = 0.0
            steps_next[ended] = 0
            return
        for j in ended:  # the common case: cheaper than fancy indexing
            # an episode's length is its step count plus this step
            ret_row[j], length_row[j] = ret.item(j), steps.item(j) + 1
            ret[j] = 0.0
            steps_next[j] = 0

    def lose(self, lost, steps_next):
        """The calls of the columns ``lost`` at row ``t + 1`` were lost:
        their new episodes start there (no reward was added: it is 0)."""
        put_at(steps_next, lost, 0)

    def finish(self, steps):
        """The fragment is collected: its last row's step counts,
        ``steps``, are the running lengths."""
        self.length[:] = steps

    # -------------------------------------------------- the episode loop --
    def count(self, counted):
        """Add the last step, and its reward, to the episodes of the
        columns ``counted`` (a bool mask)."""
        self.ret[counted] += self.rew[counted]
        self.length[counted] += 1

    def close(self, j):
        """Column ``j``'s episode is over: its ``(return, length)``; its
        accounts start again from zero."""
        result = self.ret[j], self.length[j]
        self.ret[j], self.length[j] = 0.0, 0
        return result


class TorchAccounts:
    """The accounts of the episodes under way in ``n_envs`` env columns of
    a torch source, tensors on its ``device``: the episode loop's part of
    :class:`Accounts` (:meth:`count`, :meth:`close`), with bool masks
    ``(n_envs,)`` for its lists of columns.

    Attributes
    ----------
    ret : tensor of float64, shape = (n_envs,)
        The running return of each column's episode: the float64 sum of
        its rewards as the source gave them.
    length : tensor of int64, shape = (n_envs,)
        The running length of each column's episode.
    """

    def __init__(self, n_envs, device):
        self.ret = torch.zeros(n_envs, dtype=torch.float64, device=device)
        self.length = torch.zeros(n_envs, dtype=torch.int64, device=device)

    def count(self, rew, counted):
        """Add the last step, and its rewards ``rew`` (the source's,
        ``(n_envs,)``), to the episodes of the columns ``counted``."""
        # where(counted, ret + rew, ret): a column not counted keeps its
        # return as it is (adding 0 would turn -0.0 into 0.0)
        torch.where(counted, self.ret + rew, self.ret, out=self.ret)
        self.length += counted

    def close(self, closing):
        """The episodes of the columns ``closing`` are over: returns
        ``(ret, length)``, every column's accounts before (theirs where
        ``closing``); theirs start again from zero."""
        ret, length = self.ret.clone(), self.length.clone()
        self.ret.masked_fill_(closing, 0.0)
        self.length.masked_fill_(closing, 0)
        return ret, length
