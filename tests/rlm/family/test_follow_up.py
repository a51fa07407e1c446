"""Follow-ups: new work for a completed child continues its conversation and keeps the original record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmfamily.budget import BudgetLedger
from rlmfamily.cli import main
from rlmfamily.family import procs
from rlmfamily.family.children import CONVERSATION_FILE
from rlmfamily.family.store import FamilyStore

from ..holds import Gate, wait_until
from .support import child, run_root, runs_of, script

pytestmark = pytest.mark.timeout(60)

FIRST = child("audit alpha", "found = 41\nfinal_answer('found ' + str(found))")
# The follow-up's code uses `found` from the child's first run: a Monty child keeps its namespace too.
SECOND = child("recount", "final_answer('recount ' + str(found + 1))")
SLOW = child("slow poke", "final_answer('late')")  # held at a gate that is never opened: only a cancel ends it


def test_a_follow_up_continues_the_childs_conversation_and_keeps_the_first_record(make_settings,
                                                                                 tmp_path: Path) -> None:
    settings = make_settings()
    root = """
h = rlm.run("audit alpha")
first = h.wait(50)
f = rlm.follow_up(h, "recount please")
second = f.wait(50)
final_answer({"first": first, "second": second, "first_after": h.status()})
"""
    result = run_root(settings, tmp_path, script([root], [FIRST, SECOND]))

    assert result.stop_reason == "answered", result.error
    answer = json.loads(result.answer)
    assert answer["second"]["answer"] == "recount 42" and answer["second"]["kind"] == "follow_up"
    assert answer["first_after"] == {**answer["first"], "elapsed_s": answer["first_after"]["elapsed_s"]}
    original, follow = runs_of(settings, result.run_id)
    assert (original.kind, original.state, original.answer) == ("run", "completed", "found 41")
    assert (follow.kind, follow.follows, follow.agent_id) == ("follow_up", original.run_id, original.agent_id)
    assert original.finished_at < follow.admitted_at
    conversation = json.loads((settings.runs_dir / follow.run_id / CONVERSATION_FILE).read_text())
    first_conversation = json.loads((settings.runs_dir / original.run_id / CONVERSATION_FILE).read_text())
    assert conversation[: len(first_conversation)] == first_conversation
    assert "audit alpha" in first_conversation[1]["content"]
    assert conversation[len(first_conversation)]["content"].startswith("Follow-up: recount please")
    assert [c["id"] for c in result.extra["children"]] == [original.run_id, follow.run_id]


def test_a_follow_up_of_a_child_still_working_is_refused(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    root = """
h = rlm.run("slow")
try:
    rlm.follow_up(h, "more")
    refusal = "admitted"
except ValueError as e:
    refusal = str(e)
h.cancel()
final_answer(refusal)
"""
    # The child holds its model turn at a gate that is never opened: it is still working at the follow-up.
    result = run_root(settings, tmp_path, script([root], [child("slow", "final_answer('x')")]),
                      gates={"slow": Gate(tmp_path / "never-opened")})
    assert result.answer.startswith("[child_not_completed]") and "still working" in result.answer
    assert [r.kind for r in runs_of(settings, result.run_id)] == ["run"]


def test_rlm_follow_up_on_the_command_line_draws_on_the_roots_budget(make_settings, tmp_path: Path,
                                                                     capsys) -> None:
    settings = make_settings()
    slow_poke = Gate(tmp_path / "never-opened")
    result = run_root(settings, tmp_path, script(["h = rlm.run('audit alpha')\nfinal_answer(h.wait(50)['answer'])"],
                                                 [FIRST, SECOND, SLOW]), gates={"slow poke": slow_poke})
    assert result.answer == "found 41"
    calls_before = BudgetLedger(settings.budget_path).snapshot(result.run_id).calls
    data = ["--data-dir", str(settings.data_dir)]

    assert main([*data, "follow-up", result.run_id, "c1", "recount please", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["state"], out["answer"], out["id"]) == ("completed", "recount 42", f"{result.run_id}.c1.f1")
    assert BudgetLedger(settings.budget_path).snapshot(result.run_id).calls == calls_before + 1
    assert BudgetLedger(settings.budget_path).roots() == [result.run_id]

    assert main([*data, "follow-up", result.run_id, f"{result.run_id}.c1", "recount again"]) == 0
    table = capsys.readouterr().out
    assert "c1.f2" in table and "completed" in table and "recount 42" in table
    assert main([*data, "children", result.run_id, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["children"]
    assert [(c["kind"], c["answer"]) for c in listed] == [("run", "found 41"), ("follow_up", "recount 42"),
                                                          ("follow_up", "recount 42")]
    assert main([*data, "follow-up", result.run_id, "c9", "who?"]) == 2
    assert "[child_not_found]" in capsys.readouterr().err

    # A detached follow-up keeps running after the command returns; `rlm children --cancel` stops it.
    assert main([*data, "follow-up", result.run_id, "c1", "slow poke", "--detach", "--json"]) == 0
    detached = json.loads(capsys.readouterr().out)
    assert detached["state"] in ("admitted", "running") and detached["id"] == f"{result.run_id}.c1.f3"
    wait_until(lambda: slow_poke.entered() == 1, "the detached follow-up is in its model turn")
    assert main([*data, "children", result.run_id, "--cancel", "c1.f3", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["children"]
    assert (listed[-1]["state"], listed[-1]["note"]) == ("cancelled", "cancelled from the command line")
    assert not procs.alive(FamilyStore(settings.family_path).run(detached["id"]).pid)
