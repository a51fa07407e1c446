"""The edge's own task writes match the a2a-sdk store; the log filter; the notification listener."""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from a2a.server.cluster import TaskVersion, VersionedDatabaseTaskStore
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Struct, Value
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from taskstate import rows as taskrows
from workers.executor_runner import OwnerUser
from taskstate.notify import Listener, Notifier
from app.observability import JsonFormatter, RedactingFilter
from core import db
from tests.locks import wait_until_blocked_by

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]


@pytest.fixture
async def async_engine(database_url, settings):
    engine = db.make_async_engine(database_url, settings)
    yield engine
    await engine.dispose()


def sample_task(task_id: str) -> Task:
    metadata = Struct()
    metadata.update({"k": "v", "n": 3})
    task = Task(
        id=task_id,
        context_id=str(uuid.uuid4()),
        status=TaskStatus(
            state=TaskState.TASK_STATE_WORKING,
            message=Message(message_id="s1", role=Role.ROLE_AGENT, parts=[Part(text="busy")]),
        ),
        history=[Message(message_id="h1", role=Role.ROLE_USER, parts=[Part(text="hello"), Part(raw=b"\x00\x01")])],
        artifacts=[Artifact(artifact_id="a1", parts=[Part(data=ParseDict({"x": [1, 2]}, Value()))])],
        metadata=metadata,
    )
    taskrows.stamp(task)
    return task


async def test_a_task_written_by_the_edge_reads_back_identically_through_the_sdk_store(engine, async_engine):
    owner = f"c-{uuid.uuid4().hex[:8]}:conformance"
    task = sample_task(str(uuid.uuid4()))
    with engine.begin() as conn:
        assert taskrows.insert_new(conn, task, owner) == 1
    store = VersionedDatabaseTaskStore(async_engine, create_table=False)
    context = ServerCallContext(user=OwnerUser(owner))
    stored = await store.get(task.id, context)
    assert stored is not None and stored.task == task and stored.version == TaskVersion(1)
    assert await store.get(task.id, ServerCallContext(user=OwnerUser("someone-else:conformance"))) is None

    # The version counter is shared: the SDK's compare-and-swap continues after the edge's write.
    with engine.begin() as conn:
        locked = taskrows.lock(conn, task.id, owner)
        locked.task.status.state = TaskState.TASK_STATE_INPUT_REQUIRED
        assert taskrows.write_event(conn, locked, locked.task) == 2
    task.status.state = TaskState.TASK_STATE_INPUT_REQUIRED
    after = await store.get(task.id, context)
    assert after.task == task and after.version == TaskVersion(2)
    task.status.state = TaskState.TASK_STATE_WORKING
    new_version = await store.save(task, event=None, prev=None, prev_version=after.version, context=context)
    assert new_version == TaskVersion(3)

    # An event on the row the SDK wrote: the history appended in SQL, the other columns it changed.
    odd = Message(message_id="s2", role=Role.ROLE_AGENT, parts=[Part(text='nul \x00, \u00e9, \u2603, "quoted" ]')])
    with engine.begin() as conn:
        locked = taskrows.lock(conn, task.id, owner, with_artifacts=True)
        assert not locked.task.history  # read without it
        for written in (locked.task, task):
            written.history.append(written.status.message)
            written.history.append(odd)
            written.artifacts.add(artifact_id="a2", parts=[Part(text="more")])
            written.metadata.update({"n": 4})
            written.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED))
        taskrows.stamp(locked.task)
        task.status.timestamp.CopyFrom(locked.task.status.timestamp)
        assert taskrows.write_event(conn, locked, locked.task, returning_history=True) == 4
    assert locked.task == task  # returning_history: the whole task as stored
    final = await store.get(task.id, context)
    assert final.task == task and final.version == TaskVersion(4)


def test_an_event_appends_to_an_empty_history(engine):
    owner = f"c-{uuid.uuid4().hex[:8]}:conformance"
    task = Task(id=str(uuid.uuid4()), context_id=str(uuid.uuid4()), status=TaskStatus(state=TaskState.TASK_STATE_WORKING))
    with engine.begin() as conn:
        taskrows.insert_new(conn, task, owner)
        locked = taskrows.lock(conn, task.id, owner)
        locked.task.history.append(Message(message_id="m1", role=Role.ROLE_USER, parts=[Part(text="hi")]))
        taskrows.write_event(conn, locked, locked.task)
        stored = taskrows.read(conn, task.id, owner)
    assert [m.message_id for m in stored.history] == ["m1"]


