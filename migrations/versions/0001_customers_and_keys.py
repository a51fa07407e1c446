"""Customers and their API keys.

Keys are signed tokens shown once; only their id and metadata are stored here,
so revocation is a row update that every instance sees within the revocation bound.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE customers (
            customer_id  text PRIMARY KEY
                         CHECK (customer_id ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
            created_at   timestamptz NOT NULL DEFAULT now()
        );

        CREATE TABLE api_keys (
            key_id          text PRIMARY KEY,
            customer_id     text NOT NULL REFERENCES customers (customer_id),
            environment     text NOT NULL CHECK (environment IN ('live', 'test')),
            tier            text NOT NULL CHECK (tier ~ '^[a-z0-9_-]{1,32}$'),
            label           text NOT NULL DEFAULT '' CHECK (length(label) <= 200),
            issued_at       timestamptz NOT NULL,
            expires_at      timestamptz NOT NULL,
            revoked_at      timestamptz,
            revoked_reason  text CHECK (revoked_reason IS NULL OR length(revoked_reason) BETWEEN 1 AND 500),
            revoked_by      text,
            CHECK (expires_at > issued_at),
            CHECK ((revoked_at IS NULL) = (revoked_reason IS NULL))
        );
        CREATE INDEX api_keys_customer ON api_keys (customer_id, issued_at);
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE api_keys; DROP TABLE customers;")
