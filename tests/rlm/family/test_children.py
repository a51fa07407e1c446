"""Children: real child processes with their own sessions and kernels, the scripted provider, the root's budget."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rlmfamily.budget import BudgetLedger
from rlmfamily.family import procs
from rlmfamily.family.children import Family
from rlmfamily.family.store import FamilyStore

from ..holds import DEADLINE_SLACK_S, Gate
from .support import (
    MESSAGE_WAIT_SETTINGS,
    WAIT_FOR_PARENT,
    child,
    events,
    observations,
    run_root,
    runs_of,
    script,
    trajectory_has,
)

pytestmark = pytest.mark.timeout(60)

CHILD_REPORTS = """
import time
rlm.message(rlm.parent_id(), "started " + rlm.agent_id())
final_answer("crates: " + llm_query("What is MAX_CRATES?", context.read("ferry.txt")).text)
"""
CRATES_RULE = [{"pattern": r"MAX_CRATES = (\d+).*What is MAX_CRATES", "answer": r"\1"}]


def test_children_run_in_parallel_in_their_own_processes_and_their_answers_reach_the_root(make_settings,
                                                                                          tmp_path: Path) -> None:
    settings = make_settings()
    root = """
a = rlm.run("audit alpha")
b = rlm.run("audit beta")
done = rlm.wait_all([a, b], 50)
notes = sorted(m["text"] for m in rlm.inbox())
final_answer({"answers": [d["answer"] for d in done], "states": [d["state"] for d in done], "notes": notes})
"""
    # Each child's model turn holds until both are held at once: they can only both get there in parallel.
    both = Gate(tmp_path / "both-audits")
    opener = both.open_when(lambda: both.entered() == 2, "both children in their model turn at the same time")
    result = run_root(settings, tmp_path, script([root], [child("audit (alpha|beta)", CHILD_REPORTS)], subcall=CRATES_RULE),
                      gates={"audit (alpha|beta)": both})
    opener.check()

    assert result.stop_reason == "answered", result.error
    answer = json.loads(result.answer)
    assert answer["states"] == ["completed", "completed"]
    assert answer["answers"] == ["crates: 40", "crates: 40"]
    a_id, b_id = f"{result.run_id}.c1", f"{result.run_id}.c2"
    assert answer["notes"] == [f"started {a_id}", f"started {b_id}"]
    a, b = runs_of(settings, result.run_id)
    # Each child was its own process (not this one), with its own trajectory and history scope.
    assert {a.pid, b.pid} & {os.getpid(), None} == set() and a.pid != b.pid
    assert (settings.runs_dir / a_id / "trajectory.jsonl").is_file()
    # Both runs were under way at the same time (both were held before either could finish).
    assert max(a.started_at, b.started_at) < min(a.finished_at, b.finished_at)
    assert [c["answer"] for c in result.extra["children"]] == ["crates: 40", "crates: 40"]
    assert [e["event"] for e in events(result, "child_finished")] == ["child_finished"] * 2


def test_the_family_shares_the_roots_budget_and_a_child_cannot_exceed_it(make_settings, tmp_path: Path) -> None:
    settings = make_settings(max_calls=8)
    root = """
h = rlm.run("spend")
final_answer(h.wait(50))
"""
    spender = """
