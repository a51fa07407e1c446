"""PORT, as Cloud Run sets it, is honoured by the image's entry point (ops/entrypoint.py), role by role.

The entry point runs here as the container would run it (`python -m ops.entrypoint <role>`), starting
the real service against this run's database.
"""

from __future__ import annotations

import httpx
import pytest

from tests import http_calls
from tests.app.conftest import WHOLE_SYSTEM
from tests.conftest import TEST_SECRET
from tests.deploy.roles import clean_environment, free_port, run_role, start_role

pytestmark = pytest.mark.timeout(240, func_only=True)

WORKER_SECRET = WHOLE_SYSTEM["worker_job_secrets"]


def refused(url: str) -> bool:
    """Nothing listens there: the connection is refused (a slow answer is an answer, not a refusal)."""
    try:
        http_calls.get(url)
    except httpx.ConnectError:
        return True
    return False


def test_the_edge_and_the_worker_listen_on_the_port_cloud_run_gives_their_container(api_from_terraform, worker_from_terraform):
    # Both were started with PORT only (no SPECIALISTS_*_PORT: infra/ sets none, test_infra checks it).
    assert http_calls.get(f"{api_from_terraform.url}/healthz").json()["status"] == "alive"
    assert http_calls.get(f"{worker_from_terraform.url}/healthz").json()["status"] == "ok"


def test_the_console_listens_on_the_port_cloud_run_gives_its_container(console_from_terraform):
    # Started with PORT only, as the edge and the worker: infra/console.tf sets no SPECIALISTS_CONSOLE_PORT.
    assert http_calls.get(f"{console_from_terraform.url}/healthz").status_code == 200


def test_a_roles_own_port_setting_wins_over_port(database_url, tmp_path):
    port, own_port = free_port(), free_port()
    env = clean_environment(
        DATABASE_URL=database_url,
        PORT=str(port),
        SPECIALISTS_WORKER_PORT=str(own_port),
        SPECIALISTS_WORKER_JOB_SECRETS=WORKER_SECRET,
        SPECIALISTS_WORKER_OIDC_VERIFY="false",
    )
    worker = start_role(["worker"], env, tmp_path / "worker.log", port=own_port)
    try:
        assert refused(f"http://127.0.0.1:{port}/healthz")
    finally:
        worker.stop()


def test_serve_gives_port_to_the_edge_and_keeps_its_own_worker_on_the_workers_setting(database_url, tmp_path):
    port, worker_port = free_port(), free_port()
    env = clean_environment(
        DATABASE_URL=database_url,
        PORT=str(port),
        SPECIALISTS_WORKER_PORT=str(worker_port),
        SPECIALISTS_KEY_SIGNING_SECRETS=TEST_SECRET,
        SPECIALISTS_WORKER_JOB_SECRETS=WORKER_SECRET,
        SPECIALISTS_SPECIALIST_CHECKPOINT_KEY="entrypoint-test-checkpoint-key-" + "k" * 40,
        SPECIALISTS_SERVE_WORKER="true",
        SPECIALISTS_SERVE_DISPATCHER="true",
        SPECIALISTS_WORKER_DRAIN_S="1",
    )
    service = start_role(["serve"], env, tmp_path / "serve.log", port=port, ready_path="/readyz")
    try:
        assert http_calls.get(f"http://127.0.0.1:{worker_port}/healthz").json()["status"] == "ok"
    finally:
        service.stop()
    assert service.process.returncode == 0, service.log_text()


def test_roles_that_listen_on_nothing_run_unchanged_with_port_set(database_url, tmp_path):
    env = clean_environment(DATABASE_URL=database_url, PORT=str(free_port()))
    done = run_role(["db", "status", "--json"], env, tmp_path / "status.log")
    assert done.returncode == 0, (tmp_path / "status.log").read_text()
    assert '"at_head": true' in (tmp_path / "status.log").read_text()
