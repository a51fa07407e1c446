"""The listing's rows (issue 18): pages read back what the store holds, the per-owner counts stay exact under
concurrent writers that never wait on each other, and a filtered count stops at its limit."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader

import pytest
from a2a.types.a2a_pb2 import Artifact, Message, Part, Role, Task, TaskState, TaskStatus
from google.protobuf.struct_pb2 import Struct
from sqlalchemy import Engine, text

from core.settings import PROJECT_ROOT
from taskstate import rows
from taskstate.rows import ListingFilter, Position

pytestmark = pytest.mark.timeout(120)
WRITERS = 8


def a_task(state: int = TaskState.TASK_STATE_COMPLETED, context_id: str | None = None) -> Task:
    metadata = Struct()
    metadata.update({"k": "v"})
    status = TaskStatus(state=state, message=Message(message_id="s", role=Role.ROLE_AGENT, parts=[Part(text="ok")]))
    status.timestamp.GetCurrentTime()
    task = Task(id=str(uuid.uuid4()), context_id=context_id or str(uuid.uuid4()), status=status, metadata=metadata)
    task.history.append(Message(message_id="m", role=Role.ROLE_USER, parts=[Part(text="hello")]))
    task.artifacts.append(Artifact(artifact_id="a", parts=[Part(text="result")]))
    return task


def an_owner() -> str:
    return f"c-{uuid.uuid4().hex[:12]}:conformance"


def insert(engine: Engine, owner: str, tasks: list[Task]) -> None:
    with engine.begin() as conn:
        for task in tasks:
            rows.insert_new(conn, task, owner)


def test_a_listed_task_is_the_stored_task_with_only_the_columns_asked_for(engine):
    owner, task = an_owner(), a_task()
    insert(engine, owner, [task])
    with engine.connect() as conn:
        stored = rows.read(conn, task.id, owner)
        whole = rows.list_page(conn, owner, ListingFilter(), None, 10, with_history=True, with_artifacts=True,
                               examine_max=100)
        bare = rows.list_page(conn, owner, ListingFilter(), None, 10, with_history=False, with_artifacts=False,
                              examine_max=100)
    assert list(whole.tasks) == [stored] and whole.next is None
    expected = Task()
    expected.CopyFrom(stored)
    expected.ClearField("history")
    expected.ClearField("artifacts")
    assert list(bare.tasks) == [expected]


def test_concurrent_writers_of_one_owner_never_wait_on_each_other_and_the_count_stays_exact(engine):
    owner = an_owner()
    all_open = threading.Barrier(WRITERS)
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with engine.begin() as conn:
                # A writer that had to wait for another's slot would fail here instead of waiting.
                conn.execute(text("SET LOCAL lock_timeout = '1s'"))
                rows.insert_new(conn, a_task(), owner)
                all_open.wait(timeout=60)  # every writer holds its transaction, and its slot, at once
                rows.insert_new(conn, a_task(), owner)
        except BaseException as failure:  # noqa: BLE001 - reported by the test below
            failures.append(failure)

    writers = [threading.Thread(target=write) for _ in range(WRITERS)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert not failures, failures
    with engine.connect() as conn:
        assert rows.owner_total(conn, owner) == 2 * WRITERS
        slots = conn.execute(text("SELECT count(*) FROM task_counts WHERE owner = :o"), {"o": owner}).scalar_one()
    assert 1 <= slots <= WRITERS  # one per writer that found every other slot held, at most


def test_deleted_tasks_leave_the_count_and_a_bulk_insert_counts_as_many_rows_as_it_wrote(engine):
    owner = an_owner()
    insert(engine, owner, [a_task() for _ in range(5)])
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO tasks (id, context_id, kind, owner, status, protocol_version) "
            "SELECT gen_random_uuid()::text, 'ctx', 'task', :o, '{}', '1.0' FROM generate_series(1, 300)"
        ), {"o": owner})
        conn.execute(text("DELETE FROM tasks WHERE owner = :o AND context_id = 'ctx' AND id IN "
                          "(SELECT id FROM tasks WHERE owner = :o AND context_id = 'ctx' LIMIT 120)"), {"o": owner})
    with engine.connect() as conn:
        assert rows.owner_total(conn, owner) == 5 + 300 - 120


def _migration_0180():
    path = PROJECT_ROOT / "migrations" / "versions" / "0180_list_tasks_keyset.py"
    loader = SourceFileLoader("migration_0180", str(path))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_the_backfill_adds_what_an_owners_slots_lack_and_nothing_when_run_again(engine):
    owner, other = an_owner(), an_owner()
    insert(engine, owner, [a_task() for _ in range(7)])
    insert(engine, other, [a_task() for _ in range(3)])
    backfill = text(_migration_0180().BACKFILL)
    with engine.begin() as conn:  # as if the owner's rows were written before the triggers existed
        conn.execute(text("DELETE FROM task_counts WHERE owner = :o"), {"o": owner})
    for _ in range(2):
        with engine.begin() as conn:
            conn.execute(backfill)
        with engine.connect() as conn:
            assert (rows.owner_total(conn, owner), rows.owner_total(conn, other)) == (7, 3)


def test_a_filtered_count_reads_at_most_its_limit_and_says_whether_it_is_exact(engine):
    owner, busy = an_owner(), str(uuid.uuid4())
    working = [a_task(TaskState.TASK_STATE_WORKING, busy) for _ in range(150)]
    failed = [a_task(TaskState.TASK_STATE_FAILED, busy) for _ in range(30)]
    insert(engine, owner, working + failed)
    with engine.connect() as conn:
        state = ListingFilter(state="TASK_STATE_WORKING")
        assert rows.count_matching(conn, owner, state, 100) == (100, False)
        assert rows.count_matching(conn, owner, state, 200) == (150, True)
        both = ListingFilter(context_id=busy, state="TASK_STATE_FAILED")
        assert rows.count_matching(conn, owner, both, 1000) == (30, True)
        matched, exact = rows.count_matching(conn, owner, both, 100)  # among 100 of the context's 180 tasks
        assert matched <= 30 and not exact


def test_a_page_filtered_by_context_and_status_stops_where_it_examined_all_it_may(engine):
    owner, busy = an_owner(), str(uuid.uuid4())
    # Newest first: 120 WORKING tasks, then 3 FAILED ones; a page may examine 100 rows per section.
    tasks = [a_task(TaskState.TASK_STATE_FAILED, busy) for _ in range(3)]
    tasks += [a_task(TaskState.TASK_STATE_WORKING, busy) for _ in range(120)]
    insert(engine, owner, tasks)
    both = ListingFilter(context_id=busy, state="TASK_STATE_FAILED")
    with engine.connect() as conn:
        first = rows.list_page(conn, owner, both, None, 10, with_history=False, with_artifacts=False,
                               examine_max=100)
        second = rows.list_page(conn, owner, both, first.next, 10, with_history=False, with_artifacts=False,
                                examine_max=100)
    assert first.tasks == [] and first.next is not None  # short, with the position it reached
    assert sorted(task.id for task in second.tasks) == sorted(task.id for task in tasks[:3])
    assert second.next is None


def test_a_position_among_the_tasks_without_a_timestamp_ends_a_listing_of_tasks_updated_after_a_time(engine):
    # Only an a2a-sdk cursor can carry it (they are not signed): such a task was never updated after anything.
    owner = an_owner()
    insert(engine, owner, [a_task()])
    after = ListingFilter(updated_after=datetime(2000, 1, 1))
    with engine.connect() as conn:
        page = rows.list_page(conn, owner, after, Position(None, "zzzz"), 10, with_history=False,
                              with_artifacts=False, examine_max=100)
        assert (page.tasks, page.next) == ([], None)
        assert len(rows.list_page(conn, owner, after, None, 10, with_history=False, with_artifacts=False,
                                  examine_max=100).tasks) == 1
