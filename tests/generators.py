"""What the tests of every generator share: making one of each kind under
each start method (:func:`make`, :data:`METHODS`), a deterministic actor
(:class:`CountingActor`), comparing fragments and taking collated batches
apart (:func:`assert_fragments_equal`, :func:`slot`, :func:`identities`),
and checks on failures and processes (:func:`raises_within`,
:func:`wait_started`, :func:`running`, :func:`gone`).

It lives in an importable module (not conftest) so that worker processes
started with spawn or forkserver, and Ray's, unpickle its actors by
reference.
"""
import time

import pytest
import torch
from torch import nn

from rlplay.engine import BaseActorModule
from rlplay.engine.core import columns
from rlplay.engine.nested import flatten
from rlplay.engine.rollout import Evaluator, multi, same, single

__all__ = ["METHODS", "make", "CountingActor", "ActorFailure",
           "RaisingActor", "without_version", "assert_fragments_equal",
           "slot", "fragments_of", "identities", "raises_within",
           "running", "gone", "wait_started", "RAY_STARTED_BOUND"]

# every start method of multiprocessing that the process generators take
METHODS = ["fork", "forkserver", "spawn"]
_KINDS = ("same", "single", "multi", "cluster", "evaluator")

# how long the Ray actors of a test may take to start (bounds.py says why)
from bounds import RAY_START as RAY_STARTED_BOUND  # noqa: E402


# ------------------------------------------------------------ generators --

def make(kind, factory, actor, n_steps=4, n_envs=1, *, n_actors=2,
         n_buffers=None, n_per_batch=None, start_method="fork", **kwargs):
    """A generator of ``kind``, the one place where the tests make one.

    Parameters
    ----------
    kind : {'same', 'single', 'multi', 'cluster', 'evaluator'}
        ``same.rollout``, ``single.rollout``, ``multi.rollout``,
        ``cluster.rollout`` (on the Ray that the caller joined: conftest's
        ``ray_cluster``) or an :class:`~rlplay.engine.rollout.Evaluator`.
    factory, actor
        Passed as they are (``actor`` may be anything, to test refusals).
    n_steps : int
        Steps per fragment (not the evaluator's).
    n_envs : int
        Envs per worker (``n_per_actor`` of ``multi`` and ``cluster``).
    n_actors : int
        Workers of ``multi`` and ``cluster``.
    n_buffers, n_per_batch : int, optional
        Of ``multi`` and ``cluster``. ``n_per_batch`` defaults to 1 (one
        fragment per batch) and ``n_buffers`` to ``2 * n_per_batch``
        (double buffering: the workers fill one batch's buffers while
        the learner holds the other's).
    start_method : str or None
        Of ``single``, ``multi`` and the evaluator (``None``: the
        library's default); ``same`` and ``cluster`` have none and leave
        it out.
    **kwargs
        The generator's keywords (``entropy``, ``timeout``, ...; the
        evaluator's ``n_episodes``).
    """
    if n_per_batch is None:
        n_per_batch = 1
    if n_buffers is None:
        n_buffers = 2 * n_per_batch
    if kind == "same":
        return same.rollout(factory, actor, n_steps, n_envs, **kwargs)
    if kind == "single":
        return single.rollout(factory, actor, n_steps, n_envs,
                              start_method=start_method, **kwargs)
    if kind == "multi":
        return multi.rollout(factory, actor, n_steps, n_actors, n_envs,
                             n_buffers, n_per_batch,
                             start_method=start_method, **kwargs)
    if kind == "cluster":
        from rlplay.engine.rollout import cluster  # imports Ray
        return cluster.rollout(factory, actor, n_steps, n_actors, n_envs,
                               n_buffers, n_per_batch, **kwargs)
    if kind == "evaluator":
        return Evaluator(factory, actor, n_envs=n_envs,
                         start_method=start_method, **kwargs)
    raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")


# ---------------------------------------------------------------- actors --

