"""Independent graders: acceptance decided from the attempt's output alone, never by asking a model.

- ``tests``: the task's test command in a fresh copy of the output workspace, with the task's
  protected files (its tests) restored from the pinned input, so editing a test does not pass it;
  accepted when the command exits 0; the partial score is the fraction of tests that passed, when
  the output says (unittest's or pytest's summary), else null. An attempt of the container kernel
  is graded in a container of the same image (``python`` is the image's ``python3``), the copy
  mounted as its workspace: what passed there is what the attempt could run.
- ``findings``: the answer's findings against the planted set; a finding counts only when it cites
  a planted path and a line inside that defect's range. Precision, recall; a clean bundle is
  accepted when no finding has a failing severity.
- ``answer``: every expected phrase (case-insensitive) and, if set, the expected number.

The partial score is kept apart from acceptance: a run can score 0.9 and not be accepted.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlmfamily.container.engine import ContainerUnavailable
from rlmfamily.eval.pack import AnswerEvaluator, FindingsEvaluator, Task, TestsEvaluator
from rlmfamily.settings import RLMSettings

MAX_GRADER_OUTPUT_CHARS = 4_000  # of a test command's output kept in the grade
MAX_FINDINGS = 200  # findings read from one answer; more are counted and ignored
GRADER_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")  # what a test command inherits


@dataclass
class Grade:
    accepted: bool
    score: float | None  # partial credit in [0, 1], separate from acceptance; None = not measurable
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def grade(task: Task, *, answer: str | None, workspace: Path | None,
          container_settings: RLMSettings | None = None) -> Grade:
    """``container_settings``: the settings of a container-kernel attempt, whose tests run in its image."""
    evaluator = task.spec.evaluator
    if isinstance(evaluator, TestsEvaluator):
        assert workspace is not None, "a tests grader needs the attempt's workspace"
        return grade_tests(evaluator, pristine=task.path(task.spec.input.workspace or "."), output=workspace,
                           container_settings=container_settings)
    if isinstance(evaluator, FindingsEvaluator):
        return grade_findings(evaluator, answer)
    return grade_answer(evaluator, answer)


# ---------- tests ----------

def grade_tests(evaluator: TestsEvaluator, *, pristine: Path, output: Path,
                container_settings: RLMSettings | None = None) -> Grade:
    where: dict[str, Any] = ({} if container_settings is None
                             else {"graded_in": container_settings.container_image})
    with tempfile.TemporaryDirectory(prefix="rlm-eval-grade-") as tmp:
        fresh = Path(tmp) / "workspace"
        shutil.copytree(output, fresh, ignore=shutil.ignore_patterns("__pycache__", ".rlm"))
        restored = _restore_protected(evaluator.protected, pristine, fresh)
        try:
            done = (_run_tests(evaluator, fresh) if container_settings is None
                    else _run_tests_in_container(evaluator, fresh, container_settings))
        except subprocess.TimeoutExpired:
            return Grade(False, 0.0, {"reason": f"the tests ran past {evaluator.timeout_s:g} s (evaluator.timeout_s)",
                                      "restored": restored, **where})
        except ContainerUnavailable as exc:
            return Grade(False, None, {"reason": f"the tests could not run in the container: {exc.message}",
                                       "restored": restored, **where})
    text = (done.stdout + "\n" + done.stderr).strip()
    passed, total = _test_counts(text)
    score = None if total is None else (passed / total if total else 0.0)
    return Grade(done.returncode == 0 and total != 0, score, {
        "exit_status": done.returncode, "tests_passed": passed, "tests_total": total, "restored": restored,
        "output_tail": text[-MAX_GRADER_OUTPUT_CHARS:], **where})


def _run_tests(evaluator: TestsEvaluator, fresh: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable if part == "python" else part for part in evaluator.command]
    env = {k: os.environ[k] for k in GRADER_ENV if k in os.environ} | {"PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(command, cwd=fresh, env=env, capture_output=True, text=True,
                          timeout=evaluator.timeout_s, stdin=subprocess.DEVNULL)


def _run_tests_in_container(evaluator: TestsEvaluator, fresh: Path,
                            settings: RLMSettings) -> subprocess.CompletedProcess[str]:
    """The test command in a container of the attempt's image and limits, ``fresh`` its workspace; removed after."""
    from rlmfamily.container.sandbox import RunContainer

    command = ["python3" if part == "python" else part for part in evaluator.command]
    with RunContainer.open(settings, run_id="eval-grade", workspace=fresh) as box:
        argv = box.exec_argv(command, env={"PYTHONDONTWRITEBYTECODE": "1"}, interactive=False)
        return subprocess.run(argv, cwd=box.client_dir, env=dict(box.engine.env), capture_output=True, text=True,
                              timeout=evaluator.timeout_s, stdin=subprocess.DEVNULL)


