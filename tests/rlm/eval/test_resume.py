"""An experiment killed with SIGKILL in the middle of an attempt continues without redoing the
attempts that have a record; the killed attempt runs again in a new try folder, and the usage of
the killed try (a call in flight) stays unknown in the experiment's allowance."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlmfamily.budget import BudgetLedger
from rlmfamily.cli import main

pytestmark = pytest.mark.timeout(120)
WAIT_S = 60  # a generous deadline for what the test waits for; it returns as soon as it is seen


def _pack(folder: Path, release: Path) -> Path:
    folder.mkdir()
    (folder / "pack.toml").write_text('name = "kill"\n[conditions.held]\nprovider = "scripted"\nscript = "hold"\n')
    for task, script in (
        ("a-first", '[[root]]\ncode = "final_answer(\'42\')"\n'),
        ("b-held", '[[root]]\ncode = "r = llm_query(\'what is the answer?\', context.read(\'notes.txt\'))\\n'
                   'final_answer(r.text)"\n[[subcall]]\npattern = "answer is (\\\\d+)"\nanswer = "\\\\1"\n'
                   f'hold_after = 0\nhold_until_file = "{release}"\n'),
    ):
        root = folder / "tasks" / task
        (root / "workspace").mkdir(parents=True)
        (root / "scripts").mkdir()
        (root / "workspace" / "notes.txt").write_text("The answer is 42.\n")
        (root / "scripts" / "hold.toml").write_text(script)
        (root / "task.toml").write_text(f'id = "{task}"\nkind = "analysis"\ninstruction = "What is the answer?"\n'
                                        '[input]\nworkspace = "workspace"\n[evaluator]\nkind = "answer"\nnumber = 42\n')
    return folder


def _held_call_in_flight(budget_file: Path) -> bool:
    if not budget_file.exists():
        return False
    try:
        with sqlite3.connect(budget_file) as conn:
            return conn.execute("SELECT COUNT(*) FROM usage WHERE purpose = 'subcall' AND state = 'reserved'"
                                ).fetchone()[0] == 1
    except sqlite3.Error:
        return False  # the file is being created


def _wait_for(what: str, proc: subprocess.Popen[bytes], check) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert proc.poll() is None, f"the experiment ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.02)


def test_a_killed_experiment_resumes_without_redoing_finished_attempts(tmp_path: Path, capsys) -> None:
    release = tmp_path / "release"
    pack = _pack(tmp_path / "pack", release)
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "rlmfamily", "eval", "run", str(pack), "--conditions", "held",
                             "--results", str(results), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = results / "attempts" / "a-first__held__r1.json"
    held_budget = results / "work" / "b-held__held__r1" / "try-1" / "data" / "budget.sqlite3"
    try:
        _wait_for("the first attempt's record", proc, first.exists)
        _wait_for("the second attempt's sub-call to be in flight", proc, lambda: _held_call_in_flight(held_budget))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (results / "attempts" / "b-held__held__r1.json").exists()
    recorded = first.read_bytes()
    release.write_text("go")

    assert main(["eval", "run", str(pack), "--conditions", "held", "--results", str(results)]) == 0
    progress = capsys.readouterr().err
    assert "interrupted b-held__held__r1 (try-1): 1 call(s) of unknown usage" in progress
    assert "1 attempt(s) run, 1 done before" in progress
    assert first.read_bytes() == recorded  # not redone
    import json

    second = json.loads((results / "attempts" / "b-held__held__r1.json").read_text())
    assert second["try"] == "try-2" and second["accepted"] and second["answer_preview"] == "42"
    entries = {e.purpose: e.state for e in BudgetLedger(results / "budget.sqlite3").entries("experiment")}
    assert entries == {"attempt:a-first__held__r1:try-1": "settled", "attempt:b-held__held__r1:try-1": "unknown",
                       "attempt:b-held__held__r1:try-2": "settled"}
