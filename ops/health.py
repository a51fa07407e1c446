"""`specialists health` and the console's health page: is each specialist ready, what waits, who works, how the
last drill went.

- **Specialists**: each spec in SPECIALISTS_SPECS_DIR loaded (an invalid folder makes every one not ready, with
  the loader's message), and for an ``rlm`` specialist its model route configured as a worker would judge it
  (``workers.hosted_rlm.serving.check_readiness``: the route, its key variable, the checkpoint key). Readiness is
  judged with the settings of the process asking, so ask from where the workers' settings are.
- **Queue**: the jobs no worker has taken yet (outbox rows not done whose job has no claim, or a released one),
  per specialist, and how long the oldest has waited (``taskstate.reads.queue``).
- **Workers**: those that claimed or renewed a job within SPECIALISTS_WORKER_SEEN_WINDOW_S, with when and how
  many jobs each runs (``taskstate.claims.workers_seen``). An idle worker writes nothing, so it is not seen.
- **Last drill**: the verdict of the last `specialists drill` recorded in this database (``ops.drill.record``).

Every part is bounded: the specs (``core.specs.MAX_SPECS``), the queue (one row per specialist), the workers
(SPECIALISTS_LEDGER_MAX_ROWS_PER_LISTING), one drill.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Engine

from core.settings import Settings
from core.specs import SpecInvalid, load_specs
from ops.drill import record
from taskstate import claims
from taskstate import reads as task_reads


@dataclass(frozen=True)
class SpecialistReadiness:
    specialist_id: str
    skill: str | None  # the skill its card publishes; None when the specs did not load
    executor: str | None
    spec_loaded: bool
    route_configured: bool  # an rlm specialist's model route is ready here; True for executors that need none
    problem: str | None  # why it is not ready, in words an operator can act on

    @property
    def ready(self) -> bool:
        return self.spec_loaded and self.route_configured


@dataclass(frozen=True)
class QueuedJobs:
    specialist_id: str
    queued: int
    oldest_queued_at: datetime
    oldest_age_s: float


@dataclass
class Health:
    checked_at: datetime
    specialists: list[SpecialistReadiness]
    queue: list[QueuedJobs]  # specialists with queued jobs only
    workers: list[claims.WorkerSeen]  # the most recently seen first
    seen_window_s: float
    last_drill: record.DrillRun | None
    specs_problem: str | None = None  # the specs folder did not load: no specialist is ready

    @property
    def ready(self) -> bool:
        """Every specialist loaded and routed (what `specialists health` exits 0 for)."""
        return self.specs_problem is None and all(s.ready for s in self.specialists)

    @property
    def queued(self) -> int:
        return sum(q.queued for q in self.queue)

    @property
    def oldest_queued_age_s(self) -> float | None:
        return max((q.oldest_age_s for q in self.queue), default=None)

    def as_record(self) -> dict[str, Any]:
        return {
            "checked_at": self.checked_at,
            "ready": self.ready,
            "specs_problem": self.specs_problem,
            "specialists": [asdict(s) | {"ready": s.ready} for s in self.specialists],
            "queue": {"queued": self.queued, "oldest_queued_age_s": self.oldest_queued_age_s,
                      "by_specialist": [asdict(q) for q in self.queue]},
            "workers": {"seen_window_s": self.seen_window_s, "seen": [asdict(w) for w in self.workers]},
            "last_drill": self.last_drill.as_record() if self.last_drill is not None else None,
        }


def _readiness(settings: Settings) -> tuple[list[SpecialistReadiness], str | None]:
    from workers.hosted_rlm.serving import check_readiness  # the worker's own judgement, loaded only here

    try:
        specs = load_specs(settings.hosted.specs_dir)
    except SpecInvalid as invalid:
        return [], invalid.message
    problems = {p.specialist_id: p for p in check_readiness(settings)}
    found = []
    for specialist_id, loaded in sorted(specs.items()):
        problem = problems.get(specialist_id)
        found.append(SpecialistReadiness(
            specialist_id=specialist_id, skill=loaded.spec.skill.id, executor=loaded.spec.executor, spec_loaded=True,
            route_configured=problem is None,
            problem=None if problem is None else f"{problem.code}: {problem.message}",
        ))
    return found, None


def health(settings: Settings, engine: Engine) -> Health:
    """The service's health as this database and these settings tell it (see the module doc)."""
    specialists, specs_problem = _readiness(settings)
    window_s = settings.worker.seen_window_s
    with engine.connect() as conn:
        now = conn.exec_driver_sql("SELECT now()").scalar_one()  # the database's clock, as the claims' times
        queued = task_reads.queue(conn)
        seen = claims.workers_seen(conn, since=now - timedelta(seconds=window_s),
                                   limit=settings.ledger.max_rows_per_listing)
        last = record.last_run(conn)
    return Health(
        checked_at=now.astimezone(timezone.utc),
        specialists=specialists,
        queue=[QueuedJobs(q["specialist_id"], q["queued"], q["oldest_queued_at"],
                          max(0.0, (now - q["oldest_queued_at"]).total_seconds())) for q in queued],
        workers=seen,
        seen_window_s=window_s,
        last_drill=last,
        specs_problem=specs_problem,
    )