def _restore_protected(globs: list[str], pristine: Path, fresh: Path) -> list[str]:
    restored = []
    for path in sorted(p for p in pristine.rglob("*") if p.is_file()):
        relative = path.relative_to(pristine).as_posix()
        if any(fnmatch.fnmatchcase(relative, g) for g in globs):
            target = fresh / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            restored.append(relative)
    return restored


def _test_counts(text: str) -> tuple[int | None, int | None]:
    ran = re.search(r"^Ran (\d+) tests?", text, re.MULTILINE)
    if ran:  # unittest
        total = int(ran.group(1))
        failed = re.search(r"^FAILED \(([^)]*)\)", text, re.MULTILINE)
        bad = sum(int(n) for k, n in re.findall(r"(failures|errors)=(\d+)", failed.group(1))) if failed else 0
        return total - bad, total
    summary = re.search(r"=+ (.*) in [\d.]+s", text)
    if summary:  # pytest
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error|errors)", summary.group(1))}
        passed = counts.get("passed", 0)
        return passed, passed + counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    return None, None


# ---------- findings ----------

def parse_findings(answer: str | None) -> tuple[list[dict[str, Any]], int]:
    """The findings of an answer (a JSON list, or an object with ``findings``, possibly in a code fence),
    and how many entries were malformed."""
    if not answer:
        return [], 0
    text = answer.strip()
    fence = re.search(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL)
    if fence:
        text = fence.group(1)
    try:
        data = json.loads(text)
    except ValueError:
        start, end = text.find("["), text.rfind("]")
        if not 0 <= start < end:
            return [], 1  # an answer with no findings list at all is malformed, not "no findings"
        try:
            data = json.loads(text[start:end + 1])
        except ValueError:
            return [], 1
    if isinstance(data, dict):
        data = data.get("findings", [])
    if not isinstance(data, list):
        return [], 1
    kept, malformed = [], 0
    for item in data[:MAX_FINDINGS]:
        line = item.get("line") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not isinstance(line, int):
            malformed += 1
            continue
        kept.append({"path": item["path"].removeprefix("./"),
                     "line": line, "severity": str(item.get("severity", "medium")).lower(),
                     "class": str(item.get("class", ""))})
    return kept, malformed + max(0, len(data) - MAX_FINDINGS)


def grade_findings(evaluator: FindingsEvaluator, answer: str | None) -> Grade:
    findings, malformed = parse_findings(answer)
    planted = evaluator.planted
    found = [False] * len(planted)
    true_positives = 0
    for finding in findings:
        hit = next((i for i, p in enumerate(planted)
                    if p.path == finding["path"] and p.lines[0] <= finding["line"] <= p.lines[1]), None)
        if hit is not None:
            true_positives += 1
            found[hit] = True
    failing = [f for f in findings if f["severity"] in evaluator.fail_severities]
    detail: dict[str, Any] = {"findings": len(findings), "malformed": malformed, "matched": true_positives,
                              "planted": len(planted), "found": [p.defect_class for p, f in zip(planted, found) if f],
                              "missed": [p.defect_class for p, f in zip(planted, found) if not f]}
    if not planted:  # a clean bundle
        detail["failing_findings"] = len(failing)
        return Grade(not failing, 1.0 if not failing else 0.0, detail)
    recall = sum(found) / len(planted)
    precision = true_positives / len(findings) if findings else 0.0
    detail |= {"precision": precision, "recall": recall}
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return Grade(recall >= evaluator.min_recall and precision >= evaluator.min_precision, f1, detail)


# ---------- answers ----------

def grade_answer(evaluator: AnswerEvaluator, answer: str | None) -> Grade:
    text = (answer or "").lower()
    present = [p for p in evaluator.must_contain if p.lower() in text]
    forbidden = [p for p in evaluator.must_not_contain if p.lower() in text]
    checks = len(evaluator.must_contain) + (evaluator.number is not None)
    number_ok = None
    if evaluator.number is not None:
        numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", text)]
        number_ok = any(abs(n - evaluator.number) < 1e-9 for n in numbers)
    passed = len(present) + bool(number_ok)
    accepted = passed == checks and not forbidden and answer is not None
    return Grade(accepted, passed / checks if checks else None, {
        "present": present, "missing": [p for p in evaluator.must_contain if p not in present],
        "number_found": number_ok, "forbidden_present": forbidden})
