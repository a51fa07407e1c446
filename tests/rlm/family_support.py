"""Helpers for the family tests: a root run over a small document with a scripted family, and store lookups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlm.context import Context
from rlm.family.store import FamilyStore, RunRecord
from rlm.providers import ScriptedProvider
from rlm.session import RunResult, Session
from rlm.settings import RLMSettings
from rlm.trajectory import read_trajectory

DOCUMENT = "Ferry log.\nMAX_CRATES = 40\nDOCK_TIMEOUT_S = 90\n"


def child(pattern: str, *turns: str | dict[str, Any], subcall: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ``[[child]]`` entry of a script: the turns a child whose prompt matches ``pattern`` plays."""
    entry: dict[str, Any] = {"pattern": pattern, "root": [{"code": t} if isinstance(t, str) else t for t in turns]}
    if subcall:
        entry["subcall"] = subcall
    return entry


def script(root: list[str | dict[str, Any]], children: list[dict[str, Any]] = (), **top: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"root": [{"code": r} if isinstance(r, str) else r for r in root],
                            "child": list(children), **top}
    data.setdefault("default_answer", "NONE")
    return data


def run_root(settings: RLMSettings, tmp_path: Path, data: dict[str, Any], *, kernel: str = "monty",
             run_id: str | None = None, question: str = "question") -> RunResult:
    document = tmp_path / "ferry.txt"
    if not document.exists():
        document.write_text(DOCUMENT)
    provider = ScriptedProvider(json.loads(json.dumps(data)), source="family-test")
    session = Session(context=Context.from_document(document, settings), provider=provider, settings=settings,
                      kernel=kernel, run_id=run_id)
    return session.run(question)


def runs_of(settings: RLMSettings, root_id: str) -> list[RunRecord]:
    return FamilyStore(settings.family_path).runs(root_id)


def events(result: RunResult, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_trajectory(result.trajectory_path) if e["event"] == kind]


def observations(result: RunResult) -> list[str]:
    return [e["observation"] for e in events(result, "step")]
