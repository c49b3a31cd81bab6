"""What runs in a worker, and what drives it from the learner.

- :mod:`._session`: the worker side: one :class:`Session` (seed, make the
  envs and the actor, fill fragment buffers or play evaluations), the
  members a supervisor runs (:func:`main`: a collector serving fragments,
  an evaluator serving evaluations) and the learner's end of the pipe;
  the messages between them, named types, in :mod:`._messages` (the
  start bundle :class:`WorkerConfig`, with an evaluating worker's
  :class:`EvaluationSpec`);
- :mod:`._supervisor`: worker processes under a restart policy
  (:mod:`._restarts`), one bounded wait on every pipe and sentinel, an
  ordered shutdown; :mod:`._ray`, the same for Ray actors (both sides);
- :mod:`._server` and :mod:`._grouped`: served inference, one server
  running the actor for every worker of a pool
  (:class:`ServedSupervisor`), and the loop of a served worker, its envs
  in groups;
- :mod:`._params`: the actor's parameters shared with the workers
  (:class:`SharedParams`, :class:`RayParams`);
- :mod:`._control`: env control, ``call_envs`` from the learner to every
  env (the calls, their delivery beside the parameters, their
  application in a worker);
- :mod:`._buffers` and :mod:`._batch`: the sources of ready fragments
  (a pool of shared buffers and its protocol; the ready queue) and their
  collation into a batch.

The generators of :mod:`rlplay.engine.rollout` are built from these;
nothing here imports them. Every module is private: the other folders of
rlplay import what ``__all__`` names, from here.
"""
from ._batch import Arrival, Collation, ReadyQueue, check_hx_dim, new_account
from ._buffers import WORKER_THREADS, SharedBuffers
from ._control import (MAX_CALL_BYTES, CallEnvs, CallLog, CallMail,
                       WorkerCalls, saved_calls)
from ._messages import (STOP, Buffers, Bye, Evaluate, EvaluationSpec, Failed,
                        Give, Ready, Result, SessionSpec, WorkerConfig)
from ._params import RayParams, SharedParams, cpu_copy
from ._ray import RemoteSupervisor, join, ray_options
from ._restarts import RESTART_DELAY, RestartPolicy
from ._session import LearnerLink, Session, main
from ._supervisor import Supervisor
from ._server import (SERVED_STATS, ServedSupervisor, ServeOptions,
                      serve_main)

__all__ = [
    "Arrival", "Collation", "ReadyQueue", "check_hx_dim", "new_account",
    "WORKER_THREADS", "SharedBuffers",
    "MAX_CALL_BYTES", "CallEnvs", "CallLog", "CallMail", "WorkerCalls",
    "saved_calls",
    "STOP", "Buffers", "Bye", "Evaluate", "EvaluationSpec", "Failed", "Give",
    "Ready", "Result", "SessionSpec", "WorkerConfig",
    "RayParams", "SharedParams", "cpu_copy",
    "RemoteSupervisor", "join", "ray_options",
    "RESTART_DELAY", "RestartPolicy",
    "LearnerLink", "Session", "main",
    "Supervisor",
    "SERVED_STATS", "ServedSupervisor", "ServeOptions", "serve_main",
]
