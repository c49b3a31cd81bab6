"""Two Ray nodes on this host and a rollout across them (run by
tests/test_cluster.py in a process of its own, its own Ray driver).

Starts a head node and a second node, one CPU each, with ``ray start
--block`` as child processes, on free ports and a temporary directory of
their own (never ``ray stop``, which would end every Ray on the machine),
joins the head with ``ray.init(address=...)`` and runs ``cluster.rollout``
with two workers of one CPU each (so, one per node) and ``restarts=1``;
then starts a third node, SIGKILLs the second node's raylet, and collects
on until the lost worker runs on the third. Prints one line
``RESULT {json}``.

This process makes itself the *child subreaper* of everything it starts
(Linux ``prctl(PR_SET_CHILD_SUBREAPER)``), so that the processes a killed
raylet leaves behind are re-parented here, not to init: at the end it
kills every descendant by pid and reaps it.
"""
import contextlib
import ctypes
import ctypes.util
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# each wait below, the replacement's first fragments after the node is
# lost, the whole script: the bounds and their reasons are in bounds.py
sys.path.insert(0, HERE)
from bounds import (CLUSTER_SCRIPT as DEADLINE,  # noqa: E402
                    RAY_START as REPLACEMENT_BOUND, RAY_STEADY as BOUND)
from procs import descendants as all_descendants  # noqa: E402
PR_SET_CHILD_SUBREAPER = 36


def descendants(pid):
    """Every descendant of ``pid`` (``/proc``), as a list."""
    return list(all_descendants(pid))


def cmdline(pid):
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline",
                                            "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")
    return ""


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def ray_start(args, temp, log, index):
    """``ray start --block`` (node number ``index``) with every port of its
    own: random free ones (from the ephemeral range, above 32767), and 150
    for its workers below them."""
    agent, grpc, runtime, metrics, manager, objects = free_ports(6)
    base = 20000 + 500 * (os.getpid() % 24) + 160 * index
    head = ["--include-dashboard=false"] if "--head" in args else []
    return subprocess.Popen(
        [RAY, "start", "--block", "--disable-usage-stats", *head,
         f"--temp-dir={temp}",
         "--object-store-memory=100000000",
         f"--dashboard-agent-listen-port={agent}",
         f"--dashboard-agent-grpc-port={grpc}",
         f"--runtime-env-agent-port={runtime}",
         f"--metrics-export-port={metrics}",
         f"--node-manager-port={manager}",
         f"--object-manager-port={objects}",
         f"--min-worker-port={base}", f"--max-worker-port={base + 150}",
         *args], stdout=log, stderr=subprocess.STDOUT)


def wait_for(condition, what):
    deadline = time.monotonic() + BOUND
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {BOUND} s")
        time.sleep(0.1)


class Nodes:
    """The ``ray start`` processes of the test cluster (the first is the
    head), one CPU each, so that two workers of one CPU each run on
    distinct nodes."""

    def __init__(self, temp, log):
        self.temp, self.log, self.port = temp, log, free_ports(1)[0]
        self.procs = []

    def add(self):
        where = [f"--address=127.0.0.1:{self.port}"] if self.procs else [
            "--head", f"--port={self.port}"]
        proc = ray_start(where + ["--num-cpus=1"], self.temp, self.log,
                         len(self.procs))
        self.procs.append(proc)
        if len(self.procs) == 1:  # the head: up, or an error (not a hang)
            wait_for(lambda: self._listening(proc), "head node")

    def _listening(self, proc):
        if proc.poll() is not None:
            raise RuntimeError(f"the head node exited ({proc.returncode})")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def kill_raylet(self, i):
        raylet = [pid for pid in descendants(self.procs[i].pid)
                  if "/raylet " in cmdline(pid)]
        os.kill(raylet[0], signal.SIGKILL)


