"""Batches of many workers' fragments: the ready queue and the collation.

Shared by the generators that gather fragments from a pool of workers
(:mod:`~rlplay.engine.rollout.multi` on this machine,
:mod:`~rlplay.engine.rollout.cluster` on a Ray cluster):

- :class:`ReadyQueue`: fragments that arrived, in arrival order, with the
  per-worker accounts (``received``, ``delivered``, ``dropped``,
  ``discarded``, ``collected``); :meth:`ReadyQueue.take` picks the next
  ones no older than ``version - max_lag`` and drops the stale ones;
- :class:`Collation`: the learner's preallocated batch of ``n_per_batch``
  fragments of ``B`` envs (on the host, page-locked if asked), slot ``s``
  holding env columns ``s * B .. (s + 1) * B - 1``; ``hx`` is concatenated
  along the actor's ``hx_dim`` and ``meta`` along its only dimension. It
  copies a whole batch with one ``np.concatenate`` per leaf, and makes
  ``final`` from the batch's ``obs`` where no episode ended (so that the
  workers need not copy it: ``sparse_final``).
"""
from collections import deque
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch

from ..core import Fragment, env_axes
from ..core.finals import copy_obs_to_final, obs_is_final
from ..nested import flatten, suply

__all__ = ["ReadyQueue", "Collation", "Arrival", "new_account",
           "check_hx_dim"]


class Arrival(NamedTuple):
    """A fragment ready for the learner: from ``worker``, in
    its buffer ``index``, with its ``seq`` and parameter ``version``."""
    worker: Any
    index: Any
    seq: Any
    version: Any


def new_account():
    """A worker's fragment counts (see :class:`ReadyQueue`)."""
    return {"received": 0, "delivered": 0, "dropped": 0, "discarded": 0,
            "collected": None}


class ReadyQueue:
    """Fragments ready for the learner, in arrival order.

    Parameters
    ----------
    accounts : list of dict
        One per worker, updated in place: fragments ``received``,
        ``delivered``, ``dropped`` (stale under ``max_lag``), ``discarded``
        (received, undelivered at close) and ``collected`` (the worker's
        own count, set by the protocol when it stops cleanly).
    """

    def __init__(self, accounts, run=None):
        self.accounts = accounts
        for account in accounts:
            for key, value in new_account().items():
                account.setdefault(key, value)
        self.queue = deque()
        self._last = {}  # the seq of each worker's last arrival
        # per worker, the seq of its first fragment in this part of the run
        # (> 0 when resumed) and the seq after its last fragment delivered;
        # and the drops before this part
        self.first_seq = [0] * len(accounts) if run is None \
            else list(run.seq)
        self.next_seq = list(self.first_seq)
        self._dropped = 0 if run is None else int(
            run.counters.get("dropped", 0))

    def __len__(self):
        return len(self.queue)

    def numbered_from(self, worker):
        """The ``meta.seq`` that ``worker`` (a new generation of it) numbers
        its fragments from: on from those received."""
        return self.first_seq[worker] + self.accounts[worker]["received"]

    def push(self, arrival):
        """Queue ``arrival``; a worker's arrivals come in ``seq`` order
        (the protocols see to it: a pipe, or Ray calls taken in order)."""
        last = self._last.get(arrival.worker, -1)
        assert arrival.seq > last, (arrival, last)
        self._last[arrival.worker] = arrival.seq
        self.queue.append(arrival)
        self.accounts[arrival.worker]["received"] += 1

    def take(self, n, version, max_lag, drop):
        """Up to ``n`` arrivals collected with a version of at least
        ``version - max_lag`` (``max_lag=None``: any); ``drop(arrival)``
        is called for each stale one passed over."""
        taken = []
        while self.queue and len(taken) < n:
            arrival = self.queue.popleft()
            if max_lag is not None and arrival.version < version - max_lag:
                self.accounts[arrival.worker]["dropped"] += 1
                drop(arrival)
                continue
            taken.append(arrival)
        return taken

    def give_back(self, taken):
        """Put ``taken`` arrivals back at the front, in order."""
        self.queue.extendleft(reversed(taken))

    def delivered(self, taken):
        for arrival in taken:
            self.accounts[arrival.worker]["delivered"] += 1
            self.next_seq[arrival.worker] = arrival.seq + 1

    def forget(self, worker):
        """Drop ``worker``'s arrivals (not delivered); returns them."""
        gone = [a for a in self.queue if a.worker == worker]
        self.queue = deque(a for a in self.queue if a.worker != worker)
        return gone

    def close(self):
        """Count what was received and never delivered as discarded."""
        self.queue.clear()
        for account in self.accounts:
            account["discarded"] = (account["received"] -
                                    account["delivered"] -
                                    account["dropped"])

    @property
    def dropped(self):
        """Stale fragments dropped in the run (resumes included)."""
        return self._dropped + sum(account["dropped"]
                                   for account in self.accounts)


def check_hx_dim(hx, hx_dim, n_per_actor):
    """Check that every ``hx`` leaf has ``n_per_actor`` envs along
    ``hx_dim``, so that fragments can be collated."""
    for leaf in flatten(hx):
        if leaf.dim() <= hx_dim or leaf.shape[hx_dim] != n_per_actor:
            raise ValueError(
                f"the actor's hx holds a tensor of shape {tuple(leaf.shape)}"
                f", which has no env dimension of size n_per_actor="
                f"{n_per_actor} at hx_dim={hx_dim}: set hx_dim on the "
                f"actor's class to the env dimension of its hx, so that "
                f"fragments of several workers can be collated")


