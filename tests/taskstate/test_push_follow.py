"""The push trigger (``push_deliveries_follow``, migration 0297): an inserted event becomes one delivery per push
configuration of its task, none for a task without one or for a disabled customer; stepping back over 0297 gives
back 0280's function."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import Engine, text

pytestmark = pytest.mark.timeout(120)


def _task_id() -> str:
    return "t-" + secrets.token_hex(8)


def _configure(conn, task_id: str, customer_id: str, *configs: str) -> None:
    for config_id in configs:
        conn.execute(text("INSERT INTO push_configs (task_id, config_id, owner, customer_id, url) "
                          "VALUES (:t, :c, 'owner', :u, 'https://example.test/hook')"),
                     {"t": task_id, "c": config_id, "u": customer_id})


def _events(conn, *task_ids: str) -> None:
    """One statement inserting one event for each task (the trigger sees them together)."""
    conn.execute(text("INSERT INTO task_events (task_id, owner, task_version, event_data) "
                      "SELECT t, 'owner', 1, '\\x00'::bytea FROM unnest(CAST(:ts AS text[])) t"),
                 {"ts": list(task_ids)})


def _deliveries(conn, task_id: str) -> list[tuple[str, str]]:
    return [tuple(row) for row in conn.execute(
        text("SELECT config_id, customer_id FROM push_deliveries WHERE task_id = :t ORDER BY config_id"),
        {"t": task_id})]


def test_an_event_becomes_a_delivery_per_configuration_of_its_task_only(engine: Engine) -> None:
    configured, other, bare, disabled = _task_id(), _task_id(), _task_id(), _task_id()
    customer, disabled_customer = "c-" + secrets.token_hex(4), "c-" + secrets.token_hex(4)
    with engine.begin() as conn:
        _configure(conn, configured, customer, "a", "b")
        _configure(conn, other, customer, "a")
        _configure(conn, disabled, disabled_customer, "a")
        conn.execute(text("INSERT INTO push_disabled (customer_id, reason, disabled_by) VALUES (:c, 'test', 'op')"),
                     {"c": disabled_customer})
        _events(conn, bare)  # no configuration: nothing, and the statement succeeds
        _events(conn, configured, bare, disabled)
        _events(conn, bare)
    with engine.connect() as conn:
        assert _deliveries(conn, configured) == [("a", customer), ("b", customer)]
        assert _deliveries(conn, other) == []  # configured, but none of its events was inserted
        assert _deliveries(conn, bare) == []
        assert _deliveries(conn, disabled) == []


def test_stepping_back_over_0297_restores_0280s_push_trigger(server_url: str) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    from core import db
    from tests.conftest import empty_database

    definition = text("SELECT pg_get_functiondef('push_deliveries_follow'::regproc)")
    with empty_database(server_url, "specialists_push_follow_migration") as url:
        probe = create_engine(url)
        try:
            db.upgrade(url, "0296")
            with probe.connect() as conn:
                before = conn.execute(definition).scalar_one()
            db.upgrade(url, "0297")
            with probe.connect() as conn:
                assert "IF EXISTS" in conn.execute(definition).scalar_one()
            command.downgrade(db.alembic_config(url), "0296")
            with probe.connect() as conn:
                assert conn.execute(definition).scalar_one() == before
        finally:
            probe.dispose()
