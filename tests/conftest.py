import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# helper processes of multiprocessing itself that outlive a test by design
_PERSISTENT = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _children():
    pids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(pid) for pid in f.read().split())
        except OSError:
            pass
    alive = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and not any(name in cmd for name in _PERSISTENT):
            alive[pid] = cmd
    return alive


@pytest.fixture(autouse=True)
def no_child_left_behind():
    """Fail a test that leaves a child process running."""
    before = set(_children())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = {pid: cmd for pid, cmd in _children().items()
                if pid not in before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if left:
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        pytest.fail(f"the test left child processes behind: {left}")
