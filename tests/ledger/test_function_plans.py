"""What the ledger's money functions read in their loops is an index range, on a ledger with many lots (issue 18).

EXPLAIN cannot look inside a plpgsql function, so tests/test_query_plans.py, which EXPLAINs every statement the
service sends, does not see them. These are the queries the functions loop over, cut out of migration 0002's
text (so a change there shows here), with their variables as parameters: ``ledger_expire``'s lots to sweep and
``ledger_reserve``'s draw-down and entitlement. The database is this module's own: 1,000 customers with eleven
lots each through the real ``ledger_grant``, ten of them expired and waiting for the sweep.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Connection, create_engine, text

from core.settings import PROJECT_ROOT
from tests.query_plans import rows_read, seq_scans_of_large_tables
from tests.workers.system import drop_database, fresh_database

pytestmark = pytest.mark.timeout(120)

CUSTOMERS = 1000
LOTS_PER_CUSTOMER = 11
MIN_ROWS = 10_000  # a table below this is cheaper to scan than to index: the planner is right to scan it
CUSTOMER = "p0500"


def _ledger_migration():
    spec = importlib.util.spec_from_file_location(
        "ledger_migration_0002", PROJECT_ROOT / "migrations" / "versions" / "0002_ledger.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _loop_query(function_source: str, starts: str, ends: str) -> str:
    """The SELECT a plpgsql ``FOR lot IN <query> LOOP`` runs, as the migration states it."""
    found = re.search(rf"FOR lot IN\s+({re.escape(starts)}.*?{re.escape(ends)})\s+LOOP", function_source, re.S)
    assert found, f"the loop query starting {starts!r} is no longer in migration 0002"
    return found.group(1)


_FUNCTIONS = _ledger_migration()
EXPIRE_LOOP_SQL = (
    _loop_query(_FUNCTIONS.EXPIRE_ADJUST_FN, "SELECT l.lot_id, l.customer_id, l.expires_at", "LIMIT p_max_lots")
    .replace("v_now", "now()").replace("p_max_lots", ":n")
)
DRAW_DOWN_SQL = (
    _loop_query(_FUNCTIONS.RESERVE_FN, "SELECT l.lot_id,", "l.lot_id")
    .replace("p_customer_id", ":c").replace("v_now", "now()")
)
ENTITLED_SQL = (  # ledger_reserve's entitlement check, as migration 0002 states it
    "SELECT bool_or(e.expires_at IS NULL OR e.expires_at > now()), max(e.expires_at) "
    "FROM ledger_entitlements e WHERE e.customer_id = :c AND e.skill = 'review'"
)
assert "e.customer_id = p_customer_id AND e.skill = p_skill" in _FUNCTIONS.RESERVE_FN

_GRANTS = """
SELECT count(*) FROM generate_series(0, %(customers)s::int - 1) c,
  LATERAL ledger_grant('p' || lpad(c::text, 4, '0'), 1000000000, 100, NULL, NULL, 100000, 8, ARRAY['review'],
                       NULL, NULL, 'seed', 'seed', 'live lot', now() - interval '30 days') live,
  LATERAL (SELECT ledger_grant('p' || lpad(c::text, 4, '0'), 50, 50 + k, NULL, interval '1 day', NULL, 8,
                               ARRAY['review'], NULL, NULL, 'seed', 'seed', 'old lot', now() - interval '10 days')
             FROM generate_series(1, %(old)s::int) k) old
"""


@pytest.fixture(scope="module")
def lots(server_url: str) -> Iterator[Connection]:
    url = fresh_database(server_url)
    engine = None
    try:
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as seeding:
            seeding.execute(_GRANTS, {"customers": CUSTOMERS, "old": LOTS_PER_CUSTOMER - 1})
            seeding.execute("VACUUM ANALYZE")
        engine = create_engine(url)
        with engine.connect() as conn:
            yield conn
    finally:
        if engine is not None:
            engine.dispose()
        drop_database(server_url, url)


def _no_seq_scans(conn: Connection, sql: str, params: dict) -> None:
    assert seq_scans_of_large_tables(conn, sql, params, min_rows=MIN_ROWS) == []


def test_the_expiry_sweep_reads_the_lots_that_are_due_not_the_others(lots):
    sizes = dict(lots.execute(text("SELECT relname, reltuples FROM pg_class WHERE relname LIKE 'ledger_%'")).all())
    assert sizes["ledger_lots"] >= MIN_ROWS and sizes["ledger_entitlements"] >= MIN_ROWS
    due = lots.execute(text("SELECT count(*) FROM ledger_lots WHERE swept_at IS NULL AND expires_at <= now()")
                       ).scalar_one()
    assert due == CUSTOMERS * (LOTS_PER_CUSTOMER - 1)
    _no_seq_scans(lots, EXPIRE_LOOP_SQL, {"n": 100})
    assert rows_read(lots, EXPIRE_LOOP_SQL, {"n": 100}, "ledger_lots") <= due
    # Then as it is between two sweeps: all but a few lots swept, the next sweep reads the few.
    lots.execute(text("SELECT count(*) FROM ledger_expire(now(), :n)"), {"n": due - 7})
    lots.commit()
    with lots.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as maintenance:
        maintenance.exec_driver_sql("VACUUM ANALYZE ledger_lots")
    _no_seq_scans(lots, EXPIRE_LOOP_SQL, {"n": 100})
    assert rows_read(lots, EXPIRE_LOOP_SQL, {"n": 100}, "ledger_lots") == 7


def test_a_reservations_draw_down_and_entitlement_read_only_the_customers_rows(lots):
    _no_seq_scans(lots, DRAW_DOWN_SQL, {"c": CUSTOMER})
    assert rows_read(lots, DRAW_DOWN_SQL, {"c": CUSTOMER}, "ledger_lots") <= LOTS_PER_CUSTOMER
    _no_seq_scans(lots, ENTITLED_SQL, {"c": CUSTOMER})
    assert rows_read(lots, ENTITLED_SQL, {"c": CUSTOMER}, "ledger_entitlements") == LOTS_PER_CUSTOMER
