"""Checkpoint retention: the indexes the pruner of ended jobs' Monty checkpoints reads.

A finished or unknown job never resumes, so its checkpoints (about 30 KB for a reviewer task, more than all
its other rows together) are deleted once older than SPECIALISTS_SPECIALIST_CHECKPOINT_RETENTION_S
(``workers.hosted_rlm.store.prune_ended``). Built online: the table can be large when this runs.

Expand-only: older code never reads the index.

Revision ID: 0210
Revises: 0170
"""

from migrations.compat import create_index_online, drop_index_online, forget, record

revision = "0210"
down_revision = "0170"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_index_online("specialist_checkpoints_created", "ON specialist_checkpoints (created_at)")
    # The jobs that may still resume (running or released claims): at most the jobs in flight, so a small index;
    # the pruner looks each old checkpoint's job up in it.
    create_index_online("job_claims_may_resume", "ON job_claims (job_id) WHERE state IN ('running', 'released')")
    record(revision, down_revision, serves_previous_code=True, note="an index the checkpoint pruner reads")


def downgrade() -> None:
    drop_index_online("job_claims_may_resume")
    drop_index_online("specialist_checkpoints_created")
    forget(revision)
