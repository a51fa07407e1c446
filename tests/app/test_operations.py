"""Operating the edge: `specialists serve`, health and readiness, metrics, JSON logs with request ids, no keys in logs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from core.settings import PROJECT_ROOT
from tests import http_calls
from tests.app.conftest import PAID, edge_env, message, rpc, start_edge, stop_edge
from tests.conftest import empty_database

pytestmark = pytest.mark.timeout(60, func_only=True)


def test_healthz_says_alive(edge_a):
    answer = http_calls.get(f"{edge_a.url}/healthz")
    assert answer.status_code == 200 and answer.json() == {"status": "alive"}


def test_readyz_checks_the_database_and_the_schema(edge_a):
    from core import db

    answer = http_calls.get(f"{edge_a.url}/readyz")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ready", "schema": db.head_revision()}


def test_metrics_count_requests_and_admissions_in_prometheus_format(edge_a, make_customer):
    customer = make_customer()
    http_calls.post(
        f"{edge_a.specialist('conformance')}/message:send",
        json=message(f"tck-complete-task-{uuid.uuid4()}"),
        headers=customer.headers,
    )
    answer = http_calls.get(f"{edge_a.url}/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    body = answer.text
    assert 'edge_http_requests_total{operation="http_json",status="200"}' in body
    assert 'edge_admissions_total{outcome="admitted",specialist="conformance"}' in body


def test_every_response_carries_a_request_id_that_the_json_log_line_repeats(edge_a, make_customer):
    customer = make_customer()
    mine = f"req-{uuid.uuid4().hex[:12]}"
    answer = http_calls.get(
        f"{edge_a.specialist('conformance')}/tasks", headers={**customer.headers, "X-Request-Id": mine}
    )
    assert answer.headers["x-request-id"] == mine
    generated = http_calls.get(f"{edge_a.url}/healthz").headers["x-request-id"]
    assert len(generated) == 32
    lines = [json.loads(line) for line in edge_a.log_text().splitlines() if line.startswith("{")]
    access = [line for line in lines if line.get("request_id") == mine]
    assert access and access[-1]["event"] == "http_request" and access[-1]["status"] == 200
    assert access[-1]["customer_id"] == customer.customer_id
    assert access[-1]["severity"] == "INFO"  # Cloud Logging takes the line's severity from this field


def test_the_access_line_of_a_request_about_a_task_carries_its_task_id(edge_a, make_customer):
    # Issue 42: docs/OPERATIONS.md says `jsonPayload.task_id="<id>"` finds the edge's line; it had no task_id.
    customer = make_customer()
    base = edge_a.specialist("conformance")
    sent_id, read_id, rpc_id = (f"req-{uuid.uuid4().hex[:12]}" for _ in range(3))
    task = http_calls.post(f"{base}/message:send", json=message(f"tck-complete-task-{uuid.uuid4()}"),
                           headers={**customer.headers, "X-Request-Id": sent_id}).json()["task"]
    http_calls.get(f"{base}/tasks/{task['id']}", headers={**customer.headers, "X-Request-Id": read_id})
    http_calls.post(f"{base}/jsonrpc", json=rpc("GetTask", {"id": task["id"]}),
                    headers={**customer.headers, "X-Request-Id": rpc_id})

    def access_lines() -> dict[str, dict]:  # written as each response ends: waited for, not assumed
        lines = [json.loads(line) for line in edge_a.log_text().splitlines() if line.startswith("{")]
        return {line["request_id"]: line for line in lines if line.get("event") == "http_request"}

    deadline = time.monotonic() + 60
    while not {sent_id, read_id, rpc_id} <= access_lines().keys():
        assert time.monotonic() < deadline, "the edge never logged the three access lines"
        time.sleep(0.05)
    found = access_lines()
    assert [found[r].get("task_id") for r in (sent_id, read_id, rpc_id)] == [task["id"]] * 3, found


def test_keys_never_reach_the_logs_even_at_debug(edge_b, make_customer):
    customer = make_customer(credits=20)
    base = edge_b.specialist("conformance")
    with httpx.Client(headers=customer.headers, timeout=30) as http:
        task = http.post(f"{base}/message:send", json=message(f"tck-complete-task-{uuid.uuid4()}")).json()["task"]
        http.get(f"{base}/tasks/{task['id']}")
        http.post(f"{base}/jsonrpc", json=rpc("ListTasks", {}))
        http.post(f"{edge_b.specialist(PAID)}/message:send", json=message(returnImmediately=True))
        with http.stream("POST", f"{base}/message:stream", json=message(f"tck-stream-001-{uuid.uuid4()}")) as s:
            s.read()
    tampered = customer.key[:-3] + "xyz"
    http_calls.post(f"{base}/message:send", json=message(), headers={"Authorization": f"Bearer {tampered}"})
    log = edge_b.log_text()
    assert "DEBUG" in log  # the SDK's debug lines (call contexts, bodies) are there...
    secret_part = customer.key.split("_", 3)[3]
    for leaked in (customer.key, secret_part, secret_part.split(".")[0], tampered):
        assert leaked not in log  # ...without the key
    assert customer.customer_id in log


def run_serve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`specialists serve` refusing to start: a command that exits, not a role (ops/topology.py starts the roles)."""
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", "serve", *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        # A refusal is prompt on a quiet machine; at load 25 its imports alone took longer than 30 s. This bound is
        # only there so that a serve that does not refuse ends before the test's own timeout (300 s).
        timeout=240,
    )


