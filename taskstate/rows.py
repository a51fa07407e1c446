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

The SDK's own store (``VersionedDatabaseTaskStore``, the edge's GetTask and
SubscribeToTask, and the in-process conformance executor) is the one other writer
of these tables, by design: these functions mirror it. Events of tasks that ended
long ago are pruned here too (``prune_finished_events``).

ListTasks is read here, not through the SDK's store (issue 18): ``list_page`` reads
one page as keyset ranges of an index in the listing's order (migration 0180), and
``owner_total`` / ``count_matching`` give its total without counting what a page
does not hold. The per-owner counts (``task_counts``) are kept by triggers on
``tasks`` (migration 0180), so every writer, the SDK's store included, keeps them.
"""

from __future__ import annotations

import functools
import json
import re
from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from a2a.server.models import TaskEventModel, TaskModel, TaskVersionModel
from a2a.types.a2a_pb2 import Message, Task, TaskArtifactUpdateEvent, TaskStatusUpdateEvent
from a2a.utils.proto_utils import to_stream_response
from google.protobuf.json_format import MessageToDict, ParseDict
from sqlalchemy import Connection, Select, TextClause, and_, bindparam, select, text

from core import db
from core.fragments import Fragment, compose
from taskstate.pages import Page, page_of

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
    pushed: bool = False  # set by ``write_event(pushed_sql=...)``: the task has push configurations (a notification)
    beside: Mapping[str, Any] | None = None  # set by ``write_event(beside=...)``: its row, by its columns' names


@dataclass(frozen=True)
class Beside:
    """Another owner's statement that runs in an event's own statement, in the same round trip (a job's settlement,
    ``workers.settlement``): its fragment (one row, read back by ``columns``) and its parameters, whose names the
    event's statement does not use. The task's rows are locked before (``lock``), so the lock order holds."""

    fragment: Fragment
    columns: tuple[str, ...]
    params: Mapping[str, Any]


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


# A new task at version 1, its version row, and the Task itself as its first event, written only ``{when}`` the
# condition holds: admission puts its own rows in the same statement (one round trip). Three common table
# expressions (``new_task``, ``new_version``, ``new_event``): the fragment is placed with ``NEW_TASK.ctes(when)``.
# Parameters: ``new_task_params``.
NEW_TASK = Fragment.of("taskstate.rows", """
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
    """, ("task_id", "context_id", "owner", "last_updated", "status", "artifacts", "history", "metadata",
          "event_data"))

_INSERT_NEW = compose("rows.insert_new", "WITH {new_task} SELECT 1", new_task=NEW_TASK.cte("new_task"))


def new_task_params(task: Task, owner: str) -> dict[str, Any]:
    """Parameters of ``NEW_TASK``: the JSON columns as JSON text, like the SDK's JSON type writes them."""
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
    _INSERT_NEW.execute(conn, new_task_params(task, owner))
    return 1


_TASK_WITH_VERSION_SQL = (
    "SELECT t.*, v.version FROM tasks t JOIN task_versions v ON v.task_id = t.id WHERE t.id = :t AND t.owner = :o"
)
_TASK_WITH_VERSION = text(_TASK_WITH_VERSION_SQL)


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


# The owner's task and its version when its state is one of ``states`` (``TASK_STATE_COMPLETED`` ...), else no row:
# one statement that carries the task only when the caller wants it (a blocking send's wait, on each wake-up), and
# its history only ``with_history`` (a caller that asked for none gets none). In psycopg's form, for the edge's
# async driver (``core.db.driver_rows``; issue 44: through SQLAlchemy's ``run_sync`` and execution the read cost 1.4
# times its CPU), the states written into the text (a list parameter is dumped by psycopg in Python at every read);
# the row is ``IF_IN_COLUMNS``, read back by ``task_if_in``.
IF_IN_COLUMNS = ("id", "context_id", "status", "artifacts", "history", "metadata", "version")
_STATE_NAME = re.compile(r"TASK_STATE_[A-Z_]+")  # matched whole: `$` would let a trailing newline through


