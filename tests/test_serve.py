"""multi.rollout(serve=True): one inference server computes every worker's
actions.

Exactness: with a deterministic actor the served batches equal, leaf by
leaf, each worker's fragments collected by the core loop alone (the
reference), in lock-step and deadline batching, with one and two env
groups per worker. The actor of those tests is :class:`CountingActor`,
whose outputs are elementwise (integer arithmetic, a product of each
observation by one parameter, an ``hx`` sum per column): a row's result
does not depend on which other rows share the call, so a batched call
gives the per-worker bits exactly (a matmul over more rows may not: its
sums can be ordered otherwise). Its ``hx`` is recorded in ``info`` at
every row, so the same comparison shows ``hx`` kept and reset exactly at
each episode end. A sampling actor in lock-step gives the same data in
two runs of one entropy; every action is chosen with the parameters that
``meta.version`` names (``max_lag=0``: on-policy). Faults: the server
killed, the server's actor raising, a worker killed and replaced; bad
keywords refused up front.
"""
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import closing

import pytest
import torch
from torch import nn

from bounds import (CUDA_STEADY, FAULT, REPLACEMENT, SCRIPT, SHUTDOWN,
                    START, STEADY as TIMEOUT)
from envs import ENV_INFO, mixed_factory
from generators import (CountingActor, RaisingActor, assert_fragments_equal,
                        gone, identities, slot, without_version)
from reference import reference
from rlplay.engine import (BaseActorModule, FeedForwardActor,
                           RolloutTimeout, WorkerDied, WorkerError)
from rlplay.engine.nested import getitem
from rlplay.engine.rollout import multi
from rlplay.engine.utils import get_context, preload_forkserver

preload_forkserver(get_context("forkserver"),
                   ("pytest", "envs", "generators", __name__))

T, B = 5, 4


def served(n_actors=2, n_buffers=4, n_per_batch=2, actor=None, **kwargs):
    kwargs.setdefault("entropy", 99)
    kwargs.setdefault("timeout", TIMEOUT)
    kwargs.setdefault("start_timeout", START)
    return multi.rollout(mixed_factory, actor or CountingActor(), T,
                         n_actors, B, n_buffers, n_per_batch, serve=True,
                         env_info=ENV_INFO, **kwargs)


def check_against_reference(feed, n_batches, n_actors=2, n_per_batch=2):
    refs = [reference(mixed_factory, CountingActor(), T, B, 99, worker=w,
                      count=3 * n_batches, env_info=ENV_INFO)
            for w in range(n_actors)]
    seen = 0
    for batch in itertools.islice(feed, n_batches):
        for s, (worker, seq) in enumerate(identities(batch, n_per_batch, B)):
            assert_fragments_equal(
                without_version(slot(batch, s, B, hx_dim=0)),
                without_version(refs[worker][seq]))
            seen += 1
    assert seen == n_batches * n_per_batch


# ------------------------------------------------------- the policy seam --

class FakeChannel:
    """Records the requests, answers with a version (no process)."""

    def __init__(self):
        self.asked = []

    def ask(self, *request):
        self.asked.append(request)

    def answer(self):
        return 7


