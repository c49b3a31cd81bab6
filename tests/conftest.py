import importlib.util
import os
import signal
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from procs import children, descendants  # noqa: E402
import ray_start  # noqa: E402

# helper processes of multiprocessing itself that outlive a test by design
_PERSISTENT = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")

# the session's local Ray (the ray_cluster fixture): its own processes
# (gcs_server, raylet, monitors, agents, the raylet's pool of idle workers)
# outlive a test by design, and are let off; below them, a process that
# runs a Ray actor or task ("ray::RemoteWorker...") is not
RAY_OBJECT_STORE = 200 * 2**20
# every Ray the tests start (this session's, cluster_nodes.py's nodes, the
# notebooks' local ones) runs its actors at the tests' own priority: at
# Ray's default, nice 15, a starting actor (importing torch) went without
# CPU for minutes while other work kept both cores busy, and the tests
# check what is delivered, not how Ray shares a loaded machine
os.environ.setdefault("RAY_worker_niceness", "0")
# and waits for its GCS server's port as long as a loaded machine needs
# (ray_start.py says why)
os.environ.setdefault("RAY_gcs_server_port_wait_time_s",
                      str(ray_start.GCS_PORT_WAIT))
_RAY_ROOTS = set()
_RAY_IDLE = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


_direct_children = children  # the name the tests import


def _ray_own(cmd):
    # one of Ray's processes, not one running an actor or a task
    return not cmd.startswith("ray::") or cmd.startswith(_RAY_IDLE)


def _children():
    """Live descendants of this process, but for multiprocessing's own
    helper processes and the session's Ray processes; the workers a
    forkserver started for us are the helper's children, so the walk goes
    on below it (and below Ray's, for its actors)."""
    direct = _direct_children(os.getpid())
    alive, todo, seen = {}, [(pid, False) for pid in direct], set()
    while todo:
        pid, under_ray = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        under_ray = under_ray or pid in _RAY_ROOTS
        todo.extend((child, under_ray) for child in _direct_children(pid))
        # a forkserver's children inherit its command line: only the
        # helpers themselves (our direct children) are let off
        helper = pid in direct and any(name in cmd for name in _PERSISTENT)
        if state != "Z" and not helper and not (under_ray and _ray_own(cmd)):
            alive[pid] = cmd
    return alive


# how long one query of Ray's actor table may take (bounds.py says why),
# and how many are tried
from bounds import GCS_QUERY as GCS_QUERY_TIMEOUT, REAPED  # noqa: E402
GCS_QUERY_TRIES = 2


