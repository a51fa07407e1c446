"""Large values compressed with lz4 instead of pglz (issue 44: a hosted task's own overhead).

A hosted review's message carries its bundle (the benchmark's: 200 files, 328 KiB), and it is written whole in the
outbox row (``dispatch_outbox.message``), in the task's history (``tasks.history``) and in its events; a run's
checkpoints, calls and steps are tens of KiB each. PostgreSQL compresses such values (TOAST) with pglz by default:
inserting the benchmark's message alone took 10.0 ms with pglz against 2.1 ms with lz4 on this machine (reading it
back 4.5 against 3.8 ms), for 9% more bytes stored. These columns now say lz4, so values written from here on are
compressed with it; values written before keep pglz, and both read the same.

Expand-only: the column's compression is the server's business, the code before this revision reads and writes
them unchanged. A server built without lz4 keeps pglz (the change is skipped with a notice): every supported Cloud
SQL version and Debian's packages have it.

Revision ID: 0294
Revises: 0293
"""

from alembic import op

from migrations.compat import forget, record

revision = "0294"
down_revision = "0293"
branch_labels = None
depends_on = None

# (table, column): every column that holds a message, a task, an event, or a run's records.
COLUMNS = (
    ("dispatch_outbox", "message"),
    ("tasks", "history"),
    ("tasks", "artifacts"),
    ("tasks", "metadata"),
    ("tasks", "status"),
    ("task_events", "event_data"),
    ("push_deliveries", "event_data"),
    ("job_claims", "outcome_detail"),
    ("job_stale_reports", "outcome_detail"),
    ("specialist_checkpoints", "data"),
    ("specialist_calls", "response"),
    ("specialist_steps", "result"),
    ("specialist_steps", "refusals"),
)


def _set(method: str) -> None:
    statements = " ".join(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION {method};"
                          for table, column in COLUMNS)
    op.execute(
        f"""
        DO $$
        BEGIN
            {statements}
        EXCEPTION WHEN feature_not_supported THEN
            RAISE NOTICE 'this server has no % compression: large values keep pglz', '{method}';
        END $$;
        """
    )


def upgrade() -> None:
    _set("lz4")
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: large columns compressed with lz4 from here on")


def downgrade() -> None:
    _set("pglz")
    forget(revision)
