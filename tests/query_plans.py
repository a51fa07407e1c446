"""What PostgreSQL would do for a query: ``EXPLAIN (FORMAT JSON)`` read back as the scans it plans.

Issue 18: every query the service repeats on a shared table must be served by an index, so that its cost does
not grow with history. ``seq_scans_of_large_tables`` names each sequential scan the planner chose over a table
holding at least ``min_rows`` rows (by ``pg_class.reltuples``, so the database must have been ANALYZEd after it
was seeded). A table smaller than that is cheaper to scan than to index, and the planner knows it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sqlalchemy import Connection, Engine, event, text

SEQUENTIAL = {"Seq Scan", "Parallel Seq Scan"}


def _top(raw: Any) -> dict[str, Any]:
    """The top node of what ``EXPLAIN (FORMAT JSON)`` returned (psycopg may hand it over parsed or as text)."""
    document = raw if isinstance(raw, list) else json.loads(raw)
    return document[0]["Plan"]


def plan(conn: Connection, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The planner's plan of ``sql`` (not run: no ANALYZE), as the JSON tree PostgreSQL prints."""
    return _top(conn.execute(text(f"EXPLAIN (FORMAT JSON) {sql}"), dict(params or {})).scalar_one())


def nodes(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from nodes(child)


def table_rows(conn: Connection) -> dict[str, float]:
    """Each ordinary table's row count as the planner believes it (``reltuples``; -1 before any ANALYZE)."""
    found = conn.execute(text(
        "SELECT c.relname, c.reltuples FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'r' AND n.nspname = current_schema()"
    ))
    return {name: float(rows) for name, rows in found}


def seq_scans_of_large_tables(conn: Connection, sql: str, params: Mapping[str, Any] | None = None, *,
                              min_rows: float) -> list[str]:
    """Every sequential scan of a table of ``min_rows`` rows or more in ``sql``'s plan, as "table (N rows)"."""
    return _large_seq_scans(plan(conn, sql, params), table_rows(conn), min_rows)


def _large_seq_scans(top: Mapping[str, Any], sizes: Mapping[str, float], min_rows: float) -> list[str]:
    found = []
    for node in nodes(top):
        table = node.get("Relation Name")
        if node["Node Type"] in SEQUENTIAL and table is not None and sizes.get(table, 0) >= min_rows:
            found.append(f"{table} ({sizes[table]:,.0f} rows)")
    return found


class Statements:
    """Every statement ``engine`` runs while this is entered, with its parameters, as the driver got them.

    The plan test calls the service's real functions and EXPLAINs what they sent, so it checks the SQL the
    code runs today, not a copy of it.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: list[tuple[str, Any]] = []

    def _record(self, conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if not statement.lstrip().upper().startswith(("EXPLAIN", "SET ", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT",
                                                      "RELEASE", "SHOW ", "SELECT PG_ADVISORY")):
            self.seen.append((statement, parameters))

    def __enter__(self) -> "Statements":
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)


def driver_seq_scans(conn: Connection, statement: str, parameters: Any, *, min_rows: float) -> list[str]:
    """``seq_scans_of_large_tables`` for a statement in the driver's own form (psycopg's ``%(name)s``)."""
    top = _top(conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar_one())
    return _large_seq_scans(top, table_rows(conn), min_rows)


def rows_read(conn: Connection, sql: str, params: Mapping[str, Any] | None, table: str) -> int:
    """Rows of ``table`` that ``sql``'s scans produced or threw away, run (EXPLAIN ANALYZE): what it really read.

    An index scan that filters most of what it reads is no sequential scan, yet it grows with history all the
    same; this tells them apart."""
    ran = _top(conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), dict(params or {})).scalar_one())
    total = 0
    for node in nodes(ran):
        if node.get("Relation Name") == table:
            produced = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            total += (produced + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"]
    return total


def large_seq_scans_of_call(engine: Engine, call: Callable[[Connection], object], *,
                            min_rows: float) -> tuple[int, dict[str, list[str]]]:
    """Run ``call`` in a transaction rolled back afterwards and plan every statement it sent: (how many it sent,
    each statement that scans a table of ``min_rows`` rows or more sequentially, with those scans)."""
    with Statements(engine) as sent, engine.connect() as conn:
        with conn.begin() as transaction:
            call(conn)
            transaction.rollback()
    with engine.connect() as conn:
        scans = {" ".join(statement.split())[:200]: found for statement, parameters in sent.seen
                 if (found := driver_seq_scans(conn, statement, parameters, min_rows=min_rows))}
    return len(sent.seen), scans
