"""A2A push notifications: customers' webhook configurations, and one durable delivery row per event and webhook.

- ``push_configs``: a task's webhook configurations (A2A ``TaskPushNotificationConfig``), scoped by the task's
  owner; ``customer_id`` counts against the per-customer cap (``SPECIALISTS_PUSH_MAX_CONFIGS_PER_CUSTOMER``).
  Owner module: ``taskstate/push.py``.
- ``push_deliveries``: one row per (config, task event), written by a trigger on ``task_events`` in the very
  statement that writes the event, so every writer (``taskstate.rows``, the a2a-sdk's own store) writes its
  notifications in the event's transaction and nothing is lost when an instance dies. It holds a copy of the
  event (the StreamResponse bytes the event stream holds), so a prune of ended tasks' events cannot take an
  undelivered notification with it. The dispatcher claims due rows with a lease (``taskstate/push.py``),
  delivers them in event order per webhook, and records the outcome: ``delivered`` or ``failed`` with the
  reason, which an operator lists (`specialists push failures`).
  The trigger is statement-level with a transition table: one join per statement, by primary key, and none
  at all for a task without configurations. No NOTIFY here (see ``taskstate/notify.py``): the dispatcher
  listens for the writers' own ``edge_task_events`` notifications after commit.

Expand-only: the code before this revision runs on this schema unchanged (it writes no configurations, so the
trigger inserts nothing).

Revision ID: 0240
Revises: 0230
"""

from alembic import op

from migrations.compat import forget, record

revision = "0240"
down_revision = "0230"
branch_labels = None
depends_on = None

SCHEMA = r"""
CREATE TABLE push_configs (
    task_id           varchar(36) NOT NULL,
    config_id         text NOT NULL CHECK (length(config_id) BETWEEN 1 AND 64),
    owner             varchar(255) NOT NULL,
    customer_id       text NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 200),
    url               text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    token             text CHECK (length(token) <= 512),
    auth_scheme       text CHECK (length(auth_scheme) <= 64),
    auth_credentials  text CHECK (length(auth_credentials) <= 2048),
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, config_id)
);
CREATE INDEX push_configs_customer ON push_configs (customer_id);
CREATE INDEX push_configs_created ON push_configs (created_at);  -- the retention prune's walk by age

CREATE TABLE push_deliveries (
    delivery_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id          varchar(36) NOT NULL,
    config_id        text NOT NULL,
    customer_id      text NOT NULL,
    event_seq        bigint NOT NULL,
    task_version     bigint NOT NULL,
    event_data       bytea NOT NULL,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    created_at       timestamptz NOT NULL DEFAULT now(),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    leased_until     timestamptz,
    leased_by        text,
    last_status      integer,
    last_error       text CHECK (length(last_error) <= 500),
    finished_at      timestamptz,
    UNIQUE (task_id, config_id, event_seq),
    CHECK ((state = 'pending') = (finished_at IS NULL))
);
-- What the claim reads: due rows, and per webhook the earliest pending one (delivery order).
CREATE INDEX push_deliveries_due ON push_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX push_deliveries_pending_order ON push_deliveries (task_id, config_id, event_seq)
    WHERE state = 'pending';
-- What an operator lists: final failures, newest first, of everyone or of one customer.
CREATE INDEX push_deliveries_failed ON push_deliveries (finished_at DESC, delivery_id DESC) WHERE state = 'failed';
CREATE INDEX push_deliveries_failed_customer ON push_deliveries (customer_id, finished_at DESC, delivery_id DESC)
    WHERE state = 'failed';
-- What the retention prune walks: finished rows by age.
CREATE INDEX push_deliveries_finished ON push_deliveries (finished_at) WHERE state <> 'pending';

CREATE FUNCTION push_deliveries_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO push_deliveries (task_id, config_id, customer_id, event_seq, task_version, event_data)
    SELECT c.task_id, c.config_id, c.customer_id, e.seq, e.task_version, e.event_data
      FROM written e JOIN push_configs c ON c.task_id = e.task_id AND c.owner = e.owner
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER push_deliveries_on_event AFTER INSERT ON task_events
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION push_deliveries_follow();
"""


def upgrade() -> None:
    op.execute(SCHEMA)
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: push configurations and deliveries, and the trigger on task_events")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS push_deliveries_on_event ON task_events")
    op.execute("DROP FUNCTION IF EXISTS push_deliveries_follow()")
    op.execute("DROP TABLE IF EXISTS push_deliveries")
    op.execute("DROP TABLE IF EXISTS push_configs")
    forget(revision)
