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
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_DATABASE = 4

# Piped output (no terminal, no COLUMNS) is printed at its full width, never cut: a script or a file gets whole
# values. A terminal's width, or COLUMNS when set (rich reads it), bounds the rest, and only a table's columns
# that are not ids give way (``emit_table``).
UNBOUNDED_WIDTH = 1_000_000


def _width(stream: TextIO) -> int | None:
    """A stream's width, by the same rule for stdout and stderr (a table on stderr, ``emit_table(on_stderr=True)``,
    piped with `2> file` is whole too, not wrapped to rich's default 80)."""
    if stream.isatty() or os.environ.get("COLUMNS", "").isdigit():  # the terminal's convention, as rich's
        return None
    return UNBOUNDED_WIDTH


def _out() -> Console:
    """stdout's console, its width by ``_width`` at the moment of printing: a process whose streams or COLUMNS change
    (a command run in a test's process, tests/commands.py) must not keep the first command's width."""
    return Console(highlight=False, width=_width(sys.stdout))


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


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


NARROWEST_COLUMN = 8  # a column that is not an id wraps to no fewer characters


def _is_id(column: str) -> bool:
    return column in ("job_id", "task_id", "key_id", "customer_id", "call_id") or column.endswith("_id")


def emit_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], *, title: str | None = None,
               on_stderr: bool = False) -> None:
    """A table (on stdout, or ``on_stderr``). Its title never wraps (the table is at least as wide), and an id
    column is never cut or wrapped: an id is what an operator copies into the next command."""
    out = _err() if on_stderr else _out()
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    if not cells:
        out.print(f"{title + ': ' if title else ''}nothing to show")
        return
    table = Table(title=title, show_lines=False, min_width=len(title) + 4 if title else None)
    least_width = 1  # the table's narrowest form: whole ids, other columns wrapped to NARROWEST_COLUMN
    for index, column in enumerate(columns):
        widest = max(len(column), *(len(row[index]) for row in cells))
        if _is_id(column):
            table.add_column(column, no_wrap=True, min_width=widest, overflow="fold")
            least_width += widest + 3
        else:
            table.add_column(column, overflow="fold", min_width=min(widest, NARROWEST_COLUMN))  # wrapped, never cut
            least_width += min(widest, NARROWEST_COLUMN) + 3
    for row in cells:
        table.add_row(*row)
    # A terminal narrower than the ids gets a table wider than itself (its lines wrap), never a cut id.
    wide_enough = out if out.width >= least_width else Console(
        highlight=False, width=least_width, force_terminal=out.is_terminal, file=out.file)
    wide_enough.print(table, crop=False)


def emit(payload: Any, *, as_json: bool, columns: Sequence[str] | None = None, title: str | None = None,
         on_stderr: bool = False) -> None:
    """Rows (a list of mappings) become a table, a mapping becomes a two-column table."""
    if as_json:
        emit_json(payload)
        return
    if isinstance(payload, Mapping):
        emit_table(({"field": k, "value": v} for k, v in payload.items()), ["field", "value"], title=title,
                   on_stderr=on_stderr)
    else:
        emit_table(payload, columns or (list(payload[0].keys()) if payload else []), title=title, on_stderr=on_stderr)


def stdout_is_a_terminal() -> bool:
    return sys.stdout.isatty()


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
    _out().print(message)


def progress(message: str) -> None:
    """A line for the person watching a long command, on stderr: stdout stays the command's result (and its JSON)."""
    _err().print(escape(message))


def warn(code: str, message: str) -> None:
    """Something the person should fix that stops nothing: on stderr, with or without ``--json``."""
    _err().print(f"[bold yellow]warning[/] {escape(f'[{code}]')} {escape(message)}")


def fail(code: str, message: str, *, as_json: bool, exit_code: int = EXIT_REFUSED) -> int:
    """Report an error: for people on stderr; for scripts (``--json``) as JSON on stdout and nothing else, so a
    script reads one document and a wrapper that merges the streams sees it once. Return the exit code."""
    if as_json:
        emit_json({"error": {"code": code, "message": message}})
    else:
        _err().print(f"[bold red]error[/] {escape(f'[{code}]')} {escape(message)}")
    return exit_code
