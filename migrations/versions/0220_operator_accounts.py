"""Customers opened explicitly and caps changed without a grant, each with an audit record; a task's rlm runs by index.

Before this revision a customer came into being as a side effect: the first `credits grant` (or `keys issue`)
under any well-formed id opened its account, so a mistyped id silently became a new customer. Now an operator
opens one (`specialists customers add`), and the operator's grant refuses an id the service does not know.
The concurrency cap (``max_parallel``) could only be changed by a grant; now it changes on its own.

- ``ledger_account_changes``: one row per operator change to an account (opened; max_parallel changed), with
  who, when, why, and the cap before and after. Append-only, like the journal (the same trigger refuses
  UPDATE, DELETE and TRUNCATE). A cap is at least 1 here: 0 refused every task as if the customer were busy.
- ``ledger_open_account(customer, max_parallel, operator, reason, now)``: the customer's row and its account
  under the customer's lock, once (``created``; ``exists`` after, nothing changed).
- ``ledger_set_max_parallel(customer, max_parallel, operator, reason, now)``: under the customer's lock, the
  new cap, never below the customer's open and unknown reservations (``changed``, ``unchanged``,
  ``account_not_found``, ``max_parallel_below_open``). The lock order is the ledger's: customer lock, then
  the account row.
- ``specialist_runs_task``: the rlm runs of one task (`specialists usage --job <task id>`). A job id is
  ``<task id>.<dispatch id>`` and a task id (a UUID) has no dot, so the task is the id's first part
  (``taskstate.ids.task_id_of_sql``, the same expression). Built online.

Expand-only: the code before this revision runs on this schema unchanged.

Revision ID: 0220
Revises: 0200
"""

from alembic import op

from migrations.compat import create_index_online, drop_index_online, forget, record

revision = "0220"
down_revision = "0200"
branch_labels = None
depends_on = None

TABLE = r"""
CREATE TYPE ledger_account_change_kind AS ENUM ('opened', 'max_parallel');
CREATE TABLE ledger_account_changes (
    change_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id          text NOT NULL REFERENCES customers (customer_id),
    at                   timestamptz NOT NULL,
    kind                 ledger_account_change_kind NOT NULL,
    max_parallel_before  integer,  -- NULL when the account was opened
    max_parallel         integer NOT NULL CHECK (max_parallel BETWEEN 1 AND 100000),
    operator             text NOT NULL CHECK (length(operator) BETWEEN 1 AND 200),
    reason               text NOT NULL CHECK (length(reason) <= 500)
);
CREATE INDEX ledger_account_changes_customer ON ledger_account_changes (customer_id, change_id);
CREATE TRIGGER ledger_account_changes_append_only BEFORE UPDATE OR DELETE ON ledger_account_changes
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER ledger_account_changes_no_truncate BEFORE TRUNCATE ON ledger_account_changes
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();

CREATE TYPE ledger_account_result AS (
    outcome text, customer_id text, max_parallel integer, max_parallel_before integer,
    open_reservations integer, change_id bigint, at timestamptz
);
"""

FUNCTIONS = r"""
CREATE FUNCTION ledger_open_account(
    p_customer_id text, p_max_parallel integer, p_operator text, p_reason text, p_now timestamptz DEFAULT NULL
) RETURNS ledger_account_result LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := COALESCE(p_now, now());
    res    ledger_account_result;
    a      ledger_accounts%ROWTYPE;
BEGIN
    PERFORM ledger_lock_customer(p_customer_id);
    res.customer_id := p_customer_id;
    INSERT INTO customers (customer_id) VALUES (p_customer_id) ON CONFLICT DO NOTHING;
    INSERT INTO ledger_accounts (customer_id, max_parallel, created_at) VALUES (p_customer_id, p_max_parallel, v_now)
        ON CONFLICT (customer_id) DO NOTHING
        RETURNING * INTO a;
    IF FOUND THEN
        INSERT INTO ledger_account_changes (customer_id, at, kind, max_parallel, operator, reason)
            VALUES (p_customer_id, v_now, 'opened', p_max_parallel, p_operator, p_reason)
            RETURNING change_id INTO res.change_id;
        res.outcome := 'created';
        res.at := v_now;
    ELSE
        SELECT * INTO a FROM ledger_accounts WHERE customer_id = p_customer_id;
        res.outcome := 'exists';
        res.at := a.created_at;
    END IF;
    res.max_parallel := a.max_parallel;
    res.open_reservations := a.open_reservations;
    RETURN res;
END $$;

CREATE FUNCTION ledger_set_max_parallel(
    p_customer_id text, p_max_parallel integer, p_operator text, p_reason text, p_now timestamptz DEFAULT NULL
) RETURNS ledger_account_result LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := COALESCE(p_now, now());
    res    ledger_account_result;
    a      ledger_accounts%ROWTYPE;
BEGIN
    PERFORM ledger_lock_customer(p_customer_id);
    res.customer_id := p_customer_id;
    SELECT * INTO a FROM ledger_accounts WHERE customer_id = p_customer_id;
    IF NOT FOUND THEN
        res.outcome := 'account_not_found';
        RETURN res;
    END IF;
    res.max_parallel_before := a.max_parallel;
    res.max_parallel := a.max_parallel;
    res.open_reservations := a.open_reservations;
    IF p_max_parallel < a.open_reservations THEN
        res.outcome := 'max_parallel_below_open';
        RETURN res;
    END IF;
    IF p_max_parallel = a.max_parallel THEN
        res.outcome := 'unchanged';
        RETURN res;
    END IF;
    UPDATE ledger_accounts SET max_parallel = p_max_parallel WHERE customer_id = p_customer_id;
    INSERT INTO ledger_account_changes (customer_id, at, kind, max_parallel_before, max_parallel, operator, reason)
        VALUES (p_customer_id, v_now, 'max_parallel', a.max_parallel, p_max_parallel, p_operator, p_reason)
        RETURNING change_id INTO res.change_id;
    res.outcome := 'changed';
    res.max_parallel := p_max_parallel;
    res.at := v_now;
    RETURN res;
END $$;
"""

TASK_INDEX = ("specialist_runs_task", "ON specialist_runs ((split_part(job_id, '.', 1)))")


def upgrade() -> None:
    create_index_online(*TASK_INDEX)  # first, outside the transaction: a rerun after a failure finds it built
    op.execute(TABLE)
    op.execute(FUNCTIONS)
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: account changes table, open-account and set-max-parallel functions, runs by task")


def downgrade() -> None:
    drop_index_online(TASK_INDEX[0])
    op.execute(
        "DROP FUNCTION ledger_set_max_parallel(text, integer, text, text, timestamptz); "
        "DROP FUNCTION ledger_open_account(text, integer, text, text, timestamptz); "
        "DROP TYPE ledger_account_result; DROP TABLE ledger_account_changes; DROP TYPE ledger_account_change_kind;"
    )
    forget(revision)