@functools.lru_cache(maxsize=8)
def task_if_in_sql(states: tuple[str, ...]) -> str:
    """The read's text for these states (names of ``TaskState``, checked: they are written into the text)."""
    assert states and all(_STATE_NAME.fullmatch(state) for state in states), states
    listed = ", ".join(f"'{state}'" for state in states)
    return (
        "SELECT t.id, t.context_id, t.status, t.artifacts, CASE WHEN %(with_history)s THEN t.history END, "
        "t.metadata, v.version FROM tasks t JOIN task_versions v ON v.task_id = t.id "
        f"WHERE t.id = %(t)s AND t.owner = %(o)s AND t.status ->> 'state' IN ({listed})"
    )


def task_if_in(row: tuple[Any, ...]) -> tuple[Task, int]:
    """The task and its version from a row of ``task_if_in_sql``'s statement."""
    found = _IfIn(*row)
    return task_from_row(found), int(found.version)


_IfIn = namedtuple("_IfIn", IF_IN_COLUMNS)  # type: ignore[misc]  # task_from_row reads the columns by name


def _lock_statement(with_artifacts: bool) -> Select[Any]:
    columns = [VERSIONS.c.version, TASKS.c.id, TASKS.c.context_id, TASKS.c.status, TASKS.c.metadata]
    if with_artifacts:
        columns.append(TASKS.c.artifacts)
    task_id, owner = bindparam("task_id"), bindparam("owner")
    return (
        select(*columns)
        .select_from(VERSIONS.join(TASKS, TASKS.c.id == VERSIONS.c.task_id))
        .where(and_(VERSIONS.c.task_id == task_id, VERSIONS.c.owner == owner, TASKS.c.owner == owner))
        .with_for_update(of=[VERSIONS, TASKS])
    )


# Built once: a job's finish locks its task, and building the select each time cost as much as running it (issue 44).
_LOCK = {with_artifacts: _lock_statement(with_artifacts) for with_artifacts in (False, True)}

# ``lock`` as a fragment, for a statement that locks the task in its own round trip, only ``{when}`` its condition
# holds (a job's finish: once the claim's finish was accepted and the job's outbox row closed, the lock order).
# Its columns are version, id, context_id, status, metadata and, with artifacts, artifacts: ``locked_of`` reads them.


def lock_fragment(*, with_artifacts: bool) -> Fragment:
    artifacts = ", t.artifacts" if with_artifacts else ""
    return Fragment.of("taskstate.rows", f"""
    SELECT v.version, t.id, t.context_id, t.status, t.metadata{artifacts}
      FROM task_versions v JOIN tasks t ON t.id = v.task_id
     WHERE v.task_id = :task_id AND v.owner = :owner AND t.owner = :owner AND {{when}}
       FOR UPDATE OF v, t""", ("task_id", "owner"))


def lock(conn: Connection, task_id: str, owner: str, *, with_artifacts: bool = False) -> Locked | None:
    """The owner's task, both rows locked until the transaction ends, read without its history (``Locked``);
    its artifacts only ``with_artifacts`` (an artifact event, or a caller that answers with the task).
    None if not theirs. One statement (issue 44: it was two); its rows are locked in the order ``FOR UPDATE OF``
    names them, the version row before the task row, as the SDK's store locks them."""
    found = db.hot_rows(conn, _LOCK[with_artifacts], {"task_id": task_id, "owner": owner})
    if not found:
        return None
    [row] = found
    return locked_of(row, owner, with_artifacts=with_artifacts)


