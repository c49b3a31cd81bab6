"""Multiprocessing kit: start methods, cloudpickled factories, worker error
records, bounded waits, shared parameters and shared-memory pools."""
from .mp import (DEFAULT_START_METHOD, POLL_INTERVAL, CloudpickleWrapper,
                 ErrorRecord, RemoteTraceback, RolloutError, RolloutTimeout,
                 WorkerDied, WorkerError, check_timeouts,
                 describe_exitcode, first_timeout, get_context, join_or_kill,
                 recv)
from .packed import PackedTensors
from .params import LOCK_TIMEOUT, SharedParams, bounded_acquire, cpu_copy
from .pool import (CapacityError, Field, Segment, check_capacity, fd_limit,
                   layout, open_fds, shm_free_bytes, views)
from .worker import (FORKSERVER_PRELOAD, STOP, Cloudpickled,
                     LearnerLink, WorkerProcess, ignore_interrupts,
                     preload_forkserver, start_worker)

__all__ = [
    "DEFAULT_START_METHOD", "POLL_INTERVAL", "CloudpickleWrapper",
    "ErrorRecord", "RemoteTraceback", "RolloutError", "RolloutTimeout",
    "WorkerDied", "WorkerError", "check_timeouts",
    "describe_exitcode", "first_timeout", "get_context", "join_or_kill",
    "recv", "PackedTensors", "LOCK_TIMEOUT", "SharedParams",
    "bounded_acquire", "cpu_copy",
    "CapacityError", "Field", "Segment", "check_capacity", "fd_limit",
    "layout", "open_fds", "shm_free_bytes", "views", "FORKSERVER_PRELOAD", "STOP",
    "Cloudpickled", "LearnerLink", "WorkerProcess", "ignore_interrupts",
    "preload_forkserver", "start_worker",
]
