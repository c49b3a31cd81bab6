"""cluster.rollout on the session's local Ray (conftest's ``ray_cluster``,
2 CPUs): equivalence with same.rollout, versions and max_lag, sequence
numbers, arguments and placement; Ray as an optional dependency; and a
cluster of two nodes on this host (``cluster_nodes.py``, in a process of
its own). Its faults and shutdown are in test_faults.py's matrix, its
restarts in test_restarts.py.

The workers are Ray actors that import this directory's modules (envs,
actors) by reference: the fixture starts Ray with this directory on the
workers' ``PYTHONPATH``.
"""
import functools
import itertools
import json
import os
import subprocess
import sys
import time
import warnings

import pytest
import torch
from torch import nn

ray = pytest.importorskip("ray")

import ray_start  # noqa: E402
from conftest import _ray_actors  # noqa: E402
from envs import ENV_INFO, counting_factory, mixed_factory  # noqa: E402
from generators import (CountingActor, assert_fragments_equal,  # noqa: E402
                        identities, make as make_generator, slot,
                        wait_started, without_version)
from reference import reference  # noqa: E402
from rlplay.engine import PolicyActor  # noqa: E402
from rlplay.engine.nested import suply  # noqa: E402
from rlplay.engine.rollout import cluster, same  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")

HERE = os.path.dirname(os.path.abspath(__file__))
# the bounds of the waits (their reasons in bounds.py)
from bounds import (CLEAN_STOP, CLUSTER_SCRIPT, FAULT as BOUND,  # noqa: E402
                    MARGIN, NODE_LOST, RAY_STEADY as STEADY, SCRIPT,
                    SHUTDOWN, START)
ENTROPY = 0


def make(factory=counting_factory, actor=None, n_actors=2, n_buffers=2,
         n_per_batch=1, **kwargs):
    """``n_actors`` workers of one env each, fragments of 4 steps."""
    args = dict(timeout=STEADY, start_timeout=START, shutdown_timeout=SHUTDOWN,
                entropy=ENTROPY)
    args.update(kwargs)
    return make_generator("cluster", factory, actor or CountingActor(), 4, 1,
                          n_actors=n_actors, n_buffers=n_buffers,
                          n_per_batch=n_per_batch, **args)


# ------------------------------------------------------------ equivalence --

def test_workers_reproduce_the_core_loop_and_same_rollout():
    """Two workers of three envs, two fragments per batch: worker 0's
    fragments are same.rollout's (every leaf but ``meta.version``), worker
    1's those of collector 1 with the core loop alone, ``hx`` collated
    along ``hx_dim = 0``."""
    B, T, entropy, n = 3, 5, 1234, 24
    ref = same.rollout(mixed_factory, CountingActor(), T, B, entropy=entropy,
                       env_info=ENV_INFO)
    with ref:
        want = {0: [without_version(suply(torch.clone, fragment))
                    for fragment in itertools.islice(ref, n)]}
    want[1] = [without_version(fragment) for fragment in reference(
        mixed_factory, CountingActor(), T, B, entropy, worker=1, count=n,
        env_info=ENV_INFO)]
    feed = cluster.rollout(mixed_factory, CountingActor(), T, 2, B, 4, 2,
                           entropy=entropy, env_info=ENV_INFO,
                           timeout=STEADY, start_timeout=START)
    seen = {0: 0, 1: 0}
    with feed:
        wait_started(feed)
        for batch in itertools.islice(feed, 8):
            assert batch.hx.shape == (2 * B, 2)
            for s, (worker, seq) in enumerate(identities(batch, 2, B)):
                assert_fragments_equal(
                    without_version(slot(batch, s, B, hx_dim=0)),
                    want[worker][seq])
                seen[worker] += 1
    assert min(seen.values()) >= 4, seen


def test_sampling_actor_reproduces_same_rollout():
    """A sampling actor draws from the worker's torch generator, seeded as
    same.rollout seeds its own: one worker gives the same actions."""
    actor = PolicyActor(nn.Linear(1, 5))
    ref = same.rollout(counting_factory, actor, 8, 2, entropy=7)
    feed = cluster.rollout(counting_factory, actor, 8, 1, 2, 2, 1,
                           entropy=7, timeout=STEADY, start_timeout=START)
    with ref, feed:
        for want, got in zip(itertools.islice(ref, 4),
                             itertools.islice(feed, 4)):
            assert torch.equal(got.state.act, want.state.act)
            assert torch.equal(got.state.obs, want.state.obs)


# ----------------------------------------------------- versions, max_lag --

def test_ray_params_publish_and_load():
    """One ``ray.put`` per version; ``load`` copies the tensors and the mode
    only when the version differs; another architecture is refused."""
    from rlplay.engine.workers._params import RayParams
    actor, worker = CountingActor(), CountingActor()
    params = RayParams(actor)
    with torch.no_grad():
        actor.w.fill_(2.0)
        actor.shift += 3
    actor.eval()
    assert params.publish(actor) == params.version == 1
    with torch.no_grad():
        actor.w.fill_(7.0)  # not published
    assert params.load(worker, known=None) == 1
    assert worker.w.item() == 2.0 and int(worker.shift) == 3
    assert not worker.training
    with torch.no_grad():
        worker.w.fill_(0.0)
    assert params.load(worker, known=1) == 1  # held already: no copy
    assert worker.w.item() == 0.0
    with pytest.raises(ValueError, match="missing"):
        params.publish(PolicyActor(nn.Linear(1, 5)))
    assert params.version == 1


