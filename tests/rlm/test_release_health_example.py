"""The journey's example project (library/rlmfamily/examples/release_health): its three tests fail as shipped,
each for its own rule, and pass once release_health() is rewritten as the journey's scripted model rewrites it
(the bash turn of examples/release_health_journey.toml, run here as the model's bash tool would run it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from .conftest import REPO_ROOT

EXAMPLES = REPO_ROOT / "library" / "rlmfamily" / "examples"
PROJECT = EXAMPLES / "release_health"
JOURNEY = EXAMPLES / "release_health_journey.toml"
TESTS = ("test_an_older_success_does_not_hide_a_newer_failure", "test_a_duplicated_event_makes_one_row_per_service",
         "test_a_successful_deployment_over_300_seconds_is_slow")


def _unittest(workspace: Path) -> subprocess.CompletedProcess[str]:
    # As the gate runs them: `python3 -m unittest` in the workspace, the standard library alone.
    return subprocess.run([sys.executable, "-I", "-m", "unittest", "-v"], cwd=workspace, capture_output=True,
                          text=True, timeout=60)


def _fix_of_the_journey() -> str:
    turns = tomllib.loads(JOURNEY.read_text())["root"]
    [edit] = [turn["bash"] for turn in turns if "def release_health(" in str(turn.get("bash", ""))]
    return edit


def test_the_three_tests_fail_as_shipped_each_on_its_own_rule(tmp_path):
    workspace = tmp_path / "release_health"
    shutil.copytree(PROJECT, workspace)
    done = _unittest(workspace)
    assert done.returncode == 1, done.stderr
    assert "Ran 3 tests" in done.stderr and "FAILED (failures=3)" in done.stderr, done.stderr
    for name in TESTS:
        assert f"{name} " in done.stderr and "... FAIL" in done.stderr.split(name, 1)[1].splitlines()[0], done.stderr


def test_the_journeys_fix_makes_the_three_tests_pass(tmp_path):
    workspace = tmp_path / "release_health"
    shutil.copytree(PROJECT, workspace)
    edit = subprocess.run(["bash", "--noprofile", "--norc", "-c", _fix_of_the_journey()], cwd=workspace,
                          capture_output=True, text=True, timeout=60)
    assert edit.returncode == 0, edit.stderr
    assert (workspace / "release_health" / "report.py").read_text() != (PROJECT / "release_health" / "report.py").read_text()
    done = _unittest(workspace)
    assert done.returncode == 0, done.stderr
    assert "Ran 3 tests" in done.stderr and done.stderr.rstrip().endswith("OK"), done.stderr
    # Only the function changed: the parser, the fixture and the tests are as shipped.
    for kept in ("release_health/events.py", "fixtures/deployments.jsonl", "tests/test_report.py", "RUNBOOK.md"):
        assert (workspace / kept).read_bytes() == (PROJECT / kept).read_bytes(), kept
