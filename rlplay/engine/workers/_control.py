"""Env control: ``feed.call_envs(name, *args, **kwargs)`` of every generator
(``same``, ``single``, ``multi``, ``cluster``, the
:class:`~rlplay.engine.rollout.evaluate.Evaluator`, and ``episodic`` over
them), the whole story (the generators' method is
:func:`rlplay.engine.rollout._calls.call_envs`).

A call is checked and cloudpickled once, in the learner, when it is made
(:class:`CallLog`: refused up front where the method is ``reset``,
``step`` or ``close``, the arguments do not pickle or pickle to more than
:data:`MAX_CALL_BYTES`, or the envs' source cannot take calls, EnvPool).
It is *published* with the actor's parameters, by the next ``next()``
(``submit()`` for the evaluator) that publishes them, and reaches each
worker beside them (:class:`CallMail`): down the worker's pipe, as a
:class:`CallEnvs` order sent before the publication (worker processes),
or inside the next request, which carries the parameters (Ray actors;
``same`` hands them to its session in the caller's process). A worker
applies the calls it received, in order, at its next fragment boundary
(with the parameters of its next fragment, never inside a fragment; the
evaluator's, before its next evaluation), through its env
batch (:mod:`rlplay.engine.envs.control`: every env's method, or
``VectorEnv.call``, or each PettingZoo env's), and stamps every fragment
with the number of calls applied before its first step
(``meta.control``; the evaluator's result, ``Evaluation.control``)::

    learner                                  worker w
    -------                                  --------
    call_envs("set_level", 3) → 1            ...collect fragment (control 0)
    next(): publish the calls ─ CallEnvs ──► (queued on the pipe)
            publish the parameters v_k       Ready(..., control=0)
                                             take orders: CallEnvs
                                             load v_k; set_level(3) on
                                             every env; collect (control 1)
                                       ◄──── Ready(..., control=1)

Flow control (processes): a worker's ``Ready`` (``Result``) says how
many calls it applied; the learner sends a worker new calls only once it
applied those sent before, at most :data:`MAX_CALL_BYTES` at a time, so
that a worker that stops reading its pipe (an env hung in a step) never
makes the learner wait to send. A slow worker gets a call one
publication later, never out of order.

Kept: a worker that starts (the first one, a replacement after a
restart, a resumed run's) applies every call published so far before it
resets its envs, so ``meta.control`` means the same calls whatever
happened to the worker; the calls are part of the generator's
``state_dict()`` (:func:`saved_calls`), and a resumed run applies them
all before collecting. A call whose method is missing or raises is an
:class:`~rlplay.engine.errors.EnvCallError` (in a worker: a
:class:`~rlplay.engine.errors.WorkerError` of that type), raised by the
next ``next()`` and never restarted: a replacement applies every call
again, and would fail alike.
"""
import base64
import binascii
import pickle
from typing import Any, NamedTuple

import cloudpickle

from ..envs import check_method
from ..errors import EnvCallError

__all__ = ["MAX_CALL_BYTES", "CallEnvs", "CallLog", "CallMail",
           "WorkerCalls", "saved_calls"]

# the largest pickled call (name and arguments) in bytes: with the flow
# control above, what waits on a worker's pipe stays far below the room
# of its socket (about 208 KiB on Linux), so a send never waits
MAX_CALL_BYTES = 64 * 1024

class CallEnvs(NamedTuple):
    """Learner -> worker (processes): the calls numbered ``first + 1``,
    ``first + 2``, ... (``payloads``, cloudpickled)."""
    first: Any
    payloads: Any


