"""``ledger_batch``: concurrent reserves and settles of one customer in one transaction.

On a hot account every reserve and settle takes the customer's advisory lock, and a
transaction-scoped lock is held until the commit's WAL flush is done, so one account
ran at one operation per (critical section + flush) (issue 17). ``ledger.client.Ledger``
now collects the calls of one customer that arrive while a call of that customer is
running and sends them as one call of ``ledger_batch``: k operations share one lock
acquisition, one commit and one flush, and each still gets its own answer.

A batch runs as if its settlements came first, in job id order, then its reservations
in the order given. The lock order is the ledger's own (0002): the settlements claim
their reservation rows (job id order) before any customer lock, then the customers'
locks are taken in customer id order (the reserving customers and the owners of the
claimed reservations; the client sends one customer's calls, so normally one lock),
then account and lot rows. Each operation is the same code as its single call: a
reservation is ``ledger_reserve``, a claimed settlement ``ledger_resolve_holds``, and an
unclaimed one answers what ``ledger_settle`` would have answered, read after the
batch's own settlements are written (so a repeated settlement of a job the batch
settled answers ``exists`` or ``settle_mismatch``). Refusals are outcomes, so one job's refusal does
not touch another's; an exception rolls the whole batch back and the client then runs
each operation alone. ``ledger_reserve``, ``ledger_settle`` and ``ledger_mark_unknown``
are unchanged.

Expand-only: new functions and a new type; code before this revision never calls them.

Revision ID: 0150
Revises: 0120
"""

from alembic import op

from migrations.compat import forget, record

revision = "0150"
down_revision = "0120"
branch_labels = None
depends_on = None

