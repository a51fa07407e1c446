"""Dispatch: the outbox becomes the queue (embedded) or the relay's source (Cloud Tasks), and the lease sweeper.

``dispatch_outbox`` rows stay ``pending`` until they are handed over: a Cloud
Tasks relay marks them ``sent``; the embedded dispatcher keeps them ``pending``
while it delivers, pushing ``available_at`` forward as its delivery lease (a
dispatcher that dies loses nothing: the row comes back when the lease passes).
The worker's settlement marks a row ``done`` in the transaction that finishes
its job; a cancel before any claim marks it ``canceled``; a dispatcher that gave
up on a job no worker ever claimed marks it ``undeliverable``.

The job a worker claims for a row is ``<task id>.<dispatch id>`` (one claim per
message: a follow-up to a task that asked for input is a new job of the same
task and the same reservation). Who ran a task is in ``job_claims``, so the
edge's ``first_claimed_at`` goes.

Two claim operations join those of 0020, one server-side function each:
``job_expire_lease`` (the sweeper: a running claim whose lease passed becomes
unknown without waiting for another delivery) and ``job_abandon`` (a job that no
worker ever claimed is finished as failed so that no later delivery runs it).

Revision ID: 0030
Revises: 0020
"""

from alembic import op

revision = "0030"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
        -- The CHECKs of 0010 tied 'pending' to "never claimed"; the new ones follow.
        DO $$
        DECLARE c record;
        BEGIN
            FOR c IN SELECT conname FROM pg_constraint
                      WHERE conrelid = 'dispatch_outbox'::regclass AND contype = 'c' LOOP
                EXECUTE format('ALTER TABLE dispatch_outbox DROP CONSTRAINT %I', c.conname);
            END LOOP;
        END $$;
        DROP INDEX dispatch_outbox_pending;

        ALTER TABLE dispatch_outbox RENAME COLUMN claimed_at TO taken_at;
        ALTER TABLE dispatch_outbox RENAME COLUMN claimed_by TO taken_by;
        ALTER TABLE dispatch_outbox
            ADD COLUMN attempts      integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            ADD COLUMN available_at  timestamptz NOT NULL DEFAULT now(),
            ADD COLUMN sent_at       timestamptz,
            ADD COLUMN last_error    text CHECK (last_error IS NULL OR length(last_error) <= 500),
            ADD CONSTRAINT dispatch_outbox_status_check
                CHECK (status IN ('pending', 'sent', 'done', 'canceled', 'undeliverable')),
            ADD CONSTRAINT dispatch_outbox_finished_check
                CHECK ((status IN ('done', 'canceled', 'undeliverable')) = (finished_at IS NOT NULL)),
            ADD CONSTRAINT dispatch_outbox_sent_check CHECK (status <> 'sent' OR sent_at IS NOT NULL);
        UPDATE dispatch_outbox SET status = 'done', finished_at = COALESCE(finished_at, now())
         WHERE status = 'claimed';

        -- Dispatchers take the rows that are due, oldest first.
        CREATE INDEX dispatch_outbox_due ON dispatch_outbox (available_at, dispatch_id) WHERE status = 'pending';
        -- Cancel, settlement and reconcile find a task's rows.
        CREATE INDEX dispatch_outbox_task ON dispatch_outbox (task_id, dispatch_id);

        ALTER TABLE edge_tasks DROP COLUMN first_claimed_at;

        -- The lease sweeper: a running claim whose lease passed is recorded unknown, as a delivery
        -- finding it would. True when this call made it unknown.
        CREATE FUNCTION job_expire_lease(p_job_id text)
        RETURNS TABLE (expired boolean, fencing_token bigint)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz;
        BEGIN
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := clock_timestamp();
            IF NOT FOUND OR r.state <> 'running' OR r.lease_expires_at > t THEN
                RETURN QUERY SELECT false, r.fencing_token;
                RETURN;
            END IF;
            UPDATE job_claims c SET state = 'unknown', unknown_at = t, lease_expires_at = NULL,
                   unknown_reason = format('the lease of claim %s (worker %s) expired at %s while running; '
                                           'found by the lease sweeper', r.fencing_token, r.worker_id,
                                           r.lease_expires_at)
             WHERE c.job_id = p_job_id;
            RETURN QUERY SELECT true, r.fencing_token;
        END $$;

        -- abandon: finish a job that no worker ever claimed (no claim row) as failed, so that a
        -- late delivery answers "finished" and runs nothing. False when a claim exists.
        CREATE FUNCTION job_abandon(p_job_id text, p_reason text)
        RETURNS boolean LANGUAGE sql AS $$
            INSERT INTO job_claims (job_id, state, fencing_token, finished_at, outcome, outcome_detail)
            VALUES (p_job_id, 'finished', 0, clock_timestamp(), 'failed',
                    jsonb_build_object('reason', p_reason))
            ON CONFLICT (job_id) DO NOTHING
            RETURNING true;
        $$;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP FUNCTION job_abandon(text, text);
        DROP FUNCTION job_expire_lease(text);
        ALTER TABLE edge_tasks ADD COLUMN first_claimed_at timestamptz;
        DROP INDEX dispatch_outbox_task;
        DROP INDEX dispatch_outbox_due;
        UPDATE dispatch_outbox SET status = 'done', finished_at = COALESCE(finished_at, now())
         WHERE status IN ('sent', 'undeliverable');
        ALTER TABLE dispatch_outbox
            DROP CONSTRAINT dispatch_outbox_status_check,
            DROP CONSTRAINT dispatch_outbox_finished_check,
            DROP CONSTRAINT dispatch_outbox_sent_check,
            DROP COLUMN attempts, DROP COLUMN available_at, DROP COLUMN sent_at, DROP COLUMN last_error;
        ALTER TABLE dispatch_outbox RENAME COLUMN taken_at TO claimed_at;
        ALTER TABLE dispatch_outbox RENAME COLUMN taken_by TO claimed_by;
        UPDATE dispatch_outbox SET claimed_at = NULL, claimed_by = NULL WHERE status = 'pending';
        UPDATE dispatch_outbox SET claimed_at = COALESCE(claimed_at, created_at) WHERE status = 'done';
        ALTER TABLE dispatch_outbox
            ADD CHECK (status IN ('pending', 'claimed', 'done', 'canceled')),
            ADD CHECK ((status = 'pending') = (claimed_at IS NULL) OR status = 'canceled'),
            ADD CHECK ((status IN ('done', 'canceled')) = (finished_at IS NOT NULL));
        CREATE INDEX dispatch_outbox_pending ON dispatch_outbox (executor, dispatch_id) WHERE status = 'pending';
        """
    )
