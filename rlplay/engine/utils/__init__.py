"""Multiprocessing kit: start methods, cloudpickled factories, worker error
records and bounded waits."""
from .mp import (DEFAULT_START_METHOD, POLL_INTERVAL, CloudpickleWrapper,
                 ErrorRecord, RemoteTraceback, RolloutError, RolloutTimeout,
                 WorkerDied, WorkerError, describe_exitcode, get_context,
                 join_or_kill, recv)
from .packed import PackedTensors
from .params import SharedParams, cpu_copy, seed_worker
from .worker import (FORKSERVER_PRELOAD, STOP, Cloudpickled, LearnerLink,
                     WorkerProcess, ignore_interrupts, preload_forkserver)

__all__ = [
    "DEFAULT_START_METHOD", "POLL_INTERVAL", "CloudpickleWrapper",
    "ErrorRecord", "RemoteTraceback", "RolloutError", "RolloutTimeout",
    "WorkerDied", "WorkerError", "describe_exitcode", "get_context",
    "join_or_kill", "recv", "SharedParams", "cpu_copy", "seed_worker",
    "FORKSERVER_PRELOAD", "STOP", "Cloudpickled", "LearnerLink",
    "WorkerProcess", "ignore_interrupts", "preload_forkserver",
    "PackedTensors",
]
