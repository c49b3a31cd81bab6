"""Multiprocessing kit: start methods, cloudpickled factories, worker error
records and bounded waits."""
from .mp import (DEFAULT_START_METHOD, POLL_INTERVAL, CloudpickleWrapper,
                 ErrorRecord, RemoteTraceback, RolloutError, RolloutTimeout,
                 WorkerDied, WorkerError, describe_exitcode, get_context,
                 join_or_kill, recv)
from .params import SharedParams, cpu_copy, seed_worker

__all__ = [
    "DEFAULT_START_METHOD", "POLL_INTERVAL", "CloudpickleWrapper",
    "ErrorRecord", "RemoteTraceback", "RolloutError", "RolloutTimeout",
    "WorkerDied", "WorkerError", "describe_exitcode", "get_context",
    "join_or_kill", "recv", "SharedParams", "cpu_copy", "seed_worker",
]
