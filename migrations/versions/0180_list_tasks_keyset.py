"""ListTasks costs what one page holds: indexes in the listing's order, and a per-owner count of tasks.

Issue 18: the a2a-sdk store listed a customer's tasks by reading all of them and
sorting (its sort key, ``CASE WHEN last_updated IS NULL ...``, matched no index),
and counted them on every page. ``taskstate.rows.list_page`` reads a page as
keyset ranges of an index in the listing's own order, and the unfiltered total
comes from ``task_counts``:

- ``tasks_listing (owner, last_updated DESC, id DESC)``: every listing without a
  filter, and ``statusTimestampAfter`` (a range on the same column). It replaces
  ``idx_tasks_owner_last_updated (owner, last_updated)`` (0010), dropped here: its
  columns lead this one, so whatever used it (the a2a-sdk's own count, the events
  pruner's scan) is served the same by the new one.
- ``tasks_listing_by_context (owner, context_id, last_updated DESC, id DESC)``.
- ``tasks_listing_by_state (owner, (status ->> 'state'), last_updated DESC, id DESC)``.

A task event changes ``last_updated``, so its UPDATE is never HOT and writes one
entry into every index of ``tasks``: three indexes where there was one, beside the
primary key (measured in docs/BENCHMARKS.md, "ListTasks").

``task_counts`` holds a task count per owner in "slots": a statement that inserts
(or deletes) tasks adds its count to a slot of the owner that no other transaction
holds (``FOR UPDATE SKIP LOCKED``), or to a new slot when every one is held. So a
writer never waits on another (no lock order to keep with the ledger's customer
lock), and an owner has at most as many slots as it ever had concurrent writers.
The owner's count is the sum of its slots. Statement triggers with transition
tables, so a bulk insert costs one slot update per owner, not one per row. The
backfill adds to each owner what its slots lack, in one snapshot: counted rows
minus the slots' sum, so rows whose transaction already added its own count
cancel out, and running it again adds nothing.

Expand-only: older code never reads ``task_counts``, and its inserts keep it exact
through the triggers.

Revision ID: 0180
Revises: 0210
"""

from alembic import op

from migrations.compat import create_index_online, drop_index_online, forget, record

revision = "0180"
down_revision = "0210"
branch_labels = None
depends_on = None

COUNTS = """
CREATE TABLE IF NOT EXISTS task_counts (
    slot   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner  varchar(255) NOT NULL,
    tasks  bigint NOT NULL      -- one slot may go below 0 after deletes; the owner's sum never does
);
CREATE INDEX IF NOT EXISTS task_counts_owner ON task_counts (owner);

CREATE OR REPLACE FUNCTION task_counts_follow() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_owner varchar;
    v_delta bigint;
BEGIN
    FOR v_owner, v_delta IN
        SELECT owner, CASE WHEN TG_OP = 'INSERT' THEN count(*) ELSE -count(*) END
          FROM changed WHERE owner IS NOT NULL GROUP BY owner ORDER BY owner
    LOOP
        UPDATE task_counts SET tasks = tasks + v_delta
         WHERE slot = (SELECT slot FROM task_counts WHERE owner = v_owner LIMIT 1 FOR UPDATE SKIP LOCKED);
        IF NOT FOUND THEN
            INSERT INTO task_counts (owner, tasks) VALUES (v_owner, v_delta);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION task_counts_forget() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM task_counts;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS task_counts_on_insert ON tasks;
CREATE TRIGGER task_counts_on_insert AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION task_counts_follow();
DROP TRIGGER IF EXISTS task_counts_on_delete ON tasks;
CREATE TRIGGER task_counts_on_delete AFTER DELETE ON tasks
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION task_counts_follow();
DROP TRIGGER IF EXISTS task_counts_on_truncate ON tasks;
CREATE TRIGGER task_counts_on_truncate AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_forget();
"""

# One statement, one snapshot, after the triggers committed: what each owner's slots lack.
BACKFILL = """
INSERT INTO task_counts (owner, tasks)
SELECT owner, coalesce(counted.n, 0) - coalesce(slotted.n, 0)
  FROM (SELECT owner, count(*) AS n FROM tasks WHERE owner IS NOT NULL GROUP BY owner) AS counted
  FULL JOIN (SELECT owner, sum(tasks) AS n FROM task_counts GROUP BY owner) AS slotted USING (owner)
 WHERE coalesce(counted.n, 0) <> coalesce(slotted.n, 0)
"""

INDEXES = {
    "tasks_listing": "ON tasks (owner, last_updated DESC, id DESC)",
    "tasks_listing_by_context": "ON tasks (owner, context_id, last_updated DESC, id DESC)",
    "tasks_listing_by_state": "ON tasks (owner, (status ->> 'state'), last_updated DESC, id DESC)",
}
SUPERSEDED = ("idx_tasks_owner_last_updated", "ON tasks (owner, last_updated)")


def upgrade() -> None:
    op.execute(COUNTS)
    with op.get_context().autocommit_block():  # the triggers are committed before the backfill's snapshot
        op.get_bind().exec_driver_sql(BACKFILL)
    for name, definition in INDEXES.items():
        create_index_online(name, definition)
    drop_index_online(SUPERSEDED[0])
    record(revision, down_revision, serves_previous_code=True,
           note="task_counts and the listing indexes: older code never reads the counts, and its inserts keep "
                "them exact; the dropped (owner, last_updated) index leads tasks_listing")


def downgrade() -> None:
    create_index_online(*SUPERSEDED)
    for name in INDEXES:
        drop_index_online(name)
    op.execute(
        """
        DROP TRIGGER IF EXISTS task_counts_on_truncate ON tasks;
        DROP TRIGGER IF EXISTS task_counts_on_delete ON tasks;
        DROP TRIGGER IF EXISTS task_counts_on_insert ON tasks;
        DROP FUNCTION IF EXISTS task_counts_forget();
        DROP FUNCTION IF EXISTS task_counts_follow();
        DROP TABLE IF EXISTS task_counts;
        """
    )
    forget(revision)
