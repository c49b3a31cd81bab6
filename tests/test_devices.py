"""The actor on a device, through the policy seam, with ``"cpu"`` and
(skipped without CUDA) ``"cuda"``.

- :class:`~rlplay.engine.core.DevicePolicy` in both fragment loops (a
  list of Gymnasium envs, and a torch source) gives the fragments of the
  actor called on the rows themselves.
- ``actor_device=`` of ``same`` (the parameters' device, checked) and of
  the workers of ``single`` and ``multi`` (a copy on that device) gives
  the fragments of the default.
- Bad values are refused up front, naming the argument: not a device, a
  device that is not the parameters' (``same``), a list of the wrong
  length, CUDA without CUDA, under ``fork``, for Ray workers without
  ``num_gpus``.
- With CUDA: a torch source on the GPU writes its fragments there, with
  every invariant, delivered without a copy (``copy=False``).
"""
import functools
import itertools

import gymnasium
import numpy as np
import pytest
import torch

from cartpoles import Balancer, torch_cartpole
from generators import assert_fragments_equal, without_version
from rlplay.engine.core import (DevicePolicy, LocalPolicy, as_policy,
                                collect, prepare, startup)
from rlplay.engine.envs import make_batch
from rlplay.engine.nested import suply
from rlplay.engine.rollout import multi, same, single
from rlplay.engine.rollout._delivery import Delivery
from rlplay.engine.devices import worker_devices
from rlplay.engine.seeds import env_seed_sequences

from bounds import STEADY, START  # the reasons in bounds.py

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
T, B = 10, 4
CARTPOLE = functools.partial(gymnasium.make, "CartPole-v1")
TORCH_CARTPOLE = functools.partial(torch_cartpole, B, mode="SameStep")


def core_fragments(factory, policy, n=3):
    """``n`` fragments of the core loop alone, host copies."""
    envs = make_batch(factory, env_seed_sequences(3, B))
    try:
        buffer = prepare(envs, policy, T, B)
        ctx = startup(envs, policy, buffer, env_seed_sequences(3, B))
        out = []
        for _ in range(n):
            collect(policy, buffer, ctx)
            out.append(suply(lambda x: x.cpu().clone(), buffer.pyt))
        return out
    finally:
        envs.close()