results = [llm_query("question %d" % i) for i in range(10)]
final_answer({"ok": len([r for r in results if r.ok]), "refused": [r.error_code for r in results if not r.ok]})
"""
    result = run_root(settings, tmp_path, script([root], [child("spend", spender)]))

    assert result.stop_reason == "answered", result.error
    spent = json.loads(json.loads(result.answer)["answer"])
    # The child's turn and sub-calls drew on the root's 8 calls: one root turn, one child turn, and
    # sub-calls until only the calls kept back for final answers were left (the child's and the root's).
    assert spent["ok"] == 4 and set(spent["refused"]) == {"budget_exhausted"}
    ledger = BudgetLedger(settings.budget_path)
    assert ledger.roots() == [result.run_id]  # starting a child never opened a fresh allowance
    assert result.budget.calls == 6 <= settings.max_calls
    assert [e.purpose for e in ledger.entries(result.run_id)].count("subcall") == 4
    assert ledger.kept_calls(result.run_id) == 0  # both members ended: nothing is kept any more


def test_admission_limits_are_raised_at_once_with_the_settings_name(make_settings, tmp_path: Path) -> None:
    settings = make_settings(max_children=2, max_parallel_children=1, max_calls=20, max_prompt_chars=150,
                             **MESSAGE_WAIT_SETTINGS)
    # Each child waits for the root's message, sent only after the refusal: a refusal that waited for
    # a slot (or for the child) would come only after the child gave up waiting ("never released").
    root = """
def refused(start):
    try:
        start()
        return "admitted"
    except ValueError as e:
        return str(e)
too_long = refused(lambda: rlm.run("x" * 151))
first = rlm.run("hold on")
parallel = refused(lambda: rlm.run("second"))
rlm.message(first, "go")
held = first.wait(50)["answer"]
second = rlm.run("quick")
count = refused(lambda: rlm.run("third"))
rlm.message(second, "go")
final_answer({"parallel": parallel, "count": count, "depth": second.wait(50)["answer"], "long": too_long,
              "held": held})
"""
    grandchild_attempt = """
try:
    rlm.run("grandchild")
    depth = "admitted"
except ValueError as e:
    depth = str(e)
""" + WAIT_FOR_PARENT + """
final_answer(depth if released == "released" else released)
"""
    result = run_root(settings, tmp_path, script([root], [
        child("hold on", WAIT_FOR_PARENT + "final_answer(released)"),
        child("quick", grandchild_attempt),
    ]))

    assert result.stop_reason == "answered", result.error
    answer = json.loads(result.answer)
    assert answer["held"] == "released"  # "hold on" was still running when the parallel refusal came
    assert answer["parallel"].startswith("[parallel_child_limit_reached]") and "RLM_MAX_PARALLEL_CHILDREN" in answer["parallel"]
    assert answer["count"].startswith("[child_limit_reached]") and "RLM_MAX_CHILDREN" in answer["count"]
    assert answer["long"].startswith("[child_prompt_too_large]") and "RLM_MAX_PROMPT_CHARS" in answer["long"]
    # Depth defaults to 1: the child may not start children of its own.
    assert answer["depth"].startswith("[child_depth_exceeded]") and "RLM_MAX_CHILD_DEPTH" in answer["depth"]
    assert len(runs_of(settings, result.run_id)) == 2


def test_a_child_is_refused_at_once_when_the_allowance_cannot_carry_it(make_settings, tmp_path: Path) -> None:
    settings = make_settings(max_calls=2)
    root = """
try:
    rlm.run("anything")
    final_answer("admitted")
except ValueError as e:
    final_answer(str(e))
"""
    result = run_root(settings, tmp_path, script([root], [child("anything", "final_answer('x')")]))
    assert result.answer.startswith("[budget_exhausted]") and "RLM_MAX_CALLS" in result.answer
    assert runs_of(settings, result.run_id) == []


def test_a_wait_that_times_out_leaves_the_child_running(make_settings, tmp_path: Path) -> None:
    settings = make_settings(**MESSAGE_WAIT_SETTINGS)
    root = """
