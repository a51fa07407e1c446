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
is a run that did not finish (or is still running).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from rlmfamily.errors import MAX_LISTED_NAMES, RunNotFound, TrajectoryInvalid

FILENAME = "trajectory.jsonl"
# Characters of a prompt or a response a trajectory event keeps (the history keeps them whole).
PREVIEW_CHARS = 500


class TrajectoryWriter:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._seq = 0
        self._file = self.path.open("a", encoding="utf-8")

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
