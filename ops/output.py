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
    if isinstance(value, (list, tuple, set)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def emit_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], *, title: str | None = None) -> None:
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column)
    count = 0
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in columns))
        count += 1
    if count == 0:
        _out.print(f"{title + ': ' if title else ''}nothing to show")
        return
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


def say(message: str) -> None:
    _out.print(message)


def progress(message: str) -> None:
    """A line for the person watching a long command, on stderr: stdout stays the command's result (and its JSON)."""
    _err.print(escape(message))


def fail(code: str, message: str, *, as_json: bool, exit_code: int = EXIT_REFUSED) -> int:
    """Report an error on stderr (and as JSON on stdout for scripts); return the exit code."""
    if as_json:
        emit_json({"error": {"code": code, "message": message}})
    _err.print(f"[bold red]error[/] {escape(f'[{code}]')} {escape(message)}")
    return exit_code
