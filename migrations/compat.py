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
