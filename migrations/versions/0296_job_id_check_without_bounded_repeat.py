"""A job id's CHECK says ``[class]+`` and a length instead of ``[class]{1,200}``: the same ids, a small automaton.

``job_claims.job_id`` (0020) and ``specialist_runs.job_id`` (0070) were checked with
``job_id ~ '^[A-Za-z0-9_.:-]{1,200}$'``. PostgreSQL's regex engine expands a bounded repeat into that many copies
of its atom and builds the matcher's states afresh at every match: 42 us a job id of 40 characters here, against
0.3 us for ``~ '^[A-Za-z0-9_.:-]+$' AND length(job_id) <= 200`` (100,000 ids in psql). A CHECK runs at every INSERT
and every UPDATE of its row, whatever the UPDATE sets: a no-op job writes its claim twice (``job_claim_first``,
``job_finish``), so the worker's backends matched it twice a job: 2.8% of their CPU in a perf profile (issue 44).

The new CHECK accepts exactly the ids the old one did: one to 200 characters (``length`` counts characters, as the
repeat did), each in the class (``$`` is the text's end: no flag here makes it match before a newline, and a
newline is not in the class). ``workers.dispatch.base.JOB_ID_RE`` and ``workers.auth``'s pattern, which refuse a
bad id before it reaches the database, say the same in Python (tested against both).

How: the new constraint is added ``NOT VALID`` (new and updated rows are checked from that moment, existing rows
not read) in the migration's transaction, which drops the old one; the existing rows are then checked by
``VALIDATE CONSTRAINT`` in a transaction of its own, which lets writes go on while it reads the table. Expand-only:
the code before this revision writes the same ids. The downgrade puts the original CHECK back the same way.

Revision ID: 0296
Revises: 0295
"""

from alembic import op

from migrations.compat import forget, record

revision = "0296"
down_revision = "0295"
branch_labels = None
depends_on = None

TABLES = ("job_claims", "specialist_runs")  # each one's constraint is <table>_job_id_check (named by PostgreSQL)
BOUNDED = r"job_id ~ '^[A-Za-z0-9_.:-]{1,200}$'"
UNBOUNDED = r"job_id ~ '^[A-Za-z0-9_.:-]+$' AND length(job_id) <= 200"


def _check(condition: str) -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_job_id_check, "
                   f"ADD CONSTRAINT {table}_job_id_check CHECK ({condition}) NOT VALID")
    with op.get_context().autocommit_block():  # the existing rows, read with writes going on
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {table}_job_id_check")


def upgrade() -> None:
    _check(UNBOUNDED)
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: the job id's CHECK accepts the same ids without a bounded regex repeat")


def downgrade() -> None:
    _check(BOUNDED)
    forget(revision)
