"""What one task event costs the database, counted: the bytes sent and received, and the WAL it writes.

Shared by ``bench/task_events.py`` and ``tests/taskstate/test_event_cost.py``. The bytes are those of the
statements' parameters and results as psycopg hands them over (statement text left
out: it does not depend on the task). The WAL is that of the event's own transaction,
read back with ``pg_walinspect`` by its transaction id, so other writers of the same
server (the suite's other workers) do not count; full-page images are left out (they
depend on when the last checkpoint was, not on the event), and so are B-tree page splits
(a split, about 4 KiB, falls to whichever insert finds the page full: it depends on the
index's fill, which every writer shares, not on the event; CI saw one land on one task's
event and not the other's).
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from a2a.types.a2a_pb2 import Message, Part, Role, Task, TaskState, TaskStatus
from psycopg.types.json import Json
from sqlalchemy import Engine, event, text

from taskstate import claims, rows
from taskstate.ids import TaskRef, task_payload

OWNER = "event-cost:test"
LARGE_MESSAGE_BYTES = 328 * 1024  # the message


@dataclass
class Wire:
    sent_bytes: int = 0
    received_bytes: int = 0
    statements: int = 0

    @property
    def total_bytes(self) -> int:
        return self.sent_bytes + self.received_bytes


@dataclass(frozen=True)
class Cost:
    wire: Wire
    wal_bytes: int  # without full-page images and B-tree page splits


@dataclass(frozen=True)
class Job:
    job_id: str
    payload: dict[str, Any] = field(default_factory=dict)


def _param_bytes(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, Json):  # how SQLAlchemy hands psycopg a json column's value
        return len((value.dumps or json.dumps)(value.obj).encode())
    return len(str(value).encode())


def _parameters(parameters: Any) -> Iterator[Any]:
    if isinstance(parameters, dict):
        yield from parameters.values()
    elif isinstance(parameters, list | tuple):
        for item in parameters:
            yield from _parameters(item) if isinstance(item, dict | list | tuple) else [item]


@contextmanager
def counting_wire(engine: Engine) -> Iterator[Wire]:
    """Count, while open, the bytes of every statement's parameters and result on ``engine``."""
    wire = Wire()

    def before(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001, PLR0913
        wire.statements += 1
        wire.sent_bytes += sum(_param_bytes(value) for value in _parameters(parameters))

    def after(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001, PLR0913
        result = getattr(cursor, "pgresult", None)
        if result is None:
            return
        wire.received_bytes += sum(
            len(result.get_value(row, column) or b"")
            for row in range(result.ntuples)
            for column in range(result.nfields)
        )

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        yield wire
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)


def ensure_walinspect(engine: Engine) -> None:
    with engine.begin() as conn:  # the suite's workers share a database: one creates it
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('pg_walinspect'))"))
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))


_WAL_OF_XID = text(
    """
    SELECT COALESCE(sum(record_length - fpi_length), 0)
      FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn))
     WHERE xid = CAST(:xid AS xid)
       AND NOT (resource_manager = 'Btree' AND record_type IN ('SPLIT_L', 'SPLIT_R', 'INSERT_UPPER', 'NEWROOT'))
    """
)


def _flushed_lsn(engine: Engine) -> str:
    """The WAL flushed so far, after a commit that waits for its flush (the test server commits asynchronously)."""
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL synchronous_commit = on"))
        # A commit flushes only when its transaction wrote WAL: this record is that write.
        conn.execute(text("SELECT pg_logical_emit_message(true, 'event-cost', '')"))
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT pg_current_wal_flush_lsn()")).scalar_one())


def measure(engine: Engine, task_id: str, write: Callable[[], None]) -> Cost:
    """The cost of ``write``: one transaction that adds one event to the task."""
    with engine.connect() as conn:
        start = str(conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar_one())
    with counting_wire(engine) as wire:
        write()
    end = _flushed_lsn(engine)
    with engine.connect() as conn:
        xid = conn.execute(
            text("SELECT xmin FROM task_events WHERE task_id = :t ORDER BY task_version DESC LIMIT 1"), {"t": task_id}
        ).scalar_one()
        wal_bytes = int(conn.execute(_WAL_OF_XID, {"start": start, "end": end, "xid": str(xid)}).scalar_one())
    return Cost(wire=wire, wal_bytes=wal_bytes)


def claimed_task(engine: Engine, message_bytes: int) -> tuple[Job, int]:
    """A submitted task whose history holds the customer's message of ``message_bytes``, and its job's claim."""
    task_id, context_id = str(uuid.uuid4()), str(uuid.uuid4())
    text_ = secrets.token_hex(message_bytes // 2 + 1)[:message_bytes]  # random: compression hides nothing
    task = Task(id=task_id, context_id=context_id, status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
    rows.stamp(task)
    task.history.append(Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text_)],
                                task_id=task_id, context_id=context_id))
    ref = TaskRef(task_id, 1, OWNER, context_id)
    with engine.begin() as conn:
        rows.insert_new(conn, task, OWNER)
        claimed = claims.claim(conn, ref.job_id, worker_id="event-cost", lease_s=600)
    assert claimed.outcome == "claimed", claimed
    return Job(ref.job_id, task_payload(task_id, 1, OWNER, context_id)), claimed.fencing_token
