"""The ledger's repeated queries read index ranges, not tables, on a ledger grown with the real functions (issue 18).

A database of this module's own is grown by the ledger's own functions, server-side: 1,000 customers with
eleven lots each (ten of them expired and waiting for the sweep), 15,000 reservations of which one customer
holds a tenth, most settled, some left open and some unknown, with ties in their creation times. After
ANALYZE, each query's plan must not scan a large table (``tests.query_plans``), and the listings must read
about the rows they show, whatever the history behind them (``rows_read``, from EXPLAIN ANALYZE).

Before issue 18 `ledger verify --customer` scanned the journal, the reservations and the settlements whole,
`reservations list` and `--open` scanned the reservations, and a customer's view read all of its
reservations to find its open ones.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from sqlalchemy import Connection, create_engine, text

from core import db
from core.settings import PROJECT_ROOT
from ledger import reads
from ledger import verify as ledger_verify
from tests.query_plans import nodes, seq_scans_of_large_tables

pytestmark = pytest.mark.timeout(300)

CUSTOMERS = 1000
RESERVATIONS = 15_000
BIG = "p0000"  # holds every tenth reservation
SMALL = "p0500"
MIN_ROWS = 10_000  # a table below this is cheaper to scan than to index: the planner is right to scan it
PAGE = 50


def _migration(path: str):
    spec = importlib.util.spec_from_file_location("ledger_migration", PROJECT_ROOT / "migrations" / "versions" / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


_LEDGER_FUNCTIONS = _migration("0002_ledger.py")


def _function_sql(name: str) -> str:
    return getattr(_LEDGER_FUNCTIONS, name)


def _loop_query(function_source: str, starts: str, ends: str) -> str:
    """The SELECT a plpgsql ``FOR lot IN <query> LOOP`` runs, as the migration states it."""
    found = re.search(rf"FOR lot IN\s+({re.escape(starts)}.*?{re.escape(ends)})\s+LOOP", function_source, re.S)
    assert found, f"the loop query starting {starts!r} is no longer in migration 0002"
    return found.group(1)


# What ledger_expire and ledger_reserve read in their loops (migration 0002), with their variables as parameters.
EXPIRE_LOOP_SQL = (
    _loop_query(_function_sql("EXPIRE_ADJUST_FN"), "SELECT l.lot_id, l.customer_id, l.expires_at", "LIMIT p_max_lots")
    .replace("v_now", "CAST(:now AS timestamptz)").replace("p_max_lots", ":n")
)
DRAW_DOWN_SQL = (
    _loop_query(_function_sql("RESERVE_FN"), "SELECT l.lot_id,", "l.lot_id")
    .replace("p_customer_id", ":c").replace("v_now", "CAST(:now AS timestamptz)")
)
ENTITLED_SQL = (
    "SELECT bool_or(e.expires_at IS NULL OR e.expires_at > now()), max(e.expires_at) "
    "FROM ledger_entitlements e WHERE e.customer_id = :c AND e.skill = 'review'"
)
SETTLE_CLAIM_SQL = (  # ledger_settle's and ledger_batch's claim of the reservation (migrations 0002, 0150)
    "UPDATE ledger_reservations SET state = 'settled', charged = 1, resolved_at = now() "
    "WHERE job_id = :j AND state = 'open' AND 1 <= credits"
)

_SEED = [
    # eleven lots per customer: one that never expires, ten that expired nine days ago and wait for the sweep
    """SELECT count(*) FROM generate_series(0, %(customers)s::int - 1) c,
       LATERAL ledger_grant('p' || lpad(c::text, 4, '0'), 1000000000, 100, NULL, NULL, 100000, 8, ARRAY['review'],
                            NULL, NULL, 'seed', 'seed', 'live lot', now() - interval '30 days') live,
       LATERAL (SELECT ledger_grant('p' || lpad(c::text, 4, '0'), 50, 50 + k, NULL, interval '1 day', NULL, 8,
                                    ARRAY['review'], NULL, NULL, 'seed', 'seed', 'old lot', now() - interval '10 days')
                  FROM generate_series(1, 10) k) old""",
    # reservations over twenty days, three at each instant (ties), every tenth of them the big customer's
    """SELECT count(*) FROM generate_series(%(first)s::int, %(last)s::int) i,
       LATERAL ledger_reserve(CASE WHEN i %% 10 = 0 THEN 'p0000'
                                   ELSE 'p' || lpad((1 + abs(hashint4(i)) %% (%(customers)s::int - 1))::text, 4, '0') END,
                              'job-' || lpad(i::text, 7, '0'), 'fp', 'review', 10,
                              now() - interval '20 days' + (i / 3) * interval '1 minute') r""",
    # all settled but those left open (i % 100 = 3, and the big customer's i % 1000 = 10) and unknown (i % 500 = 5)
    """SELECT count(*) FROM generate_series(%(first)s::int, %(last)s::int) i,
       LATERAL ledger_settle('job-' || lpad(i::text, 7, '0'), CASE WHEN i %% 7 = 0 THEN 0 ELSE 4 END, 'done',
                             now() - interval '20 days' + (i / 3) * interval '1 minute' + interval '30 seconds') s
       WHERE i %% 100 <> 3 AND i %% 500 <> 5 AND i %% 1000 <> 10""",
    """SELECT count(*) FROM generate_series(%(first)s::int, %(last)s::int) i,
       LATERAL ledger_mark_unknown('job-' || lpad(i::text, 7, '0'), 'lease expired', 'seed',
                                   now() - interval '20 days' + (i / 3) * interval '1 minute' + interval '1 minute') u
       WHERE i %% 500 = 5""",
]


_SEED_STEP = 2500  # jobs per seeding statement


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


@pytest.fixture(scope="module")
def grown(server_url: str) -> Iterator[Connection]:
    """A connection to a database of this module's own, grown and ANALYZEd."""
    name = f"specialists_plans_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = _with_database(server_url, name)
    engine = None
    try:
        db.upgrade(url)
        libpq = url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(libpq, autocommit=True) as seeding:
            seeding.execute(_SEED[0], {"customers": CUSTOMERS})
            seeding.execute("ANALYZE")  # the functions' plans see 11,000 lots, not an empty table
            for first in range(0, RESERVATIONS, _SEED_STEP):
                bounds = {"first": first, "last": min(RESERVATIONS, first + _SEED_STEP) - 1, "customers": CUSTOMERS}
                for statement in _SEED[1:]:
                    seeding.execute(statement, bounds)
                    # The hot rows' old versions: this server may run no autovacuum, and each statement is one
                    # transaction whose updates of an account or lot pile up until a vacuum.
                    seeding.execute("VACUUM ledger_accounts, ledger_lots")
            seeding.execute("VACUUM ANALYZE")
        engine = create_engine(url)
        with engine.connect() as conn:
            yield conn
    finally:
        if engine is not None:
            engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def rows_read(conn: Connection, sql: str, params: Mapping[str, Any], table: str) -> int:
    """Rows of ``table`` the query's scans produced or threw away (EXPLAIN ANALYZE): what it really read."""
    raw = conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), dict(params)).scalar_one()
    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
    total = 0
    for node in nodes(plan):
        if node.get("Relation Name") == table:
            per_loop = node["Actual Rows"] + node.get("Rows Removed by Filter", 0) + node.get(
                "Rows Removed by Index Recheck", 0)
            total += per_loop * node["Actual Loops"]
    return total


