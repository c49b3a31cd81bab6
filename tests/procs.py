"""Processes as /proc shows them, for the tests that check what a run
leaves behind (no rlplay import: the cluster script uses it too)."""
import os

__all__ = ["children", "descendants"]


def children(pid):
    """The direct children of ``pid`` (every thread's), as a set."""
    pids = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # it ended meanwhile
        return pids
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids.update(int(child) for child in f.read().split())
        except OSError:
            pass
    return pids


def descendants(pid):
    """Every descendant of ``pid`` (zombies included), as a set."""
    found, todo = set(), [pid]
    while todo:
        new = children(todo.pop()) - found
        found |= new
        todo.extend(new)
    return found
