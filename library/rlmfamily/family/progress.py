"""What the live progress line of ``rlm run`` shows of the family: the running children and their turn.

Read from the family store (which runs of the family are active) and from the
tail of each running child's trajectory (the latest turn it recorded). The line
renders several times a second, so the store is read at most every
``REFRESH_S``; a store that cannot be read leaves the last view in place, since a
progress line must never end the run it shows.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rlmfamily.errors import RLMError
from rlmfamily.family.store import FamilyStore
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import FILENAME

REFRESH_S = 0.5  # how often the line reads the family store (it renders 8 times a second)
TAIL_BYTES = 64 * 1024  # of a child's trajectory read for its latest turn (its last events are there)
MAX_NAMED = 4  # running children named on the line; the rest are counted


@dataclass(frozen=True)
class RunningChild:
    name: str  # short: c1, c1.c2, c1.f1 (as `rlm children` accepts them)
    state: str  # admitted | running
    turn: int | None  # the latest turn in its trajectory; None before its first


class RunningChildren:
    """The running members of one family (the root's children and theirs), as the progress line shows them."""

    def __init__(self, settings: RLMSettings, *, refresh_s: float = REFRESH_S) -> None:
        self.settings = settings
        self.refresh_s = refresh_s
        self.root_id: str | None = None
        self._store: FamilyStore | None = None
        self._read_at = float("-inf")
        self._running: list[RunningChild] = []
        self._ended = 0

    def watch(self, root_id: str) -> None:
        self.root_id = root_id

    def line(self) -> str:
        """``children 2 running (c1 turn 3, c2 starting), 1 ended``; empty while the run has no children."""
        self._refresh()
        if not self._running and not self._ended:
            return ""
        return describe(self._running, self._ended)

    def _refresh(self) -> None:
        now = time.monotonic()
        if self.root_id is None or now - self._read_at < self.refresh_s:
            return
        self._read_at = now
        path = self.settings.family_path
        if not path.is_file():  # no family yet: opening the store would create its file
            return
        try:
            self._store = self._store or FamilyStore(path)
            runs = self._store.runs(self.root_id)
        except RLMError:
            return
        active = [r for r in runs if r.active]
        self._ended = len(runs) - len(active)
        self._running = [RunningChild(_short(self.root_id, r.run_id), r.state,
                                      latest_turn(self.settings.runs_dir / r.run_id / FILENAME))
                         for r in active]


def describe(running: list[RunningChild], ended: int) -> str:
    named = [f"{c.name} turn {c.turn}" if c.state == "running" and c.turn else f"{c.name} starting"
             for c in running[:MAX_NAMED]]
    if len(running) > MAX_NAMED:
        named.append(f"+{len(running) - MAX_NAMED} more")
    line = f"children {len(running)} running" + (f" ({', '.join(named)})" if named else "")
    return line + (f", {ended} ended" if ended else "")


def latest_turn(path: Path) -> int | None:
    """The highest ``turn`` among the last events of a trajectory (None: none yet, or no file)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            tail = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if size > TAIL_BYTES:
        tail = tail[1:]  # the first line read is cut
    turns = []
    for line in tail:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(event, dict) and event.get("event") == "turn" and isinstance(event.get("turn"), int):
            turns.append(event["turn"])
    return max(turns, default=None)


def _short(root_id: str, run_id: str) -> str:
    return run_id[len(root_id) + 1:] if run_id.startswith(root_id + ".") else run_id
