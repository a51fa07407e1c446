"""An example custom tool (rlmfamily/tools.py): read-only SQL over a local SQLite file.

    from rlmfamily import Context, Session
    from rlmfamily.examples.sqlite_tool import sqlite_query_tool

    orders = sqlite_query_tool("shop.sqlite3", name="orders")
    Session(context=Context.from_repository("."), provider=..., tools=[orders]).run("Who ordered most in May?")

The model then calls ``orders("SELECT customer, SUM(total) FROM orders GROUP BY 1 ORDER BY 2 DESC", limit=5)``.

Read-only three ways: the file is opened with ``mode=ro`` (SQLite refuses every
write), the connection is ``query_only``, and an authorizer allows reads and
``SELECT`` only (no ``ATTACH``, no ``PRAGMA`` that changes anything). A query
runs at most ``query_timeout_s`` (SQLite's progress handler interrupts it, below
the tool's own deadline) and returns at most ``max_rows`` rows; more is said,
not silently dropped. It is declared ``repeat_safe``: a resumed run may run a
recorded query again, since it changes nothing.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, Final

from rlmfamily.tools import Tool, tool

MAX_ROWS: Final = 200  # rows one query returns; the model narrows with WHERE / LIMIT for the rest
QUERY_TIMEOUT_S: Final = 5.0
MAX_SQL_CHARS: Final = 10_000
PROGRESS_OPCODES: Final = 10_000  # SQLite VM steps between two looks at the query's deadline
ALLOWED_ACTIONS: Final = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION})


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _cell(value: Any) -> Any:
    return f"<{len(value)} bytes>" if isinstance(value, bytes) else value


def sqlite_query_tool(path: str | Path, *, name: str = "query", max_rows: int = MAX_ROWS,
                      query_timeout_s: float = QUERY_TIMEOUT_S) -> Tool:
    """A tool that runs one read-only SQL query on the SQLite file at ``path``."""
    database = Path(path).resolve()
    if not database.is_file():
        raise FileNotFoundError(f"no SQLite file at {database}")
    uri = database.as_uri() + "?mode=ro"

    def run_query(sql: str, params: list[Any] | None = None, limit: int = max_rows) -> dict[str, Any]:
        if not isinstance(sql, str) or len(sql) > MAX_SQL_CHARS:
            raise ValueError(f"sql must be a string of at most {MAX_SQL_CHARS:,} characters")
        limit = min(max(1, int(limit)), max_rows)
        deadline = time.monotonic() + query_timeout_s
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        try:
            conn.execute("PRAGMA query_only = ON")
            conn.set_authorizer(_authorize)
            conn.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_OPCODES)
            try:
                cursor = conn.execute(sql, list(params or []))
                rows = cursor.fetchmany(limit + 1)
            except sqlite3.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the query ran past {query_timeout_s:g} s; narrow it") from None
                raise ValueError(f"SQLite refused the query: {exc}") from None
            except sqlite3.DatabaseError as exc:
                raise ValueError(f"SQLite refused the query: {exc}") from None
            columns = [d[0] for d in cursor.description or []]
            return {"columns": columns, "rows": [[_cell(v) for v in row] for row in rows[:limit]],
                    "more_rows": len(rows) > limit}
        finally:
            conn.close()

    run_query.__doc__ = (
        f"Run one read-only SQL query (SQLite dialect) on {database.name}; ? placeholders take params. Returns "
        f"{{'columns': [...], 'rows': [[...], ...], 'more_rows': bool}}, at most `limit` rows (at most {max_rows}); "
        "more_rows says the query had more. Find the tables with "
        "\"SELECT name, sql FROM sqlite_master WHERE type = 'table'\".")
    return tool(run_query, name=name, timeout_s=query_timeout_s + 1.0, repeat_safe=True)