def locked_of(row: Mapping[str, Any], owner: str, *, with_artifacts: bool) -> Locked:
    """The ``Locked`` task of a row of ``lock``'s statement, or of ``lock_fragment``'s columns in another's."""
    version = row["version"]
    task = Task(id=row["id"], context_id=row["context_id"])
    if row["status"]:
        ParseDict(row["status"], task.status)
    if row["metadata"]:
        task.metadata.update(row["metadata"])
    stored = {"status": row["status"], "metadata": row["metadata"] or None}
    if with_artifacts:
        for artifact in row["artifacts"] or []:
            ParseDict(artifact, task.artifacts.add())
        stored["artifacts"] = row["artifacts"] or []
    return Locked(task=task, version=int(version), owner=owner, stored=stored)


# The history is spliced as json text: jsonb's ``||`` would re-encode it (and jsonb refuses a message's
# ``\u0000``). The stored text is a json array written by json.dumps (ours or the SDK's): a full one starts with
# ``[`` and ends with ``]``, cut as the last byte of the text's bytes (``convert_to``, once); a short one (an empty
# array, or one in another form) takes the checks that parse it. Text functions walk a multibyte text character by
# character (``rtrim``, ``left(..., -1)``) and json_array_length parses all of it: on a 463 KB history the append
# took 6.7 ms, 5.1 with the byte cut (issue 44: every status event that moves a message into the history, a hosted
# review's final one included). ``OFFSET 0`` keeps the bytes a subquery of their own, computed once: inlined, each
# mention of ``stored`` detoasted and copied the history again (7.8-10.0 ms against 5.2-6.5 an append of 437 KB).
_APPEND_HISTORY = """
    history = (SELECT CASE
        WHEN stored IS NULL THEN CAST(CAST(:appended AS text) AS json)
        WHEN length(stored) > 64 AND get_byte(stored, 0) = 91 AND get_byte(stored, length(stored) - 1) = 93
            THEN CAST(convert_from(substring(stored FROM 1 FOR length(stored) - 1), 'UTF8')
                      || ', ' || substr(CAST(:appended AS text), 2) AS json)
        WHEN json_typeof(history) <> 'array' OR json_array_length(history) = 0
            THEN CAST(CAST(:appended AS text) AS json)
        ELSE CAST(left(rtrim(CAST(history AS text), E' \\t\\r\\n'), -1) || ', ' || substr(CAST(:appended AS text), 2) AS json)
    END FROM (SELECT convert_to(CAST(history AS text), 'UTF8') AS stored OFFSET 0) AS bytes)"""


def write_event(conn: Connection, locked: Locked, event: Event, *, returning_history: bool = False,
                pushed_sql: str | None = None, beside: Beside | None = None) -> int:
    """Write ``event`` as the task's next version (rows locked by ``lock``), in one statement: the task row
    SETs only the columns the event changed, and appends ``locked.task.history`` to the stored history.
    ``returning_history``: afterwards ``locked.task`` is the whole task as stored (history included), for a
    caller that answers with it. ``pushed_sql`` (``push.configured_sql()``): a condition on ``:task_id`` and
    ``:owner`` read in the same statement into ``locked.pushed``. ``beside``: another owner's statement run in
    this one (issue 44: a round trip fewer in a job's finish), its row into ``locked.beside``. Returns the new
    version."""
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
    pushed = pushed_sql or "false"
    select = f"SELECT {returned} AS history, {pushed} AS pushed"
    if beside is not None:
        assert not params.keys() & beside.params.keys(), sorted(params.keys() & beside.params.keys())
        assert beside.params.keys() == beside.fragment.params, (sorted(beside.params), sorted(beside.fragment.params))
        ctes.append(beside.fragment.cte("beside").sql)
        params.update(beside.params)
        select += "".join(f", beside.{column} AS beside_{column}" for column in beside.columns)
        select += " FROM (SELECT 1) AS one LEFT JOIN beside ON true"
    statement = _event_clause(f"WITH {', '.join(ctes)} {select}")
    [written] = db.hot_rows(conn, statement, params)
    history = written["history"]
    locked.pushed = bool(written["pushed"])
    if beside is not None:
        locked.beside = {column: written[f"beside_{column}"] for column in beside.columns}
    if returning_history:
        del task.history[:]
        for message in history or []:
            ParseDict(message, task.history.add())
    locked.version = new_version
    return new_version