def test_served_policy_names_rows_and_returns_their_views():
    """A served policy sends the indices of a row (buffer, row, group,
    seq, virtual), copies ``hx`` into the in slot, and returns views of
    the rows the server writes (action row ``t + 1``, info row ``t``) and
    of the out slot; the version of the fragment's first step is kept."""
    from rlplay.engine.core import prepare
    from rlplay.engine.policy import ServedPolicy, as_policy
    from rlplay.engine.workers._grouped import columns

    actor = CountingActor()
    buffers = [prepare(mixed_factory(1), actor, T, B) for _ in range(2)]
    views = [columns(buffer, slice(2, 4), 0) for buffer in buffers]
    hx_in, hx_out = torch.zeros(2, 2), torch.zeros(2, 2)
    channel = FakeChannel()
    policy = ServedPolicy(as_policy(actor), channel, views, 1, hx_in, hx_out)
    policy.seq = 3
    row = getitem(views[1].pyt.state, slice(2, 3))
    hx = torch.ones(2, 2)
    policy.submit(row, hx)
    act, hx_next, info = policy.wait()
    assert channel.asked == [(1, 2, 1, 3, False)]
    assert torch.equal(hx_in, hx) and hx_next is hx_out
    assert act.data_ptr() == buffers[1].pyt.state.act[3, 2].data_ptr()
    assert info["value"].data_ptr() == \
        buffers[1].pyt.actor["value"][2, 2].data_ptr()
    assert policy.version is None  # not a fragment's first step
    policy.submit(getitem(views[0].pyt.state, slice(0, 1)), hx)
    policy.wait()
    assert policy.version == 7
    info = policy.lookahead(getitem(views[0].pyt.state, slice(T, T + 1)),
                            hx)
    assert channel.asked[-1] == (0, T, 1, 3, True)
    with pytest.raises(ValueError, match="shared buffers only"):
        policy.submit(getitem(buffers[0].pyt.state, slice(0, 1)), hx)


def batching_server(groups, deadline):
    """A server of two attached workers (generation 0) whose requests are
    posted into its doorbells by :func:`post` (no processes)."""
    import multiprocessing
    from rlplay.engine.workers._doors import Doors
    from rlplay.engine.workers._server import (ServeOptions, ServerConfig,
                                               _Server)
    options = ServeOptions(groups=groups, deadline=deadline, device="cpu",
                           actor=None, entropy=None, hx=None, hx_dim=1)
    doors = Doors.allocate(multiprocessing.get_context(), 2, groups)
    server = _Server(ServerConfig(options=options, buffers=None, hx=None,
                                  params=None, counters=None, n_workers=2,
                                  doors=doors), link=None)
    server.gen[:] = [0] * len(server.gen)
    return server


def post(server, w, g, buffer=0, row=0, seq=0, kind=None, generation=0):
    """Worker ``w``'s group ``g`` asks (as a worker's channel does); the
    server takes what was posted. The request's count."""
    from rlplay.engine.workers._doors import (BUFFER, KIND, REQ, ROW, SEQ,
                                              count_of)
    from rlplay.engine.workers._messages import STEP
    slot = server.doors.slot(w, g)
    slot[BUFFER], slot[ROW], slot[SEQ] = buffer, row, seq
    slot[KIND] = STEP if kind is None else kind
    count = count_of(generation, (int(slot[REQ]) & 0xFFFFFFFF) + 1)
    slot[REQ] = count
    server._scan()
    return count


def due(server):
    return [(w, g) for w, g, _ in server._due()]


def test_lockstep_serves_the_groups_in_turn_once_every_worker_asked():
    """Lock-step (no processes): group 0, then 1, then 0..., each once
    every collecting worker asked for it; a worker that says it is idle
    is not waited for."""
    from rlplay.engine.workers._doors import IDLE
    server = batching_server(2, None)
    server.collecting = {0, 1}
    for w in (0, 1):
        post(server, w, 1)  # group 1 first
    assert due(server) == []  # group 0's turn
    post(server, 0, 0)
    assert due(server) == []  # worker 1's group 0 is missing
    post(server, 1, 0)
    assert due(server) == [(0, 0), (1, 0)]
    assert due(server) == [(0, 1), (1, 1)]
    assert due(server) == []
    post(server, 1, 0, kind=IDLE)
    post(server, 0, 0, buffer=2, row=1)
    assert due(server) == [(0, 0)]


def test_deadline_serves_what_arrived_once_the_oldest_waited():
    """Deadline batching (no processes): a group at once when every
    collecting worker asked for it, else everything pending once the
    oldest request waited the deadline."""
    server = batching_server(2, 0.5)
    server.collecting = {0, 1}
    post(server, 0, 1)
    assert due(server) == []
    assert 0 < server._timeout() <= 0.5
    post(server, 1, 1)
    assert due(server) == [(0, 1), (1, 1)]  # complete: not waited for
    post(server, 1, 0, buffer=1)
    post(server, 0, 1, buffer=1)
    assert due(server) == []
    request, _, count = server.pending[0][1]
    server.pending[0][1] = (request, time.monotonic() - 1.0, count)
    assert due(server) == [(0, 1), (1, 0)]


