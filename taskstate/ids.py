"""Ids of jobs and tasks: the one place a job id is built or read.

A job is one outbox row: one per message, so a follow-up to a task is a job of
its own. Its id is ``<task id>.<dispatch id>`` (the task id is a UUID, which has
no dot). ``job_id_sql`` builds the same id in SQL, for the queries that meet a
claim (keyed by job id) and an outbox row (keyed by dispatch id), from the outbox
row's side: the claim is then a primary-key lookup. ``dispatch_id_of_sql`` reads
the dispatch id back out of a job id in SQL, for the queries that start from a
claim: the outbox row is then a primary-key lookup too. Neither needs an index of
its own (issue 18: joining on the built id alone scanned every outbox row).

A job dispatched from the outbox names its task in the signed payload
(``task_payload``: ``t`` task id, ``d`` dispatch id, ``o`` owner scope, ``x``
context id); ``TaskRef.of_payload`` reads it back. A job without them (a test's
raw job) serves no task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SEPARATOR = "."


def job_id_for(task_id: str, dispatch_id: int) -> str:
    return f"{task_id}{SEPARATOR}{dispatch_id}"


def task_id_of(job_id: str) -> str:
    """The task a job id belongs to (the job id itself when it names none)."""
    return job_id.rpartition(SEPARATOR)[0] or job_id


def split_job_id(job_id: str) -> tuple[str, int]:
    """``job_id_for`` read back: (task id, dispatch id). ValueError for an id no outbox row has."""
    task_id, _, dispatch_id = job_id.rpartition(SEPARATOR)
    if not task_id or not dispatch_id.isdigit():
        raise ValueError(f"{job_id!r} is not a job id of an outbox row (<task id>{SEPARATOR}<dispatch id>)")
    return task_id, int(dispatch_id)


def job_id_sql(alias: str) -> str:
    """``job_id_for`` in SQL, over an outbox row aliased ``alias``. The dispatch id is cast to text: ``text ||
    bigint`` is only STABLE, this is IMMUTABLE, should an index over it ever be wanted."""
    return f"({alias}.task_id || '{SEPARATOR}' || CAST({alias}.dispatch_id AS text))"


def dispatch_id_of_sql(job_id: str) -> str:
    """``split_job_id``'s dispatch id in SQL, over the job id expression ``job_id``: NULL for an id no outbox row
    has (a test's raw job), never an error. At most 18 digits, so the cast cannot overflow a bigint."""
    return f"CAST(substring({job_id} FROM '\\{SEPARATOR}([0-9]{{1,18}})$') AS bigint)"


def task_id_of_sql(job_id: str) -> str:
    """``task_id_of`` in SQL, over the job id expression ``job_id``: its part before the first dot (a task id, a
    UUID, has none), the id itself when it has no dot. Migration 0220 indexes this expression over
    ``specialist_runs`` (``specialist_runs_task``): keep the two the same."""
    return f"split_part({job_id}, '{SEPARATOR}', 1)"


@dataclass(frozen=True)
class TaskRef:
    """Which A2A task a job serves, from the job's verified payload."""

    task_id: str
    dispatch_id: int
    owner: str
    context_id: str

    @property
    def job_id(self) -> str:
        return job_id_for(self.task_id, self.dispatch_id)

    @classmethod
    def of_payload(cls, payload: Mapping[str, Any]) -> "TaskRef | None":
        if "t" not in payload:
            return None
        return cls(str(payload["t"]), int(payload["d"]), str(payload["o"]), str(payload["x"]))


def owner_of_payload(payload: Mapping[str, Any]) -> str | None:
    """The owner scope a job's payload names (``o``, ``<customer>:<specialist>``), with or without its task; None
    for a raw job that names none."""
    owner = payload.get("o")
    return None if owner is None else str(owner)


def task_payload(task_id: str, dispatch_id: int, owner: str, context_id: str) -> dict[str, Any]:
    """The signed payload naming a job's task (what ``TaskRef.of_payload`` reads back)."""
    return {"t": task_id, "d": dispatch_id, "o": owner, "x": context_id}
