"""SharedParams: versions, modes, and no hang on a lock left by a dead
process."""
import os
import signal

import pytest
import torch
from torch import nn

from rlplay.engine import RolloutTimeout, WorkerDied
from rlplay.engine.workers._params import SharedParams
from rlplay.engine.utils import bounded_acquire, get_context

from bounds import JOIN  # the reason in bounds.py


def _hold_lock_and_die(params, conn):
    params._version.get_lock().acquire()
    conn.send("holding")
    os.kill(os.getpid(), signal.SIGKILL)


def test_publish_and_load_copy_tensors_mode_and_version():
    ctx = get_context("fork")
    learner, worker = nn.Linear(3, 2), nn.Linear(3, 2)
    params = SharedParams(learner, ctx)
    assert params.version == 0
    with torch.no_grad():
        learner.weight.fill_(2.0)
    learner.eval()
    assert params.publish(learner) == 1
    assert params.load(worker) == 1
    assert torch.equal(worker.weight, learner.weight)
    assert not worker.training
    with torch.no_grad():
        worker.weight.zero_()
    # a known version is not copied again
    assert params.load(worker, known=1) == 1
    assert float(worker.weight.detach().abs().sum()) == 0.0


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_publish_reports_a_holder_that_died_instead_of_hanging(start_method):
    ctx = get_context(start_method)
    params = SharedParams(nn.Linear(3, 2), ctx)
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_hold_lock_and_die, args=(params, there))
    proc.start()
    try:
        assert here.recv() == "holding"
        proc.join(JOIN)
        assert proc.exitcode == -signal.SIGKILL

        def check():
            if not proc.is_alive():
                raise WorkerDied("the holder died", exitcode=proc.exitcode)

        with pytest.raises(WorkerDied):
            params.publish(nn.Linear(3, 2), check=check)
    finally:
        proc.join(JOIN)
        if proc.is_alive():
            proc.kill()
            proc.join()


@pytest.mark.parametrize("with_check", [False, True])
def test_bounded_acquire_times_out_on_a_live_holder(with_check):
    lock = get_context("fork").Lock()
    lock.acquire()
    checks = []
    with pytest.raises(RolloutTimeout):
        with bounded_acquire(lock, (lambda: checks.append(1)) if with_check else None,
                             timeout=0.3):
            pass
    assert bool(checks) == with_check


# ------------------------------------------------- the kit's shared helpers --

def test_public_names_live_where_the_readme_says():
    import rlplay.engine as engine
    import rlplay.engine.utils as utils
    from rlplay.engine import errors, pool
    from rlplay.engine.utils import mp
    for name in ("CapacityError", "RemoteTraceback", "RolloutError",
                 "RolloutTimeout", "WorkerDied", "WorkerError"):
        assert getattr(engine, name) is getattr(errors, name), name
        assert name in engine.__all__, name
    assert pool.CapacityError is errors.CapacityError
    for name in utils.__all__:
        assert getattr(utils, name) is getattr(mp, name), name
    # the kit no longer re-exports errors or pool names
    assert not hasattr(utils, "WorkerError")
    assert not hasattr(utils, "Segment")


def test_worker_died_names_the_worker_and_the_exit():
    ctx = get_context("fork")
    proc = ctx.Process(target=os._exit, args=(3,))
    proc.start()
    proc.join()
    err = WorkerDied.of(proc, 2, "fragment 7")
    assert (err.exitcode, err.worker) == (3, 2)
    assert str(err) == (f"worker 2 (pid {proc.pid}) died with exit code 3 "
                        f"while the learner waited for fragment 7")
    proc.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(timeout=-1), "timeout must be None or a number of seconds of at "
                       "least 0, got -1"),
    (dict(start_timeout="1"), "start_timeout must be None or a number"),
    (dict(shutdown_timeout=None), "shutdown_timeout must be a number of "
                                  "seconds of at least 0, got None"),
    (dict(timeout=float("nan")), "timeout must be None or a number"),
    (dict(timeout=float("inf")), r"timeout must be a finite number of "
                                 r"seconds, got inf \(None drops"),
    (dict(shutdown_timeout=float("inf")), "shutdown_timeout must be a "
                                          "finite number"),
])
def test_check_timeouts(kwargs, match):
    from rlplay.engine.utils import check_timeouts
    with pytest.raises(ValueError, match=match):
        check_timeouts(**kwargs)
    check_timeouts(timeout=None, start_timeout=0, shutdown_timeout=1.5)


def test_first_timeout_is_finite_for_a_finite_timeout():
    from rlplay.engine.utils import first_timeout
    assert first_timeout(2.0, None) == 2.0
    assert first_timeout(2.0, 3.0) == 5.0
    assert first_timeout(None, 3.0) is None
