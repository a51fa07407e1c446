"""Hosted RLM specialists: one run per job, its Monty checkpoints, its journal of model calls and steps.

- ``specialist_runs``: one row per job a specialist ran: which spec and route, how
  many times it was resumed, and, once it ended, why, what it used and what it
  settles (``credits_to_settle`` never above the tariff).
- ``specialist_checkpoints``: signed Monty records (``rlmfamily.kernels.checkpoints``), by
  job and increasing sequence number; a replacement worker resumes from the newest.
- ``specialist_calls``: every model call (root turn or semantic call) with its
  reported tokens and cost (NULL = unknown, never zero) and, once answered, the
  answer itself, so a resumed run replays it instead of paying again. A call in
  flight when a worker died is ``unknown`` and ``superseded_by`` the call that
  replaced it.
- ``specialist_steps``: each python step of the root model: the checkpoint it
  started from and, once it ended, its result, so a resumed run replays it.

``specialist_credits`` computes what a job settles from its journal (so a run
stopped by the worker settles what it used); ``specialist_resumable`` tells the
lease sweeper to leave a job a later delivery can still resume.

Writes by a worker are fenced: they lock the job's claim row (``FOR SHARE``) and
check its fencing token, so a worker that lost its claim writes nothing once the
next claim has committed. ``specialist_claim`` is the claim a specialist worker
makes: a lease that expired *with* a checkpoint, within the resume limit, is
claimed again (token + 1) and resumed; anything else is ``job_claim`` unchanged.

Revision ID: 0070
Revises: 0030
"""

from alembic import op

