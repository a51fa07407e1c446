"""job_claim: a job's first claim is ``job_claim_first``'s insert, not a copy of it.

0292 made the first-claim branch of ``job_claim`` a function of its own, ``job_claim_first`` (a job's first
delivery claimed in one statement in autocommit), and left the branch in ``job_claim`` too: the insert, and 0090's
lease counted after a wait on an aborted insert, were written twice. Both signatures of ``job_claim`` (0090's
without ``p_now``, 0100's with it) now call ``job_claim_first`` for that branch, so a first claim has one
definition whichever way its delivery comes. The signature without ``p_now`` was 0100's with the database clock
(``p_now`` NULL), line for line: it is now that call, so ``job_claim`` has one body. Every other branch (a
redelivery, a released job claimed again, a lease found expired) is as it was. Same signatures and outcomes: the
code before it runs unchanged.

Revision ID: 0293
Revises: 0292
"""

from alembic import op

from migrations.compat import forget, record

revision = "0293"
down_revision = "0292"
branch_labels = None
depends_on = None

_FIRST_CLAIM_CALLED = """
        CREATE OR REPLACE FUNCTION job_claim(p_job_id text, p_worker_id text, p_lease_s double precision, p_now timestamptz)
        RETURNS TABLE (outcome text, fencing_token bigint, lease_expires_at timestamptz,
                       retry_after_s double precision, job_outcome text, job_outcome_detail jsonb,
                       newly_unknown boolean)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            first_claim record;
            t timestamptz;
        BEGIN
            IF p_lease_s IS NULL OR p_lease_s <= 0 THEN
                RAISE EXCEPTION 'lease must be positive' USING ERRCODE = '22023';
            END IF;
            -- No claim yet: job_claim_first inserts it (its lease counted after any wait on an aborted insert).
            SELECT * INTO first_claim FROM job_claim_first(p_job_id, p_worker_id, p_lease_s, p_now);
            IF FOUND THEN
                RETURN QUERY SELECT 'claimed'::text, first_claim.fencing_token, first_claim.lease_expires_at,
                                    NULL::double precision, NULL::text, NULL::jsonb, false;
                RETURN;
            END IF;

            -- The row exists (a concurrent insert waited for above has committed by now).
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := COALESCE(p_now, clock_timestamp());
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

        -- 0100's signature decides by the database clock when p_now is NULL, as this one always did: one body.
        CREATE OR REPLACE FUNCTION job_claim(p_job_id text, p_worker_id text, p_lease_s double precision)
        RETURNS TABLE (outcome text, fencing_token bigint, lease_expires_at timestamptz,
                       retry_after_s double precision, job_outcome text, job_outcome_detail jsonb,
                       newly_unknown boolean)
        LANGUAGE sql AS $$
            SELECT * FROM job_claim(p_job_id, p_worker_id, p_lease_s, NULL::timestamptz)
        $$;
"""

# 0090's job_claim without p_now and 0100's with it, as they were.
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

        CREATE OR REPLACE FUNCTION job_claim(p_job_id text, p_worker_id text, p_lease_s double precision, p_now timestamptz)
        RETURNS TABLE (outcome text, fencing_token bigint, lease_expires_at timestamptz,
                       retry_after_s double precision, job_outcome text, job_outcome_detail jsonb,
                       newly_unknown boolean)
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
            IF FOUND THEN
                IF p_now IS NULL AND clock_timestamp() - t > interval '50 milliseconds' THEN
                    -- The insert waited for another transaction's insert of this job, which rolled back:
                    -- the lease starts now, not when this delivery began to wait (0090).
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
            t := COALESCE(p_now, clock_timestamp());
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
    op.execute(_FIRST_CLAIM_CALLED)
    record(revision, down_revision, serves_previous_code=True,
           note="job_claim: a first claim calls job_claim_first instead of repeating its insert")


def downgrade() -> None:
    op.execute(_BEFORE)
    forget(revision)
