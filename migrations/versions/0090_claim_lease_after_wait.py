"""job_claim: a claim that waited for another delivery's aborted insert gets its whole lease.

``job_claim`` took the time once, before its insert; an insert that waited on a
concurrent insert of the same job (which then rolled back) claimed with a lease
counted from before the wait, already spent when the wait was long, so the job
went unknown although its worker was alive. The lease now starts once the claim
is taken. Same signature and outcomes: the code before it runs unchanged.

Revision ID: 0090
Revises: 0080
"""

from alembic import op

from migrations.compat import forget, record

revision = "0090"
down_revision = "0080"
branch_labels = None
depends_on = None

_FIXED = """
        CREATE OR REPLACE FUNCTION job_claim(p_job_id text, p_worker_id text, p_lease_s double precision)
        RETURNS TABLE (outcome text, fencing_token bigint, lease_expires_at timestamptz,
                       retry_after_s double precision, job_outcome text, job_outcome_detail jsonb,
                       newly_unknown boolean)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz := clock_timestamp();
        BEGIN
            IF p_lease_s IS NULL OR p_lease_s <= 0 THEN
                RAISE EXCEPTION 'lease must be positive' USING ERRCODE = '22023';
            END IF;
            INSERT INTO job_claims AS c (job_id, state, fencing_token, lease_expires_at, worker_id, claims,
                                         deliveries, first_claimed_at, claimed_at)
            VALUES (p_job_id, 'running', 1, t + make_interval(secs => p_lease_s), p_worker_id, 1, 1, t, t)
            ON CONFLICT (job_id) DO NOTHING
            RETURNING c.* INTO r;
            IF FOUND THEN
                IF clock_timestamp() - t > interval '50 milliseconds' THEN
                    -- The insert waited for another transaction's insert of this job, which rolled back:
                    -- the lease starts now, not when this delivery began to wait.
                    t := clock_timestamp();
                    UPDATE job_claims c SET lease_expires_at = t + make_interval(secs => p_lease_s),
                           first_claimed_at = t, claimed_at = t
                     WHERE c.job_id = p_job_id RETURNING c.* INTO r;
                END IF;
                RETURN QUERY SELECT 'claimed'::text, r.fencing_token, r.lease_expires_at,
                                    NULL::double precision, NULL::text, NULL::jsonb, false;
                RETURN;
            END IF;

            -- The row exists (a concurrent insert waited for above has committed by now).
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := clock_timestamp();
            IF r.state = 'released' THEN
                UPDATE job_claims c SET state = 'running', fencing_token = c.fencing_token + 1, claims = c.claims + 1,
                       deliveries = c.deliveries + 1, lease_expires_at = t + make_interval(secs => p_lease_s),
                       worker_id = p_worker_id, claimed_at = t, renewed_at = NULL
                 WHERE c.job_id = p_job_id RETURNING c.* INTO r;
                RETURN QUERY SELECT 'claimed'::text, r.fencing_token, r.lease_expires_at,
                                    NULL::double precision, NULL::text, NULL::jsonb, false;
                RETURN;
            END IF;
            UPDATE job_claims c SET deliveries = c.deliveries + 1 WHERE c.job_id = p_job_id;
            IF r.state = 'finished' THEN
                RETURN QUERY SELECT 'finished'::text, r.fencing_token, NULL::timestamptz,
                                    NULL::double precision, r.outcome, r.outcome_detail, false;
            ELSIF r.state = 'unknown' THEN
                RETURN QUERY SELECT 'lease_expired_unknown'::text, r.fencing_token, NULL::timestamptz,
                                    NULL::double precision, NULL::text, NULL::jsonb, false;
            ELSIF r.lease_expires_at > t THEN
                RETURN QUERY SELECT 'busy'::text, r.fencing_token, r.lease_expires_at,
                                    extract(epoch FROM r.lease_expires_at - t)::double precision, NULL::text, NULL::jsonb, false;
            ELSE
                UPDATE job_claims c SET state = 'unknown', unknown_at = t, lease_expires_at = NULL,
                       unknown_reason = format('the lease of claim %s (worker %s) expired at %s while running; '
                                               'found by a later delivery', r.fencing_token, r.worker_id,
                                               r.lease_expires_at)
                 WHERE c.job_id = p_job_id;
                RETURN QUERY SELECT 'lease_expired_unknown'::text, r.fencing_token, NULL::timestamptz,
                                    NULL::double precision, NULL::text, NULL::jsonb, true;
            END IF;
        END $$;
"""

