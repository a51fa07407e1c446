"""The graders decide from the output alone: known-good outputs are accepted, known-bad ones are not,
and a finding counts only with the planted path and a line inside the planted range."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlmfamily.eval.errors import PackInvalid
from rlmfamily.eval.graders import grade, grade_answer, grade_findings, parse_findings
from rlmfamily.eval.pack import AnswerEvaluator, FindingsEvaluator, Task, load_pack

PILOT = load_pack("pilot")
CODING = [t for t in PILOT.tasks if t.spec.kind == "coding"]
SQL = FindingsEvaluator.model_validate({"kind": "findings", "planted": [
    {"path": "api/reports.py", "lines": [2, 3], "severity": "high", "class": "sql-injection"},
    {"path": "api/config.py", "lines": [1, 1], "severity": "high", "class": "secret-in-code"}]})
CLEAN = FindingsEvaluator.model_validate({"kind": "findings", "planted": []})


def test_the_pilot_pack_has_the_tasks_the_issue_asks_for() -> None:
    kinds = [t.spec.kind for t in PILOT.tasks]
    single = [t for t in CODING if "single-file" in t.spec.tags]
    assert len(single) >= 12 and len([t for t in CODING if "multi-file" in t.spec.tags]) >= 3
    sizes = [t.spec.input.generator.files for t in PILOT.tasks if t.spec.kind == "investigation"]
    assert len(sizes) == 2 and max(sizes) >= 10 * min(sizes)
    reviews = [t.spec.evaluator for t in PILOT.tasks if t.spec.kind == "review"]
    assert any(e.planted for e in reviews) and any(not e.planted for e in reviews)
    assert kinds.count("analysis") >= 2


def _grade_both(task: Task, tmp: Path) -> tuple[bool, bool]:
    workspace = tmp / task.id
    shutil.copytree(task.path("workspace"), workspace)
    before = grade(task, answer="done", workspace=workspace)
    shutil.copytree(task.path(task.spec.reference.files or ""), workspace, dirs_exist_ok=True)
    after = grade(task, answer="done", workspace=workspace)
    return before.accepted, after.accepted


def test_every_coding_task_rejects_its_input_and_accepts_its_reference_change(tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        verdicts = dict(zip([t.id for t in CODING], pool.map(lambda t: _grade_both(t, tmp_path), CODING)))
    assert verdicts == {t.id: (False, True) for t in CODING}


def test_editing_a_protected_test_does_not_pass_it(tmp_path: Path) -> None:
    task = PILOT.task("fix-leap-year")
    workspace = tmp_path / "w"
    shutil.copytree(task.path("workspace"), workspace)
    (workspace / "test_calendar_rules.py").write_text("import unittest\n\nclass T(unittest.TestCase):\n"
                                                      "    def test_ok(self):\n        pass\n")
    result = grade(task, answer="done", workspace=workspace)
    assert not result.accepted and result.detail["restored"] == ["test_calendar_rules.py"]
    assert result.detail["tests_total"] == 2 and result.score == 0.5


def test_a_finding_counts_only_with_the_planted_path_and_a_line_in_range() -> None:
    answer = ('[{"path": "api/reports.py", "line": 3, "severity": "high", "class": "sql"},'
              ' {"path": "api/handlers.py", "line": 2, "severity": "high"},'
              ' {"path": "api/config.py", "line": 2, "severity": "high"}]')
    result = grade_findings(SQL, answer)
    assert result.detail["matched"] == 1 and result.detail["recall"] == 0.5
    assert result.detail["precision"] == pytest.approx(1 / 3) and not result.accepted
    assert result.detail["missed"] == ["secret-in-code"]


def test_the_planted_set_found_at_the_cited_lines_is_accepted() -> None:
    answer = ('```json\n{"findings": [{"path": "./api/reports.py", "line": 2, "severity": "high"},'
              ' {"path": "api/config.py", "line": 1, "severity": "critical"},'
              ' {"path": "api/handlers.py", "line": 4, "severity": "low"}]}\n```')
    result = grade_findings(SQL, answer)
    assert result.accepted and result.detail["recall"] == 1.0 and result.detail["precision"] == pytest.approx(2 / 3)
    assert result.score == pytest.approx(0.8)


def test_a_clean_bundle_fails_on_a_high_finding_and_passes_on_a_low_one() -> None:
    assert not grade_findings(CLEAN, '[{"path": "a.py", "line": 1, "severity": "high"}]').accepted
    assert grade_findings(CLEAN, '[{"path": "a.py", "line": 1, "severity": "low"}]').accepted
    assert grade_findings(CLEAN, "[]").accepted


def test_malformed_findings_are_counted_not_trusted() -> None:
    assert parse_findings("no json here") == ([], 1)
    findings, malformed = parse_findings('[{"path": "a.py", "line": "7"}, {"path": "a.py", "line": 7}]')
    assert malformed == 1 and findings[0]["line"] == 7
    assert not grade_findings(SQL, None).accepted


def test_a_known_answer_needs_every_phrase_and_the_number() -> None:
    evaluator = AnswerEvaluator(kind="answer", must_contain=["settings/production.py"], number=12)
    assert grade_answer(evaluator, "It is 12, set in settings/production.py:6").accepted
    wrong = grade_answer(evaluator, "It is 4, set in settings/production.py")
    assert not wrong.accepted and wrong.score == 0.5
    assert not grade_answer(evaluator, None).accepted


def _task(folder: Path, text: str, name: str = "bad-task") -> Path:
    (folder / "tasks" / name).mkdir(parents=True)
    (folder / "tasks" / name / "task.toml").write_text(text)
    (folder / "pack.toml").write_text('name = "t"\n')
    return folder


def test_an_invalid_task_is_refused_at_load_naming_the_file_and_the_field(tmp_path: Path) -> None:
    _task(tmp_path, 'id = "bad-task"\nkind = "coding"\ninstruction = "x"\n[input]\nworkspace = "missing"\n'
                    '[evaluator]\nkind = "answer"\nmust_contain = ["x"]\n[limits]\nmax_turns = 0\n')
    with pytest.raises(PackInvalid) as caught:
        load_pack(tmp_path)
    text = caught.value.message
    assert "bad-task/task.toml: limits.max_turns: Input should be greater than or equal to 1" in text
    assert caught.value.code == "eval_pack_invalid"


def test_a_planted_range_past_the_end_of_its_file_is_refused(tmp_path: Path) -> None:
    _task(tmp_path, 'id = "rev"\nkind = "review"\ninstruction = "x"\n[input]\nworkspace = "w"\n[evaluator]\n'
                    'kind = "findings"\n[[evaluator.planted]]\npath = "a.py"\nlines = [2, 9]\nseverity = "high"\n'
                    'class = "x"\n', name="rev")
    (tmp_path / "tasks" / "rev" / "w").mkdir()
    (tmp_path / "tasks" / "rev" / "w" / "a.py").write_text("one\ntwo\n")
    with pytest.raises(PackInvalid, match=r"evaluator.planted.0.lines: \[2, 9\] runs past the end of a.py"):
        load_pack(tmp_path)