# The forms of ``write_event``'s statement: which of four columns it sets, whether it returns the history, its
# push condition or none, and a statement beside it (a job's settlement) or none.
EVENT_STATEMENTS = 64


@functools.lru_cache(maxsize=EVENT_STATEMENTS)
def _event_clause(sql: str) -> TextClause:
    """``write_event``'s statement, parsed once per form (which columns changed, history, push condition)."""
    return text(sql)


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


# --- what a task that ended long ago no longer needs ----------------------------------------------------

# The states a task never leaves, as the store writes them (``status ->> 'state'``).
def status_of_sql(task_id: str) -> str:
    """The task's status by its key, as a LATERAL sub-query of (a2a_state, e.g. ``TASK_STATE_COMPLETED``;
    last_updated, UTC without a zone, as the SDK stores it), for the operator's reads of admitted tasks:
    ``FROM ... e CROSS JOIN {status_of_sql('e.task_id')} s``. ``OFFSET 0`` keeps it one lookup per task."""
    return (f"LATERAL (SELECT t.status ->> 'state' AS a2a_state, t.last_updated FROM tasks t "
            f"WHERE t.id = {task_id} OFFSET 0)")


ENDED_STATES = ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED")


def ended_sql(alias: str) -> str:
    """A condition: the task row ``alias`` has ended. The same condition, without the alias, is the predicate of
    the partial index ``tasks_ended`` (migration 0190), so a query that states it is served by that index.

    It reads the state as ``status #>> '{state}'``, not as ``status ->> 'state'`` like the listing, on purpose: a
    partial index serves every query whose condition implies its predicate, and with ``->>`` a ListTasks filtered
    by a state that has ended (``COMPLETED``) implied it. The planner then walked ``tasks_ended`` (every owner's
    ended tasks, newest first) filtering out the other owners' rows, which grows with everyone's history; with a
    predicate only this condition states, the index serves the events prune and nothing else."""
    states = ", ".join(f"'{state}'" for state in ENDED_STATES)
    return f"({alias}.status #>> '{{state}}') IN ({states})"


def ended_task_sql(task_id: str) -> str:
    """A condition: the task of the id expression ``task_id`` has ended, a primary-key lookup. What the jobs of a
    task that has not (it waits for input, works, or is under reconciliation) left is kept: its cancel and its
    follow-ups' charge read whether a run already happened."""
    return f"EXISTS (SELECT 1 FROM tasks w WHERE w.id = {task_id} AND {ended_sql('w')} OFFSET 0)"  # per row


def ended_before_sql(alias: str) -> str:
    """A condition: the task row ``alias`` was last written more than ``:retention_s`` ago. ``last_updated`` is the
    task's status time, stored as UTC without a zone: compared with the UTC wall clock, never cast to a zone (a
    cast of the column would keep it from its index, and make the cut depend on the session's time zone)."""
    return f"{alias}.last_updated < (now() AT TIME ZONE 'UTC') - make_interval(secs => :retention_s)"


# Where the events prune's walk over ended tasks starts: before the oldest (``last_updated``, ``id``). Tasks are
# kept, so without a cursor every round would read every task that ever ended.
EVENTS_WALK_START = (datetime(1, 1, 1), "")

