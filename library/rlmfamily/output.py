"""How the ``rlm`` command prints: the consoles, and tables that never cut an id.

Piped output (no terminal, no COLUMNS) is printed at its full width: a script or a file gets whole rows, never
rows wrapped or cut at rich's default 80 columns. On a terminal (or with COLUMNS) tables fit its width, and only
the columns that are not ids give way: an id is what a person copies into the next command, so a terminal
narrower than a table's ids gets the table wider than itself (its lines wrap), never an id cut short.
Every listing command also has ``--json``, for scripts.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

UNBOUNDED_WIDTH = 1_000_000  # a piped stream's width: each line as long as it is
NARROWEST_COLUMN = 8  # a column that is not an id wraps to no fewer characters


def width_of(stream: TextIO) -> int | None:
    """None (rich's own rule: the terminal's width, or COLUMNS) for a terminal or when COLUMNS is set; else whole."""
    if stream.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return None
    return UNBOUNDED_WIDTH


def consoles() -> tuple[Console, Console]:
    """The command's stdout and stderr consoles, each as wide as ``width_of`` its stream says."""
    return (Console(soft_wrap=True, width=width_of(sys.stdout)),
            Console(stderr=True, soft_wrap=True, width=width_of(sys.stderr)))


def print_table(console: Console, table: Table, *, ids: tuple[str, ...]) -> None:
    """Print ``table``; its columns headed by a name in ``ids`` are never cut or wrapped, the others wrap."""
    least_width = 1
    for column in table.columns:
        header = str(column.header)
        widest = max([len(header), *(_length(cell) for cell in column.cells)])
        if header in ids:
            column.no_wrap, column.overflow, column.min_width = True, "fold", widest
            least_width += widest + 3
        else:
            column.no_wrap, column.overflow = False, "fold"
            column.min_width = min(widest, max(column.min_width or 0, NARROWEST_COLUMN))
            least_width += column.min_width + 3
    wide_enough = console if console.width >= least_width else Console(
        file=console.file, width=least_width, force_terminal=console.is_terminal, soft_wrap=True)
    wide_enough.print(table, crop=False)


def _length(cell: object) -> int:
    return cell.cell_len if isinstance(cell, Text) else len(str(cell))
