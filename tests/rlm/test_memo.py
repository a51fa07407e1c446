"""Memoised sub-calls: a family pays once for a sub-call it asks again, and says so in `rlm usage` and `rlm show`.

Runs are real (the scripted provider, real kernels, real child processes, the
installed console script); the memo is the real ``memo.sqlite3`` in the data dir.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.budget import Budget, BudgetLedger, BudgetLimits
from rlmfamily.context import Context
from rlmfamily.memo import MemoFile, MemoKey, SubcallMemo
from rlmfamily.providers import ScriptedProvider
from rlmfamily.providers.base import Usage
from rlmfamily.session import RunResult, Session
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import read_trajectory

from .family.support import child, run_root, script
from .test_cli import rlm

pytestmark = pytest.mark.timeout(120)

DOCUMENT = "Ferry log.\nMAX_CRATES = 40\nDOCK_TIMEOUT_S = 90\n"
CRATES_RULES = [{"pattern": r"MAX_CRATES = (\d+).*What is MAX_CRATES", "answer": r"\1"},
                {"pattern": r"DOCK_TIMEOUT_S = (\d+).*What is DOCK_TIMEOUT_S", "answer": r"\1"}]
ASK_TWICE = """
a = llm_query("What is MAX_CRATES?", context.read("ferry.txt"))
b = llm_query("What is MAX_CRATES?", context.read("ferry.txt"))
same = a.text == b.text and a.ok == b.ok and a.truncated == b.truncated and repr(a) == repr(b)
free = (b.usage.get("cached") is True and b.usage["cost_usd"] == 0 and b.usage["total_tokens"] == 0
        and a.usage.get("cached") is None and a.usage["total_tokens"] > 0)
