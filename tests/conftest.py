"""Test fixtures: a fresh PostgreSQL database for each test process.

``DATABASE_URL`` (or ``TEST_DATABASE_URL``) set: the run creates its own databases on
that server and drops them at the end. Unset: the run starts one embedded PostgreSQL
in a temporary folder (``tests/embedded_pg.py``: stopped and removed however the run
ends). The suite runs on ``-n 2`` xdist workers (pyproject.toml), a file at a time
per worker; each worker has a database of its own. Either way nothing depends on
leftovers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import Engine, create_engine, text

from core import db
from core.settings import Settings
from tests import embedded_pg

TEST_SECRET = "test-signing-secret-" + "x" * 40
# Two workers' heaviest tests at once (64-thread ledger races, a drill's five processes) need more than the 100
# connections PostgreSQL allows by default. The embedded server is given this many; a smaller external server
# runs the suite in one process.
PARALLEL_MAX_CONNECTIONS = 300
SERVER_URL_KEY = "specialists_server_url"

_run_server: embedded_pg.RunServer | None = None


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


@contextlib.contextmanager
def empty_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database of this server for one test (its name ``prefix`` and a random suffix), its URL; dropped
    at the end, whoever is still connected to it."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield _with_database(server_url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def _template_name() -> str:
    return f"specialists_template_{os.environ[embedded_pg.RUN_TOKEN_ENV]}"


def migrated_database(server_url: str, name: str) -> str:
    """Create database ``name`` at the migrations' head and give its URL.

    It is a copy of this run's template (``CREATE DATABASE ... TEMPLATE``, a quarter of a second), which the first
    caller of the run migrates (several seconds: every migration since 0001) under an advisory lock, so that the two
    xdist workers make it once between them. The template is named by the run's token, becomes visible under that
    name only once migrated (it is built under another and renamed), and is dropped when the run ends
    (``pytest_unconfigure``), so no run ever copies another's."""
    template = _template_name()
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(hashtext(:t))"), {"t": template})
            try:
                if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :t"), {"t": template}).first() is None:
                    building = f"{template}_building"
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{building}"'))
                    conn.execute(text(f'CREATE DATABASE "{building}"'))
                    db.upgrade(_with_database(server_url, building))  # its engine is gone when this returns
                    conn.execute(text(f'ALTER DATABASE "{building}" RENAME TO "{template}"'))
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(hashtext(:t))"), {"t": template})
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    finally:
        admin.dispose()
    return _with_database(server_url, name)


def _drop_template(server_url: str) -> None:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{_template_name()}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _external_url() -> str | None:
    return os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")


def _say(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line, flush=True)


def _server(config: pytest.Config) -> str:
    """This run's PostgreSQL server: the external one, or the embedded one (started on first use)."""
    global _run_server
    external = _external_url()
    if external:
        return db.sqlalchemy_url(external)
    if _run_server is None:
        _run_server = embedded_pg.start(lambda line: _say(config, line),
                                        max_connections=PARALLEL_MAX_CONNECTIONS)
    return db.sqlalchemy_url(_run_server.url)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    embedded_pg.new_run_token()  # before xdist starts its workers, so that they and their children carry it
    external = _external_url()
    if external and config.getoption("numprocesses", None) and not config.getoption("collectonly"):
        admin = create_engine(db.sqlalchemy_url(external))
        try:
            with admin.connect() as conn:
                allowed = int(conn.execute(text("SHOW max_connections")).scalar_one())
        finally:
            admin.dispose()
        if allowed < PARALLEL_MAX_CONNECTIONS:
            _say(config, f"tests: the server at DATABASE_URL allows {allowed} connections; two workers need "
                         f"{PARALLEL_MAX_CONNECTIONS} (max_connections), so the suite runs in one process")
            config.option.numprocesses = 0
            config.option.dist = "no"
            config.option.tx = []


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist: every worker uses the run's one server."""
    node.workerinput[SERVER_URL_KEY] = _server(node.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _run_server
    if not hasattr(config, "workerinput") and (_run_server is not None or _external_url()):
        _drop_template(_server(config))
    if _run_server is not None:
        for line in _run_server.stop():
            _say(config, line)
        _run_server = None


@pytest.fixture(scope="session")
def server_url(request: pytest.FixtureRequest) -> str:
    """A SQLAlchemy URL of a PostgreSQL server's maintenance database."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is not None and SERVER_URL_KEY in workerinput:
        return workerinput[SERVER_URL_KEY]
    return _server(request.config)


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """This run's own database, migrated to head."""
    name = f"specialists_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    url = migrated_database(server_url, name)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    return Settings(database={"url": database_url}, keys={"signing_secrets": [TEST_SECRET]})


@pytest.fixture(scope="session")
def engine(database_url: str, settings: Settings) -> Iterator[Engine]:
    # A small pool with a large overflow: 64-thread races get their connections, and the extra ones are
    # closed when returned instead of idling against the server's 100-connection limit.
    eng = db.make_engine(database_url, settings.model_copy(update={"database": settings.database.model_copy(update={"pool_size": 4, "max_overflow": 76})}))
    yield eng
    eng.dispose()


@pytest.fixture
def service_env(database_url: str) -> dict[str, str]:
    """Environment for running the `specialists` command against this run's database."""
    # No COLUMNS or LINES of the run's own: a table's width is what a test asks for (the full suite once found
    # COLUMNS in a worker's environment and every piped table came out wrapped).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_") and k not in ("COLUMNS", "LINES")}
    env["DATABASE_URL"] = database_url
    env["SPECIALISTS_KEY_SIGNING_SECRETS"] = TEST_SECRET
    return env
