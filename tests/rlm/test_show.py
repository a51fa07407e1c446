"""What a person sees of a run: ``rlm show`` and ``rlm usage --run`` (the progress line: test_session).

Runs are real (the scripted provider, real kernels, real child processes); the
command is the installed console script, run as a user runs it.
"""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.budget import BudgetLedger
from rlmfamily.context import Context
from rlmfamily.providers import ScriptedProvider
from rlmfamily.providers.base import Completion
from rlmfamily.session import Session
from rlmfamily.trajectory import FILENAME, read_trajectory

from .family.support import child, run_root, script
from .holds import wait_until
from .test_cli import RLM, rlm

pytestmark = pytest.mark.timeout(120)


def _document_run(tmp_path: Path, *codes: str, data: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    doc = tmp_path / "notes.txt"
    doc.write_text("the answer is 42\n")
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"root": [{"code": c} for c in codes]}))
    return rlm("run", "--document", str(doc), "--script", str(path), "what is the answer?", data_dir=data, env=env)


def test_usage_finds_a_run_by_last_and_by_prefix_as_show_does(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _document_run(tmp_path, "final_answer('42')", data=data).returncode == 0
    [root] = BudgetLedger(data / "budget.sqlite3").roots()
    for name in ("last", root[:12]):
        assert rlm("show", name, data_dir=data).returncode == 0
        usage = rlm("usage", "--run", name, "--json", data_dir=data)
        assert usage.returncode == 0, usage.stderr
        listed = json.loads(usage.stdout)
        assert [r["root_id"] for r in listed["roots"]] == [root] and len(listed["entries"]) == 1
    unknown = rlm("usage", "--run", "nope", data_dir=data)
    assert unknown.returncode == 2 and "run_not_found" in unknown.stderr


def test_a_step_without_output_reads_no_output_to_a_person_and_the_model_keeps_its_hint(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _document_run(tmp_path, "x = 1", "final_answer('42')", data=data).returncode == 0
    show = rlm("show", "last", data_dir=data)
    assert "(no output)" in show.stdout and "print() what you want to see" not in show.stdout
    events = json.loads(rlm("show", "last", "--json", data_dir=data).stdout)
    [first] = [e for e in events if e["event"] == "step"][:1]
    assert first["observation"].endswith("(no output; print() what you want to see)")


def test_a_killed_run_is_shown_as_not_finished(tmp_path: Path) -> None:
    data = tmp_path / "data"
    doc = tmp_path / "notes.txt"
    doc.write_text("the answer is 42\n")
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"root": [{"code": "print('looking')"}, {"code": "import time\ntime.sleep(50)"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    env.update({"RLM_DATA_DIR": str(data), "COLUMNS": "200", "RLM_MAX_SLEEP_S_PER_STEP": "60"})
    proc = subprocess.Popen([RLM, "run", "--quiet", "--document", str(doc), "--script", str(path), "q?"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def first_step_done() -> bool:
            files = list((data / "runs").glob(f"*/{FILENAME}")) if (data / "runs").is_dir() else []
            return bool(files) and '"event": "step"' in files[0].read_text()

        wait_until(first_step_done, "the run's first step is in its trajectory")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its kernel, as a crash or an OOM kill leaves them
        proc.wait()
    show = rlm("show", "last", data_dir=data)
    assert show.returncode == 0, show.stderr
    assert "looking" in show.stdout
    [marker] = [line for line in show.stdout.splitlines() if "did not finish" in line]
    [run_id] = [p.parent.name for p in (data / "runs").glob(f"*/{FILENAME}")]
    resume = f"continue it with `rlm resume {run_id}`"
    assert marker.endswith(f"its process (pid {proc.pid}) ended without finishing the run: killed or crashed; {resume}")
    page = rlm("show", "--html", "last", "-o", "-", data_dir=data)  # the page says the same, with the command
    assert page.returncode == 0 and "continue it with `rlm resume " + run_id in html.unescape(page.stdout)


class _SecondAnswersFirst:
    """A scripted provider whose sub-call on "first" answers only after the one on "second" has settled."""

    name = "scripted"

    def __init__(self, inner: ScriptedProvider, ledger: BudgetLedger) -> None:
        self.inner, self.ledger = inner, ledger
        self.default_model, self.prices = inner.default_model, inner.prices

    def complete(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None, model: str | None,
                 timeout_s: float, purpose: str) -> Completion:
        if purpose == "subcall" and "first" in messages[-1]["content"]:
            wait_until(lambda: any(e.purpose == "subcall" and e.state == "settled" for e in self.ledger.entries()),
                       "the second prompt's answer settled")
        return self.inner.complete(messages, tools=tools, model=model, timeout_s=timeout_s, purpose=purpose)


def test_a_batch_is_recorded_and_shown_in_input_order_whichever_answers_first(make_settings, tmp_path: Path) -> None:
    settings = make_settings(max_concurrency=2)
    doc = tmp_path / "notes.txt"
    doc.write_text("the answer is 42\n")
    code = "rs = llm_query_batched(['first question', 'second question'])\nfinal_answer([r.text for r in rs])"
    provider = _SecondAnswersFirst(
        ScriptedProvider({"root": [{"code": code}], "subcall": [{"pattern": "(first|second) question",
                                                                 "answer": r"\1 answer"}]}),
        BudgetLedger(settings.budget_path))
    result = Session(context=Context.from_document(doc, settings), provider=provider, settings=settings).run("q")
    assert json.loads(result.answer) == ["first answer", "second answer"]
    subcalls = [e for e in read_trajectory(result.trajectory_path) if e["event"] == "subcall"]
    assert [(e["seq"], e["prompt"]) for e in subcalls] == [(1, "first question"), (2, "second question")]
    resolved = {e.id: e.resolved_at for e in BudgetLedger(settings.budget_path).entries()}
    assert resolved[subcalls[0]["budget_entry"]] > resolved[subcalls[1]["budget_entry"]], "the answers came the other way round"
    show = rlm("show", result.run_id, data_dir=settings.data_dir).stdout
    assert show.index("sub-call 1") < show.index("sub-call 2") and show.index("first question") < show.index("second question")


def test_a_childs_show_reports_its_own_usage_and_names_the_family_total(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    root = "h = rlm.run('count')\nfinal_answer(h.wait(50)['answer'])"
    counter = "rs = [llm_query('question %d' % i) for i in range(2)]\nfinal_answer('asked')"
    result = run_root(settings, tmp_path, script([root], [child("count", counter)]))
    assert result.answer == "asked" and result.budget.calls == 4  # the root's turn, the child's turn and 2 sub-calls
    child_show = rlm("show", f"{result.run_id}.c1", data_dir=settings.data_dir).stdout
    assert "answered after 1 turns, 2 sub-calls, 3 calls" in child_show and "family total 4 calls" in child_show
    root_show = rlm("show", result.run_id, data_dir=settings.data_dir).stdout
    assert "answered after 1 turns, 0 sub-calls, 1 calls" in root_show and "family total 4 calls" in root_show
