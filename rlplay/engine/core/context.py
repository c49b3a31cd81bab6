"""The state of an ongoing collection (:class:`Context`), carried from
fragment to fragment, and the per-row views of a fragment buffer that the
fragment loop (:mod:`.fragments`) indexes.
"""
from typing import Any, NamedTuple

import numpy as np

from .. import envs as _envs
from ..envs import RowOut
from ..nested import getitem, suply
from .accounting import Accounts
from .checks import _SpaceChecks
from .layout import _row_fields

__all__ = ["Context"]


class _Step(NamedTuple):
    """What step ``t`` of a fragment reads and writes: the actor's input
    (torch row ``t``) and where its action and info go (torch), the numpy
    state rows ``t`` and ``t + 1``, the :class:`~rlplay.engine.envs.RowOut`
    the env batch writes (its rewards into the accounts' float64 scratch),
    and the episode statistics and the ``acted`` flags of row ``t + 1``."""
    actor_in: Any
    act_out: Any
    info_out: Any
    row: Any
    row_next: Any
    out: Any
    ret: Any
    length: Any
    acted: Any


class _Views:
    """Per-row views of one buffer, made once so the loop only indexes;
    ``rew``, ``(T, B)`` float64, is where the env batch writes each step's
    rewards as the envs gave them (:class:`~.accounting.Accounts` records
    them in the fragment's float32 rows and adds them to the returns)."""

    def __init__(self, buffer):
        npy, pyt = buffer
        T1, B = npy.state.fin.shape
        self.buffer = buffer
        rows = [getitem(pyt.state, slice(t, t + 1)) for t in range(T1)]
        self.rows = rows
        self.actor = [getitem(pyt.actor, slice(t, t + 1)) for t in range(T1)]
        state = [getitem(npy.state, t) for t in range(T1)]
        final = [getitem(npy.final, t) for t in range(T1)]
        self.state, self.final = state, final
        # the env batch writes the rewards as the envs gave them into
        # `rew`; the accounts record them in the fragment's float32 rows
        self.rew = rew = np.zeros((T1 - 1, B), np.float64)
        self.steps = [
            _Step(actor_in=rows[t], act_out=rows[t + 1].act,
                  info_out=self.actor[t], row=state[t], row_next=state[t + 1],
                  out=RowOut(t=t, obs=state[t + 1].obs, rew=rew[t],
                             fin=state[t + 1].fin,
                             truncated=npy.truncated[t + 1],
                             final=final[t + 1], info=getitem(npy.env, t),
                             info_mask=getitem(npy.env_mask, t)),
                  ret=npy.stats.ret[t + 1], length=npy.stats.length[t + 1],
                  acted=npy.acted[t + 1])
            for t in range(T1 - 1)]
        # a (T, B) bool scratch: where `final` is the observation itself
        # (.finals)
        self.keep = np.empty((T1 - 1, B), bool)



class Context:
    """The state of an ongoing collection, carried from fragment to fragment.

    Attributes
    ----------
    envs : EnvBatch
    last : tuple
        Row ``T`` of the last fragment (``state``, ``truncated``, ``final``,
        ``stats``), numpy arrays of shape ``(B, ...)``.
    hx : nested tensors
        The actor's state for ``last``.
    policy : LocalPolicy
        What calls the actor (:mod:`rlplay.engine.policy`), made by
        :func:`~.fragments.startup`.
    accounts : Accounts
        The running returns and lengths of each env's current episode
        (:class:`~.accounting.Accounts`).
    seq : int
        The ``meta.seq`` of the next fragment.
    worker, generation : int
        Recorded in ``meta.worker`` and ``meta.generation``.
    control : int
        The ``call_envs`` calls applied to the envs so far, recorded in
        ``meta.control`` (set by whoever applies them).
    env_ids : ndarray, shape = (B,)
        Global env indices recorded in ``meta.env``.
    agent_ids : ndarray, shape = (B,)
        The agent of each column recorded in ``meta.agent`` (the env
        batch's ``column_agents``).
    spaces_checked : bool
        A fragment was collected with space checks (so
        ``check_spaces='first'`` checks no more).
    """

    def __init__(self, envs, buffer, worker=0, env_ids=None, generation=0,
                 seq=0):
        npy = buffer.npy
        self.envs = envs
        B = envs.n_envs
        self.last = suply(lambda a: np.zeros_like(a), _row_fields(npy, 0))
        self.hx = None
        # the policy that calls the actor (see .policy), and its actor
        self.policy = self.actor = None
        self.accounts = Accounts(B)
        self.seq, self.worker, self.generation = seq, worker, generation
        self.control = 0
        self.env_ids = (np.arange(B) if env_ids is None
                        else np.asarray(env_ids, np.int64))
        self.agent_ids = envs.column_agents
        self.spaces_checked = False
        # `last` holds the reset observations (row 0 of the first fragment)
        # and what recording them lost, for the first checked fragment
        self._fresh, self._reset_problem = False, None
        self._checks = None
        self._views = {}
        # the envs get Box actions clipped into their bounds (see .layout)
        self.clip_actions = _envs.box_clipper(envs.action_space)

    def views(self, buffer):
        views = self._views.get(id(buffer))
        if views is None or views.buffer is not buffer:
            views = _Views(buffer)
            self._views[id(buffer)] = views
        return views

    def space_checks(self):
        if self._checks is None:
            self._checks = _SpaceChecks(self.envs)
        return self._checks
