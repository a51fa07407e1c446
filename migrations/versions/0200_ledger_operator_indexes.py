"""The ledger's operator reads served by indexes (issue 18): reservations by time and in flight, settlements by customer.

At 500,000 reservations (1,000 customers, one holding a tenth of them) `reservations list` sorted the whole
table (487-595 ms), `--open` scanned it (103-124 ms), `credits show` read every reservation of a customer to
find its unresolved ones (59-117 ms), and `ledger verify --customer` read every table whole (280-370 ms for a
customer with 500 reservations): its settlements had no customer index. Measured in docs/LEDGER.md ("Indexes").

- ``ledger_reservations_created (created_at)``: every customer's reservations, newest first, a page at a
  time (keyset on created_at, job_id). created_at never changes: this index alone would keep a settlement's
  update HOT.
- ``ledger_reservations_unresolved (created_at, customer_id) WHERE state IN ('open', 'unknown')``: the
  reservations in flight, which the accounts' ``open_reservations <= max_parallel`` bounds, whatever the
  history. One customer's are found by the index's own customer column, without a visit to the table.
  Its predicate names ``state``, which a settlement changes: a settlement's update is no longer HOT (it
  adds entries to the reservation's other indexes). bench/ledger.py's pairs/s moved by -3%, within its
  rounds' spread; the server's time per pair rose by up to a fifth (docs/LEDGER.md, "Indexes").
- ``ledger_settlements_customer (customer_id)``: a customer's settlements, for a verify of that customer
  alone (and of a range of customers, which the whole verify walks). The table is append-only: one more
  index entry per settlement, never updated.

Built with CREATE INDEX CONCURRENTLY (``migrations.compat.create_index_online``): the revision still serving
keeps writing while they build. Expand-only: older code runs on this schema unchanged.

Revision ID: 0200
Revises: 0190
"""

from migrations.compat import create_index_online, drop_index_online, forget, record

revision = "0200"
down_revision = "0190"
branch_labels = None
depends_on = None

INDEXES = (
    ("ledger_reservations_created", "ON ledger_reservations (created_at)"),
    (
        "ledger_reservations_unresolved",
        "ON ledger_reservations (created_at, customer_id) WHERE state IN ('open', 'unknown')",
    ),
    ("ledger_settlements_customer", "ON ledger_settlements (customer_id)"),
)


def upgrade() -> None:
    for name, definition in INDEXES:
        create_index_online(name, definition)
    record(revision, down_revision, serves_previous_code=True,
           note="indexes only: reservations by creation and in flight, settlements by customer")


def downgrade() -> None:
    for name, _ in reversed(INDEXES):
        drop_index_online(name)
    forget(revision)