@pytest.mark.parametrize("stored", [
    "[]", "[ ]", "[\n]", "null",  # empty, or not an array: the appended messages alone
    '[{"messageId": "m0", "role": "ROLE_USER", "parts": [{"text": "\u00e9 \u2603 ] \\"x\\""}]}]',  # json.dumps'
    '[{"messageId": "m0", "role": "ROLE_USER", "parts": [{"text": "é ☃ ]"}]}]',  # multibyte, unescaped
    '[{"messageId": "m0", "role": "ROLE_USER", "parts": [{"text": "a"}]}] \n\t ',  # not json.dumps': trailing space
    ' \n[{"messageId": "m0", "role": "ROLE_USER", "parts": [{"text": "a"}]}]',  # not json.dumps': leading space
], ids=["empty", "empty-spaced", "empty-newline", "null", "escaped", "multibyte", "trailing-space", "leading-space"])
def test_an_event_appends_to_any_stored_history_text(engine, stored):
    """The append splices the stored json text: whatever form it has, the history reads back as it was, then the
    appended messages."""
    owner = f"c-{uuid.uuid4().hex[:8]}:conformance"
    task = Task(id=str(uuid.uuid4()), context_id=str(uuid.uuid4()), status=TaskStatus(state=TaskState.TASK_STATE_WORKING))
    with engine.begin() as conn:
        taskrows.insert_new(conn, task, owner)
        conn.execute(text("UPDATE tasks SET history = CAST(:h AS json) WHERE id = :t"), {"h": stored, "t": task.id})
        before = taskrows.read(conn, task.id, owner).history
        locked = taskrows.lock(conn, task.id, owner)
        appended = [Message(message_id=f"m{n}", role=Role.ROLE_AGENT, parts=[Part(text=f"\u00e9 {n} ]")])
                    for n in (1, 2)]
        locked.task.history.extend(appended)
        taskrows.write_event(conn, locked, locked.task)
        stored_after = taskrows.read(conn, task.id, owner)
    assert list(stored_after.history) == [*before, *appended]


def test_a_tasks_lock_takes_its_version_row_before_its_task_row_as_the_sdks_store_does(engine):
    """``rows.lock`` reads both rows in one statement; the lock order stays the SDK store's (version, then task),
    or a writer of each kind could deadlock the other. Seen directly: while the task row is held elsewhere, the
    lock waits on it already holding the version row."""
    owner = f"c-{uuid.uuid4().hex[:8]}:conformance"
    task = Task(id=str(uuid.uuid4()), context_id=str(uuid.uuid4()), status=TaskStatus(state=TaskState.TASK_STATE_WORKING))
    with engine.begin() as conn:
        taskrows.insert_new(conn, task, owner)
    holder, locker, prober = engine.connect(), engine.connect(), engine.connect()
    try:
        holder.begin()
        holder.execute(text("SELECT 1 FROM tasks WHERE id = :t FOR UPDATE"), {"t": task.id})
        holder_pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        locker.begin()
        with ThreadPoolExecutor(1) as pool:
            locking = pool.submit(taskrows.lock, locker, task.id, owner)
            try:
                wait_until_blocked_by(engine, holder_pid, "the lock never waited on the task row")
                with pytest.raises(OperationalError, match="could not obtain lock"):
                    prober.execute(text("SELECT 1 FROM task_versions WHERE task_id = :t FOR UPDATE NOWAIT"),
                                   {"t": task.id})
            finally:  # both rows free (the probe may hold one when it failed): the lock goes through, the pool ends
                prober.rollback()
                holder.rollback()
            locked = locking.result(timeout=30)
        assert locked is not None and locked.task.id == task.id and locked.version == 1
        locker.rollback()
    finally:
        for conn in (holder, locker, prober):
            conn.close()


def test_the_log_filter_redacts_keys_and_bearer_credentials_whoever_logs_them():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger(f"test.redaction.{uuid.uuid4().hex}")
    logger.addHandler(handler)
    logger.propagate = False
    key = "sk_test_1a2b3c4d_eyJraWQiOiJrZXlfMSJ9.c2lnbmF0dXJl"
    logger.warning("headers %s", {"authorization": f"Bearer {key}"})
    logger.warning("call context: Authorization: bearer opaque-token-123")
    logger.warning(f"key in the message itself: {key}")
    output = stream.getvalue()
    assert key not in output and "eyJraWQiOiJrZXlfMSJ9" not in output and "opaque-token-123" not in output
    assert output.count("[redacted]") == 3


async def test_the_listener_reconnects_after_its_connection_is_killed_and_wakes_waiters_again(
    database_url, async_engine
):
    listener = Listener(database_url, application_name=f"listener-under-test-{uuid.uuid4().hex[:6]}")
    notifier = Notifier(async_engine)
    listener.start()
    try:
        async with asyncio.timeout(10):
            await listener.connected.wait()
        topic = f"t-{uuid.uuid4().hex[:8]}"
        woken = listener.watch("edge_task_events", topic)
        async with async_engine.connect() as conn:
            killed = (
                await conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = :a"
                    ),
                    {"a": listener.application_name},
                )
            ).scalar_one()
            await conn.commit()
        assert killed == 1
        async with asyncio.timeout(10):  # it comes back and tells every waiter to re-read...
            await woken.wait()
            woken.clear()
            while not listener.connected.is_set():
                await asyncio.sleep(0.05)
        await notifier.task_event(topic)  # ...and wakes waiters on new notifications again
        async with asyncio.timeout(5):
            await woken.wait()
    finally:
        await listener.stop()
