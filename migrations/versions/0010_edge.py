"""The A2A edge: tasks and their event log (the a2a-sdk cluster store's tables), admission records,
the dispatch outbox, and rate-limit windows.

The ``tasks``, ``task_versions`` and ``task_events`` tables have exactly the
shape of ``a2a.server.models`` so the SDK's ``VersionedDatabaseTaskStore`` and
``DatabaseTaskEventStream`` read and write them; the store's ``initialize()``
is never called (migrations own the schema). The ``dispatch_outbox`` row is
committed with the task and the reservation; the in-process runner (and later
the dispatcher) claims pending rows with ``FOR UPDATE SKIP LOCKED``.

No trigger sends NOTIFY: a transaction that notifies takes a database-wide lock
held through its commit, which serialized every admission behind the previous
one's WAL flush (measured: 296 against 421 admissions/s). Writers notify after
they commit instead (``app.notify.Notifier``), and readers also poll.

Revision ID: 0010
Revises: 0002
"""

from alembic import op

revision = "0010"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        -- a2a-sdk cluster task store (a2a.server.models.TaskModel / TaskVersionModel / TaskEventModel)
        CREATE TABLE tasks (
            id                varchar(36) PRIMARY KEY,
            context_id        varchar(36) NOT NULL,
            kind              varchar(16) NOT NULL,
            owner             varchar(255),
            last_updated      timestamp without time zone,
            status            json NOT NULL,
            artifacts         json,
            history           json,
            metadata          json,
            protocol_version  varchar(16)
        );
        CREATE INDEX idx_tasks_owner_last_updated ON tasks (owner, last_updated);

        CREATE TABLE task_versions (
            task_id  varchar(36) PRIMARY KEY,
            owner    varchar(255),
            version  bigint NOT NULL CHECK (version >= 1)
        );

        CREATE TABLE task_events (
            seq           bigserial PRIMARY KEY,
            task_id       varchar(36) NOT NULL,
            owner         varchar(255),
            task_version  bigint NOT NULL,
            event_data    bytea NOT NULL
        );
        -- The event stream polls "task_id = ? AND seq > ? ORDER BY seq".
        CREATE INDEX ix_task_events_task_id_seq ON task_events (task_id, seq);


        -- One row per admitted task: who it belongs to and what it may cost.
        CREATE TABLE edge_tasks (
            task_id           varchar(36) PRIMARY KEY REFERENCES tasks (id),
            customer_id       text,                   -- NULL: an anonymous caller (tariff-0 only)
            key_id            text,
            specialist_id     text NOT NULL,
            skill_id          text NOT NULL,
            owner             varchar(255) NOT NULL,  -- the task store's owner scope
            tariff_credits    bigint NOT NULL CHECK (tariff_credits >= 0),
            reservation_id    text,                   -- NULL when nothing was reserved (tariff 0)
            admitted_at       timestamptz NOT NULL DEFAULT now(),
            first_claimed_at  timestamptz,            -- set when a runner first takes the task
            CHECK (customer_id IS NOT NULL OR tariff_credits = 0),
            CHECK ((reservation_id IS NULL) = (tariff_credits = 0))
        );

        -- Idempotency: (customer, messageId) -> the task it created, with the content fingerprint.
        CREATE TABLE edge_messages (
            customer_key   text NOT NULL,             -- customer id, or '~anonymous'
            message_id     text NOT NULL CHECK (length(message_id) BETWEEN 1 AND 1024),
            fingerprint    bytea NOT NULL CHECK (length(fingerprint) = 32),
            specialist_id  text NOT NULL,
            task_id        varchar(36) NOT NULL,
            created_at     timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (customer_key, message_id)
        );

        -- A contextId belongs to the first customer that used it.
        CREATE TABLE edge_contexts (
            context_id    varchar(36) PRIMARY KEY,
            customer_key  text NOT NULL,
            created_at    timestamptz NOT NULL DEFAULT now()
        );

        -- The transactional outbox: one row per message a specialist must process.
        CREATE TABLE dispatch_outbox (
            dispatch_id    bigserial PRIMARY KEY,
            task_id        varchar(36) NOT NULL REFERENCES edge_tasks (task_id),
            specialist_id  text NOT NULL,
            executor       text NOT NULL,
            owner          varchar(255) NOT NULL,
            context_id     varchar(36) NOT NULL,
            message        bytea NOT NULL,           -- the A2A Message (protobuf) that starts or continues the task
            status         text NOT NULL DEFAULT 'pending'
                           CHECK (status IN ('pending', 'claimed', 'done', 'canceled')),
            created_at     timestamptz NOT NULL DEFAULT now(),
            claimed_at     timestamptz,
            claimed_by     text,
            finished_at    timestamptz,
            CHECK ((status = 'pending') = (claimed_at IS NULL) OR status = 'canceled'),
            CHECK ((status IN ('done', 'canceled')) = (finished_at IS NOT NULL))
        );
        -- At most one message waits per task. (A follow-up may be queued while the run that asked
        -- for input is still winding down, so 'claimed' rows are not counted.)
        CREATE UNIQUE INDEX dispatch_outbox_one_pending_per_task ON dispatch_outbox (task_id)
            WHERE status = 'pending';
        CREATE INDEX dispatch_outbox_pending ON dispatch_outbox (executor, dispatch_id) WHERE status = 'pending';


        -- Fixed-window request counters shared by every instance. UNLOGGED: no WAL, so the
        -- hot 'global' row is cheap to update; a crash forgets the current window, which only
        -- forgives some requests.
        CREATE UNLOGGED TABLE edge_rate_windows (
            bucket        text NOT NULL,
            window_start  timestamptz NOT NULL,
            requests      bigint NOT NULL CHECK (requests >= 1),
            PRIMARY KEY (bucket, window_start)
        );
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE edge_rate_windows;
        DROP TABLE dispatch_outbox;
        DROP TABLE edge_contexts;
        DROP TABLE edge_messages;
        DROP TABLE edge_tasks;
        DROP TABLE task_events;
        DROP TABLE task_versions;
        DROP TABLE tasks;
        """
    )
