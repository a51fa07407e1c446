"""Migration 0298: a customer's settlements are read through ``ledger_settlements_customer_at`` alone (the
single-column ``ledger_settlements_customer`` was a copy of its first column); stepping back builds it again."""

from __future__ import annotations

from sqlalchemy import Engine, text

INDEXES = text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'ledger_settlements' ORDER BY 1")


def test_a_settlement_enters_one_index_by_customer(engine: Engine) -> None:
    with engine.connect() as conn:
        by_customer = [definition for _, definition in conn.execute(INDEXES)
                       if "(customer_id" in definition]
    assert len(by_customer) == 1 and by_customer[0].endswith("(customer_id, at)"), by_customer


def test_stepping_back_over_0298_builds_the_single_column_index_again(server_url: str) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    from core import db
    from tests.conftest import empty_database

    with empty_database(server_url, "specialists_settlement_indexes") as url:
        probe = create_engine(url)
        try:
            db.upgrade(url, "0297")
            with probe.connect() as conn:
                before = conn.execute(INDEXES).all()
            db.upgrade(url, "0298")
            with probe.connect() as conn:
                assert "ledger_settlements_customer" not in {name for name, _ in conn.execute(INDEXES)}
            command.downgrade(db.alembic_config(url), "0297")
            with probe.connect() as conn:
                assert conn.execute(INDEXES).all() == before
        finally:
            probe.dispose()