def test_doorbells_take_each_request_once_of_the_attached_generation():
    """A slot's request is taken once (a scan without a new count takes
    nothing), with the fields written before its count; a count of
    another generation than the one attached to the slot (a retired
    worker's) is not taken; the answer is the request's count and the
    version, and a worker that sleeps is rung on its pipe."""
    import multiprocessing
    from rlplay.engine.workers._doors import (ANS, SLEEPING, VERSION,
                                              count_of)
    server = batching_server(1, None)
    server.collecting = {0, 1}
    count = post(server, 0, 0, buffer=1, row=3, seq=7)
    assert server._scan() == 0
    request, _, taken = server.pending[0][0]
    assert (request.buffer, request.row, request.seq, taken) == \
        (1, 3, 7, count)
    server.gen[1] = 4  # worker 1 was replaced by its generation 4
    post(server, 1, 0, generation=3)
    assert 1 not in server.pending[0]
    fresh = post(server, 1, 0, generation=4)
    assert fresh == count_of(4, 2) and 1 in server.pending[0]
    ours, theirs = multiprocessing.Pipe()
    server.conns[1, 0] = ours
    server.doors.slot(1, 0)[SLEEPING] = 1
    batch = [(w, g, r, 5) for w, g, r in server._due()]
    server._answer(batch)
    for w, answered in ((0, count), (1, fresh)):
        slot = server.doors.slot(w, 0)
        assert (slot[ANS], slot[VERSION]) == (answered, 5)
    assert theirs.poll(0) and theirs.recv_bytes() == b"\x00"
    assert not theirs.poll(0)  # worker 0 spun: no ring
    ours.close()
    theirs.close()


def test_a_request_being_written_is_not_taken():
    """A slot whose count says its fields are being written
    (:data:`~rlplay.engine.workers._doors.WRITING`) is passed over, and
    taken once the count is written: the server never reads half of two
    requests."""
    from rlplay.engine.workers._doors import (BUFFER, KIND, REQ, ROW,
                                              WRITING, count_of)
    server = batching_server(1, None)
    server.collecting = {0, 1}
    slot = server.doors.slot(0, 0)
    slot[REQ] = WRITING
    slot[BUFFER], slot[ROW], slot[KIND] = 3, 2, 0
    assert server._scan() == 0 and not server.pending[0]
    slot[REQ] = count_of(0, 1)
    assert server._scan() == 1
    request, _, count = server.pending[0][0]
    assert (request.buffer, request.row, count) == (3, 2, count_of(0, 1))


def test_a_channel_spins_then_sleeps_until_its_answer():
    """A worker's channel: a request counted in its slot (the server
    asleep is rung), its answer found by a spin, or after a sleep on the
    pipe once the spin is spent (the slot's flag set while it sleeps);
    a server gone (the pipe at EOF) is said."""
    import multiprocessing
    import threading
    from rlplay.engine.workers._doors import (ANS, REQ, SLEEPING, VERSION,
                                              Doors, count_of, ring)
    from rlplay.engine.workers._grouped import ServerGone, _Channel

    class Link:
        def check(self):
            pass

    doors = Doors.allocate(multiprocessing.get_context(), 1, 1)
    ours, theirs = multiprocessing.Pipe()
    channel = _Channel(ours, Link(), threading.Event(), doors, 0, 0, 2)
    slot = doors.slot(0, 0)
    doors.header[0] = 1  # the server sleeps: the request rings it
    channel.ask(1, 2, 0, 3, False)
    assert slot[REQ] == count_of(2, 1) and theirs.recv_bytes() == b"\x00"
    doors.header[0] = 0
    slot[VERSION], slot[ANS] = 6, slot[REQ]
    assert channel.answer() == 6  # answered at once
    channel.ask(1, 3, 0, 3, False)
    seen = []

    def serve():
        while not slot[SLEEPING]:
            time.sleep(1e-3)
        seen.append(True)
        slot[VERSION], slot[ANS] = 7, slot[REQ]
        ring(theirs)

    thread = threading.Thread(target=serve)
    thread.start()
    assert channel.answer() == 7
    thread.join()
    assert seen and slot[SLEEPING] == 0
    channel.ask(1, 4, 0, 3, False)
    theirs.close()
    with pytest.raises(ServerGone):
        channel.answer()
    ours.close()


