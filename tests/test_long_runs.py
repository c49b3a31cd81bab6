"""The long-run script of the documentation (docs/concepts/long-runs.md),
as it is written there: killed with SIGKILL between two checkpoints, started again, it goes
on from its last checkpoint as the same run, and its evaluation improves.
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from procs import descendants as _descendants

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "concepts" / "long-runs.md"
# the script imports this checkout's rlplay, whatever is installed
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
N_BATCHES, EVERY, KILL_AFTER = 30, 5, 10
from bounds import JOIN, LONG_RUN_PART as BOUND  # noqa: E402 (bounds.py says why)
LINE = re.compile(r"batch (\d+) seq (\d+) evaluation ([\d.]+)")


def _script(tmp_path):
    text = PAGE.read_text()
    blocks = re.findall(r"```python\n(# long_runs\.py.*?)```", text,
                        flags=re.S)
    assert len(blocks) == 1, f"the long-run script is missing from {PAGE}"
    path = tmp_path / "long_runs.py"
    path.write_text(blocks[0])
    return path


def _alive(pid):
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _start(script, checkpoint):
    return subprocess.Popen(
        [sys.executable, str(script), str(checkpoint), str(N_BATCHES)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=script.parent, env=ENV)


def test_the_long_run_survives_kill_9(tmp_path):
    script, checkpoint = _script(tmp_path), tmp_path / "run.pt"
    first, workers = [], []
    process = _start(script, checkpoint)
    try:
        deadline = time.monotonic() + BOUND
        for line in process.stdout:
            assert time.monotonic() < deadline, first
            match = LINE.fullmatch(line.strip())
            assert match, line  # nothing else is printed
            first.append(tuple(float(x) for x in match.groups()))
            if first[-1][0] == KILL_AFTER:
                workers = _descendants(process.pid)
                os.kill(process.pid, signal.SIGKILL)
                break
    finally:
        process.kill()
        process.wait(BOUND)
        process.stdout.close()
    assert process.returncode == -signal.SIGKILL
    assert workers  # its rollout worker and evaluator were running
    # a worker never outlives its learner
    deadline = time.monotonic() + JOIN
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker outlived the script"
        time.sleep(0.1)

    # the last checkpoint: at the kill's batch, or one later if the kill
    # came after the next one (a loaded machine)
    saved = torch.load(checkpoint, weights_only=True)
    k = saved["feed"]["counters"]["batches"]
    assert k in (KILL_AFTER, KILL_AFTER + EVERY)
    assert saved["feed"]["workers"][0]["seq"] == k

    done = subprocess.run(
        [sys.executable, str(script), str(checkpoint), str(N_BATCHES)],
        capture_output=True, text=True, timeout=BOUND, cwd=tmp_path,
        env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    second = [tuple(float(x) for x in LINE.fullmatch(line).groups())
              for line in done.stdout.split("\n") if line]
    # it went on from its checkpoint: the batch count and each batch's
    # seq continue (batch k holds fragment k - 1), nothing repeated
    assert [b for b, _, _ in second] == list(range(k + EVERY, N_BATCHES + 1,
                                                   EVERY))
    for batch, seq, _ in first + second:
        assert seq == batch - 1
    final = torch.load(checkpoint, weights_only=True)
    assert final["feed"]["seeds"]["resumes"] == 1
    assert final["feed"]["workers"][0] == {"seq": N_BATCHES, "generation": 1,
                                           "restarts": 0}
    assert final["evaluator"]["version"] == N_BATCHES // EVERY
    # and its evaluation keeps improving: the continuation's best is above
    # the first evaluation's (PPO's evaluations go up and down a little
    # from one checkpoint to the next)
    assert max(score for _, _, score in second) > first[0][2], (first,
                                                                 second)