# One page of ended tasks past the retention after the cursor (``tasks_ended``, an index range), and up to
# :batch of their events, each task's by its index (task_id, seq): the LIMIT inside the LATERAL keeps the planner
# from hashing the whole event table for it. Answers what was deleted, how many tasks the page held and, when
# every event of the page is gone (fewer than :batch deleted), its last task: where the next page starts.
_PRUNE_EVENTS = text(
    f"""
    WITH page AS MATERIALIZED (
        SELECT t.id, t.last_updated FROM tasks t
         WHERE {ended_sql('t')} AND {ended_before_sql('t')}
           AND (t.last_updated, t.id) > (CAST(:after_at AS timestamp), CAST(:after_id AS varchar))
         ORDER BY t.last_updated, t.id
         LIMIT :page
    ),
    doomed AS (SELECT e.seq FROM page p CROSS JOIN LATERAL (
                   SELECT seq FROM task_events WHERE task_id = p.id LIMIT :batch) e  -- per task: its index
               LIMIT :batch),
    gone AS (DELETE FROM task_events WHERE seq = ANY (ARRAY(SELECT seq FROM doomed)) RETURNING 1)
    SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM page) AS examined,
           last.last_updated AS last_at, last.id AS last_id
      FROM (SELECT 1) one
      LEFT JOIN (SELECT id, last_updated FROM page ORDER BY last_updated DESC, id DESC LIMIT 1) last
        ON (SELECT count(*) FROM gone) < :batch
    """
)
PRUNE_EVENTS_SQL = str(_PRUNE_EVENTS)


def prune_finished_events(conn: Connection, *, retention_s: float, batch: int, page: int | None = None,
                          after: tuple[datetime, str] = EVENTS_WALK_START) -> Page:
    """Delete up to ``batch`` events of the next ``page`` (default: ``batch``) tasks after ``after`` that ended
    more than ``retention_s`` ago; the page's last task is where the next one starts, once all its events are
    gone (``Page.last`` None: the batch was spent, this page goes on next time)."""
    row = conn.execute(_PRUNE_EVENTS, {"retention_s": retention_s, "batch": batch, "page": page or batch,
                                       "after_at": after[0], "after_id": after[1]}).one()
    return page_of(row, asked=page or batch)


# --- ListTasks (issue 18) ------------------------------------------------------------------------------------
# The order is the a2a-sdk store's: newest first by (last_updated, id), and the tasks without a status timestamp
# (the SDK's conformance executor writes some) after all the others, by id descending. A page is read as two
# keyset sections of one index (migration 0180), each LIMITed, in one statement: the timestamped tasks, where the
# position is a row comparison ``(last_updated, id) < (:after_ts, :after_id)`` (one range of the index, where the
# SDK's OR was not), then the tasks without one (``last_updated IS NULL AND id < :after_id``, a range too). UNION ALL
# runs its branches in order and stops once the outer LIMIT is met, so the second section is read only by the page
# that reaches it. Each filter is an equality that leads an index (``tasks_listing_by_context``,
# ``tasks_listing_by_state``), and ``updated_after`` a bound of the same range, so a filtered page reads what it
# returns too. The one combination no index leads, contextId with status, is read from the context's index and
# ``examine_max`` rows at most per section: a page may then come back short, with the position it reached.

_LISTED = "id, context_id, last_updated, status, metadata"
# Each statement of the listing has an index whose order is its ORDER BY, and is planned with sorting off (this
# transaction only) so that it is read in that order whatever the planner believes: believing a customer small (one
# the statistics have not seen yet, or whose tasks grew since the last ANALYZE), it read all of the customer's rows
# and sorted them instead (measured: 18,530 rows for a page of 51). Sorting off only prices a sort out; a plan that
# has no other way still sorts.
_IN_INDEX_ORDER = text("SET LOCAL enable_sort = off")
_ORDER = "ORDER BY last_updated DESC, id DESC"


@dataclass(frozen=True)
class ListingFilter:
    """What a listing is narrowed to (the A2A ListTasksRequest's filters), each served by an index range."""

    context_id: str | None = None
    state: str | None = None  # the TaskState's name, as ``status ->> 'state'`` stores it (TASK_STATE_WORKING)
    updated_after: datetime | None = None  # naive UTC: tasks whose last update is at or after it

    @property
    def narrows(self) -> bool:
        return self.context_id is not None or self.state is not None or self.updated_after is not None

    @property
    def examines(self) -> bool:
        """Whether a page reads more rows than it returns: contextId with status (no index leads with both)."""
        return self.context_id is not None and self.state is not None


