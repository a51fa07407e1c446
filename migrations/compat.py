"""What each migration from 0080 on declares about the code before it (``schema_compatibility``).

``record`` in a migration's upgrade, ``forget`` in its downgrade; see
``migrations/versions/0080_schema_compatibility.py`` and ``core.db.schema_problem``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text


def record(revision: str, down_revision: str, *, serves_previous_code: bool, note: str) -> None:
    """Declare whether the code of ``down_revision`` still runs on the schema ``revision`` leaves."""
    op.get_bind().execute(
        text("INSERT INTO schema_compatibility (revision, down_revision, serves_previous_code, note) "
             "VALUES (:r, :d, :s, :n)"),
        {"r": revision, "d": down_revision, "s": serves_previous_code, "n": note},
    )


def forget(revision: str) -> None:
    op.get_bind().execute(text("DELETE FROM schema_compatibility WHERE revision = :r"), {"r": revision})


def create_index_online(name: str, definition: str) -> None:
    """``CREATE INDEX CONCURRENTLY <name> <definition>``: built while the revision still serving keeps writing.

    A plain CREATE INDEX holds off every write to its table while it builds: at 1M tasks that is seconds of
    refused admissions during a release. CONCURRENTLY cannot run in a transaction, so this commits the
    migration's transaction first (alembic's autocommit block) and begins a new one after. A build that failed
    half-way leaves an INVALID index of that name; it is dropped and built again, so the revision can be rerun.
    """
    with op.get_context().autocommit_block():
        bind = op.get_bind()
        invalid = bind.execute(
            text("SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                 "WHERE c.relname = :n AND NOT i.indisvalid"), {"n": name}
        ).first()
        if invalid:
            bind.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        bind.exec_driver_sql(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} {definition}")


def drop_index_online(name: str) -> None:
    """``DROP INDEX CONCURRENTLY IF EXISTS <name>``, outside the migration's transaction (see above)."""
    with op.get_context().autocommit_block():
        op.get_bind().exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