h = rlm.run("slow")
early = h.wait(0.2)
rlm.message(h, "go")
late = h.wait(50)
final_answer([early["state"], late["state"], late["answer"]])
"""
    result = run_root(settings, tmp_path, script([root], [child("slow", WAIT_FOR_PARENT + "final_answer(released)")]))
    early, late, answer = json.loads(result.answer)
    assert early in ("admitted", "running") and (late, answer) == ("completed", "released")


def test_the_root_waits_for_active_children_before_it_completes(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    root = """
h = rlm.run("slow")
final_answer("answered before the child ended")
"""
    # The child's model turn holds until the root's session records that it is waiting for it.
    run_id = "waiting-root"
    gate = Gate(tmp_path / "slow-child")
    opener = gate.open_when(lambda: trajectory_has(settings, run_id, "children_wait"), "the root waits for its child")
    result = run_root(settings, tmp_path, script([root], [child("slow", "final_answer('late result')")]),
                      run_id=run_id, gates={"slow": gate})
    opener.check()
    assert result.stop_reason == "answered"
    assert [c["state"] for c in result.extra["children"]] == ["completed"]
    assert result.extra["children"][0]["answer"] == "late result"
    kinds = [e["event"] for e in events(result, "children_wait") + events(result, "run_finished")]
    assert kinds == ["children_wait", "run_finished"]
    finished = events(result, "run_finished")[0]
    assert finished["children"][0]["answer"] == "late result"


@pytest.mark.parametrize("kernel", ["monty", "host"])
def test_cancel_stops_the_childs_process_tree(kernel: str, make_settings, tmp_path: Path) -> None:
    settings = make_settings(child_cancel_grace_s=1.0, max_sleep_s_per_step=120.0)
    root = """
import time
h = rlm.run("sleep")
t = time.time()
while not rlm.inbox() and time.time() - t < 20:
    time.sleep(0.05)
t = time.time()
stopped = h.cancel()
final_answer([stopped["state"], stopped["note"], time.time() - t])
"""
    # The child sleeps past the test's own timeout: only the cancel can end it.
    sleeper = """
import time
rlm.message(rlm.parent_id(), "asleep")
time.sleep(100)
final_answer("woke up")
"""
    result = run_root(settings, tmp_path, script([root], [child("sleep", sleeper)]), kernel=kernel)

    state, note, cancel_s = json.loads(result.answer)
    assert (state, note) == ("cancelled", "cancelled by its parent")
    assert cancel_s < settings.child_cancel_grace_s + DEADLINE_SLACK_S, \
        "a cancel ends the child's process tree within RLM_CHILD_CANCEL_GRACE_S"
    [run] = runs_of(settings, result.run_id)
    assert run.state == "cancelled" and run.answer is None
    assert run.pid and run.kernel_pid
    assert not procs.alive(run.pid) and not procs.alive(run.kernel_pid)
    assert procs.descendants(run.pid) == []


def test_a_handle_of_another_family_reaches_nothing(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    first = run_root(settings, tmp_path, script(["h = rlm.run('quick')\nfinal_answer(h.wait(50)['state'])"],
                                                [child("quick", "final_answer('mine')")]))
    assert first.answer == "completed"
    forged = f"""
h = _ChildHandle({{"id": "{first.run_id}.c1", "agent": "{first.run_id}.c1"}})
out = []
for attempt in [h.status, h.cancel, lambda: rlm.follow_up(h, "more")]:
    try:
        out.append(attempt())
    except ValueError as e:
        out.append(str(e))
final_answer(out)
"""
    second = run_root(settings, tmp_path, script([forged]))
    refusals = json.loads(second.answer)
    assert len(refusals) == 3 and all(r.startswith("[child_not_found]") for r in refusals), refusals
    assert FamilyStore(settings.family_path).run(f"{first.run_id}.c1").state == "completed"


def test_a_deeper_family_is_an_explicit_setting(make_settings, tmp_path: Path) -> None:
    settings = make_settings(max_child_depth=2)
    root = """
h = rlm.run("middle")
final_answer(h.wait(50)["answer"])
"""
    middle = """
g = rlm.run("leaf")
final_answer("leaf says " + g.wait(50)["answer"])
"""
    result = run_root(settings, tmp_path, script([root], [child("middle", middle), child("leaf", "final_answer('hi')")]))
    assert result.answer == "leaf says hi"
    assert [r.run_id for r in runs_of(settings, result.run_id)] == [f"{result.run_id}.c1", f"{result.run_id}.c1.c1"]
    assert observations(result)


def test_wait_all_takes_at_most_one_handle_per_child(make_settings, tmp_path: Path) -> None:
    # Issue 15's audit: every entry of wait_all's list is read again at each poll; a family has at most
    # max_children children, so a longer list only repeats them.
    root = """
