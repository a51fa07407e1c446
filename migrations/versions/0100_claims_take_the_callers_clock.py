"""Claims take the time from their caller, as the ledger's functions take ``p_now``.

Each claim function that decides by the clock (claim, renew, finish, the
sweeper's expiry, the specialist's resuming claim) gains an overload with a last
argument ``p_now``: NULL means the database clock (what every worker passes),
a time means "decide as of then" (what a test passes to let a lease pass
without waiting for it, or to keep one alive however slow the machine is). The
bodies are those of 0020/0030/0070/0090 with ``t := COALESCE(p_now,
clock_timestamp())``; with ``p_now`` given, a claim that waited on a concurrent
insert keeps the caller's time (0090's correction is for the database clock).

Expand-only: the older signatures stay as they were, so the code before this
revision runs unchanged; code from this revision on calls the new ones.

Revision ID: 0100
Revises: 0090
"""

from alembic import op

from migrations.compat import forget, record

revision = "0100"
down_revision = "0090"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION job_claim(p_job_id text, p_worker_id text, p_lease_s double precision, p_now timestamptz)
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

        CREATE FUNCTION job_renew(p_job_id text, p_token bigint, p_lease_s double precision, p_now timestamptz)
        RETURNS TABLE (outcome text, lease_expires_at timestamptz, cancel_requested boolean)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz;
        BEGIN
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := COALESCE(p_now, clock_timestamp());
            IF NOT FOUND OR r.state <> 'running' OR r.fencing_token <> p_token THEN
                RETURN QUERY SELECT 'fenced'::text, NULL::timestamptz, false;
                RETURN;
            END IF;
            IF r.lease_expires_at <= t THEN
                UPDATE job_claims c SET state = 'unknown', unknown_at = t, lease_expires_at = NULL,
                       unknown_reason = format('the lease of claim %s (worker %s) expired at %s before it was renewed',
                                               r.fencing_token, r.worker_id, r.lease_expires_at)
                 WHERE c.job_id = p_job_id;
                RETURN QUERY SELECT 'expired'::text, NULL::timestamptz, r.cancel_requested_at IS NOT NULL;
                RETURN;
            END IF;
            UPDATE job_claims c SET lease_expires_at = t + make_interval(secs => p_lease_s), renewed_at = t
             WHERE c.job_id = p_job_id RETURNING c.* INTO r;
            RETURN QUERY SELECT 'renewed'::text, r.lease_expires_at, r.cancel_requested_at IS NOT NULL;
        END $$;

        CREATE FUNCTION job_finish(p_job_id text, p_token bigint, p_outcome text, p_detail jsonb, p_worker_id text,
                                   p_now timestamptz)
        RETURNS TABLE (outcome text, state text)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz;
            why text;
        BEGIN
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := COALESCE(p_now, clock_timestamp());
            IF FOUND AND r.state = 'running' AND r.fencing_token = p_token AND r.lease_expires_at > t THEN
                UPDATE job_claims c SET state = 'finished', outcome = p_outcome, outcome_detail = p_detail,
                       finished_at = t, lease_expires_at = NULL
                 WHERE c.job_id = p_job_id;
                RETURN QUERY SELECT 'finished'::text, 'finished'::text;
                RETURN;
            END IF;
            IF FOUND AND r.state = 'finished' AND r.fencing_token = p_token AND r.outcome = p_outcome
               AND r.outcome_detail IS NOT DISTINCT FROM p_detail THEN
                RETURN QUERY SELECT 'already_finished'::text, 'finished'::text;
                RETURN;
            END IF;
            IF NOT FOUND THEN
                why := 'no claim exists for this job';
            ELSIF r.fencing_token <> p_token THEN
                why := format('fencing token %s is stale; the current claim is %s', p_token, r.fencing_token);
            ELSIF r.state = 'running' THEN
                why := format('the lease expired at %s before the result arrived', r.lease_expires_at);
                UPDATE job_claims c SET state = 'unknown', unknown_at = t, lease_expires_at = NULL,
                       unknown_reason = format('the lease of claim %s (worker %s) expired at %s; its late result '
                                               'is in job_stale_reports', r.fencing_token, r.worker_id,
                                               r.lease_expires_at)
                 WHERE c.job_id = p_job_id;
                r.state := 'unknown';
            ELSE
                why := format('the job is already %s', r.state);
            END IF;
            INSERT INTO job_stale_reports (job_id, fencing_token, current_token, state_then, outcome,
                                           outcome_detail, worker_id, reason)
            VALUES (p_job_id, p_token, r.fencing_token, r.state, p_outcome, p_detail, p_worker_id, why);
            RETURN QUERY SELECT 'stale'::text, COALESCE(r.state, 'none');
        END $$;

        CREATE FUNCTION job_expire_lease(p_job_id text, p_now timestamptz)
        RETURNS TABLE (expired boolean, fencing_token bigint)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz;
        BEGIN
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := COALESCE(p_now, clock_timestamp());
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

        CREATE FUNCTION specialist_claim(p_job_id text, p_worker_id text, p_lease_s double precision,
                                         p_max_resumes integer, p_now timestamptz)
        RETURNS TABLE (outcome text, fencing_token bigint, lease_expires_at timestamptz,
                       retry_after_s double precision, job_outcome text, job_outcome_detail jsonb,
                       newly_unknown boolean, resumed boolean)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz;
        BEGIN
            IF p_lease_s IS NULL OR p_lease_s <= 0 THEN
                RAISE EXCEPTION 'lease must be positive' USING ERRCODE = '22023';
            END IF;
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := COALESCE(p_now, clock_timestamp());
            IF FOUND AND r.state = 'running' AND r.lease_expires_at <= t
               AND EXISTS (SELECT 1 FROM specialist_checkpoints k WHERE k.job_id = p_job_id)
               AND EXISTS (SELECT 1 FROM specialist_runs s WHERE s.job_id = p_job_id
                                                            AND s.resumes < p_max_resumes) THEN
                UPDATE specialist_runs s SET resumes = s.resumes + 1, state = 'running', ended_at = NULL
                 WHERE s.job_id = p_job_id;
                UPDATE job_claims c SET fencing_token = c.fencing_token + 1, claims = c.claims + 1,
                       deliveries = c.deliveries + 1, lease_expires_at = t + make_interval(secs => p_lease_s),
                       worker_id = p_worker_id, claimed_at = t, renewed_at = NULL
                 WHERE c.job_id = p_job_id RETURNING c.* INTO r;
                RETURN QUERY SELECT 'claimed'::text, r.fencing_token, r.lease_expires_at,
                                    NULL::double precision, NULL::text, NULL::jsonb, false, true;
                RETURN;
            END IF;
            RETURN QUERY SELECT j.outcome, j.fencing_token, j.lease_expires_at, j.retry_after_s, j.job_outcome,
                                j.job_outcome_detail, j.newly_unknown, false
                           FROM job_claim(p_job_id, p_worker_id, p_lease_s, p_now) j;
        END $$;
        """
    )
    record(revision, down_revision, serves_previous_code=True,
           note="claim functions with the caller's clock (p_now) beside the old signatures")


def downgrade() -> None:
    op.execute(
        """
        DROP FUNCTION specialist_claim(text, text, double precision, integer, timestamptz);
        DROP FUNCTION job_expire_lease(text, timestamptz);
        DROP FUNCTION job_finish(text, bigint, text, jsonb, text, timestamptz);
        DROP FUNCTION job_renew(text, bigint, double precision, timestamptz);
        DROP FUNCTION job_claim(text, text, double precision, timestamptz);
        """
    )
    forget(revision)
