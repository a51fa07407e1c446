"""A run can be priced by its CPU: ``specialist_runs.credits_per_cpu_second`` (issue 41 §2).

A spec's metered pricing may add a CPU term (``pricing.credits_per_cpu_second``, ``core.specs.metered_credits``);
like the run's other prices, it is recorded when the run is opened, so that a spec changed since never changes what
a running task is charged. NULL (every run before, and every spec that does not price CPU): CPU is not priced.
The job's CPU seconds themselves are kept in its claim's record (``job_claims.outcome_detail``, ``cpu_seconds``),
written by the finish with the rest of the outcome; no column is needed for them.

Expand-only: the code before this revision never names the column.

Revision ID: 0291
Revises: 0290
"""

from alembic import op

from migrations.compat import forget, record

revision = "0291"
down_revision = "0290"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE specialist_runs ADD COLUMN credits_per_cpu_second bigint "
               "CHECK (credits_per_cpu_second IS NULL OR credits_per_cpu_second >= 0)")
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: specialist_runs.credits_per_cpu_second, the CPU term of a metered run's price")


def downgrade() -> None:
    op.execute("ALTER TABLE specialist_runs DROP COLUMN credits_per_cpu_second")
    forget(revision)