final_answer(a.text + "/" + b.text + " same=" + str(same) + " free=" + str(free))
"""


def _cli_run(tmp_path: Path, code: str, *flags: str, env: dict[str, str] | None = None,
             script_extra: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    doc = tmp_path / "ferry.txt"
    doc.write_text(DOCUMENT)
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"root": [{"code": code}], "subcall": CRATES_RULES, **(script_extra or {})}))
    return rlm("run", "--document", str(doc), "--script", str(path), *flags, "how many crates?",
               data_dir=tmp_path / "data", env=env)


def _usage_json(tmp_path: Path, *args: str, data: Path | None = None) -> dict[str, Any]:
    listed = rlm("usage", "--json", *args, data_dir=data or tmp_path / "data")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def _subcall_entries(ledger: BudgetLedger, root_id: str) -> int:
    return sum(1 for e in ledger.entries(root_id) if e.purpose == "subcall")


def _session_run(settings: RLMSettings, tmp_path: Path, *codes: str) -> RunResult:
    doc = tmp_path / "ferry.txt"
    doc.write_text(DOCUMENT)
    provider = ScriptedProvider({"root": [{"code": c} for c in codes], "subcall": CRATES_RULES,
                                 "default_answer": "NONE"})
    return Session(context=Context.from_document(doc, settings), provider=provider, settings=settings).run("q")


def _subcall_events(result: RunResult) -> list[dict[str, Any]]:
    return [e for e in read_trajectory(result.trajectory_path) if e["event"] == "subcall"]


def test_the_same_subcall_asked_twice_is_paid_once_and_shown_as_cached(tmp_path: Path) -> None:
    run = _cli_run(tmp_path, ASK_TWICE, "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    # The model gets the answer as it first came, and its usage says it was cached, at no cost.
    assert result["answer"] == "40/40 same=True free=True"
    assert result["budget"]["calls"] == 2  # the root turn and one paid sub-call
    assert result["subcalls"] == 2 and result["subcalls_cached"] == 1
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "2 sub-calls (1 cached)" in _cli_run(plain, ASK_TWICE).stderr  # the summary line a person reads

    usage = _usage_json(tmp_path, "--run", "last")
    (root,) = usage["roots"]
    assert root["calls"] == 2 and root["cached"]["hits"] == 1
    assert root["cached"]["by_run"] == {result["run_id"]: {"hits": 1, "tokens_saved": root["cached"]["tokens_saved"],
                                                           "usd_saved": 0.0}}
    assert root["cached"]["tokens_saved"] > 0
    assert usage["totals"]["cached"] == 1 and usage["totals"]["calls"] == 2
    table = rlm("usage", data_dir=tmp_path / "data").stdout
    assert "cached" in table
    (row,) = [line for line in table.splitlines() if result["run_id"] in line]
    assert row.split("│")[6].strip() == "1"

    events = json.loads(rlm("show", "last", "--json", data_dir=tmp_path / "data").stdout)
    first, second = [e for e in events if e["event"] == "subcall"]
    assert not first["cached"] and first["budget_entry"] is not None
    assert second["cached"] and second["budget_entry"] is None and second["usage"] is None
    assert second["cached_from"] == {"run_id": result["run_id"], "budget_entry": first["budget_entry"]}
    assert events[-1]["subcalls_cached"] == 1
    shown = rlm("show", "last", data_dir=tmp_path / "data").stdout
    lines = [line for line in shown.splitlines() if "sub-call " in line and "[ok" in line]
    assert len(lines) == 2 and "cached" not in lines[0] and "[ok, cached, 0 tokens]" in lines[1]
    assert "2 sub-calls (1 cached)" in shown


def test_with_no_memoise_subcalls_the_same_subcall_is_paid_twice(tmp_path: Path) -> None:
    run = _cli_run(tmp_path, ASK_TWICE, "--json", "--no-memoise-subcalls")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["answer"] == "40/40 same=True free=False"
    (root,) = _usage_json(tmp_path)["roots"]
    assert root["calls"] == 3 and root["cached"]["hits"] == 0
    shown = rlm("show", "last", data_dir=tmp_path / "data").stdout
    assert "[ok, cached" not in shown and "(1 cached)" not in shown  # the code shown may say the word
    assert not (tmp_path / "data" / "memo.sqlite3").exists()


def test_the_setting_switches_memoisation_off_as_the_flag_does(tmp_path: Path) -> None:
    run = _cli_run(tmp_path, ASK_TWICE, "--json", env={"RLM_MEMOISE_SUBCALLS": "false"})
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["budget"]["calls"] == 3


def test_another_context_or_another_model_is_not_answered_from_the_memo(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    result = _session_run(settings, tmp_path, """
a = llm_query("What is MAX_CRATES?", "MAX_CRATES = 40")
b = llm_query("What is MAX_CRATES?", "MAX_CRATES = 40 ")
c = llm_query("What is MAX_CRATES?", "MAX_CRATES = 40", model="other-model")
d = llm_query("What is MAX_CRATES?", "MAX_CRATES = 40")
final_answer([a.text, b.text, c.text, d.text])
""")
    assert result.stop_reason == "answered", result.error
    assert [e["cached"] for e in _subcall_events(result)] == [False, False, False, True]
    assert _subcall_entries(BudgetLedger(settings.budget_path), result.run_id) == 3


def test_a_failed_subcall_is_not_kept_and_is_asked_again(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    failing = ScriptedProvider({"root": [{"code": 'final_answer(str(llm_query("q", "x").ok) + str(llm_query("q", "x").ok))'}],
                                "subcall": [{"pattern": "q", "error": "overloaded"}]})
    doc = tmp_path / "ferry.txt"
    doc.write_text(DOCUMENT)
    run = Session(context=Context.from_document(doc, settings), provider=failing, settings=settings).run("q")
    assert run.answer == "FalseFalse"
    assert [e["cached"] for e in _subcall_events(run)] == [False, False]
    assert _subcall_entries(BudgetLedger(settings.budget_path), run.run_id) == 2


def test_the_memo_keeps_at_most_the_bound_per_family_dropping_the_least_recently_used(make_settings,
                                                                                     tmp_path: Path) -> None:
    settings = make_settings(max_memoised_subcalls=2)
    result = _session_run(settings, tmp_path, """
ask = lambda q: llm_query(q, "MAX_CRATES = 40").text
ask("What is MAX_CRATES? (a)")
ask("What is MAX_CRATES? (b)")
ask("What is MAX_CRATES? (b)")
ask("What is MAX_CRATES? (c)")
ask("What is MAX_CRATES? (a)")
ask("What is MAX_CRATES? (c)")
final_answer("done")
""")
    assert result.stop_reason == "answered", result.error
    # a, b paid; b cached (now the most recent); c paid and a dropped; a paid again (b dropped); c cached.
    assert [e["cached"] for e in _subcall_events(result)] == [False, False, True, False, False, True]
    assert _subcall_entries(BudgetLedger(settings.budget_path), result.run_id) == 4
    assert MemoFile(settings.memo_path).entries(result.run_id) == 2


def test_a_child_asking_what_its_parent_asked_is_answered_from_the_memo(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    ask = 'llm_query("What is MAX_CRATES?", context.read("ferry.txt"))'
    root = f"""