BATCH = r"""
CREATE TYPE ledger_batch_result AS (
    op_index integer, outcome text, job_id text, customer_id text, skill text, credits bigint, state text,
    created_at timestamptz, available bigint, open_reservations integer, max_parallel integer,
    expired_at timestamptz, hold_lot_ids bigint[], hold_credits bigint[],
    charged bigint, released bigint, expired bigint, resolved_at timestamptz, operator text, reason text
);

-- What ledger_settle answers for a settlement it could not claim (read-only).
CREATE FUNCTION ledger_settle_refusal(p_job_id text, p_charged bigint)
RETURNS ledger_resolve_result LANGUAGE plpgsql STABLE AS $$
DECLARE
    res ledger_resolve_result := ledger_resolve_existing(p_job_id, NULL);
BEGIN
    IF res.outcome = 'not_found' THEN
        RETURN res;
    ELSIF res.state = 'open' THEN
        res.outcome := 'charge_exceeds_reserved';
    ELSIF res.state = 'unknown' THEN
        res.outcome := 'unknown';
    ELSIF res.charged = p_charged THEN
        res.outcome := 'exists';
    ELSE
        res.outcome := 'settle_mismatch';
    END IF;
    RETURN res;
END $$;

CREATE FUNCTION ledger_batch_resolved(p_index integer, s ledger_resolve_result)
RETURNS ledger_batch_result LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(p_index, s.outcome, s.job_id, s.customer_id, NULL, s.credits, s.state, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, s.charged, s.released, s.expired, s.resolved_at, s.operator, s.reason)::ledger_batch_result;
$$;

-- p_kinds[i] is 'reserve' or 'settle'; for a reservation p_customer_ids[i], p_fingerprints[i]
-- and p_skills[i] are set; for a settlement p_credits[i] is the charge and p_reasons[i] its
-- reason (its customer is the one its reservation names).
CREATE FUNCTION ledger_batch(
    p_customer_ids text[], p_kinds text[], p_job_ids text[], p_fingerprints text[], p_skills text[],
    p_credits bigint[], p_reasons text[], p_nows timestamptz[]
) RETURNS SETOF ledger_batch_result LANGUAGE plpgsql AS $$
DECLARE
    v_count     integer := cardinality(p_kinds);
    v_claimed   ledger_reservations[];    -- by operation index: the rows the settlements claimed
    v_customers text[] := '{}';
    v_now       timestamptz;
    v_customer  text;
    r           ledger_reservations%ROWTYPE;
    rv          ledger_reserve_result;
    i           integer;
BEGIN
    -- 1000: SCHEMA_MAX_OPERATIONS_PER_BATCH (core/settings.py), the ceiling of the client's setting.
    IF NOT v_count BETWEEN 1 AND 1000 OR NOT p_kinds <@ ARRAY['reserve', 'settle']
       OR cardinality(p_customer_ids) <> v_count OR cardinality(p_job_ids) <> v_count OR cardinality(p_fingerprints) <> v_count
       OR cardinality(p_skills) <> v_count OR cardinality(p_credits) <> v_count
       OR cardinality(p_reasons) <> v_count OR cardinality(p_nows) <> v_count THEN
        RAISE EXCEPTION 'ledger_batch takes 1 to 1000 reserve or settle operations, every array as long as p_kinds'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- 1. Settlements claim their reservation rows, in job id order, before any customer lock.
    FOR i IN
        SELECT t.i FROM unnest(p_kinds, p_job_ids) WITH ORDINALITY AS t(kind, job_id, i)
         WHERE t.kind = 'settle' ORDER BY t.job_id, t.i
    LOOP
        v_now := COALESCE(p_nows[i], now());
        UPDATE ledger_reservations
           SET state = (CASE WHEN p_credits[i] = 0 THEN 'voided' ELSE 'settled' END)::ledger_reservation_state,
               charged = p_credits[i], resolved_at = v_now
         WHERE job_id = p_job_ids[i] AND state = 'open' AND p_credits[i] <= credits
        RETURNING * INTO r;
        IF FOUND THEN
            v_claimed[i] := r;
            v_customers := v_customers || r.customer_id;
        END IF;
    END LOOP;

    -- 2. The customers' locks, in customer id order.
    FOR v_customer IN
        SELECT DISTINCT c FROM (
            SELECT unnest(v_customers) AS c
            UNION ALL
            SELECT t.c FROM unnest(p_kinds, p_customer_ids) AS t(kind, c) WHERE t.kind = 'reserve') AS all_customers
         ORDER BY c
    LOOP
        PERFORM ledger_lock_customer(v_customer);
    END LOOP;

    -- 3. The claimed settlements' postings; then what the others answer (a second settlement
    -- of a job this batch settled reads the settlement just written); then the reservations
    -- in the order given.
    FOR i IN 1 .. v_count LOOP
        CONTINUE WHEN p_kinds[i] <> 'settle' OR (v_claimed[i]).job_id IS NULL;
        RETURN NEXT ledger_batch_resolved(i, ledger_resolve_holds(
            v_claimed[i], p_credits[i], (CASE WHEN p_credits[i] = 0 THEN 'void' ELSE 'settle' END)::ledger_entry_kind,
            p_reasons[i], NULL, COALESCE(p_nows[i], now())));
    END LOOP;
    FOR i IN 1 .. v_count LOOP
        CONTINUE WHEN p_kinds[i] <> 'settle' OR (v_claimed[i]).job_id IS NOT NULL;
        RETURN NEXT ledger_batch_resolved(i, ledger_settle_refusal(p_job_ids[i], p_credits[i]));
    END LOOP;
    FOR i IN 1 .. v_count LOOP
        CONTINUE WHEN p_kinds[i] <> 'reserve';
        rv := ledger_reserve(p_customer_ids[i], p_job_ids[i], p_fingerprints[i], p_skills[i], p_credits[i], p_nows[i]);
        RETURN NEXT ROW(i, rv.outcome, rv.job_id, rv.customer_id, rv.skill, rv.credits, rv.state, rv.created_at,
                        rv.available, rv.open_reservations, rv.max_parallel, rv.expired_at, rv.hold_lot_ids,
                        rv.hold_credits, NULL, NULL, NULL, NULL, NULL, NULL)::ledger_batch_result;
    END LOOP;
    RETURN;
END $$;
"""


def upgrade() -> None:
    op.execute(BATCH)
    record(revision, down_revision, serves_previous_code=True,
           note="ledger_batch and its helpers: new functions only, older code never calls them")


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION ledger_batch, ledger_batch_resolved, ledger_settle_refusal; DROP TYPE ledger_batch_result;"
    )
    forget(revision)
