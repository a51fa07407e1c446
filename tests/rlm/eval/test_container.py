"""The container condition: an attempt's run uses the container kernel and its coding attempt is graded inside the
same image (a test that passes only in the container's /workspace passes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmfamily.cli import main

pytestmark = pytest.mark.timeout(120)


def test_the_pilot_packs_container_condition_runs_and_grades_in_the_image(
        container_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_CONTAINER_IMAGE", container_image)
    results = tmp_path / "results"
    assert main(["eval", "run", "pilot", "--conditions", "oracle-container", "--tasks", "fix-pagination",
                 "--results", str(results), "--quiet"]) == 0
    record = json.loads((results / "attempts" / "fix-pagination__oracle-container__r1.json").read_text())
    assert record["accepted"] and record["stop_reason"] == "answered", record
    assert record["grade"]["graded_in"] == container_image and record["grade"]["tests_passed"] == 3
    trajectory = next((results / "work").rglob("trajectory.jsonl")).read_text()
    assert '"kernel": "container"' in trajectory


def test_a_container_attempt_is_graded_in_the_container_not_on_the_host(
        container_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pack = tmp_path / "pack"
    task = pack / "tasks" / "where-am-i"
    (task / "workspace").mkdir(parents=True)
    (pack / "pack.toml").write_text('name = "where"\n[conditions.noop-container]\nprovider = "scripted"\n'
                                    'script = "noop"\nkernel = "container"\n')
    (task / "task.toml").write_text('id = "where-am-i"\nkind = "coding"\ninstruction = "Change nothing."\n'
                                    '[input]\nworkspace = "workspace"\n[evaluator]\nkind = "tests"\n'
                                    'command = ["python", "-m", "unittest", "-q"]\nprotected = ["test_where.py"]\n'
                                    '[reference]\nanswer = "nothing"\n')
    (task / "workspace" / "test_where.py").write_text(
        "import os, unittest\n\n\nclass Where(unittest.TestCase):\n"
        "    def test_it_runs_in_the_containers_workspace(self):\n"
        "        self.assertEqual(os.getcwd(), '/workspace')\n        self.assertTrue(os.path.isdir('/rlm'))\n")
    monkeypatch.setenv("RLM_CONTAINER_IMAGE", container_image)
    results = tmp_path / "results"
    assert main(["eval", "run", str(pack), "--conditions", "noop-container", "--results", str(results),
                 "--quiet"]) == 0
    record = json.loads((results / "attempts" / "where-am-i__noop-container__r1.json").read_text())
    assert record["accepted"] and record["grade"]["tests_passed"] == 1, record["grade"]
