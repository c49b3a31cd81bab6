import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# helper processes of multiprocessing itself that outlive a test by design
_PERSISTENT = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _direct_children(pid):
    pids = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return pids
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids.update(int(child) for child in f.read().split())
        except OSError:
            pass
    return pids


def _children():
    """Live descendants of this process, but for multiprocessing's own
    helper processes; the workers a forkserver started for us are the
    helper's children, so the walk goes on below it."""
    direct = _direct_children(os.getpid())
    alive, todo, seen = {}, list(direct), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        todo.extend(_direct_children(pid))
        # a forkserver's children inherit its command line: only the
        # helpers themselves (our direct children) are let off
        helper = pid in direct and any(name in cmd for name in _PERSISTENT)
        if state != "Z" and not helper:
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
