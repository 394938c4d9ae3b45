"""Process checks the tests share: whether a process still runs, and the processes descended from one
(torchrun starts its workers in sessions of their own, so a process group misses them). Linux /proc."""

from __future__ import annotations

import os
from pathlib import Path


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has: it only waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """Every process now descended from ``pid`` (children, theirs, ...), whatever session or group it is in."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
