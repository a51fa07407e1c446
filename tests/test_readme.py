"""The commands the README shows work as shown."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def readme_commands(prefix: str) -> list[list[str]]:
    return [shlex.split(line)[2:] for line in re.findall(rf"^{re.escape(prefix)} .*$", README, flags=re.MULTILINE)]


def test_the_readme_opens_with_the_run_and_test_commands_and_ci_runs_the_test_command():
    first_block = README.split("```")[1]
    lines = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert lines[:2] == ["./dev serve", "./dev test"]
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()


def test_the_offline_rlm_demo_in_the_readme_answers(tmp_path):
    commands = readme_commands("./dev rlm")
    assert [c[0] for c in commands] == ["demo", "show", "usage"]
    env = dict(os.environ, RLM_DATA_DIR=str(tmp_path))
    outputs = []
    for args in commands:
        done = subprocess.run([str(Path(sys.executable).parent / "rlm"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert "tried 5 times" in outputs[0]
    assert "turn 1" in outputs[1]
    assert "calls" in outputs[2]
