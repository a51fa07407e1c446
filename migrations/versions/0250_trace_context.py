"""The trace a task's job belongs to: ``dispatch_outbox.trace_parent``.

Admission writes the W3C ``traceparent`` of its own span into the row it commits (NULL when telemetry is off), and
the dispatcher continues that trace when it hands the job on, signing it into the job's body (core/telemetry.py),
so one trace runs from the customer's request to the settlement, across processes and a resume. 55 characters
is the whole of a version-00 traceparent; the bound leaves room for nothing else.

Expand-only: the code before this revision writes no trace and never reads the column.

Revision ID: 0250
Revises: 0240
"""

from alembic import op

from migrations.compat import forget, record

revision = "0250"
down_revision = "0240"
branch_labels = None
depends_on = None

MAX_TRACE_PARENT_CHARS = 55  # taskstate.outbox.MAX_TRACE_PARENT_CHARS


def upgrade() -> None:
    op.execute(
        "ALTER TABLE dispatch_outbox ADD COLUMN trace_parent text "
        f"CONSTRAINT dispatch_outbox_trace_parent_len CHECK (length(trace_parent) <= {MAX_TRACE_PARENT_CHARS})"
    )
    record(revision, down_revision, serves_previous_code=True, note="expand only: dispatch_outbox.trace_parent")


def downgrade() -> None:
    op.execute("ALTER TABLE dispatch_outbox DROP COLUMN trace_parent")
    forget(revision)
