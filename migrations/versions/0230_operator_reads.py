"""The operator's reads the console and the CLI share (issue 20): usage by day, the journal by operator and kind,
a customer's tasks, who issued a key, and the record of each drill.

- ``api_keys.issued_by``: the operator who issued the key (NULL for keys issued before this revision, and for
  keys issued by code that names no operator, such as the benchmarks'). `keys list` shows it beside
  ``revoked_by``.
- ``drill_runs``: one row per `specialists drill` run against a deployment's database: its run id, target,
  start and end, verdict and each scenario's outcome (``ops.drill.record``; `specialists health` shows the
  last). The scenarios' outcomes are a bounded JSON array (``ops.drill.record.MAX_*``).
- Indexes, built online:
  - ``ledger_settlements_at (at)`` and ``ledger_settlements_customer_at (customer_id, at)``: settlements resolved
    in a period, of everyone or of one customer (`credits usage`). The table is append-only: one more index
    entry per settlement each, never updated.
  - ``ledger_journal_operator (operator, posting_id) WHERE operator IS NOT NULL``: an operator's postings,
    newest first (`ledger journal --operator`). Reserves and settlements carry no operator, so the hot path
    adds nothing to it.
  - ``ledger_journal_operator_kinds (posting_id) WHERE kind IN ('grant', 'expire', 'adjust', 'reconcile')``:
    the journal of the kinds operators and the expiry sweep post, newest first (`ledger journal --kind grant`).
    Reserves, settlements and voids are not in it: a listing of those reads the journal's key backwards, where
    they are dense.
  - ``edge_tasks_admitted (admitted_at)`` and ``edge_tasks_customer (customer_id, admitted_at, task_id)``: tasks admitted
    in a period (tasks by outcome), and a customer's newest tasks. One more entry each per admitted task.

Expand-only: the code before this revision runs on this schema unchanged (it never names the new column, which
is nullable, or the new table).

Revision ID: 0230
Revises: 0220
"""

from alembic import op

from migrations.compat import create_index_online, drop_index_online, forget, record

revision = "0230"
down_revision = "0220"
branch_labels = None
depends_on = None

SCHEMA = r"""
ALTER TABLE api_keys ADD COLUMN issued_by text CHECK (issued_by IS NULL OR length(issued_by) BETWEEN 1 AND 200);

CREATE TABLE drill_runs (
    run_id       text PRIMARY KEY CHECK (length(run_id) BETWEEN 1 AND 64),
    target       text NOT NULL CHECK (length(target) BETWEEN 1 AND 2000),
    operator     text CHECK (operator IS NULL OR length(operator) BETWEEN 1 AND 200),
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL,
    verdict      text NOT NULL CHECK (verdict IN ('pass', 'fail')),
    scenarios    jsonb NOT NULL CHECK (jsonb_typeof(scenarios) = 'array' AND octet_length(scenarios::text) <= 65536),
    CHECK (finished_at >= started_at)
);
CREATE INDEX drill_runs_finished ON drill_runs (finished_at, run_id);
"""

INDEXES = (
    ("ledger_settlements_at", "ON ledger_settlements (at)"),
    ("ledger_settlements_customer_at", "ON ledger_settlements (customer_id, at)"),
    ("ledger_journal_operator", "ON ledger_journal (operator, posting_id) WHERE operator IS NOT NULL"),
    (
        "ledger_journal_operator_kinds",
        "ON ledger_journal (posting_id) WHERE kind IN ('grant', 'expire', 'adjust', 'reconcile')",
    ),
    ("edge_tasks_admitted", "ON edge_tasks (admitted_at)"),
    ("edge_tasks_customer", "ON edge_tasks (customer_id, admitted_at, task_id)"),
)


def upgrade() -> None:
    for name, definition in INDEXES:  # first, outside the transaction: a rerun after a failure finds them built
        create_index_online(name, definition)
    op.execute(SCHEMA)
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: api_keys.issued_by, drill_runs, indexes for usage, the journal and a customer's tasks")


def downgrade() -> None:
    op.execute("DROP TABLE drill_runs; ALTER TABLE api_keys DROP COLUMN issued_by;")
    for name, _ in reversed(INDEXES):
        drop_index_online(name)
    forget(revision)
