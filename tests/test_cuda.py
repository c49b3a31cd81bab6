"""Delivery on a CUDA device and in page-locked memory, for same.rollout,
single.rollout and multi.rollout.

Without CUDA, asking for either fails up front with a clear RuntimeError
(before any env or worker is made). With CUDA, batches arrive on the device
or page-locked, and equal the host batches of the same run.
"""
import functools
import itertools
from contextlib import closing

import pytest
import torch

from envs import ENV_INFO, mixed_factory
from generators import (METHODS, CountingActor, assert_fragments_equal, make,
                        without_version)
from rlplay.engine.nested import flatten
from rlplay.engine.rollout import multi

from bounds import CUDA_STEADY  # the reason in bounds.py

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA")
without_cuda = pytest.mark.skipif(torch.cuda.is_available(),
                                  reason="CUDA is available")


def make_kind(kind, start_method=None, **kwargs):
    """Fragments of 5 steps of 4 envs; ``multi``: one worker, one fragment
    per batch (the same fragments in every run); ``start_method`` of the
    process generators (``None``: the library's default)."""
    if kind != "same":  # same.rollout has no timeouts
        kwargs = dict(timeout=CUDA_STEADY, start_method=start_method, **kwargs)
    return make(kind, mixed_factory, CountingActor(), 5, 4, n_actors=1,
                n_buffers=2, n_per_batch=1, entropy=7, env_info=ENV_INFO,
                **kwargs)


MAKERS = {kind: functools.partial(make_kind, kind)
          for kind in ("same", "single", "multi")}


@without_cuda
@pytest.mark.parametrize("kwargs", [dict(device="cuda"), dict(pinned=True),
                                    dict(device="cuda:0", pinned=True)],
                         ids=["device", "pinned", "both"])
@pytest.mark.parametrize("maker", list(MAKERS))
def test_refused_up_front_without_cuda(maker, kwargs):
    with pytest.raises(RuntimeError, match="needs CUDA"):
        MAKERS[maker](**kwargs)


def _compare_runs(maker, n_batches, check, **kwargs):
    """Batches of a host run and of a run with ``kwargs``, side by side."""
    host, other = MAKERS[maker](), MAKERS[maker](**kwargs)
    with closing(host), closing(other):
        for want, got in itertools.islice(zip(host, other), n_batches):
            check(got)
            got = type(got)(*[None if field is None else
                              _to_cpu(field) for field in got])
            assert_fragments_equal(without_version(got),
                                   without_version(want))


def _to_cpu(tree):
    from rlplay.engine.nested import suply
    return suply(lambda x: x.cpu(), tree)


@needs_cuda
@pytest.mark.parametrize("maker", list(MAKERS))
def test_batches_on_the_device(maker):
    def check(batch):
        assert all(x.device.type == "cuda" for x in flatten(batch))

    _compare_runs(maker, 6, check, device="cuda")


@needs_cuda
@pytest.mark.parametrize("maker", list(MAKERS))
def test_batches_pinned(maker):
    def check(batch):
        assert all(x.device.type == "cpu" and x.is_pinned()
                   for x in flatten(batch))

    _compare_runs(maker, 6, check, pinned=True)


@needs_cuda
@pytest.mark.parametrize("maker", list(MAKERS))
def test_device_copies_are_fresh(maker):
    with closing(MAKERS[maker](device="cuda", copy=True)) as feed:
        first, second = next(feed), next(feed)
    assert first.state.obs.device.type == "cuda"
    assert first.state.obs.data_ptr() != second.state.obs.data_ptr()


@needs_cuda
def test_multi_collates_on_the_device():
    """Two workers, two fragments per batch, delivered on the device: each
    slot is one worker's fragment (its envs, its sequence number)."""
    B = 3
    feed = multi.rollout(mixed_factory, CountingActor(), 5, 2, B, 4, 2,
                         entropy=1, device="cuda", timeout=CUDA_STEADY)
    with closing(feed):
        for batch in itertools.islice(feed, 5):
            assert batch.hx.device.type == "cuda"
            meta = batch.meta
            for s in range(2):
                cols = slice(s * B, (s + 1) * B)
                worker = int(meta.worker[s * B])
                assert torch.equal(meta.env[cols].cpu(), torch.arange(
                    worker * B, (worker + 1) * B))
                assert torch.all(meta.seq[cols] == meta.seq[s * B])


# ------------------------------------------- every start method, on a GPU --

@needs_cuda
@pytest.mark.parametrize("kwargs", [dict(device="cuda"), dict(pinned=True)],
                         ids=["device", "pinned"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["single", "multi"])
def test_delivery_under_each_start_method(kind, method, kwargs):
    """The batches on the device (or page-locked) equal the host batches of
    the same run, whichever way the worker was started."""
    host = make_kind(kind, method)
    other = make_kind(kind, method, **kwargs)
    with closing(host), closing(other):
        for want, got in itertools.islice(zip(host, other), 6):
            for x in flatten(got):
                if "device" in kwargs:
                    assert x.device.type == "cuda"
                else:
                    assert x.device.type == "cpu" and x.is_pinned()
            got = type(got)(*[None if field is None else
                              _to_cpu(field) for field in got])
            assert_fragments_equal(without_version(got),
                                   without_version(want))


class CudaReportingActor(CountingActor):
    """A :class:`CountingActor` whose info also says, per env, whether
    CUDA was initialised in the process that called it."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        act, hx, info = super().step(stepno, obs, act, rew, fin, hx=hx,
                                     virtual=virtual)
        flag = float(torch.cuda.is_initialized())
        info["cuda"] = torch.full(stepno.shape, flag)
        return act, hx, info


@needs_cuda
@pytest.mark.parametrize("kind", ["single", "multi"])
def test_cuda_is_never_initialised_in_a_forked_worker(kind):
    """The learner uses CUDA before it forks its workers (the batches go to
    the device): a forked child that touched CUDA would fail ("Cannot
    re-initialize CUDA in forked subprocess"); the workers' actor sees CUDA
    uninitialised in every row of every fragment."""
    torch.zeros(1, device="cuda")  # the learner's CUDA, before the fork
    assert torch.cuda.is_initialized()
    feed = make(kind, mixed_factory, CudaReportingActor(), 5, 4,
                n_actors=2, entropy=3, timeout=CUDA_STEADY, start_method="fork",
                device="cuda")
    with closing(feed):
        for batch in itertools.islice(feed, 6):
            assert batch.state.obs.device.type == "cuda"
            assert not batch.actor["cuda"].any()


@needs_cuda
def test_repeated_device_runs_leave_the_device_memory_as_it_was():
    """50 create / next / close cycles of ``multi.rollout(device='cuda')``
    (one with ``copy=True``, one reusing its device batch, in turn) leave
    ``torch.cuda.memory_allocated()`` where it was."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for cycle in range(50):
        feed = multi.rollout(mixed_factory, CountingActor(), 5, 1, 4, 2, 1,
                             entropy=cycle, device="cuda", timeout=CUDA_STEADY,
                             copy=bool(cycle % 2))
        with closing(feed):
            batch = next(feed)
            assert batch.state.obs.device.type == "cuda"
        del batch, feed
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
