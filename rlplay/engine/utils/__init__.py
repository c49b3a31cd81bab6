"""Multiprocessing kit: start methods, cloudpickled factories, worker error
records, bounded waits and orphan guards (see :mod:`.mp`)."""
from .mp import (DEFAULT_START_METHOD, FORKSERVER_PRELOAD, LOCK_TIMEOUT,
                 POLL_INTERVAL, AutoAffinity, Cloudpickled, ErrorRecord,
                 bounded_acquire, check_cpu_affinity, check_timeouts,
                 first_timeout, end_group, ended, get_context, guard_group,
                 guard_parent, ignore_interrupts, join_or_kill, local_rank,
                 preload_forkserver, rank_cores, set_cpu_affinity,
                 wait_ended, worker_cpu_affinity)

__all__ = [
    "DEFAULT_START_METHOD", "FORKSERVER_PRELOAD", "LOCK_TIMEOUT",
    "POLL_INTERVAL", "AutoAffinity", "Cloudpickled", "ErrorRecord",
    "bounded_acquire", "check_cpu_affinity", "check_timeouts", "end_group",
    "ended", "first_timeout", "get_context", "guard_group", "guard_parent",
    "ignore_interrupts", "join_or_kill", "local_rank", "preload_forkserver",
    "rank_cores", "set_cpu_affinity", "wait_ended", "worker_cpu_affinity",
]
