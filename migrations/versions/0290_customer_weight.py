"""Worker slots are shared fairly across customers: ``dispatch_weights`` and an index per owner (issue 41 §1).

Dispatchers took due outbox rows first come, first served, so one customer's backlog (within its own cap) made
another's next job wait for all of it. Now a take ranks each customer's due rows behind its jobs in flight and
interleaves the customers by that rank over their weight (``taskstate.outbox``).

- ``dispatch_weights``: a customer's weight in that order, set by an operator (`specialists customers set
  --weight`), with who, when and why of the last change. A customer without a row has the default weight
  (SPECIALISTS_DISPATCH_DEFAULT_WEIGHT). ``taskstate.outbox`` owns the table.
- ``dispatch_turns``: when each customer last had a job taken. Among customers equally far from their share, the
  one whose turn is longest past goes first (a round-robin), so a customer whose job just ended does not take the
  freed slot back from one that has waited without any. One row per customer ever dispatched, written by the take
  in its own statement; no foreign key: the anonymous caller's jobs have a customer no ``customers`` row names.
- ``dispatch_outbox_customer_open``: the open rows (``pending``, ``sent``) of one customer in due order. A row's
  owner is ``<customer>:<specialist>`` (``app.identity``; a customer id has no ``:``), so the customer is the
  owner's first part. A take walks the customers with open rows through it (one probe each), counts each one's jobs
  in flight and reads its first due rows, instead of reading every due row of the queue.

Expand-only: the code before this revision never names the tables, and an index changes no answer.

Revision ID: 0290
Revises: 0280
"""

from alembic import op

from migrations.compat import create_index_online, drop_index_online, forget, record

revision = "0290"
down_revision = "0280"
branch_labels = None
depends_on = None

MAX_WEIGHT = 1000  # taskstate.outbox.MAX_WEIGHT
MAX_REASON_CHARS = 500  # taskstate.outbox.MAX_WEIGHT_REASON_CHARS, as ledger_account_changes.reason
MAX_CHANGED_BY_CHARS = 200  # taskstate.outbox.MAX_CHANGED_BY_CHARS

SCHEMA = rf"""
CREATE TABLE dispatch_weights (
    customer_id  text PRIMARY KEY REFERENCES customers (customer_id),
    weight       integer NOT NULL CHECK (weight BETWEEN 1 AND {MAX_WEIGHT}),
    changed_by   text NOT NULL CHECK (length(changed_by) BETWEEN 1 AND {MAX_CHANGED_BY_CHARS}),
    reason       text NOT NULL CHECK (length(reason) BETWEEN 1 AND {MAX_REASON_CHARS}),
    changed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE dispatch_turns (
    customer         text PRIMARY KEY CHECK (length(customer) BETWEEN 1 AND 255),
    last_started_at  timestamptz NOT NULL
);
"""
INDEX = "dispatch_outbox_customer_open"
INDEX_DEFINITION = ("ON dispatch_outbox ((split_part(owner, ':', 1)), available_at, dispatch_id) "
                    "WHERE status IN ('pending', 'sent')")


def upgrade() -> None:
    op.execute(SCHEMA)
    create_index_online(INDEX, INDEX_DEFINITION)
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: dispatch_weights, dispatch_turns, and an index of the open outbox rows by customer")


def downgrade() -> None:
    drop_index_online(INDEX)
    op.execute("DROP TABLE dispatch_turns; DROP TABLE dispatch_weights")
    forget(revision)
