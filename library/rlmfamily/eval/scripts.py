"""The scripted models of offline mode, built from a task's own data.

- ``oracle`` makes a known-good attempt through the real session, kernel and tools: it looks at the
  corpus, writes the task's reference files (a python step on the host kernel, or ``bash`` commands
  in the python-bash profile, where it also runs the tests) or answers with the reference answer or
  the planted findings, asking one sub-call on the way.
- ``noop`` makes a known-bad one: it looks, changes nothing, and answers plausibly and wrongly
  (findings one line past each planted range, a high-severity finding on a clean bundle, a wrong number).
- any other name plays the task's ``scripts/<name>.toml`` (the scripted provider's format).

These measure the runner, the graders and the report. They say nothing about any model.
"""

from __future__ import annotations

import base64
import json
import tomllib
from pathlib import Path
from typing import Any

from rlmfamily.eval.conditions import Condition
from rlmfamily.eval.errors import ConditionInvalid
from rlmfamily.eval.pack import FindingsEvaluator, Task

SUBCALL_ANSWER = "the cited lines hold the defect"


def script_for(task: Task, condition: Condition, *, reference_answer: str | None) -> tuple[dict[str, Any], Path]:
    """The script of ``condition`` for ``task``, and the folder its relative hold files are in."""
    name = condition.script or ""
    if name == "oracle":
        return _oracle(task, condition, reference_answer), task.folder
    if name == "noop":
        return _noop(task), task.folder
    file = task.path(f"scripts/{name}.toml")
    try:
        return tomllib.loads(file.read_text()), file.parent
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConditionInvalid(f"condition {condition.name}: task {task.id} has no usable script {file}: {exc}") from None


def check_scripts(tasks: tuple[Task, ...], condition: Condition) -> None:
    """Refuse before the first attempt when a task lacks the script a condition plays."""
    if condition.provider != "scripted" or condition.script in ("oracle", "noop"):
        return
    missing = [t.id for t in tasks if not t.path(f"scripts/{condition.script}.toml").is_file()]
    if missing:
        raise ConditionInvalid(f"condition {condition.name} plays scripts/{condition.script}.toml, which tasks "
                               f"{', '.join(missing)} do not have")


def _base(condition: Condition) -> dict[str, Any]:
    return {"model": condition.model or "scripted", "default_answer": SUBCALL_ANSWER}


def _oracle(task: Task, condition: Condition, reference_answer: str | None) -> dict[str, Any]:
    script = _base(condition)
    kind = task.spec.kind
    if kind == "coding":
        files = _reference_files(task)
        if condition.profile == "python-bash":
            writes = " && ".join(f"mkdir -p \"$(dirname {p})\" && printf %s {b} | base64 -d > {p}" for p, b in files.items())
            script["root"] = [{"bash": {"command": "ls -R", "read_only": True}},
                              {"bash": writes},
                              {"bash": {"command": "python3 -m unittest -q 2>&1 | tail -n 5", "read_only": True}},
                              {"code": "final_answer('changed ' + ', '.join(%r))" % sorted(files)}]
        else:
            code = ("import base64, pathlib\n"
                    f"for path, data in {json.dumps(files)}.items():\n"
                    "    target = pathlib.Path(path)\n"
                    "    target.parent.mkdir(parents=True, exist_ok=True)\n"
                    "    target.write_bytes(base64.b64decode(data))\n"
                    "final_answer('changed ' + ', '.join(sorted(%s)))" % json.dumps(sorted(files)))
            script["root"] = [{"code": "print(context.stats())"}, {"code": code}]
        return script
    first = "r = llm_query('What does this part say?', context.chunk(4000)[0])\nprint(r.text)"
    if isinstance(task.spec.evaluator, FindingsEvaluator):
        findings = [{"path": p.path, "line": p.lines[0], "severity": p.severity, "class": p.defect_class,
                     "message": f"{p.defect_class} here"} for p in task.spec.evaluator.planted]
        answer = json.dumps(findings)
    else:
        answer = reference_answer or task.spec.reference.answer or ""
    script["root"] = [{"code": "print(context.stats())"}, {"code": first},
                      {"code": f"final_answer({answer!r})"}]
    return script


def _noop(task: Task) -> dict[str, Any]:
    evaluator = task.spec.evaluator
    if task.spec.kind == "coding":
        answer = "Done: the change is made and the tests pass."
    elif isinstance(evaluator, FindingsEvaluator):
        if evaluator.planted:
            wrong = [{"path": p.path, "line": p.lines[1] + 1, "severity": p.severity, "class": p.defect_class}
                     for p in evaluator.planted]
        else:
            wrong = [{"path": "README.md", "line": 1, "severity": "high", "class": "sql-injection"}]
        answer = json.dumps(wrong)
    else:
        answer = "I looked carefully: the answer is 0, set in config.py."
    return {"model": "scripted", "default_answer": SUBCALL_ANSWER,
            "root": [{"code": "print(context.stats())"}, {"code": f"final_answer({answer!r})"}]}


def _reference_files(task: Task) -> dict[str, str]:
    folder = task.spec.reference.files
    if folder is None:
        raise ConditionInvalid(f"task {task.id} has no reference.files: the oracle cannot make its change")
    root = task.path(folder)
    return {p.relative_to(root).as_posix(): base64.b64encode(p.read_bytes()).decode()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
