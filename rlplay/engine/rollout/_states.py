"""The states of a generator (of the evaluator too) and its error latch.

States (:class:`Status`)::

    OPEN ──close()──────────────────────────► CLOSED  next(): StopIteration
      └──an error, or Ctrl-C, inside next()─► BROKEN  next(): the same error

The one Ctrl-C rule: a ``KeyboardInterrupt`` (or any exception) raised
while ``next()``, ``submit()``, ``poll()`` or ``result()`` works breaks the
generator. It may have arrived in the middle of a message on a pipe or of
a copy, so nothing can be trusted to resume: the workers are torn down at
once (no waiting for their cooperation), the interrupt propagates, and
every later call raises :class:`~rlplay.engine.errors.RolloutError` saying
that it was interrupted (for an error, the same error again). The one
exception to "an error breaks it" is the evaluator's ``result(timeout=)``
running out, which leaves the request outstanding, as
:meth:`concurrent.futures.Future.result` does.
"""
import enum

from ..errors import RolloutError

__all__ = ["Status", "Lifecycle"]


class Status(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"
    BROKEN = "broken"


class Lifecycle:
    """The one base of every generator (and of the evaluator): the states
    of the module docstring, the error latch, ``close()`` and ``with``.

    A subclass implements ``_close(graceful)`` (release everything;
    ``graceful=False`` after a failure) and runs its calls under
    :meth:`_guarded`; a generator's ``__next__`` is
    ``self._guarded(<its next batch>, stop=StopIteration)``. What it is
    made of (the set-up, the supervision of its workers, the source of
    fragments, the collation, the delivery) it holds as attributes, parts
    that hold no reference to it, so that dropping it closes it at once.
    """

    status = Status.OPEN
    _error = None

    def _guarded(self, call, *args, stop=None, keep=()):
        """``call(*args)`` under the rule of the module docstring;
        ``stop`` is raised when closed, errors in ``keep`` pass through."""
        if self.status is Status.BROKEN:
            raise self._error
        if self.status is Status.CLOSED:
            raise stop
        try:
            return call(*args)
        except keep:
            raise
        except BaseException as exc:
            self._break(exc)
            raise

    def _break(self, exc):
        self._error = exc if isinstance(exc, Exception) else RolloutError(
            f"{type(self).__name__} was broken by {type(exc).__name__} "
            f"while it waited; make a new one")
        self.status = Status.BROKEN
        self._close(graceful=False)

    def close(self):
        """Stop the workers and release the buffers; idempotent. Later
        calls end the iteration (or raise the error that broke it)."""
        if self.status is Status.OPEN:
            self.status = Status.CLOSED
            self._close(graceful=True)

    def _close(self, graceful):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