@dataclass(frozen=True)
class Position:
    """A place in the listing's order: the last task a page covered. ``last_updated`` None: the section of
    tasks without a status timestamp."""

    last_updated: datetime | None
    task_id: str


@dataclass
class ListedPage:
    tasks: list[Task]
    next: Position | None  # where the next page starts (after it); None: the listing ends here


def _filter_conditions(filters: ListingFilter, *, state: bool) -> list[str]:
    where = ["owner = :owner"]
    if filters.context_id is not None:
        where.append("context_id = :context_id")
    if filters.state is not None and state:
        where.append("(status ->> 'state') = :state")
    return where


def _section(section: int, filters: ListingFilter, after: Position | None, columns: str) -> str | None:
    """One keyset range of the page (0: timestamped tasks, 1: without a timestamp), or None if the page cannot
    reach it. Each row says whether it ``matches`` the filters, and whether it is the ``boundary``: the last row
    a section that examines may read."""
    where = _filter_conditions(filters, state=not filters.examines)
    if section == 0:
        if after is not None and after.last_updated is None:
            return None  # the position is past every timestamped task
        where.append("last_updated IS NOT NULL" if after is None else
                     "(last_updated, id) < (CAST(:after_ts AS timestamp), CAST(:after_id AS varchar))")
        if filters.updated_after is not None:
            where.append("last_updated >= CAST(:updated_after AS timestamp)")
    else:
        if filters.updated_after is not None:
            return None  # a task without a timestamp was never updated after anything
        where.append("last_updated IS NULL")
        if after is not None and after.last_updated is None:
            where.append("id < CAST(:after_id AS varchar)")
    condition = " AND ".join(where)
    if not filters.examines:
        return (f"SELECT {columns}, {section} AS section, true AS matches, false AS boundary "
                f"FROM tasks WHERE {condition} {_ORDER} LIMIT :limit")
    return (f"SELECT * FROM (SELECT {columns}, {section} AS section, (status ->> 'state') = :state AS matches, "
            f"row_number() OVER ({_ORDER}) = :examine_max AS boundary "
            f"FROM tasks WHERE {condition} {_ORDER} LIMIT :examine_max) AS examined "
            f"WHERE matches OR boundary {_ORDER}")


def page_statement(owner: str, filters: ListingFilter, after: Position | None, page_size: int, *,
                   with_history: bool, with_artifacts: bool, examine_max: int) -> tuple[str, dict[str, Any]] | None:
    """The SQL of one page of ``list_page`` and its parameters (the plan tests EXPLAIN it); None when no section
    can hold a task after ``after`` (a position among the tasks without a timestamp, with ``updated_after``)."""
    columns = _LISTED + (", history" if with_history else "") + (", artifacts" if with_artifacts else "")
    sections = [sql for sql in (_section(0, filters, after, columns), _section(1, filters, after, columns)) if sql]
    if not sections:
        return None
    statement = " UNION ALL ".join(f"({sql})" for sql in sections)
    params: dict[str, Any] = {"owner": owner, "limit": page_size + 1, "examine_max": examine_max,
                              "context_id": filters.context_id, "state": filters.state,
                              "updated_after": filters.updated_after}
    if after is not None:
        params.update(after_ts=after.last_updated, after_id=after.task_id)
    return f"SELECT * FROM ({statement}) AS page LIMIT :limit", params


def _listed_task(row: Any, *, with_history: bool, with_artifacts: bool) -> Task:
    task = Task(id=row.id, context_id=row.context_id)
    if row.status:
        ParseDict(row.status, task.status)
    if row.metadata:
        task.metadata.update(row.metadata)
    for message in (row.history or []) if with_history else []:
        ParseDict(message, task.history.add())
    for artifact in (row.artifacts or []) if with_artifacts else []:
        ParseDict(artifact, task.artifacts.add())
    return task