first = {ask}
h = rlm.run("audit crates")
final_answer(first.text + "/" + h.wait(50)["answer"])
"""
    result = run_root(settings, tmp_path, script([root], [child("audit crates", f"final_answer({ask}.text)")],
                                                 subcall=CRATES_RULES))
    assert result.stop_reason == "answered", result.error
    assert result.answer == "40/40"
    child_id = f"{result.run_id}.c1"
    (asked,) = [e for e in read_trajectory(settings.runs_dir / child_id / "trajectory.jsonl")
                if e["event"] == "subcall"]
    (paid,) = _subcall_events(result)
    assert asked["cached"] and asked["cached_from"] == {"run_id": result.run_id, "budget_entry": paid["budget_entry"]}
    assert _subcall_entries(BudgetLedger(settings.budget_path), result.run_id) == 1  # the family paid once
    usage = _usage_json(tmp_path, "--run", child_id, data=settings.data_dir)["roots"][0]["cached"]
    assert usage["hits"] == 1 and list(usage["by_run"]) == [child_id]


def test_families_do_not_share_answers(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    code = 'final_answer(llm_query("What is MAX_CRATES?", "MAX_CRATES = 40").text)'
    first, second = _session_run(settings, tmp_path, code), _session_run(settings, tmp_path, code)
    assert [e["cached"] for e in _subcall_events(first) + _subcall_events(second)] == [False, False]


WRITER = """
import sys
from rlmfamily.memo import MemoFile, MemoKey, SubcallMemo
path, family, writer, count, bound = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
memo = SubcallMemo(MemoFile(path), root_id=family, run_id=writer, max_entries=bound)
shared = MemoKey.of("m", [{"role": "user", "content": "shared"}], "")
assert memo.store(shared, response="shared answer from " + writer, model="m", usage=None, budget_entry=None)
for i in range(count):
    key = MemoKey.of("m", [{"role": "user", "content": f"{writer} {i}"}], "")
    assert memo.store(key, response=f"answer {writer} {i}", model="m", usage={"total_tokens": 3}, budget_entry=i)
    if bound > 1000:  # nothing is dropped: every answer stored is found again
        assert memo.lookup(key).response == f"answer {writer} {i}"
"""


def _writers(path: Path, family: str, bound: int, *, writers: int = 4, count: int = 40) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), family, f"w{n}", str(count), str(bound)],
                              stderr=subprocess.PIPE, text=True) for n in range(writers)]
    for proc in procs:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err


def test_processes_of_one_family_share_the_memo_file_safely(tmp_path: Path) -> None:
    path = tmp_path / "memo.sqlite3"
    _writers(path, "family", bound=100_000)
    file = MemoFile(path)
    assert file.entries("family") == 4 * 40 + 1  # one shared answer: the first writer's stays
    reader = SubcallMemo(file, root_id="family", run_id="reader", max_entries=100_000)
    hit = reader.lookup(MemoKey.of("m", [{"role": "user", "content": "shared"}], ""))
    assert hit is not None and hit.response.startswith("shared answer from w")
    assert file.usage("family").by_run["reader"]["hits"] == 1
    # Writers dropping each other's answers at the bound never leave the family over it.
    _writers(path, "bounded", bound=25)
    assert file.entries("bounded") == 25


def test_a_final_answer_past_the_token_limit_is_shown_as_an_overshoot(tmp_path: Path) -> None:
    doc = tmp_path / "ferry.txt"
    doc.write_text(DOCUMENT)
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"root": [
        {"code": "x = 1", "usage": {"prompt_tokens": 19_300, "completion_tokens": 500}},
        {"code": "final_answer('done')", "usage": {"prompt_tokens": 200, "completion_tokens": 51}},
    ]}))
    run = rlm("run", "--document", str(doc), "--script", str(path), "--max-tokens", "20000", "q",
              data_dir=tmp_path / "data", env={"RLM_FINAL_RESERVE_TOKENS": "100"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "done" and "budget_exhausted after" in run.stderr
    (root,) = _usage_json(tmp_path)["roots"]
    assert root["overshoot"] == {"tokens": {"used": 20_051, "limit": 20_000, "over": 51, "by_final_answer": True}}
    table = rlm("usage", data_dir=tmp_path / "data").stdout
    assert "20,051 / 20,000 (+51 past the limit by the final answer)" in " ".join(table.split())


def test_a_limit_passed_by_an_ordinary_call_is_not_blamed_on_the_final_answer(tmp_path: Path) -> None:
    ledger = BudgetLedger(tmp_path / "budget.sqlite3")
    budget = Budget(ledger, "r", BudgetLimits(max_calls=10, max_tokens=None, max_usd=0.01))
    budget.settle(budget.admit("subcall"), Usage(1000, 100, 0.015))  # admitted under the limit, cost more
    assert ledger.overshoot("r") == {"usd": {"used": 0.015, "limit": 0.01, "over": pytest.approx(0.005),
                                             "by_final_answer": False}}
    within = Budget(ledger, "s", BudgetLimits(max_calls=10, max_tokens=1000))
    within.settle(within.admit("subcall"), Usage(10, 10, 0.0))
    assert ledger.overshoot("s") == {}