def _no_seq_scans(conn: Connection, sql: str, params: Mapping[str, Any]) -> None:
    assert seq_scans_of_large_tables(conn, sql, params, min_rows=MIN_ROWS) == []


def test_the_grown_ledger_is_large_enough_to_tell_a_scan_from_an_index(grown):
    sizes = {name: rows for name, rows in _sizes(grown).items() if name.startswith("ledger_")}
    for table in ("ledger_journal", "ledger_reservations", "ledger_settlements", "ledger_lots",
                  "ledger_entitlements"):
        assert sizes[table] >= MIN_ROWS, sizes
    assert ledger_verify.verify(grown, BIG) == [] and ledger_verify.verify(grown, SMALL) == []


def _sizes(conn: Connection) -> dict[str, float]:
    return dict(conn.execute(text("SELECT relname, reltuples FROM pg_class WHERE relkind = 'r'")).all())


@pytest.mark.parametrize("customer", [SMALL, BIG])
def test_a_customers_verify_reads_only_its_rows_through_the_customer_indexes(grown, customer):
    scope = ledger_verify.Scope(customer_id=customer)
    _no_seq_scans(grown, ledger_verify.verify_sql(scope).text, scope.params())
    _no_seq_scans(grown, ledger_verify.totals_sql(scope).text, scope.params())
    journal = grown.execute(text("SELECT count(*) FROM ledger_journal WHERE customer_id = :c"),
                            {"c": customer}).scalar_one()
    assert rows_read(grown, ledger_verify.verify_sql(scope).text, scope.params(), "ledger_journal") == journal


