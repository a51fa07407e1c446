"""Explicit idempotency: ``Idempotency-Key`` records, and what kind of reply a task answered with.

``edge_idempotency_keys`` (owner ``taskstate.idempotency``) maps (customer, specialist,
key) to the task the first send with that key created, with the content fingerprint a
resend must match; each row expires after the edge's key retention and is pruned by the
dispatchers, oldest first, through the index on ``expires_at``.

``edge_tasks.reply_kind`` (owner ``taskstate.admitted``) says whether the task's answer was a
direct Message (``message``) rather than the Task itself (``task``), so that a resend is
answered with what the first send was answered with.

Expand-only: code before this revision never reads the table and ignores the column, and
a task it admits during a rollout gets the default, which is what it answers.

Revision ID: 0120
Revises: 0110
"""

from alembic import op

from migrations.compat import forget, record

revision = "0120"
down_revision = "0110"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE edge_idempotency_keys (
            customer_key     text NOT NULL,             -- customer id, or '~anonymous'
            specialist_id    text NOT NULL,
            idempotency_key  text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 1024),
            fingerprint      bytea NOT NULL CHECK (length(fingerprint) = 32),
            task_id          varchar(36) NOT NULL,
            created_at       timestamptz NOT NULL DEFAULT now(),
            expires_at       timestamptz NOT NULL,
            PRIMARY KEY (customer_key, specialist_id, idempotency_key)
        );
        -- The prune deletes "expires_at < now() ORDER BY expires_at LIMIT n": an index range, never a scan.
        CREATE INDEX ix_edge_idempotency_keys_expires_at ON edge_idempotency_keys (expires_at);

        ALTER TABLE edge_tasks ADD COLUMN reply_kind text NOT NULL DEFAULT 'task'
            CHECK (reply_kind IN ('task', 'message'));
        """
    )
    record(revision, down_revision, serves_previous_code=True,
           note="edge_idempotency_keys and edge_tasks.reply_kind: older code ignores both")


def downgrade() -> None:
    op.execute("ALTER TABLE edge_tasks DROP COLUMN reply_kind; DROP TABLE edge_idempotency_keys;")
    forget(revision)
