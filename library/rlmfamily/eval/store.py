"""The results folder of one experiment: a manifest, one JSON record per finished attempt, work folders.

::

    DIR/experiment.json           the pack (folder, digest), conditions, repeats, seed, spend cap
    DIR/attempts/<key>.json       one record per finished attempt, written atomically (temp file, fsync, rename)
    DIR/work/<key>/try-<n>/       the attempt's workspace and RLM data folder (trajectories, its budget)
    DIR/budget.sqlite3            the experiment's spend allowance (rlmfamily/budget.py)

An attempt is finished when its record exists; an interrupted run finds the records it has and runs
only the others. A record is never rewritten.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rlmfamily.eval.errors import ResultsMismatch, ResultsNotFound

RECORD_SCHEMA = 1
MANIFEST_KEYS = ("pack_digest", "tasks", "conditions", "repeats")  # what must match for a run to continue


def attempt_key(task_id: str, condition: str, repeat: int) -> str:
    return f"{task_id}__{condition}__r{repeat}"


class ResultsStore:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.attempts = folder / "attempts"
        self.work = folder / "work"
        self.manifest_path = folder / "experiment.json"
        self.budget_path = folder / "budget.sqlite3"

    def open(self, manifest: dict[str, Any]) -> bool:
        """Create the store, or continue it when it holds the same experiment. True when it existed."""
        if self.manifest_path.exists():
            stored = self.manifest()
            differs = [k for k in MANIFEST_KEYS if stored.get(k) != manifest.get(k)]
            if differs:
                raise ResultsMismatch(
                    f"{self.folder} holds another experiment ({', '.join(differs)} differ); give a new --results "
                    "folder, or the same pack, conditions and repeats to continue it")
            return True
        self.attempts.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(exist_ok=True)
        _write_atomic(self.manifest_path, manifest)
        return False

    def manifest(self) -> dict[str, Any]:
        try:
            return json.loads(self.manifest_path.read_text())
        except FileNotFoundError:
            raise ResultsNotFound(f"{self.folder} is not a results folder (no experiment.json); "
                                  "`rlm eval run ... --results DIR` makes one") from None

    def record_cap_raised(self, before: float, after: float) -> None:
        """The experiment's spend cap was raised (``rlm eval run`` again with a higher ``--max-usd``): the
        manifest's ``max_usd`` is the new cap, and ``max_usd_raised`` keeps each raise, oldest first."""
        manifest = self.manifest()
        raised = [*manifest.get("max_usd_raised", []), {"from": before, "to": after, "at": time.time()}]
        _write_atomic(self.manifest_path, {**manifest, "max_usd": after, "max_usd_raised": raised})

    def has(self, key: str) -> bool:
        return (self.attempts / f"{key}.json").exists()

    def write(self, record: dict[str, Any]) -> Path:
        path = self.attempts / f"{record['key']}.json"
        assert not path.exists(), f"the record of {record['key']} is written once"
        _write_atomic(path, record)
        return path

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.attempts.glob("*.json"))]

    def next_try(self, key: str) -> Path:
        """A fresh folder for another try of ``key``; earlier tries (interrupted) are kept for their records."""
        base = self.work / key
        n = 1
        while (base / f"try-{n}").exists():
            n += 1
        folder = base / f"try-{n}"
        folder.mkdir(parents=True)
        return folder


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
