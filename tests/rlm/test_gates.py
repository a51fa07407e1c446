"""Completion gates: a run is accepted only when every gate passes against the final workspace.

Real runs through the scripted model over a temporary workspace whose tests fail until ``add`` is fixed; the
gates are real ``python3 -m unittest`` processes run by the command broker, on the host and Monty kernels and in
both profiles; a peer that accepts a task and drops the connection (A2A over real HTTP on 127.0.0.1) leaves a
required delegation unknown; ``rlm show`` is read as text and opened in Debian's Chromium.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmfamily import Context, ScriptedProvider, Session
from rlmfamily.budget import BudgetLedger
from rlmfamily.bash.store import SCHEMA, JobStore
from rlmfamily.cli import main
from rlmfamily.errors import SettingsInvalid
from rlmfamily.history import History
from rlmfamily.resume import plan
from rlmfamily.session import RunResult
from rlmfamily.settings import RLMSettings, load_settings
from rlmfamily.trajectory import FILENAME, read_trajectory

from .a2a.peer_servers import HostilePeer, SdkPeer, a2a_settings
from .conftest import REPO_ROOT
from .holds import wait_until
from .test_cli import RLM, rlm

pytestmark = pytest.mark.timeout(120)

BROKEN = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = ("import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
         "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
UNITTEST = "python3 -B -m unittest -q"  # -B: no bytecode cache, which an edit of the same size in the same second would leave stale
GATE = [{"name": "tests", "command": UNITTEST}]
DOCS = (REPO_ROOT / "docs" / "RLM.md").read_text()
EXAMPLES = REPO_ROOT / "library" / "rlmfamily" / "examples"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "calc"
    folder.mkdir()
    (folder / "calc.py").write_text(BROKEN)
    (folder / "test_calc.py").write_text(TESTS)
    return folder


def run(settings: RLMSettings, workspace: Path, turns: list[dict[str, Any]], *, kernel: str = "host",
        question: str = "make the tests pass") -> tuple[RunResult, Session]:
    session = Session(context=Context.from_repository(workspace, settings), provider=ScriptedProvider({"root": turns}),
                      settings=settings, kernel=kernel)
    return session.run(question), session


def events(result: RunResult, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_trajectory(result.trajectory_path) if e["event"] == kind]


def fixing_turns(workspace: Path, kernel: str) -> list[dict[str, Any]]:
    """Answer at once (the tests fail), then read the failure by its handle, fix ``add`` and answer again.

    On the host kernel the model's own Python writes the file (the python profile); in Monty, which writes no
    file, a command job does (the python-bash profile)."""
    printf = "printf 'def add(a, b):\\n    return a + b\\n' > calc.py"
    fix = (f"open({str(workspace / 'calc.py')!r}, 'w').write({FIXED!r})" if kernel == "host"
           else f"print(bash.run({printf!r}))")
    return [
        {"code": "final_answer('add works')"},
        {"code": "failed = [r for r in gates.last() if not r['passed']]\n"
                 f"print(gates.read(failed[0]['job_id'], 'stderr', 0, 2000))\n{fix}\nfinal_answer('add is fixed')"},
    ]


@pytest.mark.parametrize(("kernel", "profile"), [("host", "python"), ("monty", "python-bash")])
def test_a_failed_gate_withdraws_the_answer_the_model_reads_the_failure_fixes_it_and_is_accepted(
        make_settings: Any, workspace: Path, kernel: str, profile: str) -> None:
    settings = make_settings(gates=GATE, profile=profile)
    result, session = run(settings, workspace, fixing_turns(workspace, kernel), kernel=kernel)

    assert (result.stop_reason, result.answer, result.verdict) == ("answered", "add is fixed", "accepted"), result.error
    assert (workspace / "calc.py").read_text() == FIXED
    runs = result.extra["gates"]
    assert [(r["attempt"], r["name"], r["passed"], r["state"], r["exit_code"]) for r in runs] == [
        (1, "tests", False, "exited", 1), (2, "tests", True, "exited", 0)]
    assert result.extra["verdict_reason"] == "every gate passed (attempt 2)" and result.extra["blocked_by"] == []
    # What the model was told after its first answer: which gate, how, the failure itself, and the handle.
    [withdrawn] = events(result, "answer_withdrawn")
    told = withdrawn["message"]
    assert withdrawn["failed"] == ["tests"] and withdrawn["turn"] == 1
    assert f"gate tests FAILED: exit 1" in told and f"(job {runs[0]['job_id']})" in told and f"$ {UNITTEST}" in told
    assert "AssertionError: -1 != 5" in told and f"gates.read({runs[0]['job_id']!r}, 'stderr', start, size)" in told
    assert {"role": "user", "content": told} in session.messages
    # The failed run's excerpt is kept in the run's history too (history.search finds it); the passed one's is not.
    assert runs[1]["history_id"] is None
    kept = History(settings.history_path, session.agent_id).read(runs[0]["history_id"])
    assert kept.startswith("gate tests failed: exit 1 after ") and f"(job {runs[0]['job_id']})\n$ {UNITTEST}\n" in kept
    # The model read the whole output by that handle in its next step.
    steps = events(result, "step")
    assert "AssertionError: -1 != 5" in steps[1]["observation"] and "FAILED (failures=1)" in steps[1]["observation"]
    gate_events = events(result, "gate")
    assert [(g["attempt"], g["passed"]) for g in gate_events] == [(1, False), (2, True)]
    assert gate_events[0]["excerpt"].startswith("stderr (") and gate_events[1]["excerpt"] == ""
    # The gates are durable command jobs of the run, surface "gate".
    jobs = {j.id: j for j in JobStore(settings.jobs_path).jobs(result.run_id)}
    assert [(jobs[r["job_id"]].surface, jobs[r["job_id"]].exit_code) for r in runs] == [("gate", 1), ("gate", 0)]
    [finished] = events(result, "run_finished")
    assert finished["verdict"] == "accepted" and len(finished["gates"]) == 2


def test_a_run_whose_gate_never_passes_ends_gates_failed_and_rlm_run_exits_3(
        settings: RLMSettings, workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "stubborn.toml"
    script.write_text('[[root]]\ncode = "final_answer(\'done\')"\n[[root]]\ncode = "final_answer(\'done again\')"\n'
                      '[[root]]\ntext = "done, really"\n')
    code = main(["--data-dir", str(settings.data_dir), "run", "--repo", str(workspace), "--kernel", "host",
                 "--script", str(script), "--gate", f"tests={UNITTEST}", "--max-turns", "2", "--quiet", "--json",
                 "make the tests pass"])
    out = capsys.readouterr().out
    result = json.loads(out)
    assert code == 3
    assert (result["verdict"], result["stop_reason"]) == ("gates_failed", "max_turns")
    # The answer to the final request is gated too; the run is ending, so it stands, not accepted.
    assert result["answer"] == "done, really"
    assert [(r["attempt"], r["passed"]) for r in result["extra"]["gates"]] == [(1, False), (2, False), (3, False)]
    assert result["extra"]["verdict_reason"] == "attempt 3: tests failed"
    withdrawn = events_of(Path(result["trajectory_path"]), "answer_withdrawn")
    assert [w["attempt"] for w in withdrawn] == [1, 2]
    assert "0 turns left" in withdrawn[1]["message"]

    # Without --json the verdict and the failing gate are printed on stderr.
    code = main(["--data-dir", str(settings.data_dir), "run", "--repo", str(workspace), "--kernel", "host",
                 "--script", str(script), "--gate", f"tests={UNITTEST}", "--max-turns", "2", "--quiet",
                 "make the tests pass"])
    captured = capsys.readouterr()
    assert code == 3 and captured.out.strip() == "done, really"
    assert "verdict: gates failed: attempt 3: tests failed" in captured.err
    assert "gate tests: FAILED (exit 1 after" in captured.err


def events_of(trajectory: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_trajectory(trajectory) if e["event"] == kind]


def test_a_run_without_gates_is_not_verified_and_says_why(settings: RLMSettings, workspace: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    result, _ = run(settings, workspace, [{"code": "final_answer('add works')"}])
    assert (result.stop_reason, result.answer, result.verdict) == ("answered", "add works", "not_verified")
    assert result.extra["verdict_reason"] == "no completion gates are configured (RLM_GATES, rlm run --gate)"
    assert "gates" not in result.extra and events(result, "gate") == []
    [finished] = events(result, "run_finished")
    assert finished["verdict"] == "not_verified"


def test_a_gate_past_its_deadline_is_killed_and_fails(make_settings: Any, workspace: Path) -> None:
    settings = make_settings(gates=[{"name": "slow", "command": "sleep 30", "deadline_s": 0.5}], max_turns=1,
                             bash_kill_grace_s=0.5)
    result, _ = run(settings, workspace, [{"code": "final_answer('done')"}, {"text": "done"}])
    assert result.verdict == "gates_failed"
    runs = result.extra["gates"]
    assert [(r["state"], r["stopped_by"], r["passed"], r["deadline_s"]) for r in runs] == [
        ("killed", "deadline", False, 0.5)] * 2
    [withdrawn] = events(result, "answer_withdrawn")
    assert "gate slow FAILED: killed at its 0.5 s deadline" in withdrawn["message"]


def test_gates_that_cannot_run_as_given_are_refused_at_start_naming_the_setting(
        make_settings: Any, workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refusals = {
        "the command is empty": [{"name": "tests", "command": "  "}],
        "gate name 'tests' is given twice": [{"name": "tests", "command": "true"}, {"name": "tests", "command": "false"}],
        "RLM_GATE_MAX_DEADLINE_S": [{"name": "tests", "command": "true", "deadline_s": 1801}],
        "RLM_MAX_GATES": [{"name": f"g{i}", "command": "true"} for i in range(9)],
        "use 1-64 letters": [{"name": "two words", "command": "true"}],
    }
    for words, gates in refusals.items():
        with pytest.raises(SettingsInvalid, match=words) as refused:
            make_settings(gates=gates)
        assert refused.value.setting == "gates" and "RLM_GATES" in refused.value.message
    with pytest.raises(SettingsInvalid, match="gate_default_deadline_s cannot exceed gate_max_deadline_s"):
        make_settings(gate_default_deadline_s=100, gate_max_deadline_s=50)

    data = ["--data-dir", str(tmp_path / "data")]
    assert main([*data, "run", "--repo", str(workspace), "--gate", "tests", "q"]) == 2
    assert "--gate 'tests': give NAME=COMMAND" in capsys.readouterr().err
    assert main([*data, "run", "--repo", str(workspace), "--gate", "t=true", "--gate", "t=false", "q"]) == 2
    assert "gates (RLM_GATES)" in capsys.readouterr().err
    # A gate needs a workspace: a run over one document has none unless RLM_BASH_WORKSPACE names it.
    document = tmp_path / "notes.txt"
    document.write_text("notes\n")
    script = tmp_path / "answer.toml"
    script.write_text('[[root]]\ncode = "final_answer(1)"\n')
    assert main([*data, "run", "--document", str(document), "--script", str(script), "--gate", "t=true", "q"]) == 2
    assert "completion gates (RLM_GATES, --gate) needs a workspace" in capsys.readouterr().err


def test_the_gates_environment_variable_is_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_GATES", json.dumps([{"name": "tests", "command": UNITTEST, "deadline_s": 30}]))
    [gate] = load_settings().gates
    assert (gate.name, gate.command, gate.deadline_s) == ("tests", UNITTEST, 30)
    monkeypatch.setenv("RLM_GATES", "python -m unittest")
    with pytest.raises(SettingsInvalid, match="RLM_GATES must be JSON") as refused:
        load_settings()
    assert refused.value.setting == "gates"


def test_the_documented_example_is_withdrawn_once_fixed_and_accepted(settings: RLMSettings, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The `rlm run ... --gate` command docs/RLM.md shows under "Completion gates", on a copy of tally."""
    section = DOCS[DOCS.index("## Completion gates"):]
    block = re.search(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert block, "docs/RLM.md shows the completion gates example"
    line = re.search(r"^rlm run .*?\"$", block[1].replace("\\\n", ""), re.MULTILINE)[0]
    words = shlex.split(line)
    copy = tmp_path / "tally"
    shutil.copytree(EXAMPLES / "tally", copy)
    args = [str(copy) if w == "/tmp/tally" else str(REPO_ROOT / w) if w.startswith("library/") else w
            for w in words[1:-1]]
    capsys.readouterr()
    code = main(["--data-dir", str(settings.data_dir), *args, "--quiet", "--json", words[-1]])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["verdict"] == "accepted" and result["answer"] == "median added; the tests pass"
    assert [(r["attempt"], r["passed"], r["deadline_s"]) for r in result["extra"]["gates"]] == [
        (1, False, 120), (2, True, 120)]
    steps = events_of(Path(result["trajectory_path"]), "step")
    assert "AssertionError: 1 != 3" in steps[1]["observation"]  # the failure, read by the gate's job id
    assert "sorted(values)" in (copy / "tally" / "stats.py").read_text()


def test_a_resumed_run_keeps_its_withdrawn_answer_and_its_gates_and_numbers_attempts_on(tmp_path: Path) -> None:
    """A gated run is SIGKILLed after its first answer was withdrawn, while a sub-call is held; ``rlm resume``
    rebuilds the conversation with the gate's message, runs the same gates and is accepted at attempt 2."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "README.md").write_text("a marker is needed\n")
    data = tmp_path / "data"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({
        "root": [{"code": "final_answer('not yet')"},
                 {"code": "a = llm_query('held question')\nprint(a.text)"},
                 {"code": "print(bash.run('touch marker'))\nfinal_answer('marked')"}],
        "subcall": [{"pattern": "held question", "answer": "go", "hold_after": 0, "hold_until_file": "release"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    env["RLM_DATA_DIR"] = str(data)
    proc = subprocess.Popen([RLM, "run", "--quiet", "--profile", "python-bash", "--repo", str(folder), "--script",
                             str(script), "--gate", "marker=test -e marker", "q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        ledger = data / "budget.sqlite3"
        wait_until(lambda: ledger.is_file() and any(
            e.purpose == "subcall" and e.state == "reserved"
            for root in BudgetLedger(ledger).roots() for e in BudgetLedger(ledger).entries(root)),
            "the sub-call after the withdrawn answer is in flight")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    (tmp_path / "release").write_text("")
    [trajectory] = (data / "runs").glob(f"*/{FILENAME}")
    recorded = read_trajectory(trajectory)
    [withdrawn] = [e for e in recorded if e["event"] == "answer_withdrawn"]

    settings = load_settings(data_dir=data)
    point = plan(settings, trajectory, recorded, Context.from_repository(folder, settings))
    assert point.answer is None and [(r["attempt"], r["passed"]) for r in point.gate_runs] == [(1, False)]
    assert {"role": "user", "content": withdrawn["message"]} in point.messages

    resumed = rlm("resume", "last", "--script", str(script), "--json", data_dir=data)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert (result["verdict"], result["answer"]) == ("accepted", "marked")
    assert [(r["attempt"], r["name"], r["passed"]) for r in result["extra"]["gates"]] == [
        (1, "marker", False), (2, "marker", True)]
    gates = [e for e in read_trajectory(trajectory) if e["event"] == "gate"]
    assert [(g["attempt"], g["passed"]) for g in gates] == [(1, False), (2, True)]


# ---------- what must be resolved first ----------


def peers_file(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "peers.toml"
    path.write_text(f'[[peers]]\nalias = "review"\nurl = "{url}"\nskill = "code-review"\ndescription = "Reviews"\n')
    return path


@pytest.fixture
def dropping_peer() -> Iterator[HostilePeer]:
    peer = HostilePeer("drop_after_accept")  # accepts the task, then the connection drops: the outcome is unknown
    yield peer
    peer.close()


def test_a_root_whose_required_delegation_is_unknown_cannot_be_accepted_and_nothing_is_resent(
        dropping_peer: HostilePeer, workspace: Path, tmp_path: Path) -> None:
    (workspace / "calc.py").write_text(FIXED)  # the gate would pass: what blocks is the remote work
    settings = a2a_settings(tmp_path / "data", a2a_peers_file=peers_file(tmp_path, dropping_peer.url), gates=GATE)
    result, _ = run(settings, workspace, [
        {"code": "h = a2a.start('review', 'review calc.py')\nprint(h.status()['state'])\nfinal_answer('reviewed')"},
    ])
    assert (result.stop_reason, result.answer, result.verdict) == ("answered", "reviewed", "not_verified")
    [blocker] = result.extra["blocked_by"]
    [delegation] = result.extra["delegations"]
    assert blocker.startswith(f"required delegation {delegation['id']} to 'review' is unknown")
    assert "not resent" in blocker and "rlm reconcile" in blocker
    assert result.extra["verdict_reason"].startswith("acceptance is blocked: required delegation")
    assert result.extra["gates"] == []  # no gate can accept it: none ran
    assert dropping_peer.hits["SendMessage"] == 1  # never replayed, by the answer's check nor by the run's end
    [blocked] = events(result, "acceptance_blocked")
    assert blocked["blocked_by"] == [blocker]


def test_a_peers_completed_work_is_evidence_never_acceptance(workspace: Path, tmp_path: Path) -> None:
    peer = SdkPeer()
    try:
        settings = a2a_settings(tmp_path / "data", a2a_peers_file=peers_file(tmp_path, peer.url))
        result, _ = run(settings, workspace, [
            {"code": "h = a2a.start('review', 'review calc.py')\nprint(h.wait(10)['state'])\nfinal_answer('ok')"},
        ])
    finally:
        peer.close()
    [delegation] = result.extra["delegations"]
    assert (delegation["state"], delegation["verified"]) == ("completed", False)
    assert result.verdict == "not_verified" and result.extra["blocked_by"] == []


# ---------- the record, shown ----------


@pytest.fixture
def accepted_run(make_settings: Any, workspace: Path) -> RunResult:
    result, _ = run(make_settings(gates=GATE), workspace, fixing_turns(workspace, "host"))
    assert result.verdict == "accepted"
    return result


def test_rlm_show_prints_each_gate_its_output_and_the_verdict(accepted_run: RunResult, settings: RLMSettings,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["--data-dir", str(settings.data_dir), "show", accepted_run.run_id]) == 0
    shown = capsys.readouterr().out
    assert "gate tests (attempt 1): FAILED (exit 1 after" in shown
    assert "AssertionError: -1 != 5" in shown
    assert "[answer withdrawn: tests failed; the model was told and went on]" in shown
    assert "gate tests (attempt 2): passed (exit 0 after" in shown
    assert "verdict: accepted: every gate passed (attempt 2)" in shown
    assert shown.index("attempt 1") < shown.index("answer withdrawn") < shown.index("attempt 2") < shown.index("verdict")


def test_the_page_of_a_run_shows_each_gate_its_output_and_the_verdict(
        accepted_run: RunResult, settings: RLMSettings, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    from .test_show_html import CHROMIUM

    page_file = tmp_path / "page.html"
    assert main(["--data-dir", str(settings.data_dir), "show", "--html", accepted_run.run_id, "-o",
                 str(page_file)]) == 0
    assert CHROMIUM.is_file(), "no /usr/bin/chromium: `./dev test` installs it (apt-get install chromium)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(page_file.as_uri())
            gates = page.locator("section.run:visible .gate")
            assert gates.count() == 2
            failed = page.locator("section.run:visible .gate.failed")
            assert "gate tests (attempt 1): FAILED (exit 1" in failed.locator("p").inner_text()
            assert "AssertionError: -1 != 5" in failed.locator("pre.output").inner_text()
            assert f"$ {UNITTEST}" in failed.locator("pre.code").inner_text()
            assert "passed (exit 0" in page.locator("section.run:visible .gate.passed").inner_text()
            assert "answer withdrawn (attempt 1): tests failed" in page.locator(".banner").inner_text()
            verdict = page.locator(".outcome .verdict.accepted")
            assert verdict.inner_text() == "verdict: accepted: every gate passed (attempt 2)"
            rows = page.locator("table.gates tbody tr")
            assert rows.count() == 2 and "FAILED" in rows.nth(0).inner_text() and "passed" in rows.nth(1).inner_text()
            assert "accepted" in page.locator("nav.tree .node").inner_text()
            assert errors == []
        finally:
            browser.close()


# ---------- the jobs file ----------


def test_a_jobs_file_from_before_gates_takes_gate_jobs_and_keeps_its_jobs_and_leases(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA.replace(", 'gate'", ""))  # the table as it was: no 'gate' surface allowed
    conn.execute("INSERT INTO jobs (seq, id, root_id, agent_id, run_id, request_id, fingerprint, surface, command, "
                 "workspace, cwd, read_only, deadline_s, state, owner, stdout_path, stderr_path, created_at, "
                 "exit_code) VALUES "
                 "(1, 'j1', 'r', 'r', 'r', 'q1', 'f', 'tool', 'make', '/w', '.', 0, 5, 'exited', 'o', 'a', 'b', 1, 0)")
    conn.execute("INSERT INTO workspace_leases VALUES ('/w', 'j1', 1)")
    conn.commit()
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO jobs (seq, id, root_id, agent_id, run_id, request_id, fingerprint, surface, "
                     "command, workspace, cwd, read_only, deadline_s, state, owner, stdout_path, stderr_path, "
                     "created_at) VALUES (2, 'j2', 'r', 'r', 'r', 'q2', 'f', 'gate', 'x', '/w', '.', 0, 5, "
                     "'waiting', 'o', 'a', 'b', 1)")
    conn.close()
    store = JobStore(path)
    job, replayed = store.admit(root_id="r", agent_id="r", run_id="r", request_id="q2", fingerprint="g",
                                surface="gate", command=UNITTEST, workspace="/w", cwd=".", read_only=False,
                                deadline_s=5, max_jobs=10)
    assert (job.id, job.surface, replayed) == ("j2", "gate", False)
    assert store.leases() == {"j1": "/w"} and store.job("j1").command == "make"


# ---------- the rule ----------


def test_the_verdict_rule_follows_its_table() -> None:
    from rlmfamily.gates.verdict import Attempt, GateRun, verdict_of

    def gate(passed: bool) -> GateRun:
        return GateRun(attempt=1, turn=1, name="tests", command="true", deadline_s=5, passed=passed,
                       state="exited", exit_code=0 if passed else 1, stopped_by=None, duration_s=0.1, job_id="j1")

    passed, failed = Attempt(1, 1, (gate(True),)), Attempt(1, 1, (gate(True), gate(False)))
    broken = Attempt(1, 1, (), error="gate 'tests': [workspace_lease_held] ...")
    cases = [
        (dict(not_gated="no gates", blocked_by=[], last=passed, answered=True), "not_verified"),
        (dict(not_gated="no gates", blocked_by=["child c1 is still running"], last=None, answered=True),
         "not_verified"),
        (dict(not_gated=None, blocked_by=["child c1 is still running"], last=passed, answered=True), "not_verified"),
        (dict(not_gated=None, blocked_by=[], last=None, answered=False), "not_verified"),
        (dict(not_gated=None, blocked_by=[], last=broken, answered=True), "not_verified"),
        (dict(not_gated=None, blocked_by=[], last=failed, answered=True), "gates_failed"),
        (dict(not_gated=None, blocked_by=[], last=failed, answered=False), "gates_failed"),
        (dict(not_gated=None, blocked_by=[], last=passed, answered=True), "accepted"),
        (dict(not_gated=None, blocked_by=[], last=passed, answered=False), "not_verified"),
    ]
    for inputs, expected in cases:
        verdict, reason = verdict_of(**inputs)
        assert verdict == expected and reason, inputs
    assert verdict_of(not_gated="no gates", blocked_by=[f"b{i}" for i in range(7)], last=passed,
                      answered=True)[1] == "acceptance is blocked: b0; b1; b2; b3; b4 (and 2 more)"
