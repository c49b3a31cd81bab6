"""The policy seam: the one interface through which the core loops call
the actor (:class:`Policy`).

The fragment loop (:mod:`rlplay.engine.core.fragments`) and the episode
loop (:mod:`rlplay.engine.core.episodes`) never call ``actor.step`` or
``actor.reset`` themselves: they call a policy, which offers

- ``probe(row, observation_space)``: the first call, virtual, on one row
  of placeholders, that sizes the buffers
  (:func:`~rlplay.engine.core.fragments.prepare`); a failure gets a note
  saying what rlplay was doing;
- ``initial_hx(row)``: the actor's state for every env column at a reset
  (a virtual call with ``hx=None``, then ``reset``), checked to keep its
  layout;
- ``step(row, hx)``: a real step, the hot path, unchecked (its action
  and ``info`` may come without the row's leading axis of length 1: the
  fragment loops copy them into the row, where they broadcast); it is
  ``submit(row, hx)`` then ``wait()``, the call in two phases (as
  Gymnasium's vector envs have ``step_async`` and ``step_wait``), so that
  a policy served by another process fits the loops unchanged: ``submit``
  starts the call on the row (which must stay as it is until ``wait``),
  ``wait`` returns ``(act, hx_next, info)``; a local policy makes the call
  at once (``step`` calls the actor directly, the hot path); and
  ``checked_step(row, hx, act_like)``, the same call with the checks of
  its action, ``hx`` and ``info`` against the buffer's layout (once per
  fragment, every step of an evaluation);
- ``lookahead(row, hx)``: the virtual call whose ``info`` fills the last
  row of a fragment (:func:`fill_lookahead`: not made for an actor that
  records no ``info``);
- ``reset(hx, fin)``: ``hx`` with the columns ``fin`` (a bool tensor)
  reset.

:class:`LocalPolicy` is today's implementation: the actor called in this
process, on the rows themselves; :class:`FeedForwardPolicy` calls a
:class:`~rlplay.engine.actor.FeedForwardActor`'s ``act`` on each row's
observations ``(B, ...)`` in its ``step`` (views it makes once per row:
the view calls and the ``step`` around ``act`` are about 2% of a step of
64 CartPole envs and a small MLP); :class:`~.device.DevicePolicy` runs it
on a device of its own, moving each row there once (:mod:`.device`).
Served to several workers by another process, it is a further
implementation of these methods (:class:`~.served.ServedPolicy`), not a
branch of the loops.
"""
import torch

from ..actor import FeedForwardActor, check_actor
from ..nested import StructureError, check_structure, flatten, suply
from ..shared import copy_

__all__ = ["Policy", "LocalPolicy", "FeedForwardPolicy", "fill_lookahead",
           "copier", "feeds_forward"]


class Policy:
    """The methods through which the core loops call an actor (see the
    module docstring); an implementation defines :meth:`probe`,
    :meth:`initial_hx`, :meth:`submit`, :meth:`wait`, :meth:`lookahead`
    and :meth:`reset`, and may define :meth:`step` and
    :meth:`checked_step` as one call (:class:`LocalPolicy` does).

    ``device`` is where the actor runs: ``None``, where the rows are.
    """

    device = None

    def probe(self, row, observation_space):
        """The first, virtual, call on one ``row`` of placeholders:
        ``(act, hx, info)``."""
        raise NotImplementedError

    def initial_hx(self, row):
        """The actor's ``hx`` at a reset of every env column of ``row``."""
        raise NotImplementedError

    def submit(self, row, hx):
        """Start a real step from ``row`` (which stays as it is until
        :meth:`wait`) with ``hx``."""
        raise NotImplementedError

    def wait(self):
        """The ``(act, hx_next, info)`` of the step :meth:`submit`
        started."""
        raise NotImplementedError

    def step(self, row, hx):
        """A real step from ``row``: :meth:`submit` then :meth:`wait`."""
        self.submit(row, hx)
        return self.wait()

    def checked_step(self, row, hx, act_like):
        """:meth:`step`, its action checked against ``act_like`` (the
        buffer's action row), its ``hx`` against ``hx`` and its ``info``
        against the row's env columns."""
        act, hx_next, info = self.step(row, hx)
        _check_step(act, hx_next, info, row, hx, act_like)
        return act, hx_next, info

    def step_at(self, t, row, hx, act_like):
        """The step of row ``t`` of a fragment: :meth:`checked_step` at
        ``t = 0`` (once per fragment, the checks of a real call), else
        :meth:`step`; both fragment loops call this."""
        if t:
            return self.step(row, hx)
        return self.checked_step(row, hx, act_like)

    def lookahead(self, row, hx):
        """The ``info`` of a virtual step from ``row`` (the last row of a
        fragment)."""
        raise NotImplementedError

    def reset(self, hx, fin):
        """``hx`` with the env columns ``fin`` (bool tensor, ``(B,)``)
        reset."""
        raise NotImplementedError


