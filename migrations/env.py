"""Alembic environment: migrations are the only way the schema changes.

The URL comes from the config object built by ``core.db.alembic_config``;
revisions are plain SQL (``op.execute``) so that server-side functions, CHECK
constraints and indexes are stated exactly as PostgreSQL will run them.
"""

from alembic import context
from sqlalchemy import create_engine, pool

config = context.config


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            # One upgrade at a time, even when several instances start together.
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7311200001)")
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `specialists db upgrade`")
run_migrations_online()
