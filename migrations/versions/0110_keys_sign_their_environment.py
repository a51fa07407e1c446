"""Keys sign their environment: each key's record says which form it has.

Before this revision a key's environment (``sk_live_`` / ``sk_test_``) was only in
its prefix, outside the signature, so a rewritten prefix verified wherever the
signing secrets were shared (issue 15). From this revision on the code signs the
environment in the payload and records ``key_form = 'env_signed'``; every key
issued before keeps ``'env_unsigned'`` (the default) and verifies until it
expires, its record vouching for its prefix (``ledger.keys``).

Expand-only: the code before this revision ignores the column, and a key it
issues during a rollout gets the default, which is the form it signs.

Revision ID: 0110
Revises: 0100
"""

from alembic import op

from migrations.compat import forget, record

revision = "0110"
down_revision = "0100"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE api_keys ADD COLUMN key_form text NOT NULL DEFAULT 'env_unsigned'
            CHECK (key_form IN ('env_unsigned', 'env_signed'));
        """
    )
    record(revision, down_revision, serves_previous_code=True,
           note="api_keys.key_form: which keys sign their environment; older code ignores it")


def downgrade() -> None:
    op.execute("ALTER TABLE api_keys DROP COLUMN key_form;")
    forget(revision)
