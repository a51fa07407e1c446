"""Workers say they are alive: ``worker_beats`` (issue 42).

Until this revision a worker wrote only its claims, so an idle worker and a dead one looked the same, and
`specialists health` said ready while the only worker had been killed. Now each worker process keeps one row:
the specialists it serves and when it last beat (every SPECIALISTS_WORKER_BEAT_S). A row whose beat is older than
SPECIALISTS_WORKER_LIVE_S is a worker that died without saying so; a worker that stops cleanly deletes its own.
``taskstate.liveness`` owns the table; each beat also deletes a bounded batch of rows dead for a day.

Expand-only: the code before this revision never names the table.

Revision ID: 0270
Revises: 0260
"""

from alembic import op

from migrations.compat import forget, record

revision = "0270"
down_revision = "0260"
branch_labels = None
depends_on = None

MAX_SPECIALISTS_PER_WORKER = 1000  # taskstate.liveness.MAX_SPECIALISTS_PER_WORKER; core.specs.MAX_SPECS is below

SCHEMA = rf"""
CREATE TABLE worker_beats (
    worker_id    text PRIMARY KEY CHECK (length(worker_id) BETWEEN 1 AND 200),
    specialists  text[] NOT NULL CHECK (cardinality(specialists) <= {MAX_SPECIALISTS_PER_WORKER}),
    started_at   timestamptz NOT NULL DEFAULT now(),
    beat_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX worker_beats_beat_at ON worker_beats (beat_at);
"""


def upgrade() -> None:
    op.execute(SCHEMA)
    record(revision, down_revision, serves_previous_code=True, note="expand only: worker_beats")


def downgrade() -> None:
    op.execute("DROP TABLE worker_beats")
    forget(revision)