def assert_close_fragments(got, want, exact):
    if exact:
        for g, w in zip(got, want):
            assert_fragments_equal(g, w)
        return
    for g, w in zip(got, want):  # a GPU may sum in another order
        suply(lambda x, y: torch.testing.assert_close(x, y), g, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("factory", [CARTPOLE, TORCH_CARTPOLE],
                         ids=["numpy", "torch"])
def test_device_policy_in_both_loops(factory, device):
    want = core_fragments(factory, Balancer())
    actor = Seeing().to(device)
    policy = DevicePolicy(actor, device)
    assert as_policy(policy) is policy
    got = core_fragments(factory, policy)
    assert_close_fragments(got, want, exact=device == "cpu")
    # the actor saw copies on its device, never the fragment's own rows:
    # at every real step
    assert policy._row.obs.device.type == device
    assert len(actor.seen) == 3 * T
    assert set(actor.seen) == {policy._row.obs.data_ptr()}


class Seeing(Balancer):
    """A :class:`Balancer` that notes where the rows of its real steps
    live."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if not virtual:
            self.seen.append(obs.data_ptr())
        return super().step(stepno, obs, act, rew, fin, hx=hx,
                            virtual=virtual)


def feed_fragments(feed, n=3):
    with feed:
        return [suply(lambda x: x.cpu().clone(), b)
                for b in itertools.islice(feed, n)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("factory", [CARTPOLE, TORCH_CARTPOLE],
                         ids=["numpy", "torch"])
def test_same_runs_the_actor_where_its_parameters_live(factory, device):
    want = feed_fragments(same.rollout(factory, Balancer(), T, B, entropy=5))
    actor = Balancer().to(device)
    feed = same.rollout(factory, actor, T, B, entropy=5,
                        actor_device=device)
    assert isinstance(feed.session.policy, DevicePolicy)
    assert_close_fragments(feed_fragments(feed), want,
                           exact=device == "cpu")
    # named by its parameters alone
    feed = same.rollout(factory, actor, T, B, entropy=5)
    expected = LocalPolicy if device == "cpu" else DevicePolicy
    assert type(feed.session.policy) is expected
    feed.close()


@pytest.mark.parametrize("device", DEVICES)
def test_workers_run_their_actor_on_a_device(device):
    factory = TORCH_CARTPOLE
    want = feed_fragments(same.rollout(factory, Balancer(), T, B, entropy=5))
    method = "fork" if device == "cpu" else "spawn"
    got = feed_fragments(single.rollout(
        factory, Balancer(), T, B, entropy=5, actor_device=device,
        start_method=method, timeout=STEADY, start_timeout=START))
    for g, w in zip(got, want):
        g, w = without_version(g), without_version(w)
        assert_close_fragments([g], [w], exact=device == "cpu")
    got = feed_fragments(multi.rollout(
        factory, Balancer(), T, 2, B, 4, 2, entropy=5,
        actor_device=[device, device], start_method=method, timeout=STEADY,
        start_timeout=START), n=2)
    assert got[0].state.obs.shape == (T + 1, 2 * B, 4)


def test_bad_actor_devices_are_refused_up_front():
    actor = Balancer()
    with pytest.raises(TypeError, match="actor_device must be"):
        same.rollout(CARTPOLE, actor, T, B, actor_device=3)
    with pytest.raises(ValueError, match="the actor's parameters live on "
                                         "cpu"):
        same.rollout(CARTPOLE, actor, T, B, actor_device="meta")
    with pytest.raises(ValueError, match="one per worker \\(2\\), got a "
                                         "list of 3"):
        multi.rollout(CARTPOLE, actor, T, 2, B, 2, 1,
                      actor_device=["cpu"] * 3)
    with pytest.raises(TypeError, match="actor_device must be a device"):
        single.rollout(CARTPOLE, actor, T, B, actor_device=[1])
    with pytest.raises(ValueError, match="num_gpus"):
        worker_devices("cuda", 2, ray_options={"num_cpus": 1})
    assert worker_devices("cuda", 2, ray_options={"num_gpus": 0.5}) == (
        torch.device("cuda"),) * 2
    if not torch.cuda.is_available():
        for make in (functools.partial(same.rollout, CARTPOLE, actor, T, B),
                     functools.partial(single.rollout, CARTPOLE, actor, T,
                                       B)):
            with pytest.raises(RuntimeError, match="needs CUDA"):
                make(actor_device="cuda")
    else:
        with pytest.raises(ValueError, match="start_method='fork'"):
            worker_devices("cuda", 1, start_method="fork")


@pytest.mark.parametrize("kind", ["single", "multi", "evaluator"])
@pytest.mark.parametrize("device", ["mps", "xla", "meta", "cpu", "mps:0"])
def test_worker_devices_other_than_cpu_and_cuda_are_refused_up_front(
        kind, device):
    """A worker's copy of the actor runs on the CPU or CUDA: another
    device type is refused when the generator is made, before a worker
    starts (not by every worker at its first step)."""
    from generators import make

    from rlplay.engine.rollout import Evaluator
    for value in (device, torch.device(device), [device] * (
            2 if kind == "multi" else 1)):
        if device == "cpu":
            assert worker_devices(value, 1 + (kind == "multi")) == (
                torch.device("cpu"),) * (1 + (kind == "multi"))
            continue
        with pytest.raises(ValueError, match=f"actor_device='{device}': a "
                           f"worker runs its copy of the actor on 'cpu' or "
                           f"on a 'cuda' device, not on "
                           f"'{device.split(':')[0]}'"):
            if kind == "evaluator":
                Evaluator(CARTPOLE, Balancer(), actor_device=value)
            else:
                make(kind, CARTPOLE, Balancer(), T, B, actor_device=value)


@pytest.mark.parametrize("name", ["copy", "pinned"])
@pytest.mark.parametrize("value", ["no", None, 0, 1.0, "False"])
@pytest.mark.parametrize("kind", ["same", "single", "multi"])
def test_delivery_flags_must_be_bools(kind, name, value):
    """``copy="no"`` would copy and ``copy=None`` hand out the reused
    buffer: a value that is not a bool is refused, naming it."""
    from generators import make
    with pytest.raises(TypeError, match=f"{name} must be True or False, "
                                        f"got {type(value).__name__} "
                                        f"{value!r}"):
        make(kind, CARTPOLE, Balancer(), T, B, **{name: value})
    assert Delivery(copy=np.bool_(False), pinned=np.bool_(False)).copy \
        is False


def test_delivery_leaves_a_device_batch_where_it_is():
    """A batch on a device (here "meta": no memory, no CUDA needed) is
    delivered there, itself with ``copy=False``, a fresh copy there with
    ``copy=True``."""
    batch = {"obs": torch.zeros(3, 2, device="meta")}
    assert Delivery(copy=False)(batch) is batch
    fresh = Delivery(copy=True)(batch)
    assert fresh["obs"] is not batch["obs"]
    assert fresh["obs"].device.type == "meta"


@needs_cuda
def test_a_torch_source_on_cuda_writes_there():
    factory = functools.partial(torch_cartpole, B, mode="NextStep",
                                device="cuda")
    actor = Balancer().cuda()
    with same.rollout(factory, actor, T, B, entropy=5, copy=False) as feed:
        assert feed.buffer.npy is None
        batch = next(feed)
        assert batch is feed.buffer.pyt  # delivered where it is
        assert batch.state.obs.device.type == "cuda"
        assert type(feed.session.policy) is LocalPolicy
        batch = next(feed)
        assert feed.stats["steps"] == 2 * T * B
    with same.rollout(factory, actor, T, B, entropy=5,
                      device="cpu") as feed:
        batch = next(feed)
        assert batch.state.obs.device.type == "cpu"
        assert np.isfinite(batch.state.obs.numpy()).all()
