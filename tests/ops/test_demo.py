"""The commands of the hosted specialists as an operator types them: `specialists demo` against a running
`specialists serve`, and `specialists usage`."""

from __future__ import annotations

import json
import subprocess

import pytest

from core.settings import PROJECT_ROOT
from tests import commands
from tests.app.conftest import edge_env, free_port
from tests.serve import running_service
from tests.workers.system import drop_database, fresh_database

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def specialists(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return commands.specialists(args, env)  # in this process (tests/commands.py)


def test_the_demo_reviews_the_example_project_through_the_running_service(server_url, engine, tmp_path):
    engine.dispose()  # the session engine's idle connections back to a server that allows 100
    with running_service(server_url, tmp_path) as service:
        env, base, log_path = service.env, service.base_url, service.log_path
        demo = specialists(env, "demo", "--url", base)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "shop/customers.py" in demo.stdout and "high" in demo.stdout  # the findings table
        assert "ledger movements of demo-" in demo.stdout and "settle" in demo.stdout
        assert "the reviewer's model route is scripted" in demo.stderr and "[working] Investigating" in demo.stderr

        as_json = json.loads(specialists(env, "demo", "--url", base, "--json").stdout)
        assert as_json["state"] == "TASK_STATE_COMPLETED"
        assert [(f["path"], f["line"]) for f in as_json["findings"]] == [("shop/customers.py", 8)]
        meta = as_json["specialist"]
        assert (meta["semanticCallsUsed"], meta["creditsCharged"]) == (1, 5)  # metered: 4 + 1 answered call
        assert meta["cpuSeconds"] > 0  # the job's processes' CPU, counted in its process (workers.cpu_share)
        entries = {(m["entry_id"], m["kind"]) for m in as_json["ledger"]}
        assert sorted(kind for _, kind in entries) == ["grant", "reserve", "settle"]  # one settlement
        charged = [m["credits"] for m in as_json["ledger"] if m["kind"] == "settle" and m["to_account"] == "revenue"]
        assert charged == [5]

        usage = json.loads(specialists(env, "usage", "--json").stdout)
        assert len(usage["jobs"]) == 2 and {j["specialist_id"] for j in usage["jobs"]} == {"reviewer"}
        job = usage["jobs"][0]
        assert (job["outcome"], job["semantic_calls_used"], job["charged_credits"]) == ("completed", 1, 5)
        assert job["cpu_seconds"] > 0
        one = specialists(env, "usage", "--job", job["job_id"])
        assert one.returncode == 0 and "model calls of" in one.stdout and "subcall" in one.stdout
        missing = specialists(env, "usage", "--job", "no-such-job", "--json")
        assert missing.returncode == 1 and json.loads(missing.stdout)["error"]["code"] == "job_not_found"
    assert "not ready" in log_path.read_text()


def test_the_demo_checks_the_service_first_and_grants_nothing_when_none_answers(server_url, engine):
    engine.dispose()  # the session engine's idle connections back to a server that allows 100
    url = fresh_database(server_url)  # of its own: nobody else adds customers to it
    try:
        env = edge_env(url, PROJECT_ROOT / "specs")
        done = specialists(env, "demo", "--url", f"http://127.0.0.1:{free_port()}")
        assert done.returncode == 1
        assert "demo_failed" in done.stderr and "is `specialists serve` running?" in done.stderr
        assert "Nothing was granted" in done.stderr
        listed = json.loads(specialists(env, "customers", "list", "--json").stdout)
        assert listed["customers"] == []  # no demo customer, no key, no credit
    finally:
        drop_database(server_url, url)


def test_the_readme_shows_the_demo_right_after_the_run_and_test_commands():
    blocks = (PROJECT_ROOT / "README.md").read_text().split("```")
    assert blocks[1].split()[:1] == ["./dev"] and "./dev test" in blocks[1]
    assert blocks[3].strip() == "./dev specialists demo"  # the next command block
