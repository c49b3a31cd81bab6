"""RunningNorm (rlplay.engine.norm): exact running statistics, fed from
any generator's batches, travelling to the workers with the parameters."""
import math
from functools import partial

import numpy as np
import pytest
import torch
from torch import nn

from rlplay.engine import BaseActorModule, RunningNorm
from rlplay.engine.returns import frozen
from rlplay.engine.rollout import same

from envs import EndsEnv, counting_factory, varying_factory
from generators import make


def test_any_split_gives_numpys_mean_and_variance():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 3)) * [1, 10, 100]
    norm = RunningNorm((3,))
    start = 0
    for size in rng.integers(1, 60, size=100):
        norm.update(torch.from_numpy(data[start:start + size]))
        start += size
        if start >= len(data):
            break
    seen = data[:start]
    assert norm.count.item() == len(seen)
    np.testing.assert_allclose(norm.mean.numpy(), seen.mean(0), rtol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), seen.var(0), rtol=1e-10)
    z = norm(torch.from_numpy(seen).float())
    np.testing.assert_allclose(z.mean(0).numpy(), 0, atol=1e-5)
    np.testing.assert_allclose(z.std(0, unbiased=False).numpy(), 1,
                               atol=1e-5)


def test_masked_rows_and_bad_shapes():
    norm = RunningNorm((2,))
    x = torch.tensor([[[1.0, 2.0], [100.0, 100.0]], [[3.0, 4.0], [5.0, 6.0]]])
    norm.update(x, torch.tensor([[True, False], [True, True]]))
    assert norm.count.item() == 3
    assert norm.mean.tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match="normalized shape"):
        norm.update(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="mask"):
        norm.update(torch.zeros(4, 2), torch.ones(3, dtype=torch.bool))
    norm(torch.zeros(5, 2))  # forward on any leading dims
    again = RunningNorm((2,))
    again.load_state_dict(norm.state_dict())
    assert torch.equal(again.mean, norm.mean) and again.count == norm.count
    assert norm.clip is None and RunningNorm((2,), clip=5.0)(
        torch.full((1, 2), 1e9)).max().item() == 5.0


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(shape=(-1,)), ValueError, r"shape must be a tuple of ints >= 1, "
                                    r"got \(-1,\)"),
    (dict(shape=(0, 2)), ValueError, r"shape .* got \(0, 2\)"),
    (dict(shape=(2.5,)), TypeError, r"shape must be a tuple of ints, got "
                                    r"\(2.5,\)"),
    (dict(shape="ab"), TypeError, "shape must be a tuple of ints, got str"),
    (dict(shape=None), TypeError, "shape must be a tuple of ints, got "
                                  "NoneType"),
    (dict(shape=(True,)), TypeError, "shape must be a tuple of ints"),
    (dict(shape=(2,), clip=-1.0), ValueError, "clip must be None or a "
                                              "number > 0, got -1.0"),
    (dict(shape=(2,), clip=0), ValueError, "clip .* got 0"),
    (dict(shape=(2,), clip=float("nan")), ValueError, "clip .* got nan"),
    (dict(shape=(2,), clip=-math.inf), ValueError, "clip .* got -inf"),
    (dict(shape=(2,), clip="5"), TypeError, "clip must be a number"),
    (dict(shape=(2,), eps=-1e-8), ValueError, "eps must be a finite number "
                                              ">= 0, got -1e-08"),
    (dict(shape=(2,), eps=float("nan")), ValueError, "eps .* got nan"),
    (dict(shape=(2,), eps=math.inf), ValueError, "eps .* got inf"),
    (dict(shape=(2,), eps=None), TypeError, "eps must be a number"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        RunningNorm(**kwargs)


def test_good_arguments_are_taken():
    assert RunningNorm(()).mean.shape == ()
    assert RunningNorm(torch.Size([3, 2])).shape == (3, 2)
    assert RunningNorm([np.int64(2)], eps=0, clip=math.inf).shape == (2,)


@pytest.mark.parametrize("sticky", [False, True])
def test_update_from_counts_each_observation_the_actor_saw_once(sticky):
    from generators import CountingActor
    norm = RunningNorm((1,))
    seen = []
    with same.rollout(EndsEnv, CountingActor(), 6, 4, sticky=sticky,
                      entropy=1) as feed:
        for _, batch in zip(range(5), feed):
            norm.update_from(batch)
            obs = batch.state.obs[1:, :, 0].numpy()
            # rows 1 .. T, but the frozen ones of a sticky fragment
            keep = ~frozen(batch.state.fin)[1:].numpy() if sticky \
                else np.ones(obs.shape, bool)
            seen.append(obs[keep].astype(np.float64))
    seen = np.concatenate(seen)
    assert norm.count.item() == len(seen)
    np.testing.assert_allclose(norm.mean.item(), seen.mean(), rtol=1e-12)
    np.testing.assert_allclose(norm.var.item(), seen.var(), rtol=1e-10)


class NormActor(BaseActorModule):
    """Acts 0; its info is the normalized observation."""

    def __init__(self):
        super().__init__()
        self.norm = RunningNorm((1,))
        self.w = nn.Parameter(torch.zeros(()))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return torch.zeros(obs.shape[:2], dtype=torch.long), (), \
            {"z": self.norm(obs)}


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_workers_normalize_with_the_statistics_of_their_version(kind):
    actor = NormActor()
    published = {0: {key: v.clone() for key, v in
                     actor.norm.state_dict().items()}}
    feed = make(kind, varying_factory, actor, 4, 2, n_actors=2,
                entropy=3)
    with feed:
        for k in range(12):
            state = {key: v.clone() for key, v in
                     actor.norm.state_dict().items()}
            batch = next(feed)
            # next() published the statistics held when it was called: as
            # version k in single (from the second call on), as the
            # version it returns in multi
            published[feed.version if kind == "multi" else k] = state
            for j, v in enumerate(batch.meta.version.tolist()):
                stats = RunningNorm((1,))
                stats.load_state_dict(published[v])
                want = stats(batch.state.obs[:, j])
                torch.testing.assert_close(batch.actor["z"][:, j], want)
            actor.norm.update_from(batch)
    assert len({v for v in published}) > 3
    assert actor.norm.count.item() > 0


class ThresholdActor(BaseActorModule):
    """Acts 4 where the normalized observation is positive, else 0 (the
    reward of a CountingEnv is the action)."""

    def __init__(self):
        super().__init__()
        self.norm = RunningNorm((1,))
        self.w = nn.Parameter(torch.zeros(()))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        act = (self.norm(obs)[..., 0] > 0).long() * 4
        return act, (), {}


def test_the_evaluator_uses_the_statistics_of_the_version_submitted():
    actor = ThresholdActor()
    actor.norm.update(torch.tensor([[-1.0], [1.0]]))  # mean 0: acts 4
    with make("evaluator", partial(counting_factory, term_every=5), actor, n_envs=2, n_episodes=2,
              entropy=0) as evaluator:
        version = evaluator.submit(actor)
        # the learner's statistics move on (the mean far above every
        # observation: it would act 0) before the worker reads them
        actor.norm.update(torch.full((100, 1), 1e12))
        result = evaluator.result()
        assert result.version == version
        # episodes of 5 steps (term_every=5), each rewarded 4
        assert result.returns.tolist() == [20.0, 20.0]
        evaluator.submit(actor)
        assert evaluator.result().returns.tolist() == [0.0, 0.0]


def test_a_scalar_norm_scales_returns():
    # the return scaler: RunningNorm(()) on the learner, fed the returns
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(7, 5))
    norm = RunningNorm(())
    for part in np.array_split(data, 3):
        norm.update(torch.from_numpy(part))
    np.testing.assert_allclose(norm.mean.item(), data.mean())
    np.testing.assert_allclose(norm.var.item(), data.var())
    scaled = torch.from_numpy(data) / (norm.var + norm.eps).sqrt()
    np.testing.assert_allclose(scaled.std(unbiased=False).item(), 1.0)