class CountingActor(BaseActorModule):
    """A deterministic recurrent actor.

    ``act = (obs + stepno + shift) % 5``; ``hx`` of shape ``(B, 2)`` (its
    env dimension first: ``hx_dim = 0``) sums the observations and step
    numbers seen since the episode began; ``info`` holds ``value = obs *
    w`` and that ``hx``.
    """

    hx_dim = 0

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))
        self.register_buffer("shift", torch.zeros((), dtype=torch.int64))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        x = obs[..., 0]
        if hx is None:
            hx = torch.zeros(x.shape[1], 2)
        hx = hx + torch.stack([x[0], stepno[0].float()], dim=-1)
        act = (x.long() + stepno + self.shift) % 5
        return act, hx, {"value": x * self.w, "h": hx.unsqueeze(0)}


class ActorFailure(Exception):
    """Raised by :class:`RaisingActor`."""


class RaisesAfter:
    """Mixed into an actor class (before it): raise :class:`ActorFailure`
    at the ``after + 1``-th real step."""

    def __init__(self, after):
        super().__init__()
        self.after, self.calls = after, 0

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if not virtual:
            self.calls += 1
            if self.calls > self.after:
                raise ActorFailure("actor failed on purpose")
        return super().step(stepno, obs, act, rew, fin, hx=hx,
                            virtual=virtual)


class RaisingActor(RaisesAfter, CountingActor):
    """Raises on its ``after + 1``-th real step (in a worker of fragments
    of 4 steps: its third fragment)."""

    def __init__(self, after=8):
        super().__init__(after)


# ------------------------------------------------------------- fragments --

def without_version(fragment):
    """A fragment with ``meta.version`` left out (``None``)."""
    return fragment._replace(meta=fragment.meta._replace(version=None))


def assert_fragments_equal(got, want):
    """Every leaf equal (``torch.equal``), with the path of the first that
    is not."""
    def check(path, x, y):
        assert x.shape == y.shape and x.dtype == y.dtype, path
        assert torch.equal(x, y), f"{path} differs:\n{x}\n{y}"

    for name in want._fields:
        leaves_got = flatten(getattr(got, name))
        leaves_want = flatten(getattr(want, name))
        assert len(leaves_got) == len(leaves_want), name
        for i, (x, y) in enumerate(zip(leaves_got, leaves_want)):
            check(f"{name}[{i}]", x, y)


def slot(batch, s, B, hx_dim):
    """The fragment in slot ``s`` of a collated batch of fragments of
    ``B`` envs (views)."""
    return columns(batch, slice(s * B, (s + 1) * B), hx_dim)


def fragments_of(batch, n_per_batch, B, hx_dim):
    """The fragments of a batch, slot by slot (a batch of ``same`` or
    ``single`` is one, ``n_per_batch=1``)."""
    return [slot(batch, s, B, hx_dim) for s in range(n_per_batch)]


def identities(batch, n_per_batch, B):
    """``(worker, seq)`` of each slot, checking that a slot is one fragment
    of one worker's envs."""
    meta = batch.meta
    out = []
    for s in range(n_per_batch):
        cols = slice(s * B, (s + 1) * B)
        worker, seq = int(meta.worker[s * B]), int(meta.seq[s * B])
        assert torch.all(meta.worker[cols] == worker)
        assert torch.all(meta.seq[cols] == seq)
        assert torch.equal(meta.env[cols],
                           torch.arange(worker * B, (worker + 1) * B))
        out.append((worker, seq))
    return out


# ---------------------------------------------------- failures, processes --

def raises_within(feed, exc_type, bound):
    """Iterate until ``exc_type`` is raised, at most ``bound`` s later;
    returns it, checking that the broken generator stays broken with the
    same error."""
    tic = time.monotonic()
    with pytest.raises(exc_type) as info:
        for _ in range(100_000):
            next(feed)
    assert time.monotonic() - tic < bound
    # a broken rollout stays broken, with the same error
    with pytest.raises(exc_type) as again:
        next(feed)
    assert again.value is info.value
    return info.value


def wait_started(feed, bound=RAY_STARTED_BOUND):
    """Until every Ray actor of a ``cluster`` rollout has started (its
    ``pids`` name them): a worker that starts first would fill the batches
    alone meanwhile, holding fewer requests."""
    deadline = time.monotonic() + bound
    while None in feed.pids:
        assert time.monotonic() < deadline, "the workers did not start"
        feed.poll(timeout=0.05)
        time.sleep(0.01)


def running(pid):
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone(pid):
    """Whether process ``pid`` has ended (reaped, or a zombie)."""
    return not running(pid)
