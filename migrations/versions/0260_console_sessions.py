"""The console's sessions, kept on the server so that logging out ends one (issue 42).

Until this revision a console session was only a signed cookie: logging out deleted the cookie, and a copy of it
(with its form's CSRF token) still worked until its TTL. Now the cookie carries a session id, and a session is
live while its row here is: ``ended_at`` NULL and ``expires_at`` ahead. Logging out sets ``ended_at``; the row
is deleted once expired (``ops.console.session_store`` prunes a bounded batch at each login). One primary-key
read per console request.

Expand-only: the code before this revision never names the table (its cookies, without an id, are refused by the
code of this revision: operators log in again after the release).

Revision ID: 0260
Revises: 0250
"""

from alembic import op

from migrations.compat import forget, record

revision = "0260"
down_revision = "0250"
branch_labels = None
depends_on = None

SCHEMA = r"""
CREATE TABLE console_sessions (
    session_id  text PRIMARY KEY CHECK (length(session_id) BETWEEN 16 AND 64),
    operator    text NOT NULL CHECK (length(operator) BETWEEN 1 AND 200),
    via         text NOT NULL CHECK (via IN ('local', 'iap')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    ended_at    timestamptz,
    CHECK (expires_at > created_at)
);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at);
"""


def upgrade() -> None:
    op.execute(SCHEMA)
    record(revision, down_revision, serves_previous_code=True, note="expand only: console_sessions")


def downgrade() -> None:
    op.execute("DROP TABLE console_sessions")
    forget(revision)