_BEFORE = """
        CREATE OR REPLACE FUNCTION job_claim(p_job_id text, p_worker_id text, p_lease_s double precision)
        RETURNS TABLE (outcome text, fencing_token bigint, lease_expires_at timestamptz,
                       retry_after_s double precision, job_outcome text, job_outcome_detail jsonb,
                       newly_unknown boolean)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz := clock_timestamp();
        BEGIN
            IF p_lease_s IS NULL OR p_lease_s <= 0 THEN
                RAISE EXCEPTION 'lease must be positive' USING ERRCODE = '22023';
            END IF;
            INSERT INTO job_claims AS c (job_id, state, fencing_token, lease_expires_at, worker_id, claims,
                                         deliveries, first_claimed_at, claimed_at)
            VALUES (p_job_id, 'running', 1, t + make_interval(secs => p_lease_s), p_worker_id, 1, 1, t, t)
            ON CONFLICT (job_id) DO NOTHING
            RETURNING c.* INTO r;
            IF FOUND THEN
                RETURN QUERY SELECT 'claimed'::text, r.fencing_token, r.lease_expires_at,
                                    NULL::double precision, NULL::text, NULL::jsonb, false;
                RETURN;
            END IF;

            -- The row exists (a concurrent insert waited for above has committed by now).
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := clock_timestamp();
            IF r.state = 'released' THEN
                UPDATE job_claims c SET state = 'running', fencing_token = c.fencing_token + 1, claims = c.claims + 1,
                       deliveries = c.deliveries + 1, lease_expires_at = t + make_interval(secs => p_lease_s),
                       worker_id = p_worker_id, claimed_at = t, renewed_at = NULL
                 WHERE c.job_id = p_job_id RETURNING c.* INTO r;
                RETURN QUERY SELECT 'claimed'::text, r.fencing_token, r.lease_expires_at,
                                    NULL::double precision, NULL::text, NULL::jsonb, false;
                RETURN;
            END IF;
            UPDATE job_claims c SET deliveries = c.deliveries + 1 WHERE c.job_id = p_job_id;
            IF r.state = 'finished' THEN
                RETURN QUERY SELECT 'finished'::text, r.fencing_token, NULL::timestamptz,
                                    NULL::double precision, r.outcome, r.outcome_detail, false;
            ELSIF r.state = 'unknown' THEN
                RETURN QUERY SELECT 'lease_expired_unknown'::text, r.fencing_token, NULL::timestamptz,
                                    NULL::double precision, NULL::text, NULL::jsonb, false;
            ELSIF r.lease_expires_at > t THEN
                RETURN QUERY SELECT 'busy'::text, r.fencing_token, r.lease_expires_at,
                                    extract(epoch FROM r.lease_expires_at - t)::double precision, NULL::text, NULL::jsonb, false;
            ELSE
                UPDATE job_claims c SET state = 'unknown', unknown_at = t, lease_expires_at = NULL,
                       unknown_reason = format('the lease of claim %s (worker %s) expired at %s while running; '
                                               'found by a later delivery', r.fencing_token, r.worker_id,
                                               r.lease_expires_at)
                 WHERE c.job_id = p_job_id;
                RETURN QUERY SELECT 'lease_expired_unknown'::text, r.fencing_token, NULL::timestamptz,
                                    NULL::double precision, NULL::text, NULL::jsonb, true;
            END IF;
        END $$;
"""


def upgrade() -> None:
    op.execute(_FIXED)
    record(revision, down_revision, serves_previous_code=True,
           note="job_claim: the lease starts when the claim is taken, after any wait")


def downgrade() -> None:
    op.execute(_BEFORE)
    forget(revision)
