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
  copies a whole batch with one ``np.concatenate`` per leaf.
"""
from collections import deque, namedtuple
from functools import partial

import numpy as np
import torch

from ..core import Fragment, env_axes
from ..nested import flatten, suply

__all__ = ["ReadyQueue", "Collation", "Arrival", "new_account",
           "check_hx_dim"]

Arrival = namedtuple("Arrival", "worker index seq version")
Arrival.__doc__ = """A fragment ready for the learner: from ``worker``, in
its buffer ``index``, with its ``seq`` and parameter ``version``."""


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
        The env dimension of ``hx`` leaves.
    n_per_batch : int
    pinned : bool
        Allocate the batch in page-locked memory.

    Attributes
    ----------
    host : Fragment of tensors, shape = (1 + T, n_per_batch * B, ...)
    npy : Fragment of numpy views of ``host``
    """

    def __init__(self, template, hx_dim, n_per_batch, pinned=False):
        check_hx_dim(template.hx, hx_dim, template.state.fin.shape[1])
        self._dims = env_axes(hx_dim)
        self._template, self.pinned = template, pinned
        self.n_per_batch = n_per_batch
        self.host = self._allocate(torch.zeros)
        self.npy = suply(torch.Tensor.numpy, self.host)
        self._targets = self._targets_of(self.npy)

    def _allocate(self, make):
        def alloc(leaf, dim):
            shape = list(leaf.shape)
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
        slot order) into the batch, one copy per leaf: into :attr:`host`,
        or with ``fresh`` into a new batch (a batch the caller keeps, made
        with one copy instead of two). Returns the batch and its numpy
        views."""
        assert len(fragments) == self.n_per_batch
        host, npy, targets = self.host, self.npy, self._targets
        if fresh:  # every leaf is written whole: no need to clear it
            host = self._allocate(torch.empty)
            npy = suply(torch.Tensor.numpy, host)
            targets = self._targets_of(npy)
        if self.n_per_batch == 1:
            for (target, _), source in zip(targets, fragments[0]):
                np.copyto(target, source)
            return host, npy
        for i, (target, dim) in enumerate(targets):
            np.concatenate([sources[i] for sources in fragments], axis=dim,
                           out=target)
        return host, npy
