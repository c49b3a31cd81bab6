"""``python -m rlplay.demo`` (``make demo``): its progress bar ends full,
where the run stopped, with a line saying why, whether the task was solved
or a budget was spent."""
import re

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
