"""The edge's wake-ups (``taskstate.notify.Notifier``): sent at once, and under load many in one round trip."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from sqlalchemy import event

from core import db
from taskstate.notify import DISPATCH, TASK_EVENTS, Notifier, libpq_url

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]


@pytest.fixture
async def async_engine(database_url, settings):
    engine = db.make_async_engine(database_url, settings)
    yield engine
    await engine.dispose()


@pytest.fixture
def sent(async_engine) -> list[dict]:
    """The parameters of every wake-up statement the engine sends, in order."""
    statements: list[dict] = []

    @event.listens_for(async_engine.sync_engine, "before_cursor_execute")
    def _seen(conn, cursor, statement, parameters, context, executemany) -> None:
        if "pg_notify" in statement:
            statements.append(parameters)

    return statements


@pytest.fixture
def listening(database_url):
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(f"LISTEN {DISPATCH}")
        conn.execute(f"LISTEN {TASK_EVENTS}")
        yield conn


def _received(conn: psycopg.Connection, count: int) -> set[tuple[str, str]]:
    return {(n.channel, n.payload) for n in conn.notifies(timeout=10, stop_after=count)}


async def test_a_wake_up_is_sent_before_the_asker_goes_on(async_engine, sent, listening) -> None:
    notifier = Notifier(async_engine)
    await notifier.dispatch("rlm")
    # Sent in the asker's own round trip, not in a window after it: the dispatcher takes the job while the edge
    # answers its customer.
    assert len(sent) == 1
    assert _received(listening, 1) == {(DISPATCH, "rlm")}


async def test_wake_ups_asked_for_during_a_send_go_out_together_in_one_more_round_trip(
    async_engine, sent, listening
) -> None:
    notifier = Notifier(async_engine)
    first = asyncio.ensure_future(notifier.dispatch("rlm"))
    await asyncio.sleep(0)  # the first asker's round trip is in flight
    others = [f"task-{index}" for index in range(9)]
    await asyncio.gather(*(notifier.task_event(task_id) for task_id in others))  # none of them waits for a send
    await first
    await notifier.close()
    assert len(sent) == 2
    assert sent[1]["channels"] == [TASK_EVENTS] * 9
    assert _received(listening, 10) == {(DISPATCH, "rlm"), *((TASK_EVENTS, task_id) for task_id in others)}
    await notifier.dispatch("rlm")  # nothing in flight again: at once
    assert len(sent) == 3
