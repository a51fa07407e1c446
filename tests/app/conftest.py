"""Fixtures for the A2A edge: real `specialists serve` processes on 127.0.0.1 against this run's database.

Every edge started here also serves the gRPC binding, on a port of its own (``EdgeProcess.grpc_address``),
which its cards name.

Server processes are started once per test session and shared: two ordinary
instances (``edge_a`` and ``edge_b``, one database: "two instances behave as
one service"; ``edge_b`` logs at DEBUG into a file the key-leak test reads) and
a strict one (tiny limits, anonymous callers allowed) for the limit tests.
``edge_a`` is the whole system as `specialists serve` starts it on one machine:
the edge, a worker and an embedded dispatcher as its children; they run every
task of the session, whichever instance admitted it. Nothing serves the paid
specialist, so its tasks stay unclaimed. Every test makes its own customer, so
tests do not depend on each other.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from core.settings import PROJECT_ROOT
from ledger import keys
from ledger.client import Ledger
from ops.topology import Ready, Role, StartBounds, ops_cli
from tests.conftest import TEST_SECRET

PAID_SPEC = """\
id: paid-echo
name: Paid echo
description: A paid specialist. No worker in these tests serves it, so its tasks wait, unclaimed.
executor: rlm
tariff_credits: 5
skill:
  id: echo
  name: Echo
  description: Echoes its input.
input_modes: [text/plain]
output_modes: [text/plain]
push_notifications: false
limits:
  max_input_bytes: 1024
  max_parts: 2
  max_metadata_bytes: 512