class Collation:
    """The learner's batch of ``n_per_batch`` fragments laid out as
    ``template``.

    Parameters
    ----------
    template : Fragment of tensors, shape = (1 + T, B, ...)
        One fragment.
    hx_dim : int
        The env dimension of ``hx`` leaves (unused where ``n_per_batch``
        is 1: nothing is concatenated).
    n_per_batch : int
    pinned : bool
        Allocate the batch in page-locked memory.
    sticky : bool
        The fragments' ``sticky`` (where their ``final`` is the
        observation: :func:`~rlplay.engine.core.finals.obs_is_final`).

    The batch's ``final`` is made from its ``obs`` where no episode ended
    and from the fragments' ``final`` elsewhere (and in row 0): the
    fragments may be collected with ``sparse_final=True``.

    Attributes
    ----------
    host : Fragment of tensors, shape = (1 + T, n_per_batch * B, ...)
    npy : Fragment of numpy views of ``host``
    """

    def __init__(self, template, hx_dim, n_per_batch, pinned=False,
                 sticky=False):
        if n_per_batch > 1:
            check_hx_dim(template.hx, hx_dim, template.state.fin.shape[1])
        self._dims = env_axes(hx_dim)
        self._template, self.pinned = template, pinned
        self.n_per_batch, self.sticky = n_per_batch, sticky
        # the positions of the `final` leaves among a fragment's sources
        # (none where there is no final, or no `acted` to place it by)
        sizes = [len(flatten(field)) for field in template]
        first = sum(sizes[:Fragment._fields.index("final")])
        self._finals = [] if template.acted is None else list(
            range(first, first + sizes[Fragment._fields.index("final")]))
        T, B = template.state.fin.shape
        self._keep = np.empty((T - 1, n_per_batch * B), bool)
        self.host = self._allocate(torch.zeros)
        self.npy = suply(torch.Tensor.numpy, self.host)
        self._targets = self._targets_of(self.npy)

    def _allocate(self, make):
        def alloc(leaf, dim):
            shape = list(leaf.shape)
            if self.n_per_batch > 1:
                shape[dim] *= self.n_per_batch
            return make(shape, dtype=leaf.dtype, pin_memory=self.pinned)

        return Fragment(*[suply(partial(alloc, dim=dim), field)
                          for field, dim in zip(self._template, self._dims)])

    def _targets_of(self, npy):
        # the leaves in a fragment's flattened order, with their env dims
        return [(leaf, dim) for field, dim in zip(npy, self._dims)
                for leaf in flatten(field)]

    @staticmethod
    def sources(npy):
        """A fragment's leaves (numpy), in the order :meth:`collate`
        takes them."""
        return [leaf for field in npy for leaf in flatten(field)]

    def collate(self, fragments, fresh=False):
        """Copy ``fragments`` (lists from :meth:`sources`, one per slot, in
        slot order) into the batch, one copy per leaf (``final``: the
        batch's ``obs`` where no episode ended, the fragments' ``final``
        elsewhere): into :attr:`host`, or with ``fresh`` into a new batch
        (a batch the caller keeps, made with one copy instead of two).
        Returns the batch and its numpy views."""
        assert len(fragments) == self.n_per_batch
        host, npy, targets = self.host, self.npy, self._targets
        if fresh:  # every leaf is written whole: no need to clear it
            host = self._allocate(torch.empty)
            npy = suply(torch.Tensor.numpy, host)
            targets = self._targets_of(npy)
        finals = self._finals
        for i, (target, dim) in enumerate(targets):
            if finals and i in finals:
                continue  # below, once obs, fin and acted are in
            if self.n_per_batch == 1:
                np.copyto(target, fragments[0][i])
            else:
                np.concatenate([sources[i] for sources in fragments],
                               axis=dim, out=target)
        if finals:
            self._finals_into(npy, [[sources[i] for i in finals]
                                    for sources in fragments])
        return host, npy

    def _finals_into(self, npy, fragments):
        """The batch's ``final`` leaves from its ``obs`` and the
        fragments' ``final`` leaves (``fragments``, one list per slot)."""
        keep = obs_is_final(npy.state.fin[1:], npy.acted[1:], self.sticky,
                            out=self._keep)
        B = keep.shape[1] // self.n_per_batch
        # where an episode ended, by slot: (rows, columns) of the slot's
        ends = [np.nonzero(~keep[:, s * B:(s + 1) * B])
                for s in range(self.n_per_batch)]
        for k, (final, obs) in enumerate(zip(flatten(npy.final),
                                             flatten(npy.state.obs))):
            sources = [leaves[k] for leaves in fragments]
            # row 0 repeats the previous fragment's row T: as it is
            np.concatenate([x[:1] for x in sources], axis=1, out=final[:1])
            copy_obs_to_final(final[1:], obs[1:], keep)
            for s, (source, (rows, cols)) in enumerate(zip(sources, ends)):
                if len(rows):
                    final[1:][rows, cols + s * B] = source[1:][rows, cols]
