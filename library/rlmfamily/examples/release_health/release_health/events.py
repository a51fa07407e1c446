"""Deployment events: one JSON object a line, parsed into DeploymentEvent.

The contract the report relies on:
- every event has an ``event_id``, a ``service``, a ``version``, a ``status``
  (``succeeded`` or ``failed``) and ``started_at`` / ``finished_at`` in ISO 8601
  with a UTC offset; they become timezone-aware datetimes;
- ``finished_at`` is never before ``started_at`` (such a line is refused);
- events are kept exactly as delivered: a duplicate (the same ``event_id``
  twice) stays twice, and the file's order is kept, which is not time order.
A line that breaks the contract raises EventError naming its line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

STATUSES = ("succeeded", "failed")
FIELDS = ("event_id", "service", "version", "status", "started_at", "finished_at")


class EventError(ValueError):
    """A line that is not a deployment event."""


@dataclass(frozen=True)
class DeploymentEvent:
    event_id: str
    service: str
    version: str
    status: str
    started_at: datetime
    finished_at: datetime

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def duration_s(self) -> float:
        return (self.finished_at - self.started_at).total_seconds()


def _instant(value: object, where: str) -> datetime:
    try:
        instant = datetime.fromisoformat(str(value))
    except ValueError:
        raise EventError(f"{where}: {value!r} is not an ISO 8601 time") from None
    if instant.tzinfo is None:
        raise EventError(f"{where}: {value!r} has no UTC offset")
    return instant


def parse_event(line: str, line_number: int = 1) -> DeploymentEvent:
    where = f"line {line_number}"
    try:
        raw = json.loads(line)
    except ValueError:
        raise EventError(f"{where}: not JSON") from None
    if not isinstance(raw, dict):
        raise EventError(f"{where}: not a JSON object")
    missing = [name for name in FIELDS if name not in raw]
    if missing:
        raise EventError(f"{where}: missing {', '.join(missing)}")
    if raw["status"] not in STATUSES:
        raise EventError(f"{where}: status {raw['status']!r} is not one of {', '.join(STATUSES)}")
    started_at = _instant(raw["started_at"], where)
    finished_at = _instant(raw["finished_at"], where)
    if finished_at < started_at:
        raise EventError(f"{where}: finished_at is before started_at")
    return DeploymentEvent(str(raw["event_id"]), str(raw["service"]), str(raw["version"]), raw["status"],
                           started_at, finished_at)


def parse_events(lines: list[str]) -> list[DeploymentEvent]:
    """Every non-blank line as an event, in the order given (duplicates kept)."""
    return [parse_event(line, number) for number, line in enumerate(lines, start=1) if line.strip()]


def load_events(path: str | Path) -> list[DeploymentEvent]:
    return parse_events(Path(path).read_text(encoding="utf-8").splitlines())
