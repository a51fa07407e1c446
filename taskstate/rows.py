"""The owner of the task tables: ``tasks``, ``task_versions`` and ``task_events``, in the a2a-sdk cluster store's format.

Admission must create the task in the same transaction as the reservation and
the outbox row, and cancel-before-claim must mark it canceled in the same
transaction as the void, so those writes cannot go through the SDK store
(which opens its own session). These functions write the same three tables
the SDK's ``VersionedDatabaseTaskStore`` writes (``tasks``, ``task_versions``,
``task_events``) with the same column encoding (mirroring its ``_to_orm`` /
``_from_orm``), the same version counter (first write 1, +1 per write) and the
same lock order (version row before task row). ``tests/app`` checks that a
task written here reads back identically through the SDK store.

The SDK's own store (``VersionedDatabaseTaskStore``, the edge's reads and the
in-process conformance executor) is the one other writer of these tables, by
design: these functions mirror it. Events of tasks that ended long ago are
pruned here too (``prune_finished_events``).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from a2a.server.models import TaskEventModel, TaskModel, TaskVersionModel
from a2a.types.a2a_pb2 import Message, Task, TaskArtifactUpdateEvent, TaskStatusUpdateEvent
from a2a.utils.proto_utils import to_stream_response
from google.protobuf.json_format import MessageToDict, ParseDict
from sqlalchemy import Connection, and_, insert, select, text, update

TASKS = TaskModel.__table__
VERSIONS = TaskVersionModel.__table__
EVENTS = TaskEventModel.__table__

Event = Task | Message | TaskStatusUpdateEvent | TaskArtifactUpdateEvent


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def _columns(task: Task, owner: str) -> dict[str, Any]:
    return {
        "id": task.id,
        "context_id": task.context_id,
        "kind": "task",
        "owner": owner,
        "last_updated": task.status.timestamp.ToDatetime() if task.status.HasField("timestamp") else None,
        "status": MessageToDict(task.status),
        "artifacts": [MessageToDict(artifact) for artifact in task.artifacts],
        "history": [MessageToDict(message) for message in task.history],
        "metadata": MessageToDict(task.metadata) if task.metadata.fields else None,
        "protocol_version": "1.0",
    }


def task_from_row(row: Any) -> Task:
    task = Task(id=row.id, context_id=row.context_id)
    if row.status:
        ParseDict(row.status, task.status)
    for artifact in row.artifacts or []:
        ParseDict(artifact, task.artifacts.add())
    for message in row.history or []:
        ParseDict(message, task.history.add())
    if row.metadata:
        task.metadata.update(row.metadata)
    return task


def _event_row(task_id: str, owner: str, version: int, event: Event) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "owner": owner,
        "task_version": version,
        "event_data": to_stream_response(event).SerializeToString(),
    }


def new_task_ctes(when: str = "true") -> str:
    """A new task at version 1, its version row, and the Task itself as its first event, as common
    table expressions written only ``when`` the condition holds: admission puts its own rows in the
    same statement (one round trip). Parameters: ``new_task_params``."""
    return f"""
    new_task AS (
        INSERT INTO tasks (id, context_id, kind, owner, last_updated, status, artifacts, history, metadata,
                           protocol_version)
        SELECT CAST(:task_id AS varchar), CAST(:context_id AS varchar), 'task', CAST(:owner AS varchar),
               CAST(:last_updated AS timestamp), CAST(:status AS json), CAST(:artifacts AS json),
               CAST(:history AS json), CAST(:metadata AS json), '1.0'
        WHERE {when}
    ),
    new_version AS (
        INSERT INTO task_versions (task_id, owner, version)
        SELECT CAST(:task_id AS varchar), CAST(:owner AS varchar), 1 WHERE {when}
    ),
    new_event AS (
        INSERT INTO task_events (task_id, owner, task_version, event_data)
        SELECT CAST(:task_id AS varchar), CAST(:owner AS varchar), 1, CAST(:event_data AS bytea) WHERE {when}
    )"""


_INSERT_NEW = text(f"WITH {new_task_ctes()} SELECT 1")


def new_task_params(task: Task, owner: str) -> dict[str, Any]:
    """Parameters of ``new_task_ctes``: the JSON columns as JSON text, like the SDK's JSON type writes them."""
    columns = _columns(task, owner)
    return {
        "task_id": task.id,
        "context_id": task.context_id,
        "owner": owner,
        "last_updated": columns["last_updated"],
        "status": json.dumps(columns["status"]),
        "artifacts": json.dumps(columns["artifacts"]),
        "history": json.dumps(columns["history"]),
        "metadata": json.dumps(columns["metadata"]) if columns["metadata"] is not None else None,
        "event_data": to_stream_response(task).SerializeToString(),
    }


