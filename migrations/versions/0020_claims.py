"""Job claims: at-most-once execution of at-least-once deliveries, with leases and fencing tokens.

One row per job (a plain text key: the A2A edge's tasks and the ledger's
reservations refer to the same job id). Each operation is one server-side
function call at default isolation; the row lock orders concurrent deliveries,
and every lease comparison uses the database clock, so workers' clocks do not
matter. ``job_stale_reports`` keeps what stale workers tried to report, for
operators.

Revision ID: 0020
Revises: 0010
"""

from alembic import op

revision = "0020"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
        CREATE TABLE job_claims (
            job_id               text PRIMARY KEY CHECK (job_id ~ '^[A-Za-z0-9_.:-]{1,200}$'),
            state                text NOT NULL CHECK (state IN ('running', 'released', 'finished', 'unknown')),
            fencing_token        bigint NOT NULL CHECK (fencing_token >= 0),
            lease_expires_at     timestamptz,
            worker_id            text CHECK (worker_id IS NULL OR length(worker_id) <= 200),
            claims               integer NOT NULL DEFAULT 0 CHECK (claims >= 0),
            deliveries           integer NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
            first_claimed_at     timestamptz,
            claimed_at           timestamptz,
            renewed_at           timestamptz,
            cancel_requested_at  timestamptz,
            cancel_reason        text CHECK (cancel_reason IS NULL OR length(cancel_reason) <= 500),
            finished_at          timestamptz,
            outcome              text CHECK (outcome IN ('completed', 'failed', 'canceled', 'rejected', 'input_required')),
            outcome_detail       jsonb,
            unknown_at           timestamptz,
            unknown_reason       text,
            created_at           timestamptz NOT NULL DEFAULT now(),
            -- A running claim always has a lease; nothing else does.
            CHECK ((state = 'running') = (lease_expires_at IS NOT NULL)),
            CHECK ((state = 'finished') = (outcome IS NOT NULL AND finished_at IS NOT NULL)),
            CHECK ((state = 'unknown') = (unknown_at IS NOT NULL)),
            -- The token counts claims: it only grows, and a job never claimed has token 0.
            CHECK (fencing_token = claims)
        );
        CREATE INDEX job_claims_unknown ON job_claims (unknown_at) WHERE state = 'unknown';
        CREATE INDEX job_claims_running_lease ON job_claims (lease_expires_at) WHERE state = 'running';

        CREATE TABLE job_stale_reports (
            report_id       bigserial PRIMARY KEY,
            job_id          text NOT NULL,
            fencing_token   bigint NOT NULL,
            current_token   bigint,
            state_then      text,
            outcome         text,
            outcome_detail  jsonb,
            worker_id       text,
            reason          text NOT NULL,
            reported_at     timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX job_stale_reports_job ON job_stale_reports (job_id, reported_at);

        -- claim: the one call a delivery makes. Outcomes:
        --   claimed                new job, or a released one re-claimed (token + 1)
        --   finished               already finished: answer success with the stored outcome
        --   busy                   a live lease: retry after retry_after_s
        --   lease_expired_unknown  the lease expired while running (now, or earlier): never run again
        CREATE FUNCTION job_claim(p_job_id text, p_worker_id text, p_lease_s double precision)
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

        -- renew (heartbeat), fenced. Outcomes: renewed | expired (the lease ran out first: the job is now
        -- unknown) | fenced (another claim, or no longer running). Also says whether a cancel was requested.
        CREATE FUNCTION job_renew(p_job_id text, p_token bigint, p_lease_s double precision)
        RETURNS TABLE (outcome text, lease_expires_at timestamptz, cancel_requested boolean)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz;
        BEGIN
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := clock_timestamp();
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

        -- finish, fenced: only the current claim, while its lease is live. Outcomes: finished |
        -- already_finished (the same claim repeating the same outcome: a retried commit) | stale (recorded
        -- in job_stale_reports; a live claim whose lease ran out becomes unknown).
        CREATE FUNCTION job_finish(p_job_id text, p_token bigint, p_outcome text, p_detail jsonb, p_worker_id text)
        RETURNS TABLE (outcome text, state text)
        LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz;
            why text;
        BEGIN
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            t := clock_timestamp();
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

        -- release: give a claim back before any work started (a draining worker); the next delivery
        -- re-claims it with the next token.
        CREATE FUNCTION job_release(p_job_id text, p_token bigint)
        RETURNS boolean LANGUAGE sql AS $$
            UPDATE job_claims SET state = 'released', lease_expires_at = NULL
             WHERE job_id = p_job_id AND state = 'running' AND fencing_token = p_token
            RETURNING true;
        $$;

        -- request_cancel, from any API instance. Outcomes: canceled_before_claim (no claim yet, or
        -- released: the job is finished as canceled and never runs) | cancel_requested (running: the
        -- worker sees it at its next heartbeat) | already_finished | unknown.
        CREATE FUNCTION job_request_cancel(p_job_id text, p_reason text)
        RETURNS text LANGUAGE plpgsql AS $$
        DECLARE
            r job_claims%ROWTYPE;
            t timestamptz := clock_timestamp();
        BEGIN
            INSERT INTO job_claims AS c (job_id, state, fencing_token, finished_at, outcome, outcome_detail,
                                         cancel_requested_at, cancel_reason)
            VALUES (p_job_id, 'finished', 0, t, 'canceled', jsonb_build_object('reason', 'canceled before claim'),
                    t, p_reason)
            ON CONFLICT (job_id) DO NOTHING
            RETURNING c.* INTO r;
            IF FOUND THEN
                RETURN 'canceled_before_claim';
            END IF;
            SELECT * INTO r FROM job_claims c WHERE c.job_id = p_job_id FOR UPDATE;
            IF r.state = 'released' THEN
                UPDATE job_claims c SET state = 'finished', finished_at = t, outcome = 'canceled',
                       outcome_detail = jsonb_build_object('reason', 'canceled before claim'),
                       cancel_requested_at = t, cancel_reason = p_reason
                 WHERE c.job_id = p_job_id;
                RETURN 'canceled_before_claim';
            ELSIF r.state = 'running' THEN
                UPDATE job_claims c SET cancel_requested_at = COALESCE(c.cancel_requested_at, t),
                       cancel_reason = COALESCE(c.cancel_reason, p_reason)
                 WHERE c.job_id = p_job_id;
                RETURN 'cancel_requested';
            ELSIF r.state = 'finished' THEN
                RETURN 'already_finished';
            END IF;
            RETURN 'unknown';
        END $$;

        -- resolve_unknown: an operator's verdict on a job whose outcome was unknown (with a reason).
        CREATE FUNCTION job_resolve_unknown(p_job_id text, p_outcome text, p_reason text, p_operator text)
        RETURNS boolean LANGUAGE sql AS $$
            UPDATE job_claims SET state = 'finished', finished_at = clock_timestamp(), outcome = p_outcome,
                   outcome_detail = jsonb_build_object('resolved_by', p_operator, 'reason', p_reason,
                                                       'unknown_reason', unknown_reason),
                   unknown_at = NULL
             WHERE job_id = p_job_id AND state = 'unknown'
            RETURNING true;
        $$;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP FUNCTION job_resolve_unknown(text, text, text, text);
        DROP FUNCTION job_request_cancel(text, text);
        DROP FUNCTION job_release(text, bigint);
        DROP FUNCTION job_finish(text, bigint, text, jsonb, text);
        DROP FUNCTION job_renew(text, bigint, double precision);
        DROP FUNCTION job_claim(text, text, double precision);
        DROP TABLE job_stale_reports;
        DROP TABLE job_claims;
        """
    )
