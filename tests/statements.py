"""What an engine runs, seen the two ways a statement can go (``core.db.hot_rows``, issue 44).

``Statements`` records ``executed``: each statement SQLAlchemy's execution takes (``before_execute``, which is no
statement hook, so a hot statement keeps to the driver and is not there). While ``watching()``, a statement hook
(``after_cursor_execute``) also records ``seen``: every statement at the cursor, the hot ones included, since a
hook listening sends them through SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event


class Statements:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.executed: list[str] = []
        self.seen: list[str] = []

    def _executed(self, conn: Any, clause: Any, *args: Any) -> None:
        self.executed.append(str(clause))

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append(statement)

    def __enter__(self) -> Statements:
        event.listen(self.engine, "before_execute", self._executed)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_execute", self._executed)

    @contextmanager
    def watching(self) -> Iterator[None]:
        event.listen(self.engine, "after_cursor_execute", self._seen)
        try:
            yield
        finally:
            event.remove(self.engine, "after_cursor_execute", self._seen)
