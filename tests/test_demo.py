"""``python -m rlplay.demo`` (``make demo``): its progress bar ends full,
where the run stopped, with a line saying why, whether the task was solved
or a budget was spent."""
import re
import sys

import pytest

pytest.importorskip("tqdm")

from rlplay import demo  # noqa: E402


def _bar_end(err):
    """The last state tqdm drew (it redraws the line after a ``\\r``)."""
    return re.split(r"[\r\n]+", err.strip())[-1]


def test_a_solved_run_ends_its_bar_full(monkeypatch, capsys):
    # every evaluation counts as perfect: solved at the second one
    monkeypatch.setattr(demo, "MAX_RETURN", 0.0)
    monkeypatch.setattr(demo, "EVAL_EVERY", 2)
    monkeypatch.setattr(demo, "EVAL_LAG", 1)
    monkeypatch.setattr(demo, "N_EVAL_EPISODES", 2)
    demo.main(["--generator", "same", "--steps", "500000"])
    out, err = capsys.readouterr()
    # asked after batches 2 and 4, read one batch later: 5 batches of 1024
    assert "solved at 5120 env steps: 2 evaluations in a row returned 0" \
        in out, out
    end = _bar_end(err)
    assert "solved" in end and "100%" in end and "5.12k/5.12k" in end, end


def test_a_spent_budget_says_so(capsys):
    demo.main(["--generator", "same", "--steps", "2048"])
    out, err = capsys.readouterr()
    assert "stopped at 2048 env steps: the step budget (2048) is spent" \
        in out, out
    end = _bar_end(err)
    assert "stopped" in end and "100%" in end, end


def test_logdir_writes_the_curves_to_tensorboard(monkeypatch, tmp_path):
    """``--logdir``: TensorBoard's own reader finds every curve the demo's
    docstring lists, at the env steps of the batches (and of the
    evaluations)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import \
        EventAccumulator
    from rlplay.engine.rollout import STATS_KEYS

    monkeypatch.setattr(demo, "EVAL_EVERY", 2)
    monkeypatch.setattr(demo, "EVAL_LAG", 1)
    monkeypatch.setattr(demo, "N_EVAL_EPISODES", 2)
    demo.main(["--generator", "same", "--steps", "4096",
               "--logdir", str(tmp_path)])
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()

    def steps(tag):
        return [event.step for event in events.Scalars(tag)]

    def values(tag):
        return [event.value for event in events.Scalars(tag)]

    # every batch of 1024 steps: the stats of same.rollout (no workers;
    # CartPole's episodes end in every batch) and the learner's scalars
    rollout = {f"rollout/{key}" for key in STATS_KEYS
               - {"returns", "lengths", "workers"}} | {
        "rollout/returns/mean", "rollout/lengths/mean"}
    train = {f"train/{key}" for key in ("lr", "loss_pi", "loss_v",
                                        "entropy", "return")}
    evaluation = {"eval/return", "eval/best", "eval/final_return"}
    assert set(events.Tags()["scalars"]) == rollout | train | evaluation
    batches = [1024, 2048, 3072, 4096]
    for tag in rollout | train:
        assert steps(tag) == batches, tag
    assert values("rollout/steps") == batches
    assert values("rollout/batches") == [1, 2, 3, 4]
    assert values("train/lr") == pytest.approx(
        [demo.LR * (1 - n / 4096) for n in [0] + batches[:-1]])
    # asked after batch 2 (the parameters of step 2048), read after batch
    # 3; the final evaluation at the last step
    assert steps("eval/return") == steps("eval/best") == [2048]
    assert steps("eval/final_return") == [4096]


def test_logdir_without_tensorboard_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(SystemExit):
        demo.main(["--generator", "same", "--logdir", "unused"])
    err = capsys.readouterr().err
    assert "--logdir needs TensorBoard" in err, err
    assert "pip install -e 'path/to/rlplay[tensorboard]'" in err, err
