"""Alembic environment: migrations are the only way the schema changes.

The URL comes from the config object built by ``core.db.alembic_config``;
revisions are plain SQL (``op.execute``) so that server-side functions, CHECK
constraints and indexes are stated exactly as PostgreSQL will run them.

One upgrade runs at a time, even when several instances start together: the
upgrade holds a session-level advisory lock for its whole run. Session-level, not
transaction-level, because a revision that builds an index on a large table does so
with ``CREATE INDEX CONCURRENTLY`` (``migrations.compat.create_index_online``), which
commits the migration's transaction around it; a transaction-level lock would be
released there and a second instance could start the same upgrade.

After the revisions, ``grants.sql`` gives the serving roles their DML-only privileges (docs/OPERATIONS.md
"Database users"), under the same lock.
"""

from pathlib import Path

from alembic import context
from sqlalchemy import create_engine, pool

config = context.config
# The serving roles' DML-only privileges, granted again after every upgrade (a new table is granted at once).
GRANTS = Path(__file__).with_name("grants.sql")

UPGRADE_LOCK = 7311200001


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.connect() as connection:
        connection.exec_driver_sql(f"SELECT pg_advisory_lock({UPGRADE_LOCK})")
        connection.commit()
        try:
            context.configure(connection=connection, transaction_per_migration=True)
            with context.begin_transaction():
                context.run_migrations()
            connection.exec_driver_sql(GRANTS.read_text())
            connection.commit()
        finally:
            connection.rollback()
            connection.exec_driver_sql(f"SELECT pg_advisory_unlock({UPGRADE_LOCK})")
            connection.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `specialists db upgrade`")
run_migrations_online()
