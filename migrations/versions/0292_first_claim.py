"""A job's first claim on its own: ``job_claim_first`` (issue 44: statements per job).

Nearly every delivery is a job's first: no claim row exists yet, and its claim decides nothing else (no lease has
expired, nothing becomes unknown, no money moves). ``job_claim_first`` is that branch of ``job_claim`` (0020,
0090's lease after a wait, 0100's ``p_now``) and nothing else: it inserts the claim and returns its token and lease,
or returns no row when the job has a claim already. One statement in autocommit is then the whole claim; a worker
that gets no row claims the job as before, in a transaction with ``job_claim`` or ``specialist_claim``, which
decide every other case (a redelivery, a resume, a lease found expired and the job made unknown with its money).

Expand-only: the code before this revision never calls it.

Revision ID: 0292
Revises: 0291
"""

from alembic import op

from migrations.compat import forget, record

revision = "0292"
down_revision = "0291"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION job_claim_first(p_job_id text, p_worker_id text, p_lease_s double precision, p_now timestamptz)
        RETURNS TABLE (fencing_token bigint, lease_expires_at timestamptz)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz := COALESCE(p_now, clock_timestamp());
        BEGIN
            IF p_lease_s IS NULL OR p_lease_s <= 0 THEN
                RAISE EXCEPTION 'lease must be positive' USING ERRCODE = '22023';
            END IF;
            INSERT INTO job_claims AS c (job_id, state, fencing_token, lease_expires_at, worker_id, claims,
                                         deliveries, first_claimed_at, claimed_at)
            VALUES (p_job_id, 'running', 1, t + make_interval(secs => p_lease_s), p_worker_id, 1, 1, t, t)
            ON CONFLICT (job_id) DO NOTHING
            RETURNING c.* INTO r;
            IF NOT FOUND THEN
                RETURN;  -- claimed before: the caller decides in a transaction (job_claim, specialist_claim)
            END IF;
            IF p_now IS NULL AND clock_timestamp() - t > interval '50 milliseconds' THEN
                -- The insert waited for another transaction's insert of this job, which rolled back:
                -- the lease starts now, not when this delivery began to wait (0090).
                t := clock_timestamp();
                UPDATE job_claims c SET lease_expires_at = t + make_interval(secs => p_lease_s),
                       first_claimed_at = t, claimed_at = t
                 WHERE c.job_id = p_job_id RETURNING c.* INTO r;
            END IF;
            RETURN QUERY SELECT r.fencing_token, r.lease_expires_at;
        END $$;
        """
    )
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: job_claim_first, a job's first claim in one statement")


def downgrade() -> None:
    op.execute("DROP FUNCTION job_claim_first(text, text, double precision, timestamptz)")
    forget(revision)
