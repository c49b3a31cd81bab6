"""The actor served by another process, behind the policy seam
(:mod:`.local`).

:class:`ServedPolicy` offers the methods of the seam to a fragment loop
whose rows live in memory that an inference server maps too (a pool of
shared fragment buffers): ``submit(row, hx)`` names the row (its buffer
and its index, found from the row's address) to the server through a
*channel*, ``wait()`` returns the server's answer, which it wrote into the
rows themselves: the action into row ``t + 1``'s ``act``, the ``info``
into row ``t``'s, ``hx_next`` into the out slot of ``hx``. Nothing but
indices crosses the channel (a doorbell slot in shared memory and a pipe,
:mod:`rlplay.engine.workers._doors`; :mod:`rlplay.engine.workers._server`
is its other end).

``hx`` travels through two shared slots of the loop's env columns: before
a request, the ``hx`` the loop holds is copied into the *in* slot (a few
numbers per env, unless it is the out slot's view already reset by no
episode end: then too, the server reads the in slot); the server reads
it there and writes ``hx_next`` into the *out* slot, whose view
``wait()`` returns. ``initial_hx`` and ``reset`` (``hx`` at episode ends)
are the actor's own, called in this process on its local copy: they must
not depend on trained parameters (the usual zeros do not).

The parameter version that acted is the server's answer; the answer to a
fragment's first step is kept in :attr:`ServedPolicy.version` (the server
pins one version for the whole fragment).
"""
from ..nested import getitem
from ..shared import copy_
from .local import Policy

__all__ = ["ServedPolicy"]


class ServedPolicy(Policy):
    """The actor called by a server on shared rows (see the module
    docstring).

    Parameters
    ----------
    local : Policy
        The actor's local copy, for :meth:`initial_hx` and :meth:`reset`.
    channel : object
        ``ask(buffer, row, group, seq, virtual)`` sends a request,
        ``answer()`` waits for its answer (the version that acted).
    buffers : list of Aliased
        The fragment buffers (their columns of this group) that the loop
        fills, as the loop sees them.
    group : int
        The group of env columns whose requests these are.
    hx_in, hx_out : nested tensors or None
        The two ``hx`` slots of this group (``None``: the actor keeps no
        ``hx``).

    Attributes
    ----------
    seq : int
        The ``meta.seq`` of the fragment being filled (set by the loop
        before each fragment).
    version : int or None
        The version that acted in the fragment's first step.
    """

    def __init__(self, local, channel, buffers, group, hx_in=None,
                 hx_out=None):
        self.local, self.channel, self.group = local, channel, group
        self.hx_in, self.hx_out = hx_in, hx_out
        self.seq, self.version = 0, None
        self._where, self._act, self._info = {}, {}, {}
        for b, buffer in enumerate(buffers):
            pyt = buffer.pyt
            T1 = pyt.state.fin.shape[0]
            for t in range(T1):
                key = (b, t)
                self._where[pyt.state.fin[t:t + 1].data_ptr()] = key
                self._info[key] = getitem(pyt.actor, slice(t, t + 1))
                if t + 1 < T1:
                    self._act[key] = getitem(pyt.state.act,
                                             slice(t + 1, t + 2))
        self._pending = None

    @property
    def device(self):
        return self.local.device

    def probe(self, row, observation_space):
        return self.local.probe(row, observation_space)

    def initial_hx(self, row):
        return self.local.initial_hx(row)

    def reset(self, hx, fin):
        return self.local.reset(hx, fin)

    def _ask(self, row, hx, virtual):
        if self._pending is not None:
            raise RuntimeError("submit() twice without a wait() between")
        key = self._where.get(row.fin.data_ptr())
        if key is None:
            raise ValueError("a served policy steps the rows of its shared "
                             "buffers only")
        if self.hx_in is not None:
            copy_(self.hx_in, hx)
        self.channel.ask(key[0], key[1], self.group, self.seq, virtual)
        self._pending = key, hx
        return key

    def _answer(self):
        (key, hx), self._pending = self._pending, None
        version = self.channel.answer()
        return key, hx, version

    def submit(self, row, hx):
        """Ask the server for the step of ``row`` (one of the shared
        buffers' rows) with ``hx``."""
        self._ask(row, hx, False)

    def wait(self):
        """The server's ``(act, hx_next, info)``: views of the rows it
        wrote (and of the out slot of ``hx``)."""
        if self._pending is None:
            raise RuntimeError("wait() without a submit() before it")
        key, hx, version = self._answer()
        if key[1] == 0:
            self.version = version
        hx_next = hx if self.hx_out is None else self.hx_out
        return self._act[key], hx_next, self._info[key]

    def lookahead(self, row, hx):
        """The ``info`` of the server's virtual step from ``row`` (row
        ``T``), written there."""
        self._ask(row, hx, True)
        key, _, _ = self._answer()
        return self._info[key]
