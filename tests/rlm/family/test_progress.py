"""The live progress line of ``rlm run`` names the family's running children and their turn.

The root runs a real child process (the scripted provider, Monty); the child's
first step waits in its sandbox for a family message, so "the child is running"
holds until the test sends it, without racing a sleep.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rlmfamily.cli import _Progress
from rlmfamily.context import Context
from rlmfamily.family.inbox import Inbox
from rlmfamily.family.progress import RunningChildren
from rlmfamily.family.store import FamilyStore
from rlmfamily.providers import ScriptedProvider
from rlmfamily.session import RunResult, Session

from ..holds import wait_until
from .support import DOCUMENT, MESSAGE_WAIT_SETTINGS, WAIT_FOR_PARENT, child, script

pytestmark = pytest.mark.timeout(90)

ROOT = "h = rlm.run('wait for the go')\nfinal_answer(h.wait(50)['answer'])"


def test_the_progress_line_names_running_children_with_their_turn(make_settings, tmp_path: Path) -> None:
    settings = make_settings(**MESSAGE_WAIT_SETTINGS)
    progress = _Progress(settings.max_turns, children=RunningChildren(settings, refresh_s=0.0))
    document = tmp_path / "ferry.txt"
    document.write_text(DOCUMENT)
    data = script([ROOT], [child("wait for the go", WAIT_FOR_PARENT, "final_answer(released)")])
    session = Session(context=Context.from_document(document, settings), provider=ScriptedProvider(data),
                      settings=settings, kernel="monty", on_event=progress.update)
    results: list[RunResult] = []
    runner = threading.Thread(target=lambda: results.append(session.run("question")), daemon=True)
    runner.start()
    try:
        first = progress.render().plain
        assert "children" not in first, "no family member runs before the root starts one"
        wait_until(lambda: "children 1 running (c1 turn 1)" in progress.render().plain,
                   "the progress line shows the child in its first turn")
    finally:
        # The root tells its child to go on (the child's code waits for any family message).
        Inbox(FamilyStore(settings.family_path), settings, session.run_id, session.run_id).send(
            f"{session.run_id}.c1", "go")
        runner.join(60)
    [result] = results
    assert result.answer == "released", result.error
    last = progress.render().plain
    assert "children 0 running, 1 ended" in last and last.endswith("done")


def test_the_line_counts_the_children_it_does_not_name() -> None:
    from rlmfamily.family.progress import MAX_NAMED, RunningChild, describe

    running = [RunningChild(f"c{i}", "running", i) for i in range(1, MAX_NAMED + 3)]
    line = describe(running, ended=2)
    assert line.startswith(f"children {MAX_NAMED + 2} running (c1 turn 1, ")
    assert line.endswith(f"c{MAX_NAMED} turn {MAX_NAMED}, +2 more), 2 ended")
    assert describe([RunningChild("c1", "admitted", None)], ended=0) == "children 1 running (c1 starting)"
