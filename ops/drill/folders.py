"""The folders of `drill --local` runs without ``--logs``: one per run in the temporary folder, the newest kept.

Each run's folder (``specialists-drill-*``: the processes' logs, their data folder) is held with an advisory lock
(``flock`` on ``.running``) while the run lives; a new run removes the oldest folders past
``SPECIALISTS_DRILL_KEEP_LOCAL_RUNS``, never one whose lock is held (a drill still running, started earlier).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "specialists-drill-"
LOCK_NAME = ".running"


class RunFolder:
    """A new run's folder in the temporary folder, locked until ``release``."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX))
        self._lock = os.open(self.path / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def release(self) -> None:
        os.close(self._lock)  # the folder stays: its logs are the run's evidence


def prune(keep: int, *, current: Path) -> list[Path]:
    """Remove the oldest run folders beside ``current`` so that at most ``keep`` remain (``current`` counts);
    skip any still locked by its run. The removed folders."""
    parent = current.parent
    others = [p for p in parent.glob(f"{PREFIX}*") if p.is_dir() and p != current and not p.is_symlink()]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in others[max(keep - 1, 0):]:
        if _running(old):
            continue
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    return removed


def _running(folder: Path) -> bool:
    try:
        handle = os.open(folder / LOCK_NAME, os.O_RDWR)
    except OSError:
        return False  # no lock file: an older layout, or a run that never started
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(handle)