def test_serve_refuses_to_start_on_an_invalid_spec_naming_file_and_field(database_url, tmp_path: Path):
    (tmp_path / "broken.yaml").write_text(
        "id: broken\nname: B\ndescription: d\nexecutor: rlm\ntariff_credits: -1\n"
        "skill: {id: s, name: S, description: d}\ninput_modes: [text/plain]\noutput_modes: [text/plain]\n"
    )
    done = run_serve(edge_env(database_url, tmp_path))
    assert done.returncode == 3
    assert "broken.yaml" in done.stderr and "tariff_credits" in done.stderr
    assert "greater than or equal to 0" in done.stderr


def test_serve_refuses_to_start_on_a_schema_that_is_not_at_head(server_url, edge_specs_dir):
    with empty_database(server_url, "specialists_edge_empty") as url:
        done = run_serve(edge_env(url, edge_specs_dir))
        assert done.returncode == 4
        assert "specialists db upgrade" in done.stderr


def test_serve_refuses_a_port_out_of_range(database_url, edge_specs_dir):
    done = run_serve(edge_env(database_url, edge_specs_dir), "--port", "0")
    assert done.returncode == 3
    assert "SPECIALISTS_EDGE_PORT" in done.stderr


def test_with_live_keys_serve_refuses_an_open_metrics_unless_opened_on_purpose(database_url, edge_specs_dir):
    # Issue 42: /metrics was open to anyone with live keys and no token.
    from app.assembly import EdgeNotConfigured, check_edge_settings
    from core.settings import Settings

    live = edge_env(database_url, edge_specs_dir, key_environment="live", push_allow_loopback="false")
    done = run_serve(live)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "edge_not_configured" in done.stderr and "SPECIALISTS_METRICS_TOKEN" in done.stderr
    assert "SPECIALISTS_METRICS_OPEN=true" in done.stderr
    with pytest.raises(EdgeNotConfigured):
        check_edge_settings(Settings(keys={"environment": "live"}))
    check_edge_settings(Settings(keys={"environment": "live"}, edge={"metrics_open": True}))  # on purpose
    check_edge_settings(Settings(keys={"environment": "test"}))  # one machine's test keys: open, as before


def test_metrics_answer_only_the_scraper_when_a_metrics_token_is_set(database_url, edge_specs_dir, tmp_path):
    token = "scraper-" + "s" * 32
    # Live keys with the scraper's token: the production shape, which starts.
    edge = start_edge(database_url, edge_specs_dir, tmp_path, "metrics-token", metrics_token=token,
                      key_environment="live", push_allow_loopback="false")
    try:
        anonymous = http_calls.get(f"{edge.url}/metrics")
        assert anonymous.status_code == 401 and anonymous.json()["code"] == "metrics_token_required"
        assert "SPECIALISTS_METRICS_TOKEN" in anonymous.json()["message"]
        assert http_calls.get(f"{edge.url}/metrics", headers={"Authorization": "Bearer " + token[:-1]}).status_code == 401
        scraped = http_calls.get(f"{edge.url}/metrics", headers={"Authorization": f"Bearer {token}"})
        assert scraped.status_code == 200 and "edge_http_requests_total" in scraped.text
        assert http_calls.get(f"{edge.url}/healthz").status_code == 200  # probes stay open
    finally:
        stop_edge(edge)
    assert token not in edge.log_text()
