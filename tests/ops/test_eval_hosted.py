"""A hosted condition goes through the real service: `specialists serve` on one machine (scripted demo
routes, no model), the a2a-sdk client with a customer's key; each record keeps the ledger's charge
beside the model's usage from the operator's usage record, and the same graders judge the findings."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from core.db import make_engine
from core.settings import PROJECT_ROOT
from ledger import keys
from ledger.client import Ledger
from rlmfamily.cli import main
from rlmfamily.eval.report import build_report
from tests.app.conftest import TEST_SECRET
from tests.serve import running_service

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_a_hosted_condition_records_the_ledger_charge_beside_the_model_usage(
        server_url, engine, settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.dispose()  # the session engine's idle connections back to the server
    with running_service(server_url, tmp_path) as service:
        env = service.env
        customer = Ledger(make_engine(env["DATABASE_URL"], settings))  # the operator's grant, in process
        issued = keys.issue_key(customer.engine, keys.KeySigner([TEST_SECRET], "test"), customer_id="evalco",
                                ttl=timedelta(days=1))
        customer.grant("evalco", 100, operator="tests", skills=["reviewer"], reason="the hosted condition's test")
        token = issued.token
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
        customer.engine.dispose()
    found = json.loads(first.read_text())
    assert found["try"] == "try-2" and found["hosted"]["task_id"] == before["hosted"]["task_id"]
    assert found["hosted"]["message_id"] == before["hosted"]["message_id"]
    assert found["usage"]["jobs"] == before["usage"]["jobs"] and len(found["usage"]["jobs"]) == 1  # nothing ran again
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