def list_page(conn: Connection, owner: str, filters: ListingFilter, after: Position | None, page_size: int, *,
              with_history: bool, with_artifacts: bool, examine_max: int) -> ListedPage:
    """The owner's tasks after ``after`` (None: from the newest), at most ``page_size``, in the listing's order;
    the history and the artifacts only if asked for (a page then reads neither column). ``conn`` must be in a
    transaction (SQLAlchemy's default): the plan's setting is ``SET LOCAL``."""
    planned = page_statement(owner, filters, after, page_size, with_history=with_history,
                             with_artifacts=with_artifacts, examine_max=examine_max)
    if planned is None:
        return ListedPage(tasks=[], next=None)
    statement, params = planned
    conn.execute(_IN_INDEX_ORDER)
    listed, reached, section = [], None, 0
    for row in conn.execute(text(statement), params):
        assert row.section >= section, "UNION ALL returned the page's sections out of order"
        section = row.section
        if row.matches:
            listed.append(row)
            if len(listed) > page_size:
                break
        if row.boundary:  # the section examined all it may: the page ends at this row, matching or not
            reached = Position(row.last_updated, row.id)
            break
    if len(listed) > page_size:
        del listed[page_size:]
        reached = Position(listed[-1].last_updated, listed[-1].id)
    tasks = [_listed_task(row, with_history=with_history, with_artifacts=with_artifacts) for row in listed]
    return ListedPage(tasks=tasks, next=reached)


_OWNER_TOTAL = text("SELECT coalesce(sum(tasks), 0) FROM task_counts WHERE owner = :owner")
# Through task_counts_owner always: while the table is small (or its statistics say so) the planner would read
# every owner's row, which grows with the customers, not with this one.
_BY_INDEX = text("SET LOCAL enable_seqscan = off")


def owner_total(conn: Connection, owner: str) -> int:
    """How many tasks the owner has: the sum of its ``task_counts`` slots (at most one per concurrent writer
    it ever had), kept exact by the triggers of migration 0180. ``conn`` must be in a transaction (the
    plan's setting is ``SET LOCAL``)."""
    conn.execute(_BY_INDEX)
    return int(conn.execute(_OWNER_TOTAL, {"owner": owner}).scalar_one())


def count_statement(owner: str, filters: ListingFilter, limit: int) -> tuple[str, dict[str, Any]]:
    """The SQL of ``count_matching`` and its parameters: at most ``limit`` rows of one index range are read. The
    ORDER BY is the index's own: without it, a filter most of the owner's tasks match is planned as a sequential
    scan that stops at ``limit``, which reads the whole table when the owner's rows are not where it starts."""
    where = _filter_conditions(filters, state=not filters.examines)
    if filters.updated_after is not None:
        where.append("last_updated >= CAST(:updated_after AS timestamp)")
    matches = "(status ->> 'state') = :state" if filters.examines else "true"
    statement = (f"SELECT count(*) FILTER (WHERE matches) AS matched, count(*) AS examined FROM "
                 f"(SELECT {matches} AS matches FROM tasks WHERE {' AND '.join(where)} {_ORDER} LIMIT :limit) AS m")
    return statement, {"owner": owner, "context_id": filters.context_id, "state": filters.state,
                       "updated_after": filters.updated_after, "limit": limit}


def count_matching(conn: Connection, owner: str, filters: ListingFilter, limit: int) -> tuple[int, bool]:
    """How many of the owner's tasks match ``filters``, reading at most ``limit`` rows, and whether that is
    exact. Not exact: at least that many match (contextId with status: that many among ``limit`` of the
    context's tasks)."""
    statement, params = count_statement(owner, filters, limit)
    conn.execute(_IN_INDEX_ORDER)
    row = conn.execute(text(statement), params).one()
    return int(row.matched), int(row.examined) < limit