def test_max_lag_zero_is_on_policy():
    """``max_lag=0``: every fragment delivered was collected with the
    parameters published by that very ``next()``, and the workers follow
    parameter changes (``shift`` changes the actions)."""
    actor = CountingActor()
    feed = make(counting_factory, actor, n_buffers=4, n_per_batch=2,
                max_lag=0, shutdown_timeout=CLEAN_STOP)
    with feed:
        for k, batch in enumerate(itertools.islice(feed, 8)):
            assert feed.version == k + 1
            assert torch.all(batch.meta.version == feed.version)
            state = batch.state
            expected = (state.obs[:-1, :, 0].long() + state.stepno[:-1]
                        + k) % 5
            assert torch.equal(state.act[1:], expected)
            assert feed.stats["lag"] == 0
            with torch.no_grad():
                actor.shift += 1
    accounts = feed.stats["workers"]
    assert sum(a["delivered"] for a in accounts) == 16
    assert feed.stats["dropped"] == sum(a["dropped"] for a in accounts) > 0
    assert all(a["received"] == a["delivered"] + a["dropped"] +
               a["discarded"] == a["collected"] for a in accounts)


def test_max_lag_drops_stale_fragments():
    """A fragment requested before the version is bumped past ``max_lag``
    is dropped, counted and requested again; none is lost, and the lag
    reported is that of the oldest fragment."""
    actor = CountingActor()
    feed = make(counting_factory, actor, n_actors=1, n_buffers=3,
                max_lag=1, shutdown_timeout=CLEAN_STOP)
    with feed:
        batch = next(feed)
        v0, s0 = feed.version, int(batch.meta.seq[0])
        assert (v0, s0, int(batch.meta.version[0])) == (1, 0, 0)
        assert feed.stats["lag"] == 1
        assert feed.poll(timeout=STEADY) >= 1
        feed.params.publish(actor)  # v0 + 1
        batch = next(feed)  # publishes v0 + 2: needs a version >= v0 + 1
        s1, dropped = int(batch.meta.seq[0]), feed.stats["dropped"]
        assert feed.version == v0 + 2
        assert int(batch.meta.version[0]) >= feed.version - 1
        assert dropped > 0 and s1 - s0 - 1 == dropped
    account = feed.stats["workers"][0]
    assert account["dropped"] == dropped
    assert account["received"] == account["delivered"] + \
        account["dropped"] + account["discarded"] == account["collected"]


def test_sequence_numbers_have_no_gap_or_duplicate():
    """Two workers, three requests in flight, two fragments per batch, 60
    batches: per worker, the sequence numbers delivered are ``0 .. d - 1``;
    after ``close()``, each worker's own count equals those received, and
    those delivered plus those discarded."""
    B, n_batches = 2, 60
    feed = cluster.rollout(functools.partial(counting_factory, term_every=5),
                           CountingActor(), 4, 2, B, 3, 2, entropy=5,
                           timeout=STEADY, start_timeout=START,
                           shutdown_timeout=CLEAN_STOP)
    seen = []
    with feed:
        for batch in itertools.islice(feed, n_batches):
            seen.extend(identities(batch, 2, B))
            assert feed.stats["lag"] == feed.version - int(
                batch.meta.version.min())
    assert len(set(seen)) == len(seen) == 2 * n_batches
    for w, account in enumerate(feed.stats["workers"]):
        seqs = sorted(seq for worker, seq in seen if worker == w)
        assert seqs == list(range(len(seqs)))
        assert account["delivered"] == len(seqs)
        assert account["collected"] == account["received"] == \
            len(seqs) + account["discarded"]
    assert feed.stats["steps"] == n_batches * 2 * B * 4
    assert set(feed.stats["workers"][0]) >= {"node", "restarts", "lost"}


# --------------------------------------------------------------- arguments --

def test_bad_arguments_fail_up_front():
    with pytest.raises(ValueError, match="n_buffers >= n_per_batch"):
        make(n_buffers=1, n_per_batch=2)
    with pytest.raises(ValueError, match="max_restarts"):
        make(actor_options={"max_restarts": 2})
    with pytest.raises(TypeError, match="actor_options"):
        make(actor_options=["num_cpus"])
    with pytest.raises(ValueError, match="restart_delay must be a finite"):
        make(restarts=1, restart_delay=float("inf"))
    with pytest.raises(ValueError, match="timeout must be a finite"):
        make(timeout=float("inf"))


