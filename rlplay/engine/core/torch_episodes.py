"""The episode loop of torch-native sources: :func:`play` plays whole
episodes over an env batch of kind ``"torch"`` (a
:class:`~rlplay.engine.envs.TorchSource`) for :func:`~.episodes.evaluate`,
which chooses it by the kind. It plays the episodes that the numpy episode
loop (:mod:`.episodes`) plays over the same envs, with the same actor,
and gives the same results: each of the ``B`` columns plays ``quota``
episodes, closed where they end or are cut at ``max_steps``, counted by
the accounts of :mod:`.accounting` (:class:`~.accounting.TorchAccounts`).

A step, in torch operations on the source's device, with bool masks
``(B,)`` where the numpy loop has lists of columns:

1. the actor's action, through the policy seam
   (:mod:`rlplay.engine.policy`) on the row of state there, and the
   source's step
   (:meth:`~rlplay.engine.envs.TorchSource.advance`);
2. the step counted in the columns that play on (``active``), unless the
   call was lost (next-step autoreset) or the column drains (below);
3. the episodes that ended, and those that reached ``max_steps`` (*cut*,
   counted as truncated), closed: their return and length into their
   column's next row of the results;
4. a column cut that plays on is reset alone where the source can
   (same-step and disabled autoreset,
   :meth:`~rlplay.engine.envs.TorchSource.restart`); a next-step source
   cannot, and the column *drains*: it plays on uncounted until its
   episode ends on its own, as a column of a numpy vector source without
   a partial reset does;
5. ``fin`` (the ends, lost calls and cuts), the step counts, and the
   actor's ``hx`` reset with ``fin`` as its mask (at every step, as in
   the torch fragment loop, :mod:`.torch_loop`).

What is read back to the host: whether a column plays on, after every
step on the host and every :data:`POLL_STEPS` steps on another device
(the steps played after every column's last episode count for nothing);
on the host, whether a column is to be reset alone (see ``restart``);
the results, once, at the end; while spaces are checked
(``check_spaces``, as in :mod:`.episodes`), the rows of each step, one
host copy of each, checked with the numpy loop's messages (the actions
before the source gets them). Once, at the end, the source is asked
whether an episode ended without its true last observation
(:meth:`~rlplay.engine.envs.TorchSource.finish`).

Not taken: ``on_frame`` (recording), as with a numpy vector source: a
torch source cannot render one env column.
"""
import numpy as np
import torch

from ..envs import TorchRow
from ..nested import getitem, suply
from ..shared import copy_, torchify
from .accounting import TorchAccounts
from .checks import _SpaceChecks, _final_label, _reset_label, _step_label
from .layout import _state_example
from .torch_loop import _torch_clipper

__all__ = ["POLL_STEPS", "play"]

# the steps between two reads of whether a column plays on, on a device
# other than the host (a read waits for the device's work); on the host
# the loop reads after every step
POLL_STEPS = 16


def play(envs, policy, quota, *, seed_sequences=None, max_steps=None,
         mode="first", on_frame=None):
    """Play ``quota`` episodes in each column of the torch source ``envs``
    (see the module docstring).

    Parameters
    ----------
    envs : TorchSource
    policy : LocalPolicy or DevicePolicy
        For rows on the source's device
        (:func:`~rlplay.engine.policy.as_policy` with ``rows=envs.device``).
    quota : int
        Episodes per column, at least 1.
    seed_sequences, max_steps, on_frame
        As in :func:`~.episodes.evaluate` (checked there).
    mode : {'first', 'always', 'never'}
        Its ``check_spaces``, checked.

    Returns
    -------
    returns : ndarray of float64, shape = (quota * B,)
    lengths : ndarray of int64, shape = (quota * B,)
        Column after column, each column's episodes in the order played.

    Raises
    ------
    TypeError
        ``on_frame`` is given.
    ValueError
        As :func:`~.episodes.evaluate`; a same-step source ended an
        episode without its true last observation.
    """
    if on_frame is not None:
        raise TypeError(f"on_frame renders env 0's frames, but "
                        f"{envs.name} cannot render one env column: "
                        f"recording needs single envs")
    game = _Play(envs, policy, quota, max_steps, mode)
    game.start(seed_sequences)
    poll = _poll(envs.device)
    while game.t % poll or bool(game.active.any()):
        game.step()
    envs.finish()
    return game.results()


def _poll(device):
    """The steps between two reads of whether a column plays on, on
    ``device`` (see :data:`POLL_STEPS`)."""
    return 1 if device.type == "cpu" else POLL_STEPS


def _host(tree):
    """A host (numpy) copy of nested tensors."""
    return suply(lambda x: x.cpu().numpy(), tree)


def _where(mask):
    """The columns of a bool tensor ``mask``, on the host."""
    return np.flatnonzero(mask.cpu().numpy())