def _ray_actors(strict=True):
    """``{actor id: pid}`` of the Ray actors not dead, when this process
    has joined Ray (the public state API, ray.util.state, needs Ray's
    dashboard, which the tests do not start: the driver's view of the GCS
    tables answers the same).

    Bounded: Ray's synchronous query waits on its reply without a
    deadline, and a reply that never came left a test's teardown waiting
    for good (twice, with two test sessions and a ``ray start`` cluster on
    one loaded machine). The query runs in a thread (it releases the GIL)
    and is asked again once; no answer is an error (``strict``) or
    ``None``.
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    from ray._private import state
    def ask(answer):
        try:
            answer.append(state.actors())
        except BaseException as exc:  # noqa: BLE001 - raised below
            answer.append(exc)

    for _ in range(GCS_QUERY_TRIES):
        answer = []
        query = threading.Thread(target=ask, args=(answer,), daemon=True,
                                 name="rlplay-tests-gcs-query")
        query.start()
        query.join(GCS_QUERY_TIMEOUT)
        if answer and isinstance(answer[0], BaseException):
            raise answer[0]
        if answer:
            return {actor_id: info.get("Pid") for actor_id, info
                    in answer[0].items() if info["State"] != "DEAD"}
    if not strict:
        return None
    raise RuntimeError(f"Ray's GCS did not answer {GCS_QUERY_TRIES} queries "
                       f"of its actor table within {GCS_QUERY_TIMEOUT} s "
                       f"each")


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray for the whole session (2 CPUs, a small object store),
    shut down at its end. ``address="local"`` starts a new one: a bare
    ``ray.init()`` would join any cluster that a temporary file names."""
    ray = pytest.importorskip("ray")
    before = _direct_children(os.getpid())
    # its workers import the tests' envs and actors by reference: they
    # inherit the environment of the processes that ray.init starts
    path = os.environ.get("PYTHONPATH")
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join([here] + ([path] if path
                                                         else []))

    def init():
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 object_store_memory=RAY_OBJECT_STORE, log_to_driver=False)

    def clean_up():
        # what a start that timed out left: its processes (the GCS server,
        # the raylet and theirs), which this process started
        ray.shutdown()
        left = _direct_children(os.getpid()) - before
        for pid in [*left, *(p for pid in left for p in descendants(pid))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in left:
            try:
                os.waitpid(pid, 0)  # killed: ends at once
            except ChildProcessError:
                pass

    try:
        # once more where Ray's fixed 30 s for the raylet ran out on a
        # loaded machine (ray_start.py)
        ray_start.start(init, clean_up)
    finally:
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path
    _RAY_ROOTS.update(_direct_children(os.getpid()) - before)
    yield ray
    ray.shutdown()
    _RAY_ROOTS.clear()


@pytest.fixture(autouse=True)
def ray_comes_last(request):
    """Fail a test that is not on Ray but runs in a process where Ray was
    started: the order that :func:`pytest_collection_modifyitems` sets
    was lost (a test forking there could hang, see that hook)."""
    ray = sys.modules.get("ray")
    if ray is not None and not _uses_ray(request.node) and \
            ray.is_initialized():
        pytest.fail("a test runs after Ray was started in its process: the "
                    "tests on Ray must come last (tests/conftest.py)")


@pytest.fixture(autouse=True)
def no_child_left_behind():
    """Fail a test that leaves a child process running, or a Ray actor
    alive: an actor's process is one of the children walked (below Ray's
    processes), and the GCS's actor table also shows the actors whose
    process has not started yet; where the GCS does not answer (see
    :func:`_ray_actors`), the processes alone are checked."""
    before, actors_before = set(_children()), _ray_actors(strict=False)
    yield
    deadline = time.monotonic() + REAPED
    while True:
        left = {pid: cmd for pid, cmd in _children().items()
                if pid not in before}
        now = None if actors_before is None else _ray_actors(strict=False)
        actors = {} if now is None else {
            actor: pid for actor, pid in now.items()
            if actor not in actors_before}
        if not (left or actors) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if actors:
        for pid in actors.values():
            if pid and pid != os.getpid():  # 0 until the actor runs
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        pytest.fail(f"the test left Ray actors alive: {actors}")
    if left:
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        pytest.fail(f"the test left child processes behind: {left}")


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    """Fail a test that leaves one of rlplay's threads running (a
    prefetch thread: ``rlplay-...-prefetch``), waiting for it as long as
    for a process."""
    def ours():
        return {t for t in threading.enumerate()
                if t.name.startswith("rlplay-") and t.name.endswith(
                    "-prefetch")}

    before = ours()
    yield
    deadline = time.monotonic() + REAPED
    while (ours() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    left = ours() - before
    if left:
        pytest.fail(f"the test left threads behind: "
                    f"{sorted(t.name for t in left)}")


# doctests of optional parts: an example that needs an extra runs where
# the extra is installed and is skipped, saying which, where it is not
# (this hook sees every item of the session, rlplay's doctests included):
# the module whose examples need an extra, and the package it installs
_EXTRAS = {"rlplay.engine.rollout.cluster": "ray",
           "rlplay.envs.jax_source": "gymnax"}


def _uses_ray(item):
    """Whether ``item`` runs on Ray: the session's (``ray_cluster``), a
    ``cluster`` case of a test over every generator, a ``ray start``
    cluster, the cluster notebook or doctests."""
    return ("ray_cluster" in getattr(item, "fixturenames", ())
            or "cluster" in item.nodeid)


def _uses_jax(item):
    """Whether ``item`` runs JAX in the test's own process: the JAX
    sources' tests and doctests (Brax's among them)."""
    return "jax_source" in item.nodeid or "brax_source" in item.nodeid


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups
def pytest_collection_modifyitems(config, items):
    # with pytest-xdist (make test runs two processes, --dist loadgroup),
    # every test on Ray runs in one of them: one local Ray for the session,
    # and the ports of a ``ray start`` cluster taken by one test at a time.
    # They run last, there as without xdist (make test keeps this order:
    # --no-loadscope-reorder): once ray.init has started gRPC's threads in
    # a process, a child that process forks may inherit a lock one of them
    # held and hang (ray-project/ray#65984), and many tests fork workers
    # (start_method="fork"); a worker that hung so at its start left a
    # multi.rollout test to one worker for the whole of its start bound
    on_ray = [item for item in items if _uses_ray(item)]
    if on_ray:
        items[:] = [item for item in items if not _uses_ray(item)] + on_ray
    # the tests that run JAX in this process come after every other test
    # but those on Ray (which fork nothing): once JAX has started its
    # threads, a process that forks a worker (start_method="fork") may hand
    # it a lock one of them held, as JAX warns at each such fork
    on_jax = [item for item in items
              if _uses_jax(item) and not _uses_ray(item)]
    if on_jax:
        rest = [item for item in items if item not in on_jax]
        first_ray = next((i for i, item in enumerate(rest)
                          if _uses_ray(item)), len(rest))
        items[:] = rest[:first_ray] + on_jax + rest[first_ray:]
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if grouped and _uses_ray(item):
            item.add_marker(pytest.mark.xdist_group("ray"))
        if not isinstance(item, pytest.DoctestItem):
            continue
        needs = _EXTRAS.get(item.dtest.globs.get("__name__", ""))
        if needs and importlib.util.find_spec(needs) is None:
            item.add_marker(pytest.mark.skip(
                reason=f"the example needs {needs} (an optional extra)"))
