"""Children survive their parent: SIGKILL the parent process mid-run, restart, and see what each child became."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlmfamily.cli import main
from rlmfamily.family import procs
from rlmfamily.family.children import Family
from rlmfamily.family.store import Agent, FamilyStore

from ..conftest import REPO_ROOT
from ..holds import Gate, wait_until
from .support import DOCUMENT, child, script

pytestmark = pytest.mark.timeout(60)

PARENT = """
import json, sys
from rlmfamily import Context, Session, load_settings
from tests.rlm.family.support import GatedScript
data_dir, document, script_file, gates, run_id = sys.argv[1:6]
settings = load_settings(data_dir=data_dir)
provider = GatedScript(json.loads(open(script_file).read()), json.loads(gates), source="parent")
Session(context=Context.from_document(document, settings), provider=provider, settings=settings,
        run_id=run_id).run("question")
"""


def _kill_tree(pid: int) -> None:
    for process in procs.descendants(pid) + [procs.stat(pid)]:
        if process is not None:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_after_the_parent_is_killed_a_live_child_is_reattached_and_a_dead_one_is_interrupted(
        make_settings, tmp_path: Path, capsys) -> None:
    settings = make_settings()
    root_id = "restart-root"
    (tmp_path / "ferry.txt").write_text(DOCUMENT)
    data = script(["a = rlm.run('long')\nb = rlm.run('doomed')\nfinal_answer(rlm.wait_all([a, b], 50))"], [
        child("long", "final_answer('long result')"),
        child("doomed", "final_answer('never')"),
    ])
    # Both children hold their model turn at a gate: "long" until the test opens it, "doomed" for good.
    gates = {"long": Gate(tmp_path / "long"), "doomed": Gate(tmp_path / "doomed")}
    (tmp_path / "script.json").write_text(json.dumps(data))
    (tmp_path / "parent.py").write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py"), str(settings.data_dir), str(tmp_path / "ferry.txt"),
         str(tmp_path / "script.json"), json.dumps({p: str(g.directory) for p, g in gates.items()}), root_id],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, start_new_session=True,
    )
    store = FamilyStore(settings.family_path)
    long_id, doomed_id = f"{root_id}.c1", f"{root_id}.c2"
    try:
        wait_until(lambda: all(g.entered() == 1 for g in gates.values()), "both children are in their model turn")
        assert [r.state for r in store.runs(root_id)] == ["running", "running"]
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        doomed = store.run(doomed_id)
        _kill_tree(doomed.pid)  # this child dies too, without writing a result
        wait_until(lambda: not procs.alive(doomed.pid), "the doomed child is dead")

        # The restart: a new process (here, the test) opens the family.
        family = Family.open(settings, root_id)
        report = {r["run_id"]: r["outcome"] for r in family.recover()}
        assert report == {long_id: "reattached", doomed_id: "interrupted"}
        assert "process is gone" in store.run(doomed_id).note
        gates["long"].open()
        finished = family.wait(None, long_id, 20)
        assert (finished.state, finished.answer) == ("completed", "long result")

        # Another restart later: the completed child's result is recovered from its record.
        again = Family.open(settings, root_id).recover()
        assert {r["run_id"]: (r["outcome"], r["state"]) for r in again} == {
            long_id: ("recovered", "completed"), doomed_id: ("recovered", "interrupted")}
        assert main(["--data-dir", str(settings.data_dir), "children", root_id, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)["children"]
        assert [(c["state"], c["answer"]) for c in listed] == [("completed", "long result"), ("interrupted", None)]
    finally:
        for run in store.runs(root_id):
            if run.pid and procs.proven(run.pid, run.pid_start, run.token):
                _kill_tree(run.pid)
        if parent.poll() is None:
            parent.kill()


def test_a_recycled_pid_is_never_taken_for_a_child(settings, tmp_path: Path) -> None:
    store = FamilyStore(settings.family_path)
    store.ensure_root("R")
    token = "b" * 32
    # A live process that is not the child: one without the token, one with it but started at another time.
    strangers = [
        subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"]),
        subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()", token]),
    ]
    try:
        starts = [procs.start_time(s.pid) for s in strangers]
        for index, (stranger, start) in enumerate(zip(strangers, [starts[0], str(int(starts[1]) - 7)], strict=True)):
            run_id = f"R.c{index + 1}"
            with store.transaction() as conn:
                FamilyStore.insert_agent(conn, Agent(run_id, "R", "R", 1, []))
                FamilyStore.insert_run(conn, run_id=run_id, agent_id=run_id, root_id="R", kind="run", follows=None,
                                       prompt="p", token=token)
            assert store.confirm_start(run_id, token, stranger.pid, start)

        family = Family.open(settings, "R")
        assert procs.proven(strangers[1].pid, starts[1], token)  # with the true start time it would be proven
        assert {r["run_id"]: r["outcome"] for r in family.recover()} == {"R.c1": "interrupted", "R.c2": "interrupted"}
        assert family.cancel(None, "R.c1").state == "interrupted"  # already ended: nothing is signalled
        assert all(s.poll() is None for s in strangers)  # neither stranger was signalled
    finally:
        for stranger in strangers:
            stranger.kill()
            stranger.wait()


def test_a_child_that_never_confirms_its_start_is_stopped_and_failed(make_settings, tmp_path: Path) -> None:
    # One record, judged twice: by a family whose start timeout it is surely within, then, once the
    # clock is past it, by one with a short RLM_CHILD_START_TIMEOUT_S.
    patient = make_settings(child_start_timeout_s=600, child_cancel_grace_s=0.5)
    settings = make_settings(child_start_timeout_s=0.5, child_cancel_grace_s=0.5)
    store = FamilyStore(settings.family_path)
    store.ensure_root("R")
    token = "c" * 32
    # Our process (its token is on its command line) that hangs before confirming its start.
    hung = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()", token])
    try:
        with store.transaction() as conn:
            FamilyStore.insert_agent(conn, Agent("R.c1", "R", "R", 1, []))
            FamilyStore.insert_run(conn, run_id="R.c1", agent_id="R.c1", root_id="R", kind="run", follows=None,
                                   prompt="p", token=token)
        store.set_spawned("R.c1", hung.pid, procs.start_time(hung.pid))
        assert Family.open(patient, "R").recover()[0]["outcome"] == "reattached"  # proven, within its start time
        admitted_at = store.run("R.c1").admitted_at
        wait_until(lambda: time.time() - admitted_at > settings.child_start_timeout_s,
                   "the clock passes RLM_CHILD_START_TIMEOUT_S after the admission")
        assert Family.open(settings, "R").recover()[0]["outcome"] == "failed"
        run = store.run("R.c1")
        assert run.state == "failed" and "RLM_CHILD_START_TIMEOUT_S" in run.error
        assert hung.wait(5) == -signal.SIGTERM
    finally:
        hung.kill()
        hung.wait()
