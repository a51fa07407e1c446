"""``ledger_settlements_customer (customer_id)`` is dropped: ``ledger_settlements_customer_at (customer_id, at)`` serves
every read it served.

0200 added the single-column index for a customer's verify (``ledger/verify.py``: ``customer_id = C``, or a range of
customer ids); 0230 added ``(customer_id, at)`` for a customer's usage in a period. An index whose first column is
``customer_id`` serves the verify's equality and range as well, so the first one was a second copy of what the
second holds: one more index entry, and its WAL, in every settlement's transaction (a job's finish), and one more
index the settlement's insert opens (issue 44: the work a job's transaction costs PostgreSQL). The reads that
named it (``tests/test_query_plans.py``: a customer's verify and a range of the whole verify) read
``ledger_settlements_customer_at`` instead, with no sequential scan.

Dropped online (``DROP INDEX CONCURRENTLY``), so the revision still serving keeps settling meanwhile; the downgrade
builds it again online. Expand-only: no statement names an index.

Revision ID: 0298
Revises: 0297
"""

from migrations.compat import create_index_online, drop_index_online, forget, record

revision = "0298"
down_revision = "0297"
branch_labels = None
depends_on = None

DROPPED = ("ledger_settlements_customer", "ON ledger_settlements (customer_id)")  # as 0200 built it


def upgrade() -> None:
    drop_index_online(DROPPED[0])
    record(revision, down_revision, serves_previous_code=True,
           note="index only: settlements by customer are read through ledger_settlements_customer_at")


def downgrade() -> None:
    create_index_online(*DROPPED)
    forget(revision)
