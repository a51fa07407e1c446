"""Issue 17: a task event costs what it changes, not what the task already holds.

One task's history holds the customer's 328 KiB message, the other's a tiny one; both
get the same events through ``TaskEvents.emit`` (fenced, as a worker writes them). The
bytes an event moves between the worker and the database must not depend on the history;
neither must the WAL of an event that leaves the history alone. An event that moves a
status message into the history rewrites the history's stored value (PostgreSQL stores a
json value whole): its WAL still grows with the history, and this test says so.
"""

from __future__ import annotations

import pytest
from a2a.types.a2a_pb2 import Artifact, Part, TaskArtifactUpdateEvent

from taskstate import rows
from taskstate.updates import TaskEvents
from bench.task_event_cost import LARGE_MESSAGE_BYTES, OWNER, Cost, claimed_task, ensure_walinspect, measure

pytestmark = pytest.mark.timeout(120)

TINY_MESSAGE_BYTES = 16
# What may differ between the two tasks' events: nothing that depends on the history. The wire's slack covers
# encodings of equal-length ids and timestamps (a timestamp's trailing zeros); the WAL's also whether the
# update found room on its page (a HOT update writes no index entries), which the history does not decide.
WIRE_SLACK_BYTES = 64
WAL_SLACK_BYTES = 2048


def _events_of(engine, message_bytes: int) -> dict[str, Cost]:
    job, token = claimed_task(engine, message_bytes)
    events = TaskEvents(engine)
    task_id = job.payload["t"]
    costs = {
        # SUBMITTED had no status message: the history is left alone.
        "first progress": measure(engine, task_id, lambda: events.emit(job, token, "progress", {"text": "reading"})),
        "artifact": measure(engine, task_id, lambda: events.emit(job, token, "artifact", {"id": "a1", "text": "x"})),
        # The previous status message ("reading") moves into the history.
        "next progress": measure(engine, task_id, lambda: events.emit(job, token, "progress", {"text": "writing"})),
    }
    chunk = TaskArtifactUpdateEvent(append=True, artifact=Artifact(artifact_id="a1", parts=[Part(text="y")]))
    costs["artifact append"] = measure(engine, task_id, lambda: events.emit(job, token, "a2a", {"event": chunk}))
    with engine.connect() as conn:
        task = rows.read(conn, task_id, OWNER)
    assert [m.parts[0].text for m in task.history[1:]] == ["reading"]
    assert task.status.message.parts[0].text == "writing"
    assert [p.text for p in task.artifacts[0].parts] == ["x", "y"]
    return costs


def test_a_task_events_bytes_do_not_grow_with_the_message_in_its_history(engine):
    ensure_walinspect(engine)
    tiny, large = _events_of(engine, TINY_MESSAGE_BYTES), _events_of(engine, LARGE_MESSAGE_BYTES)
    for name in tiny:
        pair = (name, tiny[name], large[name])
        assert large[name].wire.total_bytes - tiny[name].wire.total_bytes <= WIRE_SLACK_BYTES, pair
        assert large[name].wire.statements == tiny[name].wire.statements, pair
        if name != "next progress":
            assert large[name].wal_bytes - tiny[name].wal_bytes <= WAL_SLACK_BYTES, pair
    # The one that moves a message into the history rewrites the history's value (see the module's docstring).
    assert large["next progress"].wal_bytes > LARGE_MESSAGE_BYTES