try:
    rlm.wait_all(["x"] * 3, 1)
    final_answer("accepted")
except ValueError as e:
    final_answer(str(e))
"""
    result = run_root(make_settings(max_children=2), tmp_path, script([root]))
    assert result.stop_reason == "answered", result.error
    assert result.answer.startswith("[family_argument_invalid]") and "RLM_MAX_CHILDREN" in result.answer


# What a parent's Family.start does up to its spawn: the child is admitted and has no process yet. The
# admitting process then waits on its stdin, so the test decides when it is gone.
ADMIT_THEN_WAIT = """
import sys
from rlmfamily.family.store import Agent, FamilyStore
store = FamilyStore(sys.argv[1])
store.ensure_root("root")
with store.transaction() as conn:
    FamilyStore.insert_agent(conn, Agent("root.c1", "root", "root", 1, []))
    FamilyStore.insert_run(conn, run_id="root.c1", agent_id="root.c1", root_id="root", kind="run", follows=None,
                           prompt="sibling", token="0" * 32)
print("admitted", flush=True)
sys.stdin.read()
"""


def test_a_child_admitted_by_a_live_parent_is_not_gone_before_its_process_starts(make_settings) -> None:
    # Seen: a child calling rlm.run while its parent started siblings judged the siblings admitted a moment
    # earlier (no pid recorded yet) gone, and they failed before they started.
    settings = make_settings()
    parent = subprocess.Popen([sys.executable, "-c", ADMIT_THEN_WAIT, str(settings.family_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline() == "admitted\n"
        [run] = Family(settings, "root").children(None)  # another process of the family looks at it
        assert (run.state, run.pid, run.error) == ("admitted", None, None)
    finally:
        parent.communicate("")
    # Its admitting process is gone without starting it: now it never will.
    [run] = Family(settings, "root").children(None)
    assert run.state == "failed" and "before it started" in run.error


def test_a_family_file_from_before_the_owner_columns_still_opens(make_settings) -> None:
    settings = make_settings()
    FamilyStore(settings.family_path)
    with sqlite3.connect(settings.family_path) as old:  # the runs table as the first release wrote it
        old.execute("ALTER TABLE runs DROP COLUMN owner_pid")
        old.execute("ALTER TABLE runs DROP COLUMN owner_start")
    subprocess.run([sys.executable, "-c", ADMIT_THEN_WAIT, str(settings.family_path)], input="", check=True,
                   capture_output=True, text=True)
    [run] = Family(settings, "root").children(None)
    assert run.owner_pid and run.state == "failed" and "before it started" in run.error


def test_every_member_keeps_its_own_call_for_its_final_answer(make_settings, tmp_path: Path) -> None:
    # Each member's turns run out (max_turns=1) and each must ask for its answer once more. A child that
    # spends the family's calls down to one kept call must not take the root's: each live member keeps its own.
    settings = make_settings(max_calls=5, max_turns=1)
    root = """
h = rlm.run("spend")
outcome = h.wait(50)
"""
    spender = """
results = [llm_query("question %d" % i) for i in range(10)]
refused = [r.error_code for r in results if not r.ok]
"""
    result = run_root(settings, tmp_path, script([root, {"text": "root answered"}],
                                                 [child("spend", spender, {"text": "child answered"})]))

    assert result.stop_reason == "max_turns", result.error
    assert result.answer == "root answered", result.error
    (record,) = result.extra["children"]
    assert record["answer"] == "child answered"
    purposes = [e.purpose for e in BudgetLedger(settings.budget_path).entries(result.run_id)]
    # Root turn, child turn, the child's sub-calls up to the two kept finals, the child's final, the root's.
    assert purposes == ["root", "root", "subcall", "root_final", "root_final"], purposes
    assert result.budget.calls == 5 == settings.max_calls