revision = "0070"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
        CREATE TABLE specialist_runs (
            job_id                  text PRIMARY KEY CHECK (job_id ~ '^[A-Za-z0-9_.:-]{1,200}$'),
            specialist_id           text NOT NULL,
            route                   text NOT NULL,
            pricing                 text NOT NULL CHECK (pricing IN ('fixed', 'metered')),
            tariff_credits          bigint NOT NULL CHECK (tariff_credits >= 0),
            base_credits            bigint CHECK (base_credits IS NULL OR base_credits >= 0),
            credits_per_semantic_call bigint CHECK (credits_per_semantic_call IS NULL OR credits_per_semantic_call >= 0),
            session_id              text NOT NULL,
            resumes                 integer NOT NULL DEFAULT 0 CHECK (resumes >= 0),
            state                   text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'ended')),
            outcome                 text,
            stop_reason             text,
            turns                   integer CHECK (turns IS NULL OR turns >= 0),
            semantic_calls_used     integer CHECK (semantic_calls_used IS NULL OR semantic_calls_used >= 0),
            semantic_calls_charged  integer CHECK (semantic_calls_charged IS NULL OR semantic_calls_charged >= 0),
            credits_to_settle       bigint CHECK (credits_to_settle IS NULL
                                                  OR credits_to_settle BETWEEN 0 AND tariff_credits),
            started_at              timestamptz NOT NULL DEFAULT now(),
            ended_at                timestamptz,
            CHECK ((state = 'ended') = (ended_at IS NOT NULL)),
            CHECK ((pricing = 'metered') = (base_credits IS NOT NULL AND credits_per_semantic_call IS NOT NULL))
        );
        CREATE INDEX specialist_runs_started ON specialist_runs (started_at);

        CREATE TABLE specialist_checkpoints (
            job_id         text NOT NULL,
            seq            bigint NOT NULL CHECK (seq >= 0),
            session_id     text NOT NULL,
            fencing_token  bigint NOT NULL,
            data           bytea NOT NULL,
            created_at     timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (job_id, seq)
        );

        CREATE TABLE specialist_calls (
            call_id            bigserial PRIMARY KEY,
            job_id             text NOT NULL,
            fencing_token      bigint NOT NULL,
            purpose            text NOT NULL CHECK (purpose IN ('root', 'subcall')),
            turn               integer NOT NULL CHECK (turn >= 0),
            step_index         integer CHECK (step_index IS NULL OR step_index >= 0),
            after_seq          bigint,
            request_sha256     bytea NOT NULL CHECK (length(request_sha256) = 32),
            request_text       text,
            model              text,
            state              text NOT NULL CHECK (state IN ('started', 'completed', 'failed', 'unknown')),
            superseded_by      bigint REFERENCES specialist_calls (call_id),
            response           jsonb,
            prompt_tokens      integer CHECK (prompt_tokens IS NULL OR prompt_tokens >= 0),
            completion_tokens  integer CHECK (completion_tokens IS NULL OR completion_tokens >= 0),
            cost_usd           numeric(20, 10) CHECK (cost_usd IS NULL OR cost_usd >= 0),
            replays            integer NOT NULL DEFAULT 0 CHECK (replays >= 0),
            note               text,
            started_at         timestamptz NOT NULL DEFAULT now(),
            ended_at           timestamptz,
            CHECK ((state = 'started') = (ended_at IS NULL)),
            CHECK (state <> 'completed' OR response IS NOT NULL)
        );
        CREATE INDEX specialist_calls_job ON specialist_calls (job_id, call_id);

        CREATE TABLE specialist_steps (
            job_id         text NOT NULL,
            turn           integer NOT NULL CHECK (turn >= 1),
            step_index     integer NOT NULL CHECK (step_index >= 0),
            fencing_token  bigint NOT NULL,
            base_seq       bigint NOT NULL,
            result         jsonb,
            answer         text,
            refusals       jsonb,
            started_at     timestamptz NOT NULL DEFAULT now(),
            ended_at       timestamptz,
            PRIMARY KEY (job_id, turn, step_index),
            CHECK ((result IS NULL) = (ended_at IS NULL))
        );

        -- What a job settles, from its journal: the tariff (fixed), or the base plus the price of each answered
        -- semantic call, never above the tariff (metered). A call superseded after a resume counts once. NULL:
        -- the job is not a specialist run.
        CREATE FUNCTION specialist_credits(p_job_id text)
        RETURNS bigint LANGUAGE sql STABLE AS $$
            SELECT CASE WHEN r.pricing = 'fixed' THEN r.tariff_credits
                        ELSE LEAST(r.tariff_credits, r.base_credits + r.credits_per_semantic_call * (
                               SELECT count(*) FROM specialist_calls c
                                WHERE c.job_id = p_job_id AND c.purpose = 'subcall' AND c.state = 'completed'
                                  AND c.superseded_by IS NULL)) END
              FROM specialist_runs r WHERE r.job_id = p_job_id;
        $$;

        -- Whether a running job whose lease expired may still be resumed by a later delivery: it has a checkpoint,
        -- fewer than p_max_resumes resumes, and its lease expired less than p_window_s ago. The lease sweeper
        -- leaves such a job to the delivery instead of recording it unknown.
        CREATE FUNCTION specialist_resumable(p_job_id text, p_max_resumes integer, p_window_s double precision)
        RETURNS boolean LANGUAGE sql STABLE AS $$
            SELECT EXISTS (SELECT 1 FROM job_claims c
                            WHERE c.job_id = p_job_id AND c.state = 'running'
                              AND c.lease_expires_at + make_interval(secs => p_window_s) > clock_timestamp())
               AND EXISTS (SELECT 1 FROM specialist_checkpoints k WHERE k.job_id = p_job_id)
               AND EXISTS (SELECT 1 FROM specialist_runs s WHERE s.job_id = p_job_id AND s.resumes < p_max_resumes);
        $$;

        -- The claim of a specialist worker. A running claim whose lease expired is resumed (claimed again,
        -- token + 1) when the job has a checkpoint and fewer than p_max_resumes resumes; everything else
        -- (a new job, a released one, finished, busy, an expired lease without a checkpoint or past the
        -- limit: unknown) is exactly job_claim. The claim row is locked first, so a resume and an
        -- ordinary claim of the same job are ordered.
        CREATE FUNCTION specialist_claim(p_job_id text, p_worker_id text, p_lease_s double precision,
                                         p_max_resumes integer)
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
            t := clock_timestamp();
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
                           FROM job_claim(p_job_id, p_worker_id, p_lease_s) j;
        END $$;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP FUNCTION specialist_claim(text, text, double precision, integer);
        DROP FUNCTION specialist_resumable(text, integer, double precision);
        DROP FUNCTION specialist_credits(text);
        DROP TABLE specialist_steps;
        DROP TABLE specialist_calls;
        DROP TABLE specialist_checkpoints;
        DROP TABLE specialist_runs;
        """
    )
