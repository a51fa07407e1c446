"""Process identity and stopping a process tree (Linux /proc), for child runs.

A pid alone proves nothing after a restart: it may have been recycled. A child
is *proven* to be ours when the pid is alive (not a zombie), its start time (in
clock ticks since boot, from ``/proc/<pid>/stat``) is the one recorded when it
was spawned, and its command line carries the random token of its run.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.02


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    state: str  # R, S, D, Z (zombie), T, ...
    start: str  # start time in clock ticks since boot


def stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    try:
        fields = raw.rsplit(b")", 1)[1].split()
        return ProcStat(pid, int(fields[1]), fields[0].decode(), fields[19].decode())
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> str | None:
    info = stat(pid)
    return info.start if info is not None else None


def alive(pid: int, start: str | None = None) -> bool:
    """The pid runs (a zombie has ended) and, if given, started at ``start``."""
    info = stat(pid)
    if info is None or info.state == "Z":
        return False
    return start is None or info.start == start


def proven(pid: int | None, start: str | None, token: str) -> bool:
    """Is ``pid`` the very process that was started with ``token``? Never assumed from the pid alone."""
    if not pid or not start or not token or not alive(pid, start):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return token.encode() in cmdline


def descendants(pid: int) -> list[ProcStat]:
    """Every live process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[ProcStat]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = stat(int(entry))
            if info is not None:
                children.setdefault(info.ppid, []).append(info)
    found: list[ProcStat] = []
    todo = [pid]
    while todo:
        for info in children.get(todo.pop(), []):
            found.append(info)
            todo.append(info.pid)
    return found


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies have ended) of process group ``pgid``: none left means the group is gone."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _signal(pid: int, start: str, sig: int) -> None:
    if alive(pid, start):  # never signal a recycled pid
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_tree(pid: int, start: str | None, grace_s: float, *, extra: list[tuple[int, str]] = ()) -> None:
    """SIGTERM ``pid`` (it cleans up), wait ``grace_s``, then SIGKILL it and every process below it.

    The tree is collected before each signal, so processes re-parented after their
    parent died are still found. ``extra`` adds processes (pid, start) known from
    elsewhere (a kernel that started its own session).
    """
    if start is None or not alive(pid, start):
        tree = [(p, s) for p, s in extra]
    else:
        tree = [(pid, start)] + [(d.pid, d.start) for d in descendants(pid)] + list(extra)
        _signal(pid, start, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and alive(pid, start):
            time.sleep(POLL_S)
        tree += [(d.pid, d.start) for d in descendants(pid)] if alive(pid, start) else []
    for member_pid, member_start in tree:
        for below in descendants(member_pid) if alive(member_pid, member_start) else []:
            tree.append((below.pid, below.start))
    for member_pid, member_start in tree:
        _signal(member_pid, member_start, signal.SIGKILL)
    deadline = time.monotonic() + max(grace_s, 1.0)
    while time.monotonic() < deadline and any(alive(p, s) for p, s in tree):
        time.sleep(POLL_S)