# ------------------------------------------------------------- exactness --

@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("deadline", [None, 0.002],
                         ids=["lockstep", "deadline"])
def test_equal_to_per_worker_fragments(groups, deadline):
    """Each slot equals the reference fragment of its worker and seq:
    observations, actions, rewards, ends, ``info`` (with ``hx`` at every
    row: kept, and reset at each episode end), ``hx`` at row 0, meta;
    ``meta.version`` aside (the next test). The server's statistics count
    its calls and rows."""
    feed = served(groups=groups, deadline=deadline, start_method="fork")
    with closing(feed):
        check_against_reference(feed, 6)
        stats = feed.stats
    assert stats["served_calls"] > 0
    # every call serves whole groups of B // groups rows
    assert stats["served_rows"] % (B // groups) == 0
    assert stats["served_mean_rows"] == pytest.approx(
        stats["served_rows"] / stats["served_calls"])
    if deadline is None:  # both workers' groups, every call but at starts
        assert stats["served_mean_rows"] > B // groups
    assert 0 < stats["time_serve_forward"] <= stats["time_serve_busy"]


def test_equal_when_the_sides_sleep_between_batches():
    """A learner that takes its time between batches (the workers wait
    for buffers, the server's spin runs out and it sleeps on the pipes)
    gets the same fragments: a request rings the sleeping server awake,
    and the server's answer a sleeping worker."""
    from rlplay.engine.workers._doors import SPIN_SECONDS

    class Slow:
        def __init__(self, feed):
            self.feed = feed

        def __iter__(self):
            for batch in self.feed:
                time.sleep(20 * SPIN_SECONDS)
                yield batch

    feed = served(n_buffers=2, start_method="fork")
    with closing(feed):
        check_against_reference(Slow(feed), 4)


@pytest.mark.parametrize("publish", ["next", "manual"])
def test_served_with_prefetch_equals_per_worker_fragments(publish):
    """A served pool with a batch prepared ahead (``prefetch=1``) gives the
    same fragments: the thread of the learner waits on the server's
    supervisor as on the workers'."""
    feed = served(groups=2, prefetch=1, publish=publish,
                  start_method="fork")
    with closing(feed):
        check_against_reference(feed, 6)
        if publish == "manual":
            assert feed.publish() == 1
        assert feed.stats["served_calls"] > 0


class CountingFeedForward(FeedForwardActor):
    """:class:`CountingActor` without ``hx``, stepped by its ``act`` (the
    server calls it on the rows as they are: a
    :class:`~rlplay.engine.policy.FeedForwardPolicy`)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))

    def act(self, obs):
        x = obs[..., 0]
        return x.long() % 5, {"value": x * self.w}


@pytest.mark.parametrize("n_actors", [1, 2], ids=["one-worker", "two"])
@pytest.mark.parametrize("groups", [1, 2])
def test_feed_forward_equal_to_per_worker_fragments(n_actors, groups):
    """A feed-forward actor's served fragments equal the reference: one
    worker's group alone in a call (its outputs copied as they are), and
    two workers' groups in one call (split along the env axis)."""
    feed = served(n_actors=n_actors, n_per_batch=n_actors,
                  actor=CountingFeedForward(), groups=groups,
                  start_method="fork")
    refs = [reference(mixed_factory, CountingFeedForward(), T, B, 99,
                      worker=w, count=12, env_info=ENV_INFO)
            for w in range(n_actors)]
    with closing(feed):
        for batch in itertools.islice(feed, 5):
            for s, (worker, seq) in enumerate(
                    identities(batch, n_actors, B)):
                assert_fragments_equal(
                    without_version(slot(batch, s, B, hx_dim=1)),
                    without_version(refs[worker][seq]))


def test_a_fragment_joins_the_running_version_under_no_max_lag():
    """Without ``max_lag`` (``share``), a fragment that starts while
    another collecting worker's fragment runs with the version before the
    latest takes that version (one call a round); with ``max_lag``, or
    when the running version is older still, it takes the latest."""
    from rlplay.engine.workers._messages import Request
    for share, latest, running, expected in [
            (True, 7, 6, 6), (True, 7, 7, 7), (True, 8, 6, 8),
            (False, 7, 6, 7)]:
        server = batching_server(1, None)
        server.options = server.options._replace(share=share)
        server._latest = lambda latest=latest: latest
        server.collecting = {0, 1}
        server.pins = {1: (3, running)}
        batch = [(0, 0, Request(0, 0, 0, 5))]
        assert server._pinned(batch)[0][3] == expected
        assert server.pins[0] == (5, expected)
        # the running fragment's next request keeps its pin
        assert server._pinned([(1, 0, Request(1, 2, 0, 3))])[0][3] \
            == running


class LayeredActor(CountingActor):
    """:class:`CountingActor` with ``hx`` of two leaves laid out as an
    LSTM's, ``(layers, B, 2)``: the env axis second (``hx_dim = 1``)."""

    hx_dim = 1

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        inner = None if hx is None else hx[0][0]
        act, inner, info = super().step(stepno, obs, act, rew, fin,
                                        hx=inner, virtual=virtual)
        return act, (inner.unsqueeze(0), (inner * 2).unsqueeze(0)), info


def test_hx_of_several_leaves_along_hx_dim():
    """``hx`` leaves with the env axis second: each group's slots, the
    server's concatenation and the batch's ``hx`` along ``hx_dim``; the
    fragments equal the reference's."""
    feed = served(actor=LayeredActor(), groups=2, start_method="fork")
    refs = [reference(mixed_factory, LayeredActor(), T, B, 99, worker=w,
                      count=12, env_info=ENV_INFO) for w in range(2)]
    with closing(feed):
        for batch in itertools.islice(feed, 4):
            assert batch.hx[0].shape == (1, 2 * B, 2)
            for s, (worker, seq) in enumerate(identities(batch, 2, B)):
                assert_fragments_equal(
                    without_version(slot(batch, s, B, hx_dim=1)),
                    without_version(refs[worker][seq]))


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_start_methods(start_method):
    """The same data under every start method (the server's pipes to the
    workers travel as file descriptors on its own pipe)."""
    feed = served(groups=2, start_method=start_method)
    with closing(feed):
        check_against_reference(feed, 2)


class SamplingActor(BaseActorModule):
    """Actions drawn with the process's torch generator (the server's,
    seeded from the run's entropy), from logits that depend on the
    observation."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.1))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        logits = (obs[..., 0:1] % 7) * self.scale * torch.arange(5.0)
        act = torch.multinomial(logits.flatten(0, 1).softmax(-1), 1)
        return act.view(obs.shape[:2]), hx, {"logits": logits}


@pytest.mark.parametrize("groups", [1, 2])
def test_sampling_reproducible_in_lockstep(groups):
    """Two runs of one entropy draw the same actions: in lock-step the
    server's batches are the same from run to run (no worker waits for a
    buffer before these fragments: each holds four), its generator seeded
    from the entropy. The fragments are compared by (worker, seq), the
    order in which the workers' reports reach the learner being theirs."""
    def fragments():
        feed = served(actor=SamplingActor(), n_buffers=8, groups=groups,
                      start_method="fork")
        out = {}
        with closing(feed):
            for batch in itertools.islice(feed, 2):
                for s, key in enumerate(identities(batch, 2, B)):
                    out[key] = without_version(slot(batch, s, B, hx_dim=1))
        return out

    first, second = fragments(), fragments()
    common = set(first) & set(second)
    assert common
    actions = set()
    for key in common:
        assert_fragments_equal(first[key], second[key])
        actions.update(first[key].state.act[1:].flatten().tolist())
    assert len(actions) > 1  # it did sample


