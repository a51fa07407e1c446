"""A hosted condition goes through the real service: `specialists serve` on one machine (scripted demo
routes, no model), the a2a-sdk client with a customer's key; each record keeps the ledger's charge
beside the model's usage from the operator's usage record, and the same graders judge the findings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import PROJECT_ROOT
from rlmfamily.cli import main
from rlmfamily.eval.report import build_report
from tests.serve import running_service

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def specialists(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "ops.cli", *args], env=env, cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_a_hosted_condition_records_the_ledger_charge_beside_the_model_usage(
        server_url, engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.dispose()  # the session engine's idle connections back to the server
    with running_service(server_url, tmp_path) as service:
        env = service.env
        specialists(env, "customers", "add", "--customer", "evalco")
        specialists(env, "credits", "grant", "--customer", "evalco", "--credits", "100", "--skill", "review")
        token = json.loads(specialists(env, "keys", "issue", "--customer", "evalco", "--json").stdout)["key"]
        conditions = tmp_path / "hosted.toml"
        usage_command = [sys.executable, "-m", "ops.cli", "usage", "--json", "--job", "{task_id}"]
        conditions.write_text(
            f'[conditions.hosted-reviewer]\nprovider = "hosted"\nurl = "{service.base_url}"\nspecialist = "reviewer"\n'
            f'api_key_env = "EVAL_CUSTOMER_KEY"\nusage_command = {json.dumps(usage_command)}\ndeadline_s = 120\n')
        monkeypatch.setenv("EVAL_CUSTOMER_KEY", token)
        for name, value in env.items():  # the operator's usage command reads the service's database
            if name.startswith("SPECIALISTS_") or name == "DATABASE_URL":
                monkeypatch.setenv(name, value)
        monkeypatch.chdir(PROJECT_ROOT)
        results = tmp_path / "results"
        assert main(["eval", "run", "pilot", "--conditions-file", str(conditions), "--conditions", "hosted-reviewer",
                     "--tasks", "review-sql-injection,review-path-traversal", "--max-usd", "1", "--results",
                     str(results)]) == 0
        # An attempt whose record is lost (the runner killed after the send) sends the same message again:
        # the service answers with the first task, charged once.
        first = results / "attempts" / "review-sql-injection__hosted-reviewer__r1.json"
        before = json.loads(first.read_text())
        first.unlink()
        assert main(["eval", "run", "pilot", "--conditions-file", str(conditions), "--conditions", "hosted-reviewer",
                     "--tasks", "review-sql-injection,review-path-traversal", "--max-usd", "1", "--results",
                     str(results)]) == 0
        jobs = json.loads(specialists(env, "usage", "--json").stdout)["jobs"]
    found = json.loads(first.read_text())
    assert found["try"] == "try-2" and found["hosted"]["task_id"] == before["hosted"]["task_id"]
    assert found["hosted"]["message_id"] == before["hosted"]["message_id"]
    assert len(jobs) == 2  # one job per task: the resend ran nothing
    missed = json.loads((results / "attempts" / "review-path-traversal__hosted-reviewer__r1.json").read_text())
    # The scripted route finds the f-string SQL at its line, and nothing in the path traversal bundle.
    assert found["accepted"] and found["grade"]["recall"] == 1.0
    assert not missed["accepted"] and missed["grade"]["missed"] == ["path-traversal"]
    hosted = found["hosted"]
    assert hosted["state"] == "TASK_STATE_COMPLETED" and hosted["pricing"] == "metered"
    assert (hosted["semantic_calls_charged"], hosted["credits_charged"]) == (1, 5)  # 4 + 1 answered call
    assert missed["hosted"]["credits_charged"] == 4
    usage = found["usage"]
    assert usage["source"] == "the service's usage record (usage_command)" and usage["jobs"]
    assert usage["calls"] == 4 and usage["unknown_usage_calls"] == 0 and usage["input_tokens"] > 0
    assert found["cost_basis"].startswith("the service's usage record")
    report = build_report(results)
    assert not report["offline"] and report["conditions"][0]["accepted"] == 1