class _Play:
    """An evaluation under way over a torch source (see the module
    docstring): one row of state ``(1, B, ...)`` on the source's device,
    the accounts, and the results of each column's episodes."""

    def __init__(self, envs, policy, quota, max_steps, mode):
        device, n_envs = envs.device, envs.n_envs
        self.envs, self.policy, self.quota = envs, policy, quota
        self.max_steps, self.mode = max_steps, mode
        # the placeholders of the spaces (valid actions), fin set
        self.row = row = suply(lambda x: x.to(device),
                               torchify(_state_example(envs), 1, n_envs))
        obs = getitem(row.obs, 0)
        self.out = TorchRow(
            obs=obs, fin=row.fin[0], truncated=None, final=None
            if envs.final_is_obs else suply(torch.empty_like, obs),
            info={}, info_mask={})
        # the true last observations of the episodes that ended in a step
        self.last = obs if envs.final_is_obs else self.out.final
        self.checks = None if mode == "never" else _SpaceChecks(envs)
        self.checked = False  # mode 'first': every first episode is over
        # what the source gets: the actions, Box leaves clipped (.layout)
        self.clip = _torch_clipper(envs.action_space, device)
        self.accounts = TorchAccounts(n_envs, device)
        # row k: each column's k-th result; row `quota`, the writes of the
        # columns that closed no episode in a step
        self.returns = torch.zeros((quota + 1, n_envs), dtype=torch.float64,
                                   device=device)
        self.lengths = torch.zeros((quota + 1, n_envs), dtype=torch.int64,
                                   device=device)
        self.columns = torch.arange(n_envs, device=device)
        self.closed = torch.zeros(n_envs, dtype=torch.int64, device=device)
        self.active = torch.ones(n_envs, dtype=torch.bool, device=device)
        # cut where the source cannot reset a column alone: its steps
        # count for nothing until its episode ends on its own
        self.draining = torch.zeros_like(self.active)
        # the columns whose first episode is over
        self.first_over = torch.zeros_like(self.active)
        # the cuts without max_steps: none, allocated once
        self.no_cut = torch.zeros_like(self.active)
        self.t, self.hx, self.stateless = 0, None, False

    def start(self, seed_sequences):
        """Reset every column; the actor's first ``hx``."""
        self.envs.start(self.out.obs, seed_sequences)
        if self.checks is not None:
            self.checks.observation(_host(self.out.obs), _reset_label)
        self.hx = self.policy.initial_hx(self.row)
        # a feed-forward actor's hx is (): nothing to reset
        self.stateless = type(self.hx) is tuple and not self.hx

    def step(self):
        """One step of every column (the columns that play on count it):
        the actor's actions, the source's step, the episodes that ended or
        were cut, ``fin``, ``stepno`` and ``hx``."""
        t, row, out, checks = self.t, self.row, self.out, self.checks
        checking = self._checking()
        # every call checked, before copy_ could broadcast a wrong shape
        act, self.hx, _ = self.policy.checked_step(row, self.hx, row.act)
        copy_(row.act, act)
        act = getitem(row.act, 0)
        if checking:
            live = _where(self.active)
            checks.action(getitem(_host(act), live), t, live)
        rew, ended, lost = self.envs.advance(self.clip(act), out)
        counted = self.active & ~self.draining
        if lost is not None:  # lost calls are no steps
            counted &= ~lost
        self.accounts.count(rew, counted)
        row.rew[0].copy_(rew)
        ended = ended & self.active
        if checking:
            checks.reward(rew.cpu().numpy()[live], t, live)
            ends = _where(ended)
            if ends.size:  # the last observations
                checks.observation(getitem(_host(self.last), ends),
                                   _final_label(t), ends)
        out.fin.logical_or_(self._settle(ended, counted))
        # the step count the actor reads next: 0 where an episode starts
        row.stepno.add_(1).masked_fill_(out.fin, 0)
        if checking:
            live = _where(self.active)
            checks.observation(getitem(_host(out.obs), live),
                               _step_label(t, out.fin.cpu().numpy()), live)
        if not self.stateless:
            self.hx = self.policy.reset(self.hx, out.fin.clone())
        self.t += 1

    def _checking(self):
        """Whether this step's rows are checked: always, or until every
        column's first episode is over (one read of the device a step
        until then), or never."""
        if self.checks is None or self.checked:
            return False
        if self.mode == "first":
            self.checked = bool(self.first_over.all())
        return not self.checked

    def _settle(self, ended, counted):
        """Close the episodes that ended (``ended``, the active columns')
        or reached ``max_steps`` among the columns ``counted``, and start
        the next ones of the columns cut that play on; returns the mask of
        the columns cut."""
        accounts, draining = self.accounts, self.draining
        done = ended & ~draining
        draining &= ~ended
        if self.max_steps is None:
            cut = self.no_cut
        else:  # not where an episode ended or a call was lost
            cut = counted & (accounts.length >= self.max_steps) \
                & ~self.out.fin
        closing = done | cut
        ret, length = accounts.close(closing)
        slot = torch.where(closing, self.closed, self.quota)
        self.returns[slot, self.columns] = ret
        self.lengths[slot, self.columns] = length
        self.closed += closing
        self.first_over |= closing
        torch.lt(self.closed, self.quota, out=self.active)
        if self.max_steps is not None:
            again = cut & self.active
            if self.envs.can_reset_columns:
                self.envs.restart(self.out.obs, again)
            else:
                draining |= again
        return cut

    def results(self):
        """``(returns, lengths)``, column after column (see :func:`play`)."""
        returns = self.returns[:self.quota].T.reshape(-1)
        lengths = self.lengths[:self.quota].T.reshape(-1)
        return returns.cpu().numpy(), lengths.cpu().numpy()
