"""Follow-up questions to a finished root run (``Session.follow_up``, ``rlm ask``): the same conversation and
namespace, the family's one budget, the earlier answer's record kept, and a long conversation compacted into a
summary with handles to the full record. The scripted model serves every question's turns from one script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rlmfamily import Context, ScriptedProvider, Session
from rlmfamily.budget import BudgetLedger
from rlmfamily.cli import main
from rlmfamily.errors import ResumeUnsupported, RunNotFinished, SettingsInvalid
from rlmfamily.run_records import follow_up_point
from rlmfamily.trajectory import read_trajectory

from .holds import wait_until
from .test_cli import RLM, rlm
from .test_session import Recording

pytestmark = pytest.mark.timeout(90)

STEPS = ["x = 41\nprint('x is set')", "final_answer(str(x))",  # the first question
         "x += 1\nprint('now', x)", "final_answer(str(x))",  # the first follow-up
         "final_answer(str(x * 2))"]  # the second


def _session(settings: Any, doc: Path, kernel: str, provider: Any, **kw: Any) -> Session:
    return Session(context=Context.from_document(doc, settings), provider=provider, settings=settings, kernel=kernel,
                   **kw)


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("the notes say nothing much\n")
    return path


@pytest.mark.parametrize("kernel", ["monty", "host"])
def test_a_follow_up_continues_the_namespace_and_conversation_under_the_family_budget(
        kernel: str, doc: Path, make_settings: Any) -> None:
    settings = make_settings(max_turns=2)
    provider = Recording(ScriptedProvider({"root": [{"code": c} for c in STEPS]}))
    session = _session(settings, doc, kernel, provider)
    first = session.run("what is x?")
    second = session.follow_up("and one more?")
    # A new Session over the same run id (the kernel is gone): the namespace comes back from the records.
    third = _session(settings, doc, kernel, provider, run_id=first.run_id).follow_up("and twice that?")
    assert [first.answer, second.answer, third.answer] == ["41", "42", "84"], (second.error, third.error)
    assert [r.stop_reason for r in (first, second, third)] == ["answered"] * 3
    # Each question has max_turns=2 of its own; turns are numbered across the session.
    assert [first.turns, second.turns, third.turns] == [2, 4, 5]
    # The follow-up's first request is the whole earlier conversation plus the question.
    before, asked = provider.root_requests[1], provider.root_requests[2]
    assert asked[: len(before)] == before and "Follow-up: and one more?" in asked[-1]["content"]
    events = read_trajectory(first.trajectory_path)
    finished = [e for e in events if e["event"] == "run_finished"]
    assert [e["answer"] for e in finished] == ["41", "42", "84"]  # the first terminal record stays as written
    assert [(e["number"], e["restore"]) for e in events if e["event"] == "follow_up"] == \
        [(1, "checkpoint"), (2, "checkpoint")] if kernel == "monty" else [(1, "replay"), (2, "replay")]
    # One allowance: every call, of every question, is an entry of the root's family.
    ledger = BudgetLedger(settings.budget_path)
    assert ledger.roots() == [first.run_id] and len(ledger.entries(first.run_id)) == 5
    assert third.budget.calls == 5


def test_rlm_ask_continues_a_finished_run_and_rlm_show_shows_its_turns_as_one_session(tmp_path: Path, doc: Path,
                                                                                    make_settings: Any,
                                                                                    capsys: Any) -> None:
    data = tmp_path / "data"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"root": [{"code": c} for c in STEPS[:4]]}))
    first = _session(make_settings(data_dir=data), doc, "monty", ScriptedProvider.from_file(script)).run("what is x?")
    assert first.answer == "41", first.error
    assert main(["--data-dir", str(data), "resume", "last", "--script", str(script)]) == 2
    refused = capsys.readouterr().err
    assert f"[run_finished] run {first.run_id} already finished" in refused
    assert f"Ask it a follow-up with `rlm ask {first.run_id} QUESTION`" in refused
    asked = rlm("ask", "last", "and one more?", "--quiet", "--json", "--script", str(script), data_dir=data)
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["answer"] == "42"  # x came back from the Monty checkpoint of the first process
    # rlm show and its page, in this process (the follow-up above ran in its own).
    assert main(["--data-dir", str(data), "show", "last"]) == 0
    lines = capsys.readouterr().out
    assert lines.index("question: what is x?") < lines.index("══ follow-up 1: and one more?") < lines.index("now 42")
    assert "namespace from the Monty checkpoint after step 2" in lines
    assert "did not finish" not in lines
    # The page: the first question's outcome, then the follow-up's banner and turns, then its own outcome.
    assert main(["--data-dir", str(data), "show", "--html", "last", "-o", "-"]) == 0
    page = capsys.readouterr().out
    first_end, follow, last_end = (page.index("answered after 2 turns"), page.index("follow-up 1: and one more?"),
                                   page.index("answered after 4 turns"))
    assert last_end < first_end < follow < page.index("now 42") and "did not finish" not in page  # the outcome leads


def test_past_its_size_a_conversation_is_compacted_and_its_record_kept_whole(doc: Path, make_settings: Any) -> None:
    settings = make_settings(follow_up_compact_chars=1_000, follow_up_summary_chars=2_000)
    long_step = "big = 'y' * 3000\nprint(big)"
    script = {"root": [{"code": long_step}, {"code": "final_answer(str(len(big)))"},
                       {"code": "final_answer(str(len(big) + 1))"}, {"code": "final_answer('again')"}]}
    provider = Recording(ScriptedProvider(script))
    session = _session(settings, doc, "monty", provider)
    first = session.run("how long is big?")
    second = session.follow_up("and plus one?")
    assert second.answer == "3001", second.error
    sent = provider.root_requests[2]
    assert len(sent) == 3 and "y" * 3000 not in json.dumps(sent)  # the long output is not sent again
    summary = sent[-1]["content"]
    assert "compacted past RLM_FOLLOW_UP_COMPACT_CHARS (1,000)" in summary and "Nothing was deleted" in summary
    assert "Q1: how long is big?" in summary and "A1: 3000" in summary
    step = next(e for e in read_trajectory(first.trajectory_path) if e["event"] == "step")
    assert f"turn 1: `big = 'y' * 3000` -> ok, history {step['history_id']}" in summary
    assert "y" * 3000 in step["observation"] or step["full_chars"] >= 3000  # the record keeps it
    # Rebuilt from the records, the conversation is the session's, compacted as it was (what a resume continues
    # from); with a larger limit the next question is added to it as it stands.
    path = first.trajectory_path
    roomy = make_settings(follow_up_compact_chars=1_000_000)
    rebuilt = follow_up_point(roomy, path, read_trajectory(path), session.context, "again?")
    assert rebuilt.messages[:-1] == json.loads(json.dumps(session.messages))
    assert rebuilt.messages[2] == sent[2] and "Follow-up: again?" in rebuilt.messages[-1]["content"]


def test_a_follow_up_to_an_unfinished_or_child_run_is_refused_naming_the_command(doc: Path, make_settings: Any,
                                                                               tmp_path: Path) -> None:
    settings = make_settings()
    session = _session(settings, doc, "monty", ScriptedProvider({"root": [{"code": "x = 1"}]}))
    path = settings.runs_dir / session.run_id / "trajectory.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"seq": 1, "ts": 0, "event": "run_started", "run_id": session.run_id,
                                "question": "q", "kernel": "monty", "system_prompt": "s", "first_message": "m"}) + "\n")
    with pytest.raises(RunNotFinished, match=f"rlm resume {session.run_id}"):
        session.follow_up("more?")
    with path.open("a") as fh:
        fh.write(json.dumps({"seq": 2, "ts": 0, "event": "run_finished", "stop_reason": "answered"}) + "\n")
    on_host = _session(settings, doc, "host", ScriptedProvider({"root": []}), run_id=session.run_id)
    with pytest.raises(SettingsInvalid, match="ran on the monty kernel; ask its follow-up on the same kernel"):
        on_host.follow_up("more?")


def test_a_follow_up_killed_midway_is_resumed_with_its_own_question(tmp_path: Path, doc: Path,
                                                                   make_settings: Any) -> None:
    data = tmp_path / "data"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({
        "root": [{"code": c} for c in STEPS[:2]] + [
            {"code": "x += 1\nr = llm_query('held question')\nprint(r.text)"},
            {"code": "final_answer(r.text + ' ' + str(x))"}],
        "subcall": [{"pattern": "held question", "answer": "HELD", "hold_after": 0, "hold_until_file": "release"}]}))
    first = _session(make_settings(data_dir=data), doc, "monty", ScriptedProvider.from_file(script)).run("what is x?")
    assert first.answer == "41", first.error
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    asking = subprocess.Popen([RLM, "ask", "last", "--quiet", "--script", str(script), "and now?"],
                              env={**env, "RLM_DATA_DIR": str(data)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    ledger = BudgetLedger(data / "budget.sqlite3")
    try:
        wait_until(lambda: any(e.purpose == "subcall" and e.state == "reserved"
                               for r in ledger.roots() for e in ledger.entries(r)),
                   "the follow-up's sub-call in flight")
    finally:
        os.killpg(asking.pid, signal.SIGKILL)
        asking.wait()
    (tmp_path / "release").write_text("")
    resumed = rlm("resume", "last", "--json", "--script", str(script), data_dir=data)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["answer"] == "HELD 42"  # the follow-up's question, x from the first one
    [root] = ledger.roots()
    events = read_trajectory(data / "runs" / root / "trajectory.jsonl")
    kinds = [e["event"] for e in events if e["event"] in ("run_finished", "follow_up", "run_resumed")]
    assert kinds == ["run_finished", "follow_up", "run_resumed", "run_finished"]
    assert [e["answer"] for e in events if e["event"] == "run_finished"] == ["41", "HELD 42"]


def test_a_kept_kernel_continues_a_namespace_that_no_replay_could_rebuild(doc: Path, make_settings: Any) -> None:
    settings = make_settings()
    steps = ["import random\nr = random.random()\nprint(r)", "final_answer(str(r))", "final_answer(str(r))"]
    provider = ScriptedProvider({"root": [{"code": c} for c in steps]})
    with _session(settings, doc, "host", provider, keep_kernel=True) as session:
        first = session.run("draw a number")
        second = session.follow_up("which number was it?")
    assert second.answer == first.answer and second.stop_reason == "answered", second.error
    follow = next(e for e in read_trajectory(first.trajectory_path) if e["event"] == "follow_up")
    assert follow["restore"] == "kept"
    # Without the live kernel, the host kernel's replay would print another number: the follow-up is refused.
    fresh = _session(settings, doc, "host", ScriptedProvider({"root": []}), run_id=first.run_id)
    with pytest.raises(ResumeUnsupported, match="cannot be rebuilt faithfully"):
        fresh.follow_up("and now?")


def test_rlm_ask_names_the_unknown_usage_to_reconcile_before_a_follow_up(tmp_path: Path, doc: Path,
                                                                         make_settings: Any, capsys: Any) -> None:
    data = tmp_path / "data"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"root": [{"code": "r = llm_query('q')"}, {"code": "final_answer('done')"}],
                                  "subcall": [{"pattern": "q", "answer": "A", "usage": "unknown"}]}))
    settings = make_settings(data_dir=data, max_usd=5.0,
                             prices_usd_per_mtok={"scripted": {"prompt": 1.0, "completion": 1.0}})
    first = _session(settings, doc, "monty", ScriptedProvider.from_file(script, prices=None)).run("q?")
    assert first.stop_reason in ("answered", "budget_exhausted"), first.error
    assert main(["--data-dir", str(data), "ask", "last", "more?", "--script", str(script)]) == 2
    refused = capsys.readouterr().err
    assert "[resume_needs_reconcile]" in refused and f"`rlm ask {first.run_id} QUESTION` again" in refused
    assert [e["event"] for e in read_trajectory(first.trajectory_path)].count("follow_up") == 0
