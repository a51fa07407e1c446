"""The release-health report: one row per service, from its deployment events (RUNBOOK.md, "The report's three rules")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from release_health.events import DeploymentEvent

SLOW_DEPLOY_S = 300  # a successful deployment that took longer than this is slow (RUNBOOK.md, rule 3)


@dataclass(frozen=True)
class ServiceHealth:
    service: str
    version: str
    status: str  # "healthy" or "failing"
    slow: bool
    event_id: str
    finished_at: datetime


def release_health(events: list[DeploymentEvent]) -> list[ServiceHealth]:
    """One row per service, sorted by service name, following the runbook's three rules."""
    # TODO(runbook): a draft. It keeps a row per event, in file order, as the events arrived.
    rows = []
    for event in events:
        rows.append(ServiceHealth(
            service=event.service,
            version=event.version,
            status="healthy" if event.succeeded else "failing",
            slow=False,  # TODO(runbook): never set yet.
            event_id=event.event_id,
            finished_at=event.finished_at,
        ))
    return sorted(rows, key=lambda row: row.service)
