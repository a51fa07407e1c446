"""How the `specialists` command talks to people (tables) and to scripts (``--json``).

Exit codes scripts can trust:
  0  done
  1  refused or found problems (a ledger outcome other than success, violations)
  2  usage error (bad arguments)
  3  configuration error (a setting is missing or invalid)
  4  the database is unreachable or its schema is not at head
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_DATABASE = 4

# Piped output keeps whole values rather than wrapping them to 80 columns.
_out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
_err = Console(stderr=True, highlight=False, soft_wrap=True)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    return value


def emit_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(_plain(payload), indent=2, sort_keys=True) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, Mapping):  # a record inside a cell reads as "key value, ...", never as a Python dict
        return ", ".join(f"{k} {_cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple, set)):
        return ("; " if any(isinstance(v, Mapping) for v in value) else ", ").join(_cell(v) for v in value) or "-"
    return str(value)


def _is_id(column: str) -> bool:
    return column in ("job_id", "task_id", "key_id", "customer_id", "call_id") or column.endswith("_id")


def emit_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], *, title: str | None = None) -> None:
    """A table. Its title never wraps (the table is at least as wide), and an id column is never cut or
    wrapped: an id is what an operator copies into the next command."""
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    if not cells:
        _out.print(f"{title + ': ' if title else ''}nothing to show")
        return
    table = Table(title=title, show_lines=False, min_width=len(title) + 4 if title else None)
    for index, column in enumerate(columns):
        if _is_id(column):
            widest = max(len(column), *(len(row[index]) for row in cells))
            table.add_column(column, no_wrap=True, min_width=widest, overflow="fold")
        else:
            table.add_column(column)
    for row in cells:
        table.add_row(*row)
    _out.print(table)


def emit(payload: Any, *, as_json: bool, columns: Sequence[str] | None = None, title: str | None = None) -> None:
    """Rows (a list of mappings) become a table, a mapping becomes a two-column table."""
    if as_json:
        emit_json(payload)
        return
    if isinstance(payload, Mapping):
        emit_table(({"field": k, "value": v} for k, v in payload.items()), ["field", "value"], title=title)
    else:
        emit_table(payload, columns or (list(payload[0].keys()) if payload else []), title=title)


def emit_page(rows: list[Mapping[str, Any]], *, as_json: bool, key: str, columns: Sequence[str], title: str,
              next_flag: str, next_value: Any, older: str) -> None:
    """One page of a listing: ``{key: rows, next_<flag>: value}`` for scripts; for people a table, and under it the
    flag that shows the next page (``older``: what that page holds)."""
    if as_json:
        emit_json({key: rows, "next_" + next_flag.lstrip("-"): next_value})
        return
    emit_table(rows, columns, title=title)
    if next_value is not None:
        say(f"{older}: the same command with {next_flag} {next_value}")


def say(message: str) -> None:
    _out.print(message)


def progress(message: str) -> None:
    """A line for the person watching a long command, on stderr: stdout stays the command's result (and its JSON)."""
    _err.print(escape(message))


def fail(code: str, message: str, *, as_json: bool, exit_code: int = EXIT_REFUSED) -> int:
    """Report an error: for people on stderr; for scripts (``--json``) as JSON on stdout and nothing else, so a
    script reads one document and a wrapper that merges the streams sees it once. Return the exit code."""
    if as_json:
        emit_json({"error": {"code": code, "message": message}})
    else:
        _err.print(f"[bold red]error[/] {escape(f'[{code}]')} {escape(message)}")
    return exit_code