def run(nodes):
    """The rollout on the cluster; returns the result to print."""
    import ray
    from envs import counting_factory
    from rlplay.engine.rollout import cluster
    from generators import CountingActor

    ray.init(address=f"127.0.0.1:{nodes.port}", log_to_driver=False)
    try:  # leave Ray before the nodes go, or exiting waits for them
        return _run(ray, nodes, cluster, counting_factory, CountingActor)
    finally:
        ray.shutdown()


def _alive(ray, n):
    wait_for(lambda: sum(node["Alive"] for node in ray.nodes()) == n,
             f"{n} nodes")
    return [node["NodeID"] for node in ray.nodes() if node["Alive"]]


def _run(ray, nodes, cluster, counting_factory, CountingActor):
    head = [n["NodeID"] for n in ray.nodes()
            if "node:__internal_head__" in n["Resources"]][0]
    second = [node for node in _alive(ray, 2) if node != head][0]
    feed = cluster.rollout(functools.partial(counting_factory, term_every=5),
                           CountingActor(), 4, 2, 1, 4, 2, entropy=0,
                           restarts=1, restart_delay=0.1, timeout=BOUND,
                           start_timeout=BOUND)
    with feed:
        for _ in range(5):
            next(feed)
        wait_for(lambda: feed.poll(0.1) >= 0 and None not in feed.nodes,
                 "both workers started")
        nodes_before, lost = list(feed.nodes), feed.nodes.index(second)
        # a third node, where the lost worker can go, then the loss
        nodes.add()
        third = [node for node in _alive(ray, 3)
                 if node not in (head, second)][0]
        nodes.kill_raylet(1)
        tic = time.monotonic()
        deadline = tic + REPLACEMENT_BOUND
        while not feed.stats["restarts"]:
            next(feed)
        detected = time.monotonic() - tic
        delivered, batches = feed.stats["workers"][lost]["delivered"], 0
        # on until the replacement has delivered (two fragments may be the
        # lost actor's, received before it died)
        while feed.stats["workers"][lost]["delivered"] < delivered + 4:
            assert time.monotonic() < deadline, "no replacement"
            next(feed)
            batches += 1
        return dict(head=head, second=second, third=third,
                    nodes_before=nodes_before, nodes_after=list(feed.nodes),
                    restarts=feed.stats["restarts"],
                    cause=feed.stats["workers"][lost]["last_cause"],
                    detected_s=round(detected, 2), batches_after=batches)


def abort():
    # the last resort: whatever hangs (a Ray call waiting for a node that
    # is gone), every process started here goes, and this one exits
    print(f"cluster_nodes.py: still running after {DEADLINE} s",
          file=sys.stderr, flush=True)
    teardown()
    os._exit(3)


def main():
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    watchdog = threading.Timer(DEADLINE, abort)
    watchdog.daemon = True
    watchdog.start()
    # short: Ray's unix sockets live under it (at most 107 bytes a path)
    temp = tempfile.mkdtemp(prefix="rl", dir="/tmp")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    sys.path.insert(0, HERE)
    # a throw-away cluster on the loopback: no token to share; a lost node
    # is declared dead after 3 missed checks of 0.5 s; its workers run at
    # this script's priority, not Ray's nice 15 (see conftest.py)
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_worker_niceness="0",
                      RAY_health_check_period_ms="500",
                      RAY_health_check_timeout_ms="500",
                      RAY_health_check_failure_threshold="3")
    log = open(os.path.join(temp, "nodes.log"), "w")
    try:
        nodes = Nodes(temp, log)
        nodes.add()
        nodes.add()
        print("RESULT", json.dumps(run(nodes)), flush=True)
    except BaseException:
        log.flush()
        with open(log.name) as f:
            print(f.read()[-4000:], file=sys.stderr)
        raise
    finally:
        teardown()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def teardown():
    """SIGKILL every process started here, orphans included (this process
    is their subreaper), by pid, and reap them."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        pids = descendants(os.getpid())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.05)
    raise TimeoutError(f"processes left: {descendants(os.getpid())}")


if __name__ == "__main__":
    main()
