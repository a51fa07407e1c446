"""A page of a prune's walk: one statement over an index in key order, from where the last one stopped.

The prunes of the task tables (``rows``), the outbox (``outbox``) and the claims
(``claims``) each walk their table's partial index of what has ended, oldest
first, a page a statement: what they delete leaves the index, what they must keep
(it is still needed) is passed, and the walker (``workers.dispatch.pruner``) keeps
the key of the last row done, so the next page starts after it instead of reading
the kept rows again every round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Page:
    deleted: int  # rows this statement deleted
    examined: int  # index entries it read
    last: tuple[Any, ...] | None  # the key up to which everything is done (None: do this page again)
    at_edge: bool  # it read fewer entries than it asked for: the walk reached the retention's edge


def page_of(row: Any, *, asked: int, key: tuple[str, ...] = ("last_at", "last_id")) -> Page:
    """A page from a prune statement's one result row (``deleted``, ``examined``, and the last key's columns, NULL
    when the page was empty or is not done), which read up to ``asked`` index entries."""
    last = tuple(row._mapping[column] for column in key)
    return Page(int(row.deleted), int(row.examined), None if last[0] is None else last, int(row.examined) < asked)
