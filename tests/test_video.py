"""Evaluation you can watch: ``Evaluator(record=DIR)`` writes the video of
the first episode of each evaluation, named by the parameter version; with
``record=None`` nothing is rendered."""
import functools
import os
from contextlib import closing

import numpy as np
import pytest

from envs import RenderEnv, render_factory
from generators import CountingActor, make
from rlplay.engine.core import evaluate
from rlplay.engine.errors import WorkerError

Image = pytest.importorskip("PIL.Image")


def _frames(path):
    with Image.open(path) as gif:
        frames = []
        for k in range(gif.n_frames):
            gif.seek(k)
            frames.append(np.asarray(gif.convert("RGB")))
    return np.stack(frames)


def test_evaluate_hands_out_env_0s_first_episode():
    envs = [RenderEnv("rgb_array", term_every=3) for _ in range(2)]
    frames = []
    returns, lengths = evaluate(envs, CountingActor(), 4,
                                on_frame=frames.append)
    assert lengths.tolist() == [3, 3, 3, 3]
    # its reset, then each of its 3 steps: obs 0, 1, 2, 3 (episode 0)
    assert [int(f[0, 0, 0]) for f in frames] == [0, 40, 80, 120]
    assert all(f.shape == (8, 8, 3) and f.dtype == np.uint8
               for f in frames)


def test_evaluate_hands_out_frames_up_to_max_steps():
    envs = [RenderEnv("rgb_array", term_every=None)]
    frames = []
    _, lengths = evaluate(envs, CountingActor(), 2, max_steps=5,
                          on_frame=frames.append)
    assert lengths.tolist() == [5, 5] and len(frames) == 6


def test_evaluate_refuses_an_env_that_renders_no_frames():
    with pytest.raises(TypeError, match="render_mode='rgb_array'.*env 0 "
                                        "rendered <class 'NoneType'>"):
        evaluate([RenderEnv(None)], CountingActor(), 1,
                 on_frame=lambda frame: None)


def test_a_video_per_evaluation_named_by_the_version(tmp_path):
    log = tmp_path / "renders.txt"
    record = tmp_path / "videos"
    actor = CountingActor()
    # RenderEnv takes render_mode: the evaluator asks for rgb_array frames
    factory = functools.partial(RenderEnv, term_every=4, log=str(log))
    with closing(make("evaluator", factory, actor, n_envs=2, n_episodes=4,
                      entropy=0, record=record)) as evaluator:
        results = []
        for _ in range(2):
            evaluator.submit(actor)
            results.append(evaluator.result())
    assert sorted(os.listdir(record)) == ["version-000001.gif",
                                          "version-000002.gif"]
    for result in results:
        assert result.video == str(record / f"version-"
                                             f"{result.version:06d}.gif")
        frames = _frames(result.video)
        # env 0's first episode: its reset and its 4 steps
        assert frames.shape == (5, 8, 8, 3)
        # exact colours (the shared palette holds them all): observations
        # one apart, 40 * obs % 256 each
        values = frames[:, 0, 0, 0].astype(int)
        assert (np.diff(values) % 256 == 40).all(), values
    # only env 0's first episode was rendered, in each evaluation
    assert len(log.read_text().split()) == 2 * 5


def test_nothing_is_rendered_without_record(tmp_path):
    log = tmp_path / "renders.txt"
    actor = CountingActor()
    factory = functools.partial(RenderEnv, "rgb_array", 4, str(log))
    with closing(make("evaluator", factory, actor, n_envs=2,
                      n_episodes=2)) as evaluator:
        evaluator.submit(actor)
        assert evaluator.result().video is None
    assert not log.exists()


def test_record_needs_envs_that_render_frames(tmp_path):
    # a factory that takes no render_mode makes envs that render nothing:
    # a clear error from the worker, not restarted
    actor = CountingActor()
    with closing(make("evaluator", render_factory, actor, n_envs=1,
                      n_episodes=1, record=tmp_path, restarts=1)) as ev:
        ev.submit(actor)
        with pytest.raises(WorkerError, match="render_mode='rgb_array'"):
            ev.result()
        assert ev.stats["restarts"] == 0


def test_record_must_be_a_directory():
    with pytest.raises(TypeError, match="record must be a directory"):
        make("evaluator", render_factory, CountingActor(), record=3)


def test_a_directory_that_cannot_be_written_is_refused_up_front(tmp_path):
    # refused in the learner, before the worker starts (which would fail
    # at its first video, and be restarted to no avail)
    afile = tmp_path / "a-file"
    afile.write_text("")
    bad = [afile, afile / "videos"]
    if os.geteuid() != 0:  # root writes into a read-only directory
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        bad.append(locked)
    for record in bad:
        with pytest.raises(ValueError, match="record must be a directory "
                                             "that can be written, got"):
            make("evaluator", render_factory, CountingActor(), record=record,
                 restarts=1)
    assert not list(tmp_path.glob("**/tmp*"))


@pytest.mark.parametrize("source", ["torch", "vector"])
def test_a_source_that_cannot_render_one_env_is_refused_up_front(
        source, tmp_path):
    """A torch source or a vector env renders all its envs at once: the
    evaluator refuses to record them when it is made, not at its first
    result."""
    from gymnasium.vector import SyncVectorEnv

    from rlplay.envs import TorchCartPole
    from torch import nn

    from rlplay.engine import PolicyActor
    if source == "torch":
        factory, name = functools.partial(TorchCartPole, 2), "TorchCartPole"
    else:
        factory = functools.partial(SyncVectorEnv, [RenderEnv] * 2)
        name = "SyncVectorEnv"
    with pytest.raises(TypeError, match=f"record=.* renders env 0's frames, "
                       f"but the {name} made by factory .* cannot render "
                       f"one env column: recording needs single envs"):
        make("evaluator", factory, PolicyActor(nn.Linear(4, 2))
             if source == "torch" else CountingActor(), n_envs=2,
             record=tmp_path)