def test_more_workers_than_the_cluster_holds_are_refused_up_front():
    """The session's Ray (2 CPUs, started by this process: it cannot grow)
    holds two workers of one CPU: eight would leave six pending, never
    started, until the first batch timed out; they are refused at once,
    before any actor is created, with what was asked and what there is."""
    before = set(_ray_actors())
    tic = time.monotonic()
    with pytest.raises(ValueError) as info:
        make(n_actors=8, n_buffers=8)
    assert time.monotonic() - tic < BOUND
    message = str(info.value)
    for said in ("n_actors=8 workers ask Ray for 8 CPU (1 CPU each)",
                 "have 2 CPU: 2 of the workers fit", "n_actors=2 or fewer",
                 "actor_options={'num_cpus': ...}", "address="):
        assert said in message, message
    assert set(_ray_actors()) == before
    # a quarter of a CPU each: eight fit (the check only, no actor made)
    assert cluster.placeable(
        [node["Resources"] for node in ray.nodes() if node["Alive"]],
        {"CPU": 0.25}) == 8


def test_a_cluster_that_may_grow_is_warned_of(monkeypatch):
    """A cluster joined (not started by this process) may have an
    autoscaler: the same request goes ahead, with a warning that Python
    shows by default (the check alone here: no actor made)."""
    monkeypatch.setattr(cluster, "_cluster_fixed", lambda: False)
    options = {"num_cpus": 1}
    with pytest.warns(RuntimeWarning, match="wait until the cluster grows"):
        cluster._check_placement(options, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cluster._check_placement(options, 2)  # they fit: not a word


def test_placeable_counts_node_by_node():
    """An actor runs on one node: two nodes of 1.5 CPUs hold two workers
    of one CPU, not three."""
    nodes = [{"CPU": 1.5}, {"CPU": 1.5, "GPU": 1.0}]
    assert cluster.placeable(nodes, {"CPU": 1.0}) == 2
    assert cluster.placeable(nodes, {"CPU": 0.5, "GPU": 0.5}) == 2
    assert cluster.placeable(nodes, {"CPU": 0.1}) == 30
    assert cluster.placeable(nodes, {"tpu": 1.0}) == 0
    assert cluster.placeable(nodes, {}) == float("inf")


# -------------------------------------------------------- Ray is optional --

def test_without_ray_calling_rollout_says_how_to_install():
    """Importing rlplay (and the cluster module) needs no Ray; importing
    rlplay.engine.rollout does not import it; calling cluster.rollout
    without it raises ImportError."""
    code = (
        "import sys\n"
        "import rlplay.engine.rollout\n"
        "assert 'ray' not in sys.modules\n"
        "sys.modules['ray'] = None  # import ray now fails\n"
        "from rlplay.engine.rollout import cluster\n"
        "from rlplay.engine import PolicyActor\n"
        "import torch\n"
        "try:\n"
        "    cluster.rollout(None, PolicyActor(torch.nn.Linear(1, 2)), 4,"
        " 1, 1, 1, 1)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=SCRIPT)
    assert out.returncode == 0, out.stderr
    assert "pip install -e 'path/to/rlplay[cluster]'" in out.stdout


# -------------------------------------------------------------- two nodes --

def run_cluster_nodes():
    """cluster_nodes.py's output, run once more (with a warning naming why)
    only where a node it started ran out of Ray's fixed 30 s for a raylet
    to register (ray_start.py): beside other CPU-heavy work, ``ray start``
    can lose that race; the script kills everything it started before it
    exits, so a second run starts from nothing."""
    for attempt in range(1, ray_start.START_TRIES + 1):
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "cluster_nodes.py")],
            capture_output=True, text=True, timeout=CLUSTER_SCRIPT + MARGIN)
        said = out.stdout + out.stderr
        if (out.returncode == 0 or ray_start.STARTUP_TIMED_OUT not in said
                or attempt == ray_start.START_TRIES):
            return out
        warnings.warn(ray_start.RayStartRetried(
            f"a node of cluster_nodes.py did not start (try {attempt} of "
            f"{ray_start.START_TRIES}); running the script again"))


# cluster_nodes.py's own deadline is CLUSTER_SCRIPT, run at most twice
@pytest.mark.timeout(ray_start.START_TRIES * (CLUSTER_SCRIPT + MARGIN)
                     + MARGIN)
def test_two_nodes_and_a_lost_node():
    """A head node and a second node (``ray start``) on this host, in a
    script of its own (its own Ray driver): the two workers run on distinct
    nodes; a third node joins and the second node's raylet is SIGKILLed;
    its worker is reported dead naming that node and, with ``restarts=1``,
    moves to the third."""
    out = run_cluster_nodes()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[-1][len("RESULT "):])
    head, second = result["head"], result["second"]
    assert sorted(result["nodes_before"]) == sorted([head, second])
    lost = result["nodes_before"].index(second)
    assert result["nodes_after"][lost] == result["third"]
    assert result["nodes_after"][1 - lost] == head
    assert result["cause"].startswith(f"WorkerDied: worker {lost}")
    assert second in result["cause"]
    assert result["restarts"] == 1 and result["batches_after"] > 0
    assert result["detected_s"] < NODE_LOST
