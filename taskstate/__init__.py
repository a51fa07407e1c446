"""The shared state of a hosted task and its jobs: the bottom room that ``app/`` and ``workers/`` both stand on.

Each table has one owner module here, the only one whose SQL names it
(``tests/test_architecture.py`` fails otherwise); everyone else calls it:

- ``ids``: job ids (``<task id>.<dispatch id>``), the task a job serves, the signed payload naming it.
- ``rows``: ``tasks``, ``task_versions``, ``task_events``, in the a2a-sdk cluster store's format.
- ``admitted``: ``edge_tasks``, the edge's record of an admitted task: who sent it and what it reserved.
- ``outbox``: ``dispatch_outbox``, one row per message to dispatch.
- ``claims``: ``job_claims`` and ``job_stale_reports``: at most one execution per job.
- ``notify``: the NOTIFY channels that wake streams and dispatchers on every instance.
- ``updates``: a job's writes to its task (fenced progress, final state, unknown, an operator's verdict).
- ``cancel``: a customer's cancel, in one transaction with what it charges.
- ``charge``: the one pure function that decides what a job is charged.
- ``reads``: the operator's reads of admitted tasks (by outcome, a customer's newest, the queue), composed of the
  owners' relations.

Owners publish *relations* (SQL sub-queries over their table) for reads that
others compose into one statement, so a query that joins two tables still
names each in its own owner's module. Lock order, everywhere a job and its task
meet: claim rows, outbox rows, task rows, ledger.
"""
