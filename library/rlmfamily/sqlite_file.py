"""One SQLite file in WAL mode, shared by threads and processes: the base of the library's durable stores.

The inference budget, the family store and the delegation store each keep their
own schema in such a file. Writers take the write lock first (``BEGIN
IMMEDIATE``), so a check and the write it guards are atomic across processes.
This is the one place where ``sqlite3`` errors (a locked, unreadable or corrupt
file, a full disk) become the library's own ``StoreUnavailable``.

The path ``MEMORY`` (``":memory:"``) names no file: the store lives in one connection of this process, for
as long as the object, with every use of it serialised by a lock. That is for a store nobody needs after
the run: a hosted specialist's budget and history (its service's journal in PostgreSQL holds what a
resume needs, and the run's data folder is deleted when it ends) - no file to open, lock and sync on
every write.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlmfamily.errors import StoreUnavailable

BUSY_TIMEOUT_MS = 30_000
MEMORY = ":memory:"  # the path of a store kept in memory (see above)


class SQLiteFile:
    """A store kept in one SQLite file; subclasses set ``SCHEMA`` (idempotent DDL)."""

    SCHEMA: str = ""
    FOREIGN_KEYS: bool = False
    # Columns a table gained after files were first written, ``{table: ((name, definition), ...)}``: an older
    # file gets them when it is opened, and ``_backfill`` gives its existing rows their values.
    ADDED_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {}

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._memory: sqlite3.Connection | None = None
        self._memory_lock = threading.RLock()
        if str(path) == MEMORY:
            self._memory = self._connect()
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailable(f"cannot create the folder of {self.path}: {exc} (setting RLM_DATA_DIR)",
                                       setting="data_dir") from None
        self._initialize()

    def _initialize(self) -> None:
        """WAL mode and the schema. Switching a new file to WAL answers "database is locked" at once, without
        waiting out the busy timeout, when another connection opens it at that moment (eight agents of one
        family starting together did): such a refusal is tried again, for up to the busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        pause_s = 0.005
        while True:
            try:
                with self.reading() as conn:
                    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                        conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(self.SCHEMA)
                break
            except StoreUnavailable as refused:
                locked = isinstance(refused.__cause__, sqlite3.OperationalError) and "locked" in str(refused.__cause__)
                if not locked or time.monotonic() >= deadline:
                    raise
                time.sleep(pause_s)
                pause_s = min(2 * pause_s, 0.2)
        self._add_columns()

    def _add_columns(self) -> None:
        for table, columns in self.ADDED_COLUMNS.items():
            if not self._missing(table, columns):
                continue
            with self.transaction() as conn:  # under the write lock: two processes never both add a column
                missing = self._missing(table, columns, conn)
                for name, definition in missing:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
                self._backfill(conn, table, [name for name, _ in missing])

    def _backfill(self, conn: sqlite3.Connection, table: str, added: list[str]) -> None:
        """Values for the existing rows of ``table`` in the columns just ``added`` (the same transaction)."""

    def _missing(self, table: str, columns: tuple[tuple[str, str], ...],
                 conn: sqlite3.Connection | None = None) -> list[tuple[str, str]]:
        if conn is None:
            with self.reading() as reader:
                return self._missing(table, columns, reader)
        present = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
        return [c for c in columns if c[0] not in present]

    def _connect(self) -> sqlite3.Connection:
        memory = str(self.path) == MEMORY
        conn = sqlite3.connect(MEMORY if memory else self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=not memory)
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous=NORMAL")
        if self.FOREIGN_KEYS:
            conn.execute("PRAGMA foreign_keys=ON")
        conn.row_factory = sqlite3.Row
        return conn

    @contextmanager
    def transaction(self, *, foreign_keys_off: bool = False) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds the write lock from its first statement; ``foreign_keys_off`` for a
        table rebuild (SQLite ignores the pragma inside a transaction, so it is set before BEGIN)."""
        with self._converted(), self._connection() as conn:
            if foreign_keys_off:
                conn.execute("PRAGMA foreign_keys=OFF")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                if foreign_keys_off and self.FOREIGN_KEYS and self._memory is not None:
                    conn.execute("PRAGMA foreign_keys=ON")  # the one connection outlives this transaction

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A connection in autocommit mode, for reads (and a single statement that needs no lock held)."""
        with self._converted(), self._connection() as conn:
            yield conn

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """A new connection to the file, closed after use; or the store's one connection in memory, held."""
        if self._memory is None:
            conn = self._connect()
            try:
                yield conn
            finally:
                conn.close()
            return
        with self._memory_lock:
            yield self._memory

    @contextmanager
    def _converted(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreUnavailable(
                f"the library file {self.path} cannot be used: {exc}; check that it is readable, writable and "
                "not damaged (its folder is RLM_DATA_DIR)", setting="data_dir", path=str(self.path),
            ) from exc