class VersionActor(BaseActorModule):
    """Records its parameter in ``info``: which parameters acted."""

    def __init__(self):
        super().__init__()
        self.value = nn.Parameter(torch.tensor(0.0))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        n = obs.shape[1]
        return (torch.zeros(1, n, dtype=torch.int64), hx,
                {"value": self.value.expand(1, n).clone()})


@pytest.mark.parametrize("max_lag", [None, 0])
def test_versions_recorded_exactly(max_lag):
    """Before each next(), the learner sets the parameter to the version
    that next() publishes: every row's ``info`` holds the ``meta.version``
    of its fragment (a fragment is served by one version, pinned when its
    first request is served); with ``max_lag=0`` that is the version of
    this very next()."""
    actor = VersionActor()
    feed = served(actor=actor, max_lag=max_lag, groups=2,
                  start_method="fork")
    with closing(feed):
        for k in range(6):
            with torch.no_grad():
                actor.value.fill_(k + 1)  # next() #k publishes k + 1
            batch = next(feed)
            assert feed.version == k + 1
            version = batch.meta.version.to(torch.float32)
            assert torch.equal(batch.actor["value"],
                               version.expand_as(batch.actor["value"]))
            if max_lag == 0:
                assert torch.all(batch.meta.version == k + 1)


# ---------------------------------------------------------------- faults --

