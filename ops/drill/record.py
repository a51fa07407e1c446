"""The owner of ``drill_runs``: each `specialists drill` run's verdict, kept in the database of the deployment it
drilled, so that `specialists health` (and the console's health page) can show the last one.

A run is recorded once it ends, whatever its verdict: its id, what it drilled, who ran it, when it started and
ended, and each scenario's verdict with its last line of evidence (clipped to ``MAX_EVIDENCE_CHARS``: the whole
evidence is in the drill's own output). The drill audits the service's tables and never writes them; this table
is its own.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Engine, text

# The CHECK constraints of migration 0230.
MAX_RUN_ID_CHARS = 64
MAX_TARGET_CHARS = 2000
MAX_OPERATOR_CHARS = 200
# A scenario's last line of evidence kept with its verdict (the drill's output keeps all of it), and how many
# scenarios one run records: the six a drill has, with room to grow. The whole array stays far below the
# CHECK's 64 KiB.
MAX_EVIDENCE_CHARS = 500
MAX_SCENARIOS = 32

RunVerdict = Literal["pass", "fail"]


@dataclass(frozen=True)
class ScenarioOutcome:
    scenario: str
    verdict: str  # pass | fail | skip (ops.drill.scenarios.VerdictKind)
    seconds: float
    evidence: str  # its last line of evidence, clipped to MAX_EVIDENCE_CHARS


@dataclass(frozen=True)
class DrillRun:
    run_id: str
    target: str  # what was drilled: "local, embedded dispatch", or the target's URLs
    operator: str | None
    started_at: datetime
    finished_at: datetime
    verdict: RunVerdict
    scenarios: tuple[ScenarioOutcome, ...]

    def as_record(self) -> dict[str, Any]:
        return asdict(self) | {"scenarios": [asdict(s) for s in self.scenarios]}


def outcome_of(scenario: str, verdict: str, seconds: float, evidence: list[str]) -> ScenarioOutcome:
    """A scenario's outcome as recorded: its last line of evidence, clipped."""
    last = evidence[-1] if evidence else ""
    return ScenarioOutcome(scenario, verdict, round(seconds, 2), last[:MAX_EVIDENCE_CHARS])


_INSERT = text(
    "INSERT INTO drill_runs (run_id, target, operator, started_at, finished_at, verdict, scenarios) "
    "VALUES (:run_id, :target, :operator, :started_at, :finished_at, :verdict, CAST(:scenarios AS jsonb))"
)
# The newest run (drill_runs_finished, read backwards).
_LAST = text(
    "SELECT run_id, target, operator, started_at, finished_at, verdict, scenarios FROM drill_runs "
    "ORDER BY finished_at DESC, run_id DESC LIMIT 1"
)


def record_run(engine: Engine, run: DrillRun) -> None:
    """Keep the run's verdict (its own transaction). Refuses what the table's CHECKs would (ValueError)."""
    if not 0 < len(run.run_id) <= MAX_RUN_ID_CHARS or not 0 < len(run.target) <= MAX_TARGET_CHARS:
        raise ValueError(f"a drill run's id is 1-{MAX_RUN_ID_CHARS} characters and its target 1-{MAX_TARGET_CHARS}")
    if len(run.scenarios) > MAX_SCENARIOS:
        raise ValueError(f"a drill run records at most {MAX_SCENARIOS} scenarios, got {len(run.scenarios)}")
    operator = run.operator[:MAX_OPERATOR_CHARS] if run.operator else None
    with engine.begin() as conn:
        conn.execute(_INSERT, {
            "run_id": run.run_id, "target": run.target, "operator": operator, "started_at": run.started_at,
            "finished_at": run.finished_at, "verdict": run.verdict,
            "scenarios": json.dumps([asdict(s) for s in run.scenarios]),
        })


def last_run(conn: Connection) -> DrillRun | None:
    """The run that ended last; None when no drill was recorded here."""
    row = conn.execute(_LAST).mappings().first()
    if row is None:
        return None
    return DrillRun(
        run_id=row["run_id"], target=row["target"], operator=row["operator"], started_at=row["started_at"],
        finished_at=row["finished_at"], verdict=row["verdict"],
        scenarios=tuple(ScenarioOutcome(**s) for s in row["scenarios"]),
    )
