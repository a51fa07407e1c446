"""An operator can turn off a customer's webhooks: ``push_disabled`` (issue 42).

A dead webhook took about 15 minutes to fail fully, one row per event, each event's attempts after the previous
event's. Now `specialists push disable --customer C --reason R` records the customer here and, in the same
transaction, fails its pending notifications (``push_disabled``); while the row exists the trigger of migration
0240 writes no notification for the customer's events. `specialists push enable` deletes the row. The owner is
``taskstate.push``.

Expand-only: the code before this revision never names the table, and the trigger's new condition is true
whenever the table is empty.

Revision ID: 0280
Revises: 0270
"""

from alembic import op

from migrations.compat import forget, record

revision = "0280"
down_revision = "0270"
branch_labels = None
depends_on = None

MAX_REASON_CHARS = 1000  # taskstate.push.MAX_DISABLE_REASON_CHARS

SCHEMA = rf"""
CREATE TABLE push_disabled (
    customer_id  text PRIMARY KEY CHECK (length(customer_id) BETWEEN 1 AND 200),
    reason       text NOT NULL CHECK (length(reason) BETWEEN 1 AND {MAX_REASON_CHARS}),
    disabled_by  text NOT NULL CHECK (length(disabled_by) BETWEEN 1 AND 200),
    disabled_at  timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION push_deliveries_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO push_deliveries (task_id, config_id, customer_id, event_seq, task_version, event_data)
    SELECT c.task_id, c.config_id, c.customer_id, e.seq, e.task_version, e.event_data
      FROM written e JOIN push_configs c ON c.task_id = e.task_id AND c.owner = e.owner
     WHERE NOT EXISTS (SELECT 1 FROM push_disabled x WHERE x.customer_id = c.customer_id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
"""

PREVIOUS_FUNCTION = r"""
CREATE OR REPLACE FUNCTION push_deliveries_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO push_deliveries (task_id, config_id, customer_id, event_seq, task_version, event_data)
    SELECT c.task_id, c.config_id, c.customer_id, e.seq, e.task_version, e.event_data
      FROM written e JOIN push_configs c ON c.task_id = e.task_id AND c.owner = e.owner
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
"""


def upgrade() -> None:
    op.execute(SCHEMA)
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: push_disabled, and the push trigger skips a disabled customer")


def downgrade() -> None:
    op.execute(PREVIOUS_FUNCTION)
    op.execute("DROP TABLE push_disabled")
    forget(revision)
