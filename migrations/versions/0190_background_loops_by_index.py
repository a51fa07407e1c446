"""The background loops' queries by index, and the indexes the retention prunes walk (issue 18).

Four partial indexes, each built online (``create_index_online``: CREATE INDEX
CONCURRENTLY, so admissions and finishes go on while they build):

* ``dispatch_outbox_sent (sent_at) WHERE status = 'sent'``: the sweeper's
  abandoned-job query (every sweep in Cloud Tasks mode) reads the rows handed to
  Cloud Tasks before its bound, instead of scanning the outbox (217 ms at 1M
  tasks in issue 18).
* ``dispatch_outbox_finished (finished_at, dispatch_id) WHERE status IN (done,
  canceled, undeliverable)``: the outbox prune walks finished rows oldest first,
  a page a statement from a cursor (the key is the cursor's): what it deletes
  leaves the index, what it must keep is passed, not read again every round.
* ``job_claims_finished (COALESCE(finished_at, claimed_at), job_id) WHERE state
  IN (finished, released)``: the same for the claims prune. Running and unknown
  claims are not in it: they are never pruned.
* ``tasks_ended (last_updated, id) WHERE (status #>> '{state}') IN (the four ended
  states)``: the events prune walks the tasks that ended, in the order they
  ended, from a cursor (the tasks themselves are kept, so their index does not
  shrink). It scanned ``tasks``, or the ``(owner, last_updated)`` index without
  its leading column, before. Only ended tasks have an entry, and an update that
  changes neither the status nor ``last_updated`` (an artifact) stays a HOT
  update.

The expired-lease query needs no index: it reads the running claims by lease
(``job_claims_running_lease``, migration 0020) and each one's outbox row by its
primary key, the dispatch id read back out of the job id
(``taskstate.ids.dispatch_id_of_sql``), instead of joining on the job id built
from every row (a sequential scan of the outbox per expired lease).

Expand-only: indexes the code before this revision does not know of. That code
does not check a job's outbox row before claiming it; the retention settings are
refused below the longest a delivery can still arrive
(``SPECIALISTS_WORKER_JOB_MAX_AGE_S`` + ``SPECIALISTS_DISPATCH_DEADLINE_S``), so a
worker of the previous release, too, never meets a pruned job's late delivery.

Revision ID: 0190
Revises: 0180
"""

from migrations.compat import create_index_online, drop_index_online, forget, record

revision = "0190"
down_revision = "0180"
branch_labels = None
depends_on = None

ENDED = "('TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED')"

INDEXES = {
    "dispatch_outbox_sent": "ON dispatch_outbox (sent_at) WHERE status = 'sent'",
    "dispatch_outbox_finished": (
        "ON dispatch_outbox (finished_at, dispatch_id) WHERE status IN ('done', 'canceled', 'undeliverable')"
    ),
    "job_claims_finished": (
        "ON job_claims ((COALESCE(finished_at, claimed_at)), job_id) WHERE state IN ('finished', 'released')"
    ),
    # ``#>> '{state}'``, which only taskstate.rows.ended_sql states: with ``->> 'state'`` a ListTasks filtered by
    # an ended state implied the predicate and was planned over every owner's ended tasks.
    "tasks_ended": f"ON tasks (last_updated, id) WHERE (status #>> '{{state}}') IN {ENDED}",
}


def upgrade() -> None:
    for name, definition in INDEXES.items():
        create_index_online(name, definition)
    record(revision, down_revision, serves_previous_code=True,
           note="partial indexes for the sweeper's and the pruners' queries; older code does not use them")


def downgrade() -> None:
    for name in reversed(list(INDEXES)):
        drop_index_online(name)
    forget(revision)
