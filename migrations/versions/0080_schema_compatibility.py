"""Schema compatibility: what each migration declares about the code before it.

A release migrates the schema before its code takes traffic (cloudbuild.yaml), so
for a while the previous revision serves on the new schema, and must be able to
start instances (Cloud Run scales it, replaces a crashed one). Every process
checks the schema at start-up and in ``/readyz`` (``core.db.schema_problem``): it
runs on its own head, or on a later revision when every migration since its head
recorded ``serves_previous_code`` here: the code of the revision before it still
runs on the schema it leaves (expand-only: new tables, new nullable or defaulted
columns, new functions; nothing older code uses is removed, renamed or
re-typed). A contracting migration records false, and the code before it stops
at once: deploy such a migration only after no revision older than it serves.

Every migration from this one on calls ``migrations.compat.record`` in its
upgrade (and ``forget`` in its downgrade). This one only adds a table older code never reads.

Revision ID: 0080
Revises: 0070
"""

from alembic import op

from migrations.compat import record

revision = "0080"
down_revision = "0070"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE schema_compatibility (
            revision              text PRIMARY KEY,
            down_revision         text NOT NULL,
            serves_previous_code  boolean NOT NULL,
            note                  text NOT NULL CHECK (length(note) BETWEEN 1 AND 2000),
            recorded_at           timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    record(revision, down_revision, serves_previous_code=True, note="adds schema_compatibility only")


def downgrade() -> None:
    op.execute("DROP TABLE schema_compatibility")