def test_server_killed():
    """The server SIGKILLed: WorkerDied naming it, within the bound;
    every process ends (the fixture checks none is left)."""
    feed = served(groups=2, start_method="fork")
    with closing(feed):
        next(feed)
        server = feed._supervision.supervisor.server.pid
        pids = list(feed.pids)
        os.kill(server, signal.SIGKILL)
        tic = time.monotonic()
        with pytest.raises(WorkerDied, match="inference server") as info:
            for _ in range(1000):
                next(feed)
        assert time.monotonic() - tic < FAULT
        assert info.value.exitcode == -signal.SIGKILL
    assert all(gone(pid) for pid in pids + [server])


def test_server_actor_raises():
    """An exception of the actor in the server: WorkerError naming the
    server, with the actor's exception type; never restarted."""
    feed = served(actor=RaisingActor(after=6), restarts=3,
                  start_method="fork")
    with closing(feed):
        with pytest.raises(WorkerError, match="inference server") as info:
            for _ in range(1000):
                next(feed)
    assert info.value.type_name.endswith("ActorFailure")


class HangingActor(CountingActor):
    """Hangs (sleeps for good) at the 20th real step of its process (the
    server copies the actor for each parameter version: the count is the
    class's)."""

    calls = 0

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if not virtual:
            HangingActor.calls += 1
            if HangingActor.calls >= 20:
                time.sleep(1000.0)
        return super().step(stepno, obs, act, rew, fin, hx=hx,
                            virtual=virtual)


def test_server_hangs():
    """A server that hangs in the actor: RolloutTimeout after ``timeout``
    of no news (the workers are alive, waiting for it), and every process
    is ended, the server too."""
    feed = served(actor=HangingActor(), timeout=0.5, shutdown_timeout=0.5,
                  start_method="fork")
    with closing(feed):
        next(feed)
        pids = list(feed.pids) + [feed._supervision.supervisor.server.pid]
        tic = time.monotonic()
        with pytest.raises(RolloutTimeout, match="within 0.5 s"):
            for _ in range(1000):
                next(feed)
        assert time.monotonic() - tic < FAULT
    assert all(gone(pid) for pid in pids)


