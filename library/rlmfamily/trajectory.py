"""The JSON-lines trajectory every run writes, and reading it back.

One JSON object per line, each with ``event``, ``seq`` and ``ts``. Events:
``run_started`` (question, corpus shape, kernel, model, limits, the process's
pid and start time), ``turn`` (the model's text and code, usage), ``step`` (one
python step: ok, error, the observation as the model saw it, history id),
``subcall`` (prompt preview, outcome, usage; a batch's in input order),
``final_request`` (why the model was asked to answer now) and ``run_finished``
(stop reason, answer, the run's own ``usage`` and the family allowance's
``budget`` totals). Lines are flushed as they are written, so a crashed run
still leaves everything up to the crash; a trajectory without ``run_finished``
is a run that did not finish (or is still running). The writer holds an
exclusive ``flock`` on the file while it is open, so a live run's trajectory is
never written by a second process (``rlm resume`` refuses it as ``run_running``);
the lock goes with the process, whatever kills it.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from rlmfamily.errors import MAX_LISTED_NAMES, RunNotFound, RunRunning, TrajectoryInvalid

FILENAME = "trajectory.jsonl"
# Characters of a prompt or a response a trajectory event keeps (the history keeps them whole).
PREVIEW_CHARS = 500
TAIL_BYTES = 1 << 16  # read from the end of a trajectory that is appended to, to find its last seq


def lock_trajectory(fd: int, path: Path) -> None:
    """Take the writer's lock on an open trajectory, or raise RunRunning (another process holds it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunRunning(f"run {path.parent.name} is still running: another process is writing {path}; "
                         "wait for it to finish, or stop it first") from None


def last_seq(path: Path) -> int:
    """The largest event ``seq`` in the tail of a trajectory (0 for none)."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - TAIL_BYTES))
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return 0
    seqs = []
    for line in lines:
        try:
            seqs.append(int(json.loads(line)["seq"]))
        except (ValueError, KeyError, TypeError):
            continue  # the cut first line of the tail
    return max(seqs, default=0)  # the largest: a subcall event's own "seq" is its sub-call's number


class TrajectoryWriter:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")
        try:
            lock_trajectory(self._file.fileno(), self.path)
        except RunRunning:
            self._file.close()
            raise
        self._seq = last_seq(self.path)  # a resumed run numbers on after the events it appends to

    def write(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._seq += 1
            record = {"event": event, "seq": self._seq, "ts": round(time.time(), 3), **fields}
            self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


def read_trajectory(path: str | Path) -> list[dict[str, Any]]:
    file = Path(path)
    events = []
    with file.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise TrajectoryInvalid(f"{file}: line {number} is not JSON") from None
            if not isinstance(record, dict) or "event" not in record:
                raise TrajectoryInvalid(f"{file}: line {number} has no 'event'")
            events.append(record)
    return events


def find_run(runs_dir: Path, run: str) -> Path:
    """The trajectory of ``run``: a path to a file, a run id, a unique id prefix, or "last"."""
    given = Path(run).expanduser()
    if given.is_file():
        return given
    if (given / FILENAME).is_file():
        return given / FILENAME
    candidates = sorted(p for p in runs_dir.glob("*") if (p / FILENAME).is_file()) if runs_dir.is_dir() else []
    if run in ("last", "latest"):
        if not candidates:
            raise RunNotFound(f"no runs under {runs_dir} yet (data dir: RLM_DATA_DIR / --data-dir)")
        return max(candidates, key=lambda p: (p / FILENAME).stat().st_mtime) / FILENAME
    exact = [p for p in candidates if p.name == run]
    matches = exact or [p for p in candidates if p.name.startswith(run)]
    if len(matches) == 1:
        return matches[0] / FILENAME
    if not matches:
        raise RunNotFound(f"no run {run!r} under {runs_dir} (data dir: RLM_DATA_DIR / --data-dir)")
    raise RunNotFound(f"{run!r} matches {len(matches)} runs: {', '.join(p.name for p in matches[:MAX_LISTED_NAMES])}")
