"""A task moved to its next status as a worker moves it, for tests that need a task's events without running a job.

``move`` writes the status event through the task tables' owner (``taskstate.rows``) in its own transaction, as a
worker's progress does; ``notify=True`` then wakes the task's listeners (``taskstate.notify.task_event_now``), as the
worker does after its commit.
"""

from __future__ import annotations

from a2a.types.a2a_pb2 import TaskStatus, TaskStatusUpdateEvent
from sqlalchemy import Engine

from taskstate import notify as notifications
from taskstate import rows


def move(engine: Engine, task_id: str, owner: str, state: int, *, notify: bool = False) -> None:
    """Write the owner's task's next status event (``state``, a ``TaskState``) and commit; ``notify``: then
    notify its task's listeners, outside the transaction."""
    with engine.begin() as conn:
        locked = rows.lock(conn, task_id, owner)
        assert locked is not None, f"no task {task_id} of {owner}"
        locked.task.status.CopyFrom(TaskStatus(state=state))
        rows.stamp(locked.task)
        rows.write_event(conn, locked, TaskStatusUpdateEvent(task_id=task_id, context_id=locked.task.context_id,
                                                             status=locked.task.status))
    if notify:
        notifications.task_event_now(engine.execution_options(isolation_level="AUTOCOMMIT"), task_id)
