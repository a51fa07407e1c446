"""The edge's wake-ups (``taskstate.notify.Notifier``): a lone one at once, under traffic many in one statement."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import event

from core import db
from taskstate.notify import DISPATCH, TASK_EVENTS, Notifier, libpq_url

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]

# Longer than any test takes: every wake-up asked for after the first falls within its window.
WINDOW_S = 600.0


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


async def test_a_wake_up_after_a_quiet_spell_is_sent_before_the_asker_goes_on(async_engine, sent, listening) -> None:
    notifier = Notifier(async_engine, coalesce_s=WINDOW_S, quiet_s=WINDOW_S)
    await notifier.dispatch("rlm")
    # In the asker's own round trip, not after a window: the dispatcher takes the job while the edge answers.
    assert len(sent) == 1
    assert _received(listening, 1) == {(DISPATCH, "rlm")}
    await notifier.close()
    assert len(sent) == 1


async def test_wake_ups_under_traffic_go_out_together_in_one_statement_off_their_askers_paths(
    async_engine, sent, listening
) -> None:
    notifier = Notifier(async_engine, coalesce_s=WINDOW_S, quiet_s=WINDOW_S)
    await notifier.dispatch("rlm")
    others = [f"task-{index}" for index in range(9)]
    for task_id in others:
        await notifier.task_event(task_id)
    assert len(sent) == 1  # none of the nine waited for a statement: they wait for the window
    await notifier.close()  # a shutdown sends them at once
    assert len(sent) == 2 and sent[1]["channels"] == [TASK_EVENTS] * 9
    assert _received(listening, 10) == {(DISPATCH, "rlm"), *((TASK_EVENTS, task_id) for task_id in others)}


async def test_once_the_window_has_passed_a_wake_up_after_a_quiet_spell_goes_at_once_again(
    async_engine, sent
) -> None:
    notifier = Notifier(async_engine, coalesce_s=0, quiet_s=0)
    for executor in ("a", "b", "c"):
        await notifier.dispatch(executor)
        assert sent[-1]["payloads"] == [executor]
    assert len(sent) == 3
    await notifier.close()

