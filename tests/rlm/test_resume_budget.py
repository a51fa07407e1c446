"""``rlm resume`` of a run killed under ``--max-usd`` says what to reconcile first, and the command, before resuming.

The in-flight sub-call's cost is unknown after the kill, and unknown cost blocks a USD limit: resumed as it is, the
run could ask nothing but a forced final answer. The resume refuses, naming the entry; once it is reconciled with
the command it printed, the run resumes to its real answer.
"""

from __future__ import annotations

import json
import re

import pytest

from rlmfamily.trajectory import read_trajectory

from .test_cli import rlm
from .test_resume import interrupted  # noqa: F401 - the fixture: a run killed while its second sub-call is in flight

pytestmark = pytest.mark.timeout(180)


def test_a_run_killed_under_max_usd_names_the_entry_to_reconcile_before_it_resumes(interrupted) -> None:  # noqa: F811
    run = interrupted("monty", env={"RLM_MAX_USD": "5"})
    run.wait_for_the_held_subcall()
    run.kill()
    run.release()

    refused = run.resume()

    assert refused.returncode == 2 and "[resume_needs_reconcile]" in refused.stderr, refused.stderr
    [root] = run.ledger.roots()
    [unknown] = [e for e in run.ledger.entries(root) if e.state == "unknown"]
    command = re.search(r"`(rlm usage --reconcile \d+) --tokens N --usd X", refused.stderr)
    assert command is not None and command.group(1) == f"rlm usage --reconcile {unknown.id}"
    assert "run_resumed" not in {e["event"] for e in read_trajectory(run.trajectory)}

    done = rlm("usage", "--reconcile", str(unknown.id), "--tokens", "30", "--usd", "0", "--reason",
               "the replayed script costs nothing", data_dir=run.data)
    assert done.returncode == 0, done.stderr
    resumed = run.resume("--json")

    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["answer"] == "ONE TWO 42" and result["stop_reason"] == "answered"