def test_a_range_of_customers_is_verified_through_the_customer_indexes(grown):
    scope = ledger_verify.Scope(from_customer="p0300", to_customer="p0310")
    _no_seq_scans(grown, ledger_verify.verify_sql(scope).text, scope.params())
    tail = ledger_verify.Scope(from_customer="p0990")
    _no_seq_scans(grown, ledger_verify.verify_sql(tail).text, tail.params())


def _deep_cursor(conn: Connection, pages: int, **filters: Any) -> str:
    cursor = None
    for _ in range(pages):
        cursor = reads.reservation_page(conn, limit=PAGE, before=cursor, **filters).next_cursor
        assert cursor is not None
    return cursor


@pytest.mark.parametrize(
    "filters",
    [{}, {"states": ("open",)}, {"states": ("unknown",)}, {"states": ("open", "unknown")},
     {"customer_id": SMALL}, {"customer_id": BIG}, {"customer_id": BIG, "states": ("open", "unknown")}],
    ids=["all", "open", "unknown", "unresolved", "small-customer", "big-customer", "big-customer-unresolved"],
)
def test_each_reservation_page_is_one_index_range_at_any_depth(grown, filters):
    unresolved = grown.execute(text("SELECT count(*) FROM ledger_reservations WHERE state IN ('open', 'unknown')")
                               ).scalar_one()
    depths = [None]
    first = reads.reservation_page(grown, limit=PAGE, **filters)
    if first.next_cursor is not None:
        depths.append(first.next_cursor)
    if not filters:
        depths.append(_deep_cursor(grown, 200))  # 10,000 reservations deep
    for before in depths:
        sql, params = reads.listing(limit=PAGE, before=before, **filters)
        _no_seq_scans(grown, sql.text, params)
        read = rows_read(grown, sql.text, params, "ledger_reservations")
        bound = unresolved if "states" in filters else 15 * PAGE  # a big customer's page skips others' rows
        assert read <= bound, (filters, before, read)


def test_a_customers_view_reads_its_unresolved_reservations_without_its_history(grown):
    unresolved = grown.execute(
        text("SELECT count(*) FROM ledger_reservations WHERE customer_id = :c AND state IN ('open', 'unknown')"),
        {"c": BIG},
    ).scalar_one()
    sql, params = reads.listing(customer_id=BIG, states=("open", "unknown"), limit=1000)
    assert 0 < unresolved == rows_read(grown, sql.text, params, "ledger_reservations")
    view = reads.account(grown, BIG, max_rows=1000)
    assert len(view.unresolved) == unresolved
    for statement in (reads.ACCOUNT_SQL, reads.LOTS_SQL, reads.ENTITLEMENTS_SQL, reads.HISTORY_SQL):
        _no_seq_scans(grown, statement.text, {"c": BIG, "now": None, "at": view.lots[0].created_at, "n": 1000})
    _no_seq_scans(grown, reads.RESERVATION_SQL.text, {"j": "job-0007000"})


def test_the_money_functions_loops_read_index_ranges(grown):
    """ledger_expire's lots to sweep (ledger_lots_to_sweep), ledger_reserve's draw-down and entitlement
    (ledger_lots_drawdown, the entitlements' key) and the settlement's claim (the reservation's key)."""
    due = grown.execute(text("SELECT count(*) FROM ledger_lots WHERE swept_at IS NULL AND expires_at <= now()")
                        ).scalar_one()
    assert due >= MIN_ROWS - CUSTOMERS
    _no_seq_scans(grown, EXPIRE_LOOP_SQL, {"now": None, "n": 100})
    assert rows_read(grown, EXPIRE_LOOP_SQL, {"now": None, "n": 100}, "ledger_lots") <= due
    _no_seq_scans(grown, DRAW_DOWN_SQL, {"c": BIG, "now": None})
    assert rows_read(grown, DRAW_DOWN_SQL, {"c": BIG, "now": None}, "ledger_lots") <= 11
    _no_seq_scans(grown, ENTITLED_SQL, {"c": BIG})
    _no_seq_scans(grown, SETTLE_CLAIM_SQL, {"j": "job-0000003"})
