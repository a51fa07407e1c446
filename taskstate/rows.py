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

An event (``lock`` then ``write_event``) costs what it changes, not what the
task holds (issue 17): it reads the task without its history, UPDATEs only the
columns that changed, and appends to the history in SQL. A column left out of
the UPDATE keeps its stored (TOASTed) value as it is, so a 328 KiB message in
the history is neither sent again nor WAL-logged again by a progress event.
An event that does change the history (a status message moves into it) still
makes PostgreSQL store the history's new value whole: it is one json column.

The SDK's own store (``VersionedDatabaseTaskStore``, the edge's reads and the
in-process conformance executor) is the one other writer of these tables, by
design: these functions mirror it. Events of tasks that ended long ago are
pruned here too (``prune_finished_events``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from a2a.server.models import TaskEventModel, TaskModel, TaskVersionModel
from a2a.types.a2a_pb2 import Message, Task, TaskArtifactUpdateEvent, TaskStatusUpdateEvent
from a2a.utils.proto_utils import to_stream_response
from google.protobuf.json_format import MessageToDict, ParseDict
from sqlalchemy import Connection, and_, select, text

TASKS = TaskModel.__table__
VERSIONS = TaskVersionModel.__table__
EVENTS = TaskEventModel.__table__

Event = Task | Message | TaskStatusUpdateEvent | TaskArtifactUpdateEvent


@dataclass
class Locked:
    """A task locked for one event (``lock``), read without its history: what an event needs to decide and
    apply. ``task.history`` holds only the messages this event appends (``write_event`` appends them in
    SQL), so an event costs what it changes, not what the task already holds."""

    task: Task
    version: int
    owner: str
    stored: dict[str, Any]  # the columns as read (status, metadata, artifacts if read): SET only what changed


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


def lock(conn: Connection, task_id: str, owner: str, *, with_artifacts: bool = False) -> Locked | None:
    """The owner's task, both rows locked until the transaction ends, read without its history (``Locked``);
    its artifacts only ``with_artifacts`` (an artifact event, or a caller that answers with the task).
    None if not theirs. Locks the version row before the task row, as the SDK's store does."""
    version = conn.execute(
        select(VERSIONS.c.version)
        .where(and_(VERSIONS.c.task_id == task_id, VERSIONS.c.owner == owner))
        .with_for_update()
    ).scalar_one_or_none()
    if version is None:
        return None
    columns = [TASKS.c.id, TASKS.c.context_id, TASKS.c.status, TASKS.c.metadata]
    if with_artifacts:
        columns.append(TASKS.c.artifacts)
    row = conn.execute(
        select(*columns).where(and_(TASKS.c.id == task_id, TASKS.c.owner == owner)).with_for_update()
    ).one_or_none()
    if row is None:
        return None
    task = Task(id=row.id, context_id=row.context_id)
    if row.status:
        ParseDict(row.status, task.status)
    if row.metadata:
        task.metadata.update(row.metadata)
    stored = {"status": row.status, "metadata": row.metadata or None}
    if with_artifacts:
        for artifact in row.artifacts or []:
            ParseDict(artifact, task.artifacts.add())
        stored["artifacts"] = row.artifacts or []
    return Locked(task=task, version=int(version), owner=owner, stored=stored)


# The history is spliced as json text: jsonb's ``||`` would re-encode it (and jsonb refuses a message's
# ``\u0000``). The stored text is always a json array written by json.dumps (ours or the SDK's).
_APPEND_HISTORY = """
    history = CASE
        WHEN history IS NULL OR json_typeof(history) <> 'array' OR json_array_length(history) = 0
            THEN CAST(CAST(:appended AS text) AS json)
        ELSE CAST(left(rtrim(CAST(history AS text), E' \\t\\r\\n'), -1) || ', '
                  || substr(CAST(:appended AS text), 2) AS json)
    END"""


def write_event(conn: Connection, locked: Locked, event: Event, *, returning_history: bool = False) -> int:
    """Write ``event`` as the task's next version (rows locked by ``lock``), in one statement: the task row
    SETs only the columns the event changed, and appends ``locked.task.history`` to the stored history.
    ``returning_history``: afterwards ``locked.task`` is the whole task as stored (history included), for a
    caller that answers with it. Returns the new version."""
    task, new_version = locked.task, locked.version + 1
    params: dict[str, Any] = {"task_id": task.id, "owner": locked.owner, "version": new_version,
                              "event_data": to_stream_response(event).SerializeToString()}
    sets = []
    for name, value in _changed_columns(locked).items():
        sets.append(f"{name} = CAST(:{name} AS {'timestamp' if name == 'last_updated' else 'json'})")
        params[name] = value if name == "last_updated" or value is None else json.dumps(value)
    if task.history:
        sets.append(_APPEND_HISTORY)
        params["appended"] = json.dumps([MessageToDict(message) for message in task.history])
    ctes = [
        "version AS (UPDATE task_versions SET version = :version WHERE task_id = :task_id)",
        "event AS (INSERT INTO task_events (task_id, owner, task_version, event_data) "
        "VALUES (:task_id, :owner, :version, :event_data))",
    ]
    if sets:
        ctes.insert(0, f"task AS (UPDATE tasks SET {', '.join(sets)} WHERE id = :task_id RETURNING history)")
    elif returning_history:
        ctes.insert(0, "task AS (SELECT history FROM tasks WHERE id = :task_id)")
    returned = "(SELECT history FROM task)" if returning_history else "NULL"
    history = conn.execute(text(f"WITH {', '.join(ctes)} SELECT {returned} AS history"), params).scalar_one()
    if returning_history:
        del task.history[:]
        for message in history or []:
            ParseDict(message, task.history.add())
    locked.version = new_version
    return new_version


def _changed_columns(locked: Locked) -> dict[str, Any]:
    """The columns of ``locked.task`` (history aside) that differ from what ``lock`` read."""
    task, changed = locked.task, {}
    status = MessageToDict(task.status)
    if status != locked.stored["status"]:
        changed["status"] = status
        changed["last_updated"] = task.status.timestamp.ToDatetime() if task.status.HasField("timestamp") else None
    metadata = MessageToDict(task.metadata) if task.metadata.fields else None
    if metadata != locked.stored["metadata"]:
        changed["metadata"] = metadata
    if "artifacts" in locked.stored:
        artifacts = [MessageToDict(artifact) for artifact in task.artifacts]
        if artifacts != locked.stored["artifacts"]:
            changed["artifacts"] = artifacts
    else:
        assert not task.artifacts, "artifacts changed on a task locked without them (lock(with_artifacts=True))"
    return changed


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