def test_worker_killed_is_replaced():
    """A worker SIGKILLed with ``restarts=1``: replaced (its pipes to the
    server dropped, new ones attached), batches go on, each fragment
    still equal to its generation's reference."""
    feed = served(groups=2, restarts=1, restart_delay=0.0,
                  start_method="fork")
    with closing(feed):
        next(feed)
        victim = feed.pids[1]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + REPLACEMENT
        refs = {}
        fresh = 0
        while fresh < 2:
            assert time.monotonic() < deadline
            batch = next(feed)
            for s, (worker, seq) in enumerate(identities(batch, 2, B)):
                generation = int(batch.meta.generation[s * B])
                if (worker, generation) not in refs:
                    # generation 0 from its start; a replacement from
                    # resets at its first fragment (the first delivered)
                    first = seq if generation else 0
                    refs[worker, generation] = (first, reference(
                        mixed_factory, CountingActor(), T, B, 99,
                        worker=worker, generation=generation, seq=first,
                        count=40, env_info=ENV_INFO))
                first, fragments = refs[worker, generation]
                assert_fragments_equal(
                    without_version(slot(batch, s, B, hx_dim=0)),
                    without_version(fragments[seq - first]))
                fresh += generation == 1
        assert feed.stats["restarts"] == 1
    assert gone(victim)


def test_close_is_bounded_in_mid_collection():
    """``close()`` while the workers and the server are busy: every
    process stops within the shutdown bound (the server's STOP ends the
    waits of workers in the middle of a fragment)."""
    feed = served(groups=2, n_buffers=8, shutdown_timeout=SHUTDOWN,
                  start_method="fork")
    next(feed)
    pids = list(feed.pids) + [feed._supervision.supervisor.server.pid]
    tic = time.monotonic()
    feed.close()
    assert time.monotonic() - tic < 2 * SHUTDOWN
    assert all(gone(pid) for pid in pids)


_EXIT_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from envs import mixed_factory
from generators import CountingActor
from rlplay.engine.rollout import multi

if __name__ == "__main__":
    feed = multi.rollout(mixed_factory, CountingActor(), 4, 2, 2, 4, 2,
                         serve=True, groups=2, timeout={timeout})
    next(feed)
    print(*feed.pids, feed._supervision.supervisor.server.pid, flush=True)
    cycle = [feed]
    cycle.append(cycle)  # only the exit handler can close it
"""


def test_interpreter_exits_without_close():
    """A script that never closes its served rollout still exits, and
    leaves neither a worker nor the server behind (the exit handler
    stops the server with the workers)."""
    script = _EXIT_SCRIPT.format(tests=os.path.dirname(__file__),
                                 timeout=TIMEOUT)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=SCRIPT)
    assert done.returncode == 0, done.stderr
    pids = list(map(int, done.stdout.split()))
    assert len(pids) == 3
    assert all(gone(pid) for pid in pids)


# -------------------------------------------------------------- keywords --

@pytest.mark.parametrize("kwargs, match", [
    (dict(serve=True, groups=3), "groups=3 must divide n_per_actor=4"),
    (dict(serve=True, groups=0), "groups must be an int"),
    (dict(serve=True, deadline=-1.0), "deadline must be None"),
    (dict(groups=2), "give serve=True"),
    (dict(serve="yes"), "serve must be True or False"),
    (dict(serve=True, actor_device="meta"), "actor_device='meta'"),
    (dict(serve=True, actor_device=["cpu", "cpu"]), "one device"),
])
def test_bad_keywords(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        multi.rollout(mixed_factory, CountingActor(), T, 2, B, 4, 2,
                      **kwargs)


@pytest.mark.parametrize("kind", ["same", "single"])
def test_generators_without_the_served_mode_refuse_it(kind):
    from rlplay.engine.rollout import same, single
    module = {"same": same, "single": single}[kind]
    with pytest.raises(TypeError, match="serve"):
        module.rollout(mixed_factory, CountingActor(), T, B, serve=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("groups", [1, 2])
def test_served_on_cuda_equals_per_worker_fragments(groups):
    """The server on CUDA (under forkserver): the same fragments as the
    reference's (the actor's elementwise outputs are exact on any
    device)."""
    feed = served(groups=groups, actor_device="cuda",
                  start_method="forkserver", timeout=CUDA_STEADY)
    with closing(feed):
        check_against_reference(feed, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
def test_cuda_server_needs_cuda():
    with pytest.raises(RuntimeError, match="needs CUDA"):
        multi.rollout(mixed_factory, CountingActor(), T, 2, B, 4, 2,
                      serve=True, actor_device="cuda")
