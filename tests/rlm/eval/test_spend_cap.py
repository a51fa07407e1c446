"""The spend cap: a paid condition is refused without one (before anything is written or called), a
model the cap cannot price is refused, and a spent cap stops the experiment before the next attempt,
through the library's own budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmfamily.budget import BudgetLedger
from rlmfamily.cli import main
from rlmfamily.eval.report import build_report

pytestmark = pytest.mark.timeout(60)

PRICED = """
[conditions.priced]
provider = "scripted"
script = "oracle"
model = "priced-scripted"
prices_usd_per_mtok = { "priced-scripted" = { prompt = 1000.0, completion = 1000.0 } }

[conditions.unpriced]
provider = "openai"
model = "a-model-nobody-prices"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "EVAL_TEST_KEY"
"""


@pytest.fixture
def conditions_file(tmp_path: Path) -> Path:
    path = tmp_path / "conditions.toml"
    path.write_text(PRICED)
    return path


def test_a_paid_condition_without_a_cap_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    results = tmp_path / "results"
    code = main(["eval", "run", "pilot", "--conditions", "oracle-python,gpt-python", "--results", str(results)])
    assert code == 2 and not results.exists()
    err = capsys.readouterr().err
    assert "[eval_spend_cap_required]" in err and "gpt-python" in err and "--max-usd" in err


def test_a_paid_model_without_a_price_is_refused(tmp_path: Path, conditions_file: Path, capsys,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVAL_TEST_KEY", "not-a-real-key")
    results = tmp_path / "results"
    code = main(["eval", "run", "pilot", "--conditions-file", str(conditions_file), "--conditions", "unpriced",
                 "--max-usd", "1", "--results", str(results)])
    assert code == 2 and not results.exists()
    assert "has no price, so the spend cap cannot count its calls" in capsys.readouterr().err


def test_a_spent_cap_stops_the_experiment_before_the_next_attempt(tmp_path: Path, conditions_file: Path,
                                                                  capsys) -> None:
    results = tmp_path / "results"
    code = main(["eval", "run", "pilot", "--conditions-file", str(conditions_file), "--conditions", "priced",
                 "--tasks", "analyst-503-count,review-sql-injection", "--max-usd", "2.5", "--results", str(results)])
    assert code == 1
    err = capsys.readouterr().err
    assert "stopped before review-sql-injection__priced__r1: the experiment's spend cap refused it" in err
    (record_file,) = (results / "attempts").glob("*.json")
    record = json.loads(record_file.read_text())
    # Every call was admitted against what was left of the cap before it was made; the run stopped when the
    # cap was spent, and asked for its answer once (the final request, which a run always keeps).
    assert record["stop_reason"] == "budget_exhausted" and record["cut_by_spend_cap"]
    assert record["usage"]["cost_usd"] > 2.5 and record["cost_basis"].startswith("scripted: price table rates")
    (entry,) = BudgetLedger(results / "budget.sqlite3").entries("experiment")
    assert entry.state == "settled" and entry.cost_usd == pytest.approx(record["usage"]["cost_usd"])
    report = build_report(results)
    assert report["excluded_cut_by_spend_cap"] == ["analyst-503-count__priced__r1"]
    assert report["conditions"][0]["attempts"] == 0 and any("spend cap" in n for n in report["notes"])
    # Running it again with the same cap admits nothing more.
    assert main(["eval", "run", "pilot", "--conditions-file", str(conditions_file), "--conditions", "priced",
                 "--tasks", "analyst-503-count,review-sql-injection", "--max-usd", "2.5", "--results",
                 str(results)]) == 1
    assert len(list((results / "attempts").glob("*.json"))) == 1
    capsys.readouterr()

    # The stop message says to raise --max-usd: the same experiment continues under the higher cap, recorded.
    assert main(["eval", "run", "pilot", "--conditions-file", str(conditions_file), "--conditions", "priced",
                 "--tasks", "analyst-503-count,review-sql-injection", "--max-usd", "100", "--results",
                 str(results)]) == 0
    assert "the spend cap is raised from $2.5 to $100" in capsys.readouterr().err
    assert len(list((results / "attempts").glob("*.json"))) == 2
    manifest = json.loads((results / "experiment.json").read_text())
    assert manifest["max_usd"] == 100 and [(r["from"], r["to"]) for r in manifest["max_usd_raised"]] == [(2.5, 100)]
    assert BudgetLedger(results / "budget.sqlite3").limits("experiment").max_usd == 100
    assert any("raised from $2.5 to $100" in n for n in build_report(results)["notes"])
    # A lower cap is no way to continue it.
    assert main(["eval", "run", "pilot", "--conditions-file", str(conditions_file), "--conditions", "priced",
                 "--tasks", "analyst-503-count,review-sql-injection", "--max-usd", "50", "--results",
                 str(results)]) == 2
    assert "[budget_limits_mismatch]" in capsys.readouterr().err