"""
PAID = "paid-echo"
PAID_TARIFF = 5
PUSH_SECRET = "edge-tests-push-signing-secret-" + "p" * 40
# How long an edge may start without progress (ops/topology.py: CPU time or log growth of it and its children).
# Its start took 17 s with the database at load 7 on 2 cores, over 90 s at load 14 (its worker child alone two
# minutes), computing all along. The tests using the edges time their own body only (``func_only``): the first
# test of a session also sets up the database and the edges, each bounded by its own start.
STARTUP_TIMEOUT_S = 240.0
STARTUP_BOUNDS = StartBounds(stall_s=60)
# How long the conformance specialist keeps a `test-resubscribe-message-id` task WORKING: the window in which
# a test that saw it WORKING subscribes to it or cancels it. Long enough for a loaded machine to get a few
# requests through; each test that waits for such a task to complete pays it once.
CONFORMANCE_HOLD_S = 5.0


@dataclass
class EdgeProcess:
    url: str
    role: Role  # ops/topology.py's: started, waited for and stopped there
    grpc_address: str = ""  # host:port of its A2A gRPC binding (every test edge serves one)
    conformance_grpc_address: str = ""  # host:port of the conformance specialist's own gRPC listener (no tenant)

    @property
    def process(self) -> subprocess.Popen:
        assert self.role.popen is not None
        return self.role.popen

    @property
    def log_path(self) -> Path:
        assert self.role.log_path is not None
        return self.role.log_path

    def specialist(self, specialist_id: str) -> str:
        return f"{self.url}/specialists/{specialist_id}"

    def log_text(self) -> str:
        return self.role.log_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def edge_env(database_url: str, specs_dir: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
    env.update(
        {
            "DATABASE_URL": database_url,
            "SPECIALISTS_KEY_SIGNING_SECRETS": TEST_SECRET,
            "SPECIALISTS_SPECS_DIR": str(specs_dir),
            "SPECIALISTS_REVOCATION_CACHE_S": "0",
            "SPECIALISTS_CONFORMANCE_HOLD_WORKING_S": str(CONFORMANCE_HOLD_S),
            # Push notifications on, to webhooks on 127.0.0.1 (tests/webhook.py): local development's setting.
            "SPECIALISTS_PUSH_SIGNING_SECRETS": PUSH_SECRET,
            "SPECIALISTS_PUSH_ALLOW_LOOPBACK": "true",
            # The edge alone, unless a fixture asks for the whole system (edge_a).
            "SPECIALISTS_SERVE_WORKER": "false",
            "SPECIALISTS_SERVE_DISPATCHER": "false",
            "SPECIALISTS_SERVE_CONSOLE": "false",  # tests/console starts it
        }
    )
    env.update({f"SPECIALISTS_{k.upper()}": v for k, v in settings.items()})
    return env


def edge_application_name(name: str) -> str:
    """The ``application_name`` of the connections of the test edge ``name`` (``start_edge``)."""
    return f"test-edge-{name}"


def start_edge(database_url: str, specs_dir: Path, log_dir: Path, name: str, **settings: str) -> EdgeProcess:
    port, grpc_port, conformance_port = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    settings = {"grpc_specialist_ports": json.dumps({"conformance": conformance_port}), **settings}
    # Its connections are named (libpq's PGAPPNAME; the listener names its own), so a test can find its backends.
    env = edge_env(database_url, specs_dir, **settings) | {"PGAPPNAME": edge_application_name(name)}
    role = Role(f"edge {name}", ops_cli("serve", "--port", str(port), "--grpc-port", str(grpc_port)),
                env, Ready.http(f"{url}/readyz"), log_dir / f"{name}.log",
                bounds=STARTUP_BOUNDS, stop_grace_s=15)
    return EdgeProcess(url=url, role=role.run(), grpc_address=f"127.0.0.1:{grpc_port}",
                       conformance_grpc_address=f"127.0.0.1:{conformance_port}")


def stop_edge(edge: EdgeProcess) -> None:
    edge.role.stop()


@pytest.fixture(scope="session")
def edge_specs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("specs")
    shutil.copy(PROJECT_ROOT / "specs" / "conformance.yaml", folder / "conformance.yaml")
    (folder / f"{PAID}.yaml").write_text(PAID_SPEC)
    return folder


@pytest.fixture(scope="session")
def edge_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("edge-logs")


# What `serve` needs to run a worker and a dispatcher beside the edge (production mode: DATABASE_URL is set,
# so nothing is generated), with a short lease so that a cancel reaches the worker quickly.
WHOLE_SYSTEM = dict(
    serve_worker="true",
    serve_dispatcher="true",
    worker_job_secrets="edge-tests-worker-secret-" + "w" * 40,
    specialist_checkpoint_key="edge-tests-checkpoint-key-" + "k" * 40,  # serve refuses a worker with rlm specs without
    worker_lease_s="3",
    worker_heartbeat_s="0.5",
    worker_cancel_grace_s="1",
    worker_drain_s="1",
    dispatch_poll_interval_s="0.5",
    # The worker child imports the whole worker before it answers: at load 14 on 2 cores that took two minutes,
    # over the default 30 s. Like STARTUP_TIMEOUT_S, generous: only "never" is a failure.
    serve_child_start_timeout_s=str(int(STARTUP_TIMEOUT_S)),
)


@pytest.fixture(scope="session")
def edge_a(database_url: str, edge_specs_dir: Path, edge_logs: Path) -> Iterator[EdgeProcess]:
    edge = start_edge(database_url, edge_specs_dir, edge_logs, "a", worker_port=str(free_port()), **WHOLE_SYSTEM)
    yield edge
    stop_edge(edge)


@pytest.fixture(scope="session")
def edge_b(database_url: str, edge_specs_dir: Path, edge_logs: Path, edge_a: EdgeProcess) -> Iterator[EdgeProcess]:
    # The second instance of edge_a's system: its tasks run on the worker and dispatcher edge_a serves beside it.
    # Without edge_a a test on edge_b alone waited for a worker that only an earlier test file had started.
    # DEBUG on purpose: the a2a-sdk logs call contexts and bodies at DEBUG, and keys must still not appear.
    edge = start_edge(database_url, edge_specs_dir, edge_logs, "b", log_level="DEBUG")
    yield edge
    stop_edge(edge)


@pytest.fixture(scope="session")
def edge_alone(database_url: str, edge_specs_dir: Path, edge_logs: Path) -> Iterator[EdgeProcess]:
    """An edge with no worker beside it: one process, quick to start; its tasks wait, unclaimed (what tests of
    the wire alone need: ids, error forms, refusals)."""
    edge = start_edge(database_url, edge_specs_dir, edge_logs, "alone")
    yield edge
    stop_edge(edge)


@pytest.fixture(scope="session")
def strict_edge(database_url: str, edge_specs_dir: Path, edge_logs: Path) -> Iterator[EdgeProcess]:
    edge = start_edge(
        database_url,
        edge_specs_dir,
        edge_logs,
        "strict",
        rate_limit_window_s="3600",
        rate_limit_per_key="4",
        rate_limit_anonymous_per_address="1000",
        anonymous_free_skills="true",
        max_request_body_bytes="4096",
        max_open_streams="2",
    )
    yield edge
    stop_edge(edge)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Customer:
    customer_id: str
    key_id: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "A2A-Version": "1.0"}


@pytest.fixture(scope="session")
def signer() -> keys.KeySigner:
    return keys.KeySigner([TEST_SECRET], "test")


@pytest.fixture(scope="session")
def ledger(engine: Engine) -> Ledger:
    return Ledger(engine)


@pytest.fixture
def make_customer(engine: Engine, signer: keys.KeySigner, ledger: Ledger):
    """A new customer with a key; ``credits`` > 0 also grants the paid specialist."""

    def make(credits: int = 0, *, max_parallel: int | None = None, entitled: bool = True) -> Customer:
        customer_id = f"c-{uuid.uuid4().hex[:12]}"
        issued = keys.issue_key(engine, signer, customer_id=customer_id, ttl=timedelta(days=1))
        if credits:
            ledger.grant(
                customer_id,
                credits,
                operator="tests",
                skills=[PAID] if entitled else [],
                max_parallel=max_parallel,
                reason="test grant",
            )
        return Customer(customer_id=customer_id, key_id=issued.identity.key_id, key=issued.token)

    return make


def footprint(engine: Engine, customer_id: str) -> dict[str, int]:
    """What a customer's requests left behind: tasks, outbox rows, idempotency records, reservations."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM edge_tasks WHERE customer_id = :c) AS tasks, "
                "(SELECT count(*) FROM tasks WHERE owner LIKE :o) AS task_rows, "
                "(SELECT count(*) FROM dispatch_outbox WHERE owner LIKE :o) AS outbox, "
                "(SELECT count(*) FROM edge_messages WHERE customer_key = :c) AS messages, "
                "(SELECT count(*) FROM ledger_reservations WHERE customer_id = :c) AS reservations"
            ),
            {"c": customer_id, "o": f"{customer_id}:%"},
        ).one()
    return dict(row._mapping)


NOTHING = {"tasks": 0, "task_rows": 0, "outbox": 0, "messages": 0, "reservations": 0}


def message(message_id: str | None = None, text: str = "hello", **extra: object) -> dict:
    """An A2A 1.0 SendMessageRequest body (HTTP+JSON form; JSON-RPC params are the same)."""
    body: dict = {
        "message": {
            "messageId": message_id or f"m-{uuid.uuid4()}",
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        }
    }
    for key, value in extra.items():
        if key in ("metadata", "taskId", "contextId"):
            body["message"][key] = value
        else:
            body.setdefault("configuration", {})[key] = value
    return body


def rpc(method: str, params: dict, request_id: int | str = 1) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