class LocalPolicy(Policy):
    """The actor, called in this process (see the module docstring).

    Parameters
    ----------
    actor : BaseActorModule

    Raises
    ------
    TypeError
        Not an actor (:func:`~rlplay.engine.actor.check_actor`).
    """

    def __init__(self, actor):
        check_actor(actor)
        self.actor = actor
        self._pending = None  # the result of a submit(), until wait()

    def _move(self, row):
        """``row`` where the actor runs: the row itself (a
        :class:`~.device.DevicePolicy` copies it to its device)."""
        return row

    def probe(self, row, observation_space):
        """The first, virtual, call on one ``row`` (torch, ``(1, B,
        ...)``) of placeholders; returns ``(act, hx, info)``, the action
        and ``info`` checked against the row's layout."""
        moved = self._move(row)
        try:
            with torch.no_grad():
                act, hx, info = self.actor.step(*moved, hx=None,
                                                virtual=True)
        except Exception as exc:
            _add_note(exc, _probe_note(self.actor, row.obs,
                                       observation_space))
            raise
        _check_action(act, row.act)
        _check_info(info, row.fin.shape[1])
        return act, hx, info

    @torch.no_grad()
    def initial_hx(self, row):
        """``actor.reset`` of the hx a virtual step returns, for all
        envs."""
        _, hx, _ = self.actor.step(*self._move(row), hx=None, virtual=True)
        n_envs = row.fin.shape[1]
        hx0 = self.actor.reset(hx, torch.ones(n_envs, dtype=torch.bool,
                                              device=self.device))
        _check_hx(hx, hx0, "step()", "the hx that reset() makes of it")
        return hx0

    def step(self, row, hx):
        """A real step from ``row``: ``(act, hx_next, info)``, the call
        made at once (the hot path)."""
        return self.actor.step(*row, hx=hx, virtual=False)

    def submit(self, row, hx):
        """:meth:`step`, its result kept for :meth:`wait`."""
        self._pending = self.step(row, hx)

    def wait(self):
        """The result of the last :meth:`submit`.

        Raises
        ------
        RuntimeError
            No step was submitted since the last ``wait()``.
        """
        result, self._pending = self._pending, None
        if result is None:
            raise RuntimeError("wait() without a submit() before it")
        return result

    def checked_step(self, row, hx, act_like):
        act, hx_next, info = self.actor.step(*row, hx=hx, virtual=False)
        _check_step(act, hx_next, info, row, hx, act_like)
        return act, hx_next, info

    def lookahead(self, row, hx):
        """The ``info`` of a virtual step from ``row`` (the last row of a
        fragment)."""
        return self.actor.step(*row, hx=hx, virtual=True)[2]

    def reset(self, hx, fin):
        """``hx`` with the env columns ``fin`` (bool tensor, ``(B,)``)
        reset."""
        return self.actor.reset(hx, fin)


class FeedForwardPolicy(LocalPolicy):
    """A :class:`~rlplay.engine.actor.FeedForwardActor` (its own
    ``step``), called in this process: :meth:`step` is its ``act`` on the
    row's observations ``(B, ...)``, and returns its action and ``info``
    as ``act`` gives them, ``(B, ...)``.

    The views ``(B, ...)`` of a row's observations are made the first
    time the row is stepped and kept (up to :attr:`MAX_ROWS` rows, the
    rows of a few buffers: a fragment loop steps the same row views,
    fragment after fragment). The other calls (the first step of a
    fragment, checked; the lookahead; the probe) go through the actor's
    ``step``, which calls ``act`` on the same observations.
    """

    MAX_ROWS = 4096

    def __init__(self, actor):
        super().__init__(actor)
        self._flat = {}  # id(row): (row, its observations (B, ...))

    def step(self, row, hx):
        kept = self._flat.get(id(row))
        if kept is None or kept[0] is not row:
            kept = self._keep(row)
        act, info = self.actor.act(kept[1])
        return act, hx, info

    def _keep(self, row):
        if len(self._flat) >= self.MAX_ROWS:
            self._flat.clear()
        kept = self._flat[id(row)] = (row, suply(_row_batch, row.obs))
        return kept


def _row_batch(x):
    return x[0]


def feeds_forward(actor):
    """Whether ``actor`` is stepped by its ``act`` (a
    :class:`~rlplay.engine.actor.FeedForwardActor` with its own
    ``step``)."""
    return isinstance(actor, FeedForwardActor) and \
        type(actor).step is FeedForwardActor.step


def _same_kind(a, b):
    def kind(dtype):
        if dtype == torch.bool:
            return "b"
        return "f" if dtype.is_floating_point else (
            "c" if dtype.is_complex else "i")
    return kind(a) == kind(b) or {kind(a), kind(b)} == {"b", "i"}