def insert_new(conn: Connection, task: Task, owner: str) -> int:
    """Create a task at version 1; the Task itself is its first event. Returns the version."""
    conn.execute(_INSERT_NEW, new_task_params(task, owner))
    return 1


_TASK_WITH_VERSION = text(
    "SELECT t.*, v.version FROM tasks t JOIN task_versions v ON v.task_id = t.id WHERE t.id = :t AND t.owner = :o"
)


def read(conn: Connection, task_id: str, owner: str) -> Task | None:
    """The owner's task as stored, unlocked; None if not theirs."""
    row = conn.execute(select(TASKS).where(and_(TASKS.c.id == task_id, TASKS.c.owner == owner))).one_or_none()
    return None if row is None else task_from_row(row)


def owns(conn: Connection, task_id: str, owner: str) -> bool:
    """Whether the task exists and is the owner's, without a lock (a task's owner never changes)."""
    return conn.execute(
        select(VERSIONS.c.version).where(and_(VERSIONS.c.task_id == task_id, VERSIONS.c.owner == owner))
    ).first() is not None


def load(conn: Connection, task_id: str, owner: str) -> tuple[Task, int]:
    """The owner's task and its version, unlocked (the caller knows it exists: an idempotent resend)."""
    row = conn.execute(_TASK_WITH_VERSION, {"t": task_id, "o": owner}).one()
    return task_from_row(row), int(row.version)


def load_locked(conn: Connection, task_id: str, owner: str) -> tuple[Task, int] | None:
    """The owner's task and its version, both rows locked until the transaction ends; None if not theirs."""
    version = conn.execute(
        select(VERSIONS.c.version)
        .where(and_(VERSIONS.c.task_id == task_id, VERSIONS.c.owner == owner))
        .with_for_update()
    ).scalar_one_or_none()
    if version is None:
        return None
    row = conn.execute(
        select(TASKS).where(and_(TASKS.c.id == task_id, TASKS.c.owner == owner)).with_for_update()
    ).one_or_none()
    if row is None:
        return None
    return task_from_row(row), int(version)


def write(conn: Connection, task: Task, owner: str, version: int, event: Event) -> int:
    """Write ``task`` as the next version after ``version`` (rows locked by ``load_locked``)."""
    new_version = version + 1
    columns = _columns(task, owner)
    del columns["id"]
    conn.execute(update(TASKS).where(TASKS.c.id == task.id).values(**columns))
    conn.execute(update(VERSIONS).where(VERSIONS.c.task_id == task.id).values(version=new_version))
    conn.execute(insert(EVENTS).values(**_event_row(task.id, owner, new_version, event)))
    return new_version


def stamp(task: Task) -> None:
    """Set the status timestamp to now (the store derives ``last_updated`` from it)."""
    task.status.timestamp.FromDatetime(now_utc())


_PRUNE = text(
    """
    WITH doomed AS (
        SELECT e.seq
          FROM task_events e
          JOIN tasks t ON t.id = e.task_id
         WHERE t.status ->> 'state' IN ('TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED',
                                        'TASK_STATE_REJECTED')
           AND t.last_updated < now() - make_interval(secs => :retention_s)
         LIMIT :batch
    )
    DELETE FROM task_events WHERE seq IN (SELECT seq FROM doomed)
    """
)


def prune_finished_events(conn: Connection, *, retention_s: float, batch: int) -> int:
    """Delete up to ``batch`` events of tasks terminal for longer than ``retention_s``; how many were deleted."""
    return int(conn.execute(_PRUNE, {"retention_s": retention_s, "batch": batch}).rowcount)
