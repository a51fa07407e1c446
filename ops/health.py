"""`specialists health` and the console's health page: can work run now, what waits, who works, how the last
drill went. Both show this one record (``health``), so they cannot disagree.

- **Specialists**: each spec in SPECIALISTS_SPECS_DIR loaded (an invalid folder makes every one not ready, with
  the loader's message), for an ``rlm`` specialist its model route configured as a worker would judge it
  (``workers.hosted_rlm.serving.check_readiness``: the route, its key variable, the checkpoint key), and how many
  live workers serve it: a worker is live while its beat (``taskstate.liveness``, every SPECIALISTS_WORKER_BEAT_S)
  is at most SPECIALISTS_HEALTH_WORKER_LIVE_S old. Readiness of routes is judged with the settings of the process
  asking, so ask from where the workers' settings are; liveness is the workers' own word.
- **Queue**: the jobs no worker has taken yet, per specialist, how many of them wait to be delivered again (a
  dispatcher tried: a worker was unreachable, full or failing), and how long the oldest has waited
  (``taskstate.reads.service_facts``, the read the dispatchers' gauges and the edge's ``/metrics`` make too).
- **Push**: notifications pending, how long the oldest one due has waited for an attempt, and how many finally
  failed within SPECIALISTS_HEALTH_FAILURES_WINDOW_S.
- **Unknown jobs**: jobs whose outcome is unknown, holding credits until an operator reconciles them.
- **Workers seen**: those that claimed or renewed a job within SPECIALISTS_WORKER_SEEN_WINDOW_S, with when and how
  many jobs each runs (``taskstate.claims.workers_seen``).
- **Last drill**: the verdict of the last `specialists drill` recorded in this database (``ops.drill.record``).

``problems`` says, with a stable code each, why the service is not healthy: ``specs_invalid``,
``specialist_not_ready`` (route, key), ``no_live_worker``, ``job_wait_too_long`` (the oldest waiting job is
older than SPECIALISTS_HEALTH_MAX_JOB_WAIT_S), ``push_stalled`` (a notification due for longer than
SPECIALISTS_HEALTH_MAX_PUSH_WAIT_S). Any problem makes `specialists health` exit 1. Failed push deliveries and
unknown jobs are shown and never a problem here: a customer's webhook may be down, and unknowns have their own
alert and command.

Every part is bounded: the specs (``core.specs.MAX_SPECS``), the queue (one row per specialist), the workers
(SPECIALISTS_LEDGER_MAX_ROWS_PER_LISTING; their beats ``liveness.MAX_WORKERS_READ``), counts capped at
``taskstate.push.MAX_COUNTED``, one drill.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Engine

from core.settings import HealthSettings, Settings
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
class Problem:
    code: str  # specs_invalid, specialist_not_ready, no_live_worker, job_wait_too_long, push_stalled
    message: str  # what is wrong and where to look, naming the setting or command
    specialist_id: str | None = None


@dataclass
class Health:
    checked_at: datetime
    specialists: list[SpecialistReadiness]
    facts: task_reads.ServiceFacts
    workers: list[claims.WorkerSeen]  # the most recently seen first
    seen_window_s: float
    last_drill: record.DrillRun | None
    limits: HealthSettings
    specs_problem: str | None = None  # the specs folder did not load: no specialist is ready

    @property
    def queue(self) -> list[task_reads.SpecialistQueue]:
        return self.facts.queue

    @property
    def queued(self) -> int:
        return self.facts.queued

    @property
    def redelivery(self) -> int:
        return self.facts.redelivery

    @property
    def oldest_queued_age_s(self) -> float | None:
        return self.facts.oldest_queued_age_s

    @property
    def without_live_worker(self) -> list[str]:
        return self.facts.without_live_worker

    @property
    def problems(self) -> list[Problem]:
        found: list[Problem] = []
        if self.specs_problem is not None:
            found.append(Problem("specs_invalid", f"the specs did not load, so no specialist is ready: "
                                                  f"{self.specs_problem}"))
        for s in self.specialists:
            if not s.ready:
                found.append(Problem("specialist_not_ready", s.problem or "not ready", s.specialist_id))
        for specialist_id in self.without_live_worker:
            found.append(Problem(
                "no_live_worker",
                f"no worker serving {specialist_id} beat within {self.limits.worker_live_s:g} s "
                "(SPECIALISTS_HEALTH_WORKER_LIVE_S): its jobs wait; start a worker (`specialists worker`) or "
                "look at the workers' logs", specialist_id))
        oldest = self.oldest_queued_age_s
        if oldest is not None and oldest > self.limits.max_job_wait_s:
            found.append(Problem(
                "job_wait_too_long",
                f"the oldest job no worker has taken has waited {oldest:.0f} s, over "
                f"{self.limits.max_job_wait_s:g} s (SPECIALISTS_HEALTH_MAX_JOB_WAIT_S); {self.redelivery} wait to be "
                "delivered again: look for dispatch_retry and workers_unreachable in the dispatchers' logs"))
        due = self.facts.push.oldest_due_age_s
        if due is not None and due > self.limits.max_push_wait_s:
            found.append(Problem(
                "push_stalled",
                f"a push notification has been due for {due:.0f} s without an attempt, over "
                f"{self.limits.max_push_wait_s:g} s (SPECIALISTS_HEALTH_MAX_PUSH_WAIT_S): the dispatchers' push "
                "deliverers are down or behind (SPECIALISTS_PUSH_SIGNING_SECRETS set on the dispatchers?)"))
        return found

    @property
    def ready(self) -> bool:
        """No problem (what `specialists health` exits 0 for)."""
        return not self.problems

    def as_record(self) -> dict[str, Any]:
        facts = self.facts
        return {
            "checked_at": self.checked_at,
            "ready": self.ready,
            "problems": [asdict(p) for p in self.problems],
            "specs_problem": self.specs_problem,
            "specialists": [asdict(s) | {"ready": s.ready, "live_workers": facts.live_workers.get(s.specialist_id, 0)}
                            for s in self.specialists],
            "without_live_worker": self.without_live_worker,
            "live_workers": {"live_s": facts.live_s,
                             "beats": [asdict(w) | {"specialists": list(w.specialists)} for w in facts.workers]},
            "queue": {"queued": self.queued, "redelivery": self.redelivery,
                      "oldest_queued_age_s": self.oldest_queued_age_s,
                      "by_specialist": [asdict(q) for q in facts.queue]},
            "push": asdict(facts.push) | {"failures_window_s": self.limits.failures_window_s},
            "unknown_jobs": facts.unknown_jobs,
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
    limits = settings.health
    with engine.connect() as conn:
        facts = task_reads.service_facts(conn, specialists=[s.specialist_id for s in specialists],
                                         live_s=limits.worker_live_s, failures_window_s=limits.failures_window_s)
        now = facts.checked_at  # the database's clock, as the claims' times
        seen = claims.workers_seen(conn, since=now - timedelta(seconds=window_s),
                                   limit=settings.ledger.max_rows_per_listing)
        last = record.last_run(conn)
    return Health(
        checked_at=now.astimezone(timezone.utc),
        specialists=specialists,
        facts=facts,
        workers=seen,
        seen_window_s=window_s,
        last_drill=last,
        limits=limits,
        specs_problem=specs_problem,
    )