def _encode(name, args, kwargs):
    check_method(name)
    try:
        payload = cloudpickle.dumps((name, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - refused, saying why
        raise TypeError(
            f"call_envs: the arguments of {name}() cannot be pickled "
            f"({type(exc).__name__}: {exc}); they travel to every worker: "
            f"pass plain values") from None
    if len(payload) > MAX_CALL_BYTES:
        raise ValueError(
            f"call_envs: the arguments of {name}() pickle to {len(payload)} "
            f"bytes, more than {MAX_CALL_BYTES}: pass a smaller description "
            f"(a file name, a seed) and let the env load the rest")
    return payload


class CallLog:
    """The calls made on a generator's envs, in order (the learner's side).

    Parameters
    ----------
    saved : list of (name, payload)
        A resumed run's calls (:func:`saved_calls`), published already.

    Attributes
    ----------
    payloads : list of bytes
        Each call cloudpickled as ``(name, args, kwargs)``.
    published : int
        How many of them were published.
    refusal : str or None
        Why the envs' source cannot take calls (set at set-up).
    """

    def __init__(self, saved=()):
        self.names = [name for name, _ in saved]
        self.payloads = [payload for _, payload in saved]
        self.published = len(self.payloads)
        self.refusal = None

    def add(self, name, args, kwargs):
        """Check and keep a call; returns its number (1 for the first)."""
        if self.refusal is not None:
            raise TypeError(self.refusal)
        payload = _encode(name, args, kwargs)
        self.names.append(name)
        self.payloads.append(payload)
        return len(self.payloads)

    def publish(self):
        """Every call made so far is published (with the parameters)."""
        self.published = len(self.payloads)

    def since(self, first):
        """The published calls after the ``first``, as one order."""
        return CallEnvs(first, tuple(self.payloads[first:self.published]))

    def state(self):
        """The ``calls`` entry of a ``state_dict()``: plain values (each
        payload in base64), loadable with ``torch.load(weights_only=True)``.
        """
        return [{"method": name, "payload": base64.b64encode(payload)
                 .decode("ascii")}
                for name, payload in zip(self.names, self.payloads)]


def saved_calls(state, where="resume['calls']"):
    """The calls of a ``state_dict()`` as ``[(name, payload), ...]``; a
    state without them (saved before generators had ``call_envs``) has
    none.

    Raises
    ------
    TypeError, ValueError
        A damaged entry, named by its path (``where[i]``).
    """
    calls = state.get("calls", [])
    if not isinstance(calls, (list, tuple)):
        raise TypeError(f"{where} must be a list of calls, got {calls!r}")
    saved = []
    for i, call in enumerate(calls):
        if not (isinstance(call, dict) and isinstance(call.get("method"), str)
                and isinstance(call.get("payload"), str)):
            raise TypeError(f"{where}[{i}] must be a dict of a method's "
                            f"name and a payload (str), got {call!r}")
        try:
            payload = base64.b64decode(call["payload"], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{where}[{i}]['payload'] is not base64, got "
                             f"{call['payload'][:40]!r}") from None
        saved.append((call["method"], payload))
    return saved


class CallMail:
    """Which calls each worker was sent (see the module docstring).

    Parameters
    ----------
    log : CallLog
    n_workers : int
    gated : bool
        Send a worker new calls only once it applied those sent before
        (processes; a Ray actor runs its requests in order).
    """

    def __init__(self, log, n_workers, gated):
        self.log, self.gated = log, gated
        self.sent = [log.published] * n_workers
        self.applied = list(self.sent)

    def start(self, w):
        """The calls that worker ``w``, starting, applies before its first
        reset: every one published."""
        n = self.sent[w] = self.applied[w] = self.log.published
        return tuple(self.log.payloads[:n])

    def take(self, w):
        """The next :class:`CallEnvs` to send worker ``w`` (``None``:
        nothing now), at most :data:`MAX_CALL_BYTES` of them (but one)."""
        first, log = self.sent[w], self.log
        if first >= log.published or (self.gated
                                      and self.applied[w] < first):
            return None
        last, size = first + 1, len(log.payloads[first])
        while last < log.published and \
                size + len(log.payloads[last]) <= MAX_CALL_BYTES:
            size += len(log.payloads[last])
            last += 1
        self.sent[w] = last
        return CallEnvs(first, tuple(log.payloads[first:last]))

    def applied_by(self, w, control):
        """Worker ``w`` says it applied ``control`` calls."""
        self.applied[w] = max(self.applied[w], control)


class WorkerCalls:
    """The calls a worker received and how many it applied (its side)."""

    def __init__(self, payloads=()):
        self.payloads = list(payloads)
        self.applied = 0

    def receive(self, order):
        """Keep the calls of a :class:`CallEnvs` (sent in order)."""
        assert order.first <= len(self.payloads), (order.first,
                                                   len(self.payloads))
        self.payloads.extend(order.payloads[len(self.payloads)
                                            - order.first:])

    def apply(self, session):
        """Apply the calls not applied yet to ``session``'s envs, in
        order, and stamp its context's ``control``; returns the number
        applied in all.

        Raises
        ------
        EnvCallError
            A call's method is missing or raised, or its arguments do not
            unpickle here.
        """
        while self.applied < len(self.payloads):
            number = self.applied + 1
            session.stage = "the envs' calls"
            try:
                name, args, kwargs = pickle.loads(self.payloads[number - 1])
            except Exception as exc:  # noqa: BLE001 - reported, with cause
                raise EnvCallError(
                    f"call {number} of call_envs does not unpickle here: "
                    f"{type(exc).__name__}: {exc}") from exc
            try:
                session.envs.call(name, args, kwargs)
            except EnvCallError as exc:
                exc.args = (f"call {number} of call_envs: {exc}",)
                raise
            self.applied = number
        if session.ctx is not None:
            session.ctx.control = self.applied
        return self.applied