def _check_action(act, expected):
    """The actor's action against the action space's layout.

    Structure mismatches name the space first, the action second (so that
    "missing keys" are keys the action lacks).
    """
    def check(want, got):
        if not isinstance(got, torch.Tensor):
            raise TypeError(f"the actor must return actions as tensors, got "
                            f"{type(got).__name__}")
        if got.shape != want.shape:
            raise ValueError(f"the actor returned an action of shape "
                             f"{tuple(got.shape)}, expected "
                             f"{tuple(want.shape)} (1, n_envs, *space.shape)")
        if not _same_kind(got.dtype, want.dtype):
            raise TypeError(f"the actor returned an action of dtype "
                            f"{got.dtype} for an action space of dtype "
                            f"{want.dtype}")

    try:
        check_structure(expected, act)
    except (StructureError, TypeError) as exc:
        raise type(exc)(f"the actor's action (second) does not match the "
                        f"action space (first): {exc}") from None
    suply(check, expected, act)


def _check_step(act, hx_next, info, row, hx, act_like):
    # the probe checked a virtual call; check a real one too, before
    # copy_ could broadcast a wrong shape
    _check_action(act, act_like)
    _check_hx(hx_next, hx, "step()", "the hx it was given")
    _check_info(info, row.fin.shape[1])


def _check_info(info, n_envs):
    for leaf in flatten(info):
        if not isinstance(leaf, torch.Tensor) or leaf.dim() < 2 \
                or leaf.shape[:2] != (1, n_envs):
            shape = tuple(leaf.shape) if isinstance(
                leaf, torch.Tensor) else type(leaf).__name__
            raise ValueError(f"the actor's info must hold tensors of shape "
                             f"(1, n_envs={n_envs}, ...), got {shape}")


def _describe_tensor(x):
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {x.dtype}"
    return f"a {type(x).__name__}"


def _check_hx(hx, expected, what, against):
    """``hx`` (returned by ``what``) against the ``expected`` layout.

    Structure mismatches name ``expected`` first, ``hx`` second.
    """
    def check(want, got):
        if not isinstance(got, torch.Tensor) or not isinstance(
                want, torch.Tensor) or got.shape != want.shape \
                or got.dtype != want.dtype:
            raise ValueError(f"the actor's hx from {what} holds "
                             f"{_describe_tensor(got)}, but {against} holds "
                             f"{_describe_tensor(want)}")

    try:
        suply(check, expected, hx)
    except (StructureError, TypeError) as exc:
        raise type(exc)(f"the actor's hx from {what} (second) does not "
                        f"match {against} (first): {exc}") from None


def _probe_note(actor, obs, space):
    """What a failure of the probe call was doing (see
    :func:`~rlplay.engine.core.fragments.prepare`)."""
    shapes = suply(lambda x: f"{tuple(x.shape)} {x.dtype}", obs)
    return (f"(raised while rlplay probed the actor {type(actor).__name__} "
            f"on one row of observations laid out as the env's first "
            f"observation, {shapes} for the observation space {space!r}, to "
            f"size the buffers: does the policy take inputs of that size "
            f"and dtype?)")


def _add_note(exc, note):
    # the exception is raised as it is, with a note where Python has them
    # (PEP 678, 3.11) and else with the note in its message when it has
    # one plain string argument
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    elif len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} {note}",)


def fill_lookahead(policy, info_row, row, hx):
    """Row ``T``'s ``info``, ``info_row``, from ``policy``'s lookahead
    call on ``row``: the one virtual call of a fragment. An actor that
    records no ``info`` is not called there, as nothing of the call would
    be kept (its real steps check that its ``info`` stays empty)."""
    if flatten(info_row):
        copy_(info_row, policy.lookahead(row, hx))


def copier(dst):
    """``copy(dst_row, src)``: ``copy_`` specialised to ``dst``'s layout.

    A single tensor or a flat dict of tensors (the usual action and info)
    is copied without walking the structure each step; the walk, with its
    structure checks, stays for anything else. Once per fragment the loop
    still checks the real structures (``_check_action``).
    """
    if isinstance(dst, torch.Tensor):
        return torch.Tensor.copy_
    if type(dst) is dict and not dst:
        return _copy_nothing
    if type(dst) is dict and all(isinstance(v, torch.Tensor)
                                 for v in dst.values()):
        return _copy_flat_dict
    return copy_


def _copy_nothing(dst, src):
    if src:  # the actor's info grew a key
        _check_structure_of("info", src, dst)


def _check_structure_of(what, got, expected):
    try:
        check_structure(got, expected)
    except (StructureError, TypeError) as exc:
        raise type(exc)(f"the actor's {what} changed its structure since "
                        f"the first call (now vs then): {exc}") from None


def _copy_flat_dict(dst, src):
    if src.keys() != dst.keys():
        _check_structure_of("info", src, dst)
    for key, leaf in dst.items():
        leaf.copy_(src[key])

