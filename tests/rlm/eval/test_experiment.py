"""A complete offline experiment: two conditions (known-good and known-bad scripted models), two
repeats, a small subset of the pilot pack; its records, its report (table, JSON, HTML) and its numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlmfamily.cli import main
from rlmfamily.eval.conditions import choose, parse_conditions
from rlmfamily.eval.errors import ResultsMismatch
from rlmfamily.eval.pack import load_pack
from rlmfamily.eval.report import OFFLINE_NOTICE, build_report, render_html
from rlmfamily.eval.runner import Experiment

pytestmark = pytest.mark.timeout(120)

TASKS = ["fix-pagination", "review-two-defects"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("eval") / "results"
    code = main(["eval", "run", "pilot", "--conditions", "oracle-python,noop", "--repeats", "2", "--tasks",
                 ",".join(TASKS), "--results", str(folder), "--quiet"])
    assert code == 0
    return folder


def test_every_attempt_has_one_record_with_its_usage_and_grade(results: Path) -> None:
    records = {p.stem: json.loads(p.read_text()) for p in (results / "attempts").glob("*.json")}
    assert sorted(records) == sorted(f"{t}__{c}__r{r}" for t in TASKS for c in ("oracle-python", "noop")
                                     for r in (1, 2))
    good = records["fix-pagination__oracle-python__r1"]
    assert good["accepted"] and good["score"] == 1.0 and good["stop_reason"] == "answered"
    assert good["grade"]["tests_passed"] == 3 and good["grade"]["restored"] == ["test_pages.py"]
    usage = good["usage"]
    assert usage["calls"] == usage["root_calls"] == 2 and usage["unknown_usage_calls"] == 0
    assert usage["input_tokens"] > 0 and usage["cost_usd"] == 0.0
    assert usage["reasoning_tokens"] is None and usage["cached_input_tokens"] is None  # not reported: unknown
    assert good["cost_basis"] == "scripted: no cost (0 USD)" and good["tokens_basis"].startswith("scripted estimate")
    review = records["review-two-defects__oracle-python__r2"]
    assert review["accepted"] and review["semantic_queries"] == 1 and review["usage"]["subcalls"] == 1
    bad = records["fix-pagination__noop__r2"]
    assert not bad["accepted"] and bad["score"] == pytest.approx(1 / 3)  # partial credit apart from acceptance
    assert good["input_digest"] == bad["input_digest"]  # the same pinned input


def test_the_report_compares_the_conditions_on_matched_repeats(results: Path) -> None:
    report = build_report(results)
    assert report["offline"] and report["notes"][0] == OFFLINE_NOTICE
    assert (report["planned"], report["recorded"]) == (8, 8)
    oracle, noop = report["conditions"]
    assert (oracle["condition"], oracle["attempts"], oracle["accepted"], oracle["pass_rate"]) == ("oracle-python", 4, 4, 1.0)
    assert oracle["usd"] == 0.0 and oracle["usd_per_accepted"] == 0.0
    assert (noop["accepted"], noop["pass_rate"], noop["usd_per_accepted"]) == (0, 0.0, None)
    assert noop["mean_score"] == pytest.approx((1 / 3 + 1 / 3 + 0 + 0) / 4)
    (pair,) = report["pairs"]
    assert (pair["a"], pair["b"], pair["tasks_compared"]) == ("oracle-python", "noop", 2)
    assert pair["accepted_diff"] == -1.0 and pair["interval"] == [-1.0, -1.0]
    assert [(t["task"], t["n"], t["accepted_diff"]) for t in pair["per_task"]] == [
        ("fix-pagination", 2, -1.0), ("review-two-defects", 2, -1.0)]
    assert build_report(results) == report  # the bootstrap is seeded


def test_report_prints_a_table_writes_json_and_a_self_contained_page(results: Path, capsys, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "report.html"
    assert main(["eval", "report", str(results), "--json", "--html", str(page)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pairs"][0]["accepted_diff"] == -1.0
    text = page.read_text()
    assert "default-src 'none'" in text and "<script" not in text and "http" not in text.replace(
        "http-equiv", "").replace("http://www.w3.org/2000/svg", "")
    assert text.count("<div class='task'>") == 2 and "measure the runner&#x27;s plumbing" in text and "not model quality" in text
    monkeypatch.delenv("COLUMNS", raising=False)  # piped: whole rows, to compare with the page's
    assert main(["eval", "report", str(results)]) == 0
    table = capsys.readouterr().out
    assert "noop minus oracle-python" in table and "Offline experiment" in table
    # The page's conditions table is the command's: the same columns, tokens and errors too, and the same cells.
    [cli_row] = [line for line in table.splitlines() if line.startswith("│ oracle-python ")]
    [page_row] = re.findall(r"<tr><td>oracle-python</td>.*?</tr>", text)
    assert [c.strip() for c in cli_row.split("│")[1:-1]] == re.findall(r"<td>([^<]*)</td>", page_row)
    headers = re.findall(r"<th>([^<]*)</th>", text)
    assert "tokens in/out" in headers and headers[-1] == "errors"


def test_the_same_run_again_redoes_nothing_and_another_experiment_is_refused(results: Path) -> None:
    pack = load_pack("pilot").select(TASKS)
    conditions = choose(parse_conditions(pack.conditions, source="pack.toml"), ["oracle-python", "noop"])
    before = sorted(p.stat().st_mtime_ns for p in (results / "attempts").glob("*.json"))
    summary = Experiment(pack, conditions, repeats=2, results=results, max_usd=None).run()
    assert (summary.ran, summary.skipped, summary.stopped) == (0, 8, None)
    assert sorted(p.stat().st_mtime_ns for p in (results / "attempts").glob("*.json")) == before
    with pytest.raises(ResultsMismatch, match="repeats differ"):
        Experiment(pack, conditions, repeats=3, results=results, max_usd=None).run()


def test_tasks_lists_the_pack_and_says_which_conditions_are_paid(capsys) -> None:
    assert main(["eval", "tasks", "pilot", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert len(listing["tasks"]) == 28 and {t["evaluator"] for t in listing["tasks"]} == {"tests", "findings", "answer"}
    assert {n: c["paid"] for n, c in listing["conditions"].items()} == {
        "oracle-python": False, "oracle-bash": False, "oracle-container": False, "noop": False, "gpt-python": True,
        "gpt-bash": True}


def test_a_tag_no_task_has_is_refused_naming_the_tags_there_are(tmp_path: Path, capsys) -> None:
    assert main(["eval", "run", "pilot", "--conditions", "noop", "--tag", "nope", "--results", str(tmp_path / "r")]) == 2
    assert "no task of pack pilot has the tag(s) nope; its tags are analyst, bug-from-log" in capsys.readouterr().err
