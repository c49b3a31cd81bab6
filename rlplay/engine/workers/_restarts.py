"""The restart policy, one for every supervisor (:mod:`._supervisor`'s
processes, :mod:`._ray`'s Ray actors).

A failed worker is replaced, generation ``g + 1`` after ``restart_delay``
seconds, unless

- the failure is not restartable: an exception raised by the actor, or by
  rlplay's checks of what the actor and the envs return (a bug in the
  user's code, not a crashing env);
- it is a crash loop: this generation failed before delivering anything,
  and so did the one before;
- the budget (``restarts``, a total for the run) is spent.

Then the failure is raised, with the count ("... after 2 restarts").

Scheduling, for both supervisors: :meth:`RestartPolicy._replace` sets the
member's ``due`` time; every wait for news is cut to the next due time
(:meth:`RestartPolicy.until_due`), and after it
:meth:`RestartPolicy.start_due` starts those due, with the supervisor's
own start (which clears ``due``); none once the supervisor is ``closed``.
"""
import time

__all__ = ["Member", "RestartPolicy", "reported", "RESTART_DELAY"]

# seconds before a failed worker's replacement starts, by default (a
# keyword of the generators, in the table of rlplay/engine/rollout)
RESTART_DELAY = 1.0


class Member:
    """What a supervisor knows of worker ``index``, restart-wise;
    ``account`` receives ``restarts``, ``lost`` and ``last_cause``."""

    def __init__(self, index, account):
        self.index, self.account, self.generation = index, account, 0
        self.due = None             # when its replacement starts
        self.delivered = False      # this generation delivered something
        self.failed_early = False   # the previous one failed before that
        account.update(restarts=0, lost=0, last_cause=None)


class RestartPolicy:
    """Mixin of a supervisor of ``members`` (:class:`Member`): ``budget``,
    ``restart_delay``, ``restarts`` (used so far), ``accounts`` (the
    members'), ``closed`` (set by the supervisor's shutdown);
    :meth:`_fail` raises or counts a replacement, which :meth:`until_due`
    and :meth:`start_due` schedule."""

    def __init__(self, members, restarts, restart_delay, run=None):
        self._members = members
        self.accounts = [member.account for member in members]
        self.closed = False
        self.budget, self.restart_delay = restarts, restart_delay
        self.restarts = 0
        if run is not None:  # a resumed run goes on with its counts
            self.restarts = int(run.counters.get("restarts", 0))
            for member in members:
                member.generation = run.generation[member.index]
                member.account["restarts"] = run.restarts[member.index]

    def positions(self, ready):
        """Per member, ``(seq, generation, restarts)`` for a state (see
        :mod:`._resume`): the ``meta.seq`` after its last fragment
        delivered (from the :class:`~._batch.ReadyQueue` ``ready``), its
        generation, its replacements."""
        return [(ready.next_seq[m.index], m.generation,
                 m.account["restarts"]) for m in self._members]

    @property
    def starting(self):
        """Whether a worker has not delivered yet since it started (its
        start-up gets ``start_timeout`` more)."""
        return any(not m.delivered for m in self._members)

    @property
    def replacing(self):
        """Whether a replacement waits out its ``restart_delay``."""
        return any(m.due is not None for m in self._members)

    def _fail(self, member, exc, restartable, cause):
        """Raise ``exc`` (with the reason) unless ``member`` is to be
        replaced; then the caller retires it and calls :meth:`_replace`."""
        member.account["last_cause"] = cause
        crash_loop = not member.delivered and member.failed_early
        if restartable and not crash_loop and self.restarts < self.budget:
            return
        if crash_loop:
            exc.args = (exc.args[0] + f" (a crash loop: generation "
                        f"{member.generation} of worker {member.index} "
                        f"failed before delivering, as did the one "
                        f"before)",)
        if self.restarts:
            exc.args = (exc.args[0] + f" after {self.restarts} restart"
                        f"{'s' * (self.restarts != 1)}",)
        raise exc

    def _replace(self, member, lost):
        """Count ``member``'s restart (``lost`` fragments in flight) and
        schedule its next generation."""
        member.account["lost"] += lost
        member.account["restarts"] += 1
        self.restarts += 1
        member.failed_early = not member.delivered
        member.generation += 1
        member.due = time.monotonic() + self.restart_delay

    def until_due(self, timeout):
        """``timeout`` (seconds, ``None``: no bound) cut to the time left
        until the next replacement is due."""
        due = [m.due for m in self._members if m.due is not None]
        if not due:
            return timeout
        until = max(0.0, min(due) - time.monotonic())
        return until if timeout is None else min(timeout, until)

    def start_due(self, start):
        """Call ``start(member)`` (which clears its ``due``) for every
        member whose replacement is due, unless ``closed``; returns how
        many were started."""
        now = time.monotonic()
        due = [] if self.closed else [
            m for m in self._members if m.due is not None and m.due <= now]
        for member in due:
            start(member)
        return len(due)


def reported(failed, worker):
    """``(exc, restartable, cause)`` of a worker's
    :class:`._session.Failed` report, as :meth:`RestartPolicy._fail`
    takes them."""
    record = failed.record
    return (record.to_exception(worker=worker), failed.restartable,
            f"{record.type_name}: {record.message}")
