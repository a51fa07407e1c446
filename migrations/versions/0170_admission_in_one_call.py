"""Admission in one call: the function that turns a new task's one statement back when it cannot stand alone.

The edge admits a new task with ONE autocommit statement (``app/admission.py``,
``_ADMIT_AT_ONCE``): the idempotency records, the context binding, the task rows,
the outbox row and the ledger reservation, all common table expressions of one
statement, so one round trip and one commit. When the outcome is anything but a
clean new task (a resend, a context another customer holds or one claimed a moment
ago, a reservation the ledger refuses), the statement's last step calls
``edge_admission_fallback``, which raises SQLSTATE ``SPADM`` with the reason. The
statement is rolled back whole (nothing half-written), and the edge runs the same
admission as one explicit transaction, which answers each of those cases.

Expand-only: code before this revision never calls the function.

Revision ID: 0170
Revises: 0150
"""

from alembic import op

from migrations.compat import forget, record

revision = "0170"
down_revision = "0150"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION edge_admission_fallback(p_reason text) RETURNS boolean
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            RAISE EXCEPTION USING ERRCODE = 'SPADM', MESSAGE = 'admission needs its transaction: ' || p_reason;
        END
        $$;
        """
    )
    record(revision, down_revision, serves_previous_code=True,
           note="edge_admission_fallback: older code never calls it")


def downgrade() -> None:
    op.execute("DROP FUNCTION edge_admission_fallback(text);")
    forget(revision)
