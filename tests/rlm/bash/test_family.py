"""Two children of one family: their mutating commands serialise on the workspace lease, their read-only
commands overlap. Both shown by what the commands themselves observed, not by timing."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from rlmfamily.bash.store import JobStore
from rlmfamily.context import Context
from rlmfamily.providers import ScriptedProvider
from rlmfamily.session import RunResult, Session
from rlmfamily.settings import RLMSettings

from ..holds import wait_until

pytestmark = pytest.mark.timeout(90)

# Read-only: each child notes its start, then waits (at most 10 s) until the other has started too, and
# prints how many starts it saw: 2 only if both ran at once.
OVERLAP = ("echo start-$ME >> overlap; for i in $(seq 1000); do [ $(grep -c start- overlap) -ge 2 ] && break; "
           "sleep 0.01; done; grep -c start- overlap")
# Mutating: note the start, wait for the test's go-file, note the end.
MUTATE = "echo start-$ME >> events; while [ ! -e go-$ME ]; do sleep 0.01; done; echo end-$ME >> events"
CHILD = f"""
me = rlm.agent_id().split(".")[-1]
ro = bash.run("ME=" + me + "; " + {OVERLAP!r}, read_only=True)
mu = bash.run("ME=" + me + "; " + {MUTATE!r})
final_answer(me + " saw " + ro.stdout_preview.strip() + " starts; mutating " + mu.state)
"""
ROOT = """
a = rlm.run("work alpha")
b = rlm.run("work beta")
done = rlm.wait_all([a, b], 80)
final_answer(sorted(d["answer"] for d in done))
"""


def run_two_children_on_one_lease(settings: RLMSettings, workspace: Path, *, join_s: float) -> tuple[RunResult, JobStore]:
    """ROOT's two children on ``workspace``: checks their mutating commands serialise on the workspace lease and
    their read-only ones overlap, and returns the answered run and the family's job store."""
    script = {"root": [{"code": ROOT}], "child": [{"pattern": "work (alpha|beta)", "root": [{"code": CHILD}]}],
              "default_answer": "NONE"}
    session = Session(context=Context.from_repository(workspace, settings), provider=ScriptedProvider(script),
                      settings=settings)
    results: list[RunResult] = []
    root = threading.Thread(target=lambda: results.append(session.run("q")), daemon=True)
    root.start()
    store = JobStore(settings.jobs_path)
    events = workspace / "events"

    def mutating() -> list:
        return [j for j in store.jobs() if not j.read_only]

    # One child's mutating command runs (its start is written) while the other's job is admitted and waiting.
    wait_until(lambda: events.exists() and sorted(j.state for j in mutating()) == ["running", "waiting"],
               "one mutating job running, the other waiting for the lease")
    first = next(j for j in mutating() if j.state == "running")
    second = next(j for j in mutating() if j.state == "waiting")
    first_name, second_name = first.agent_id.split(".")[-1], second.agent_id.split(".")[-1]
    assert events.read_text() == f"start-{first_name}\n", "the waiting job must not have started"
    (workspace / f"go-{first_name}").touch()
    wait_until(lambda: store.job(second.id).state == "running" and "start-" + second_name in events.read_text(),
               "the second mutating job started once the first ended")
    (workspace / f"go-{second_name}").touch()
    root.join(join_s)
    assert results, "the root finished"
    result = results[0]
    assert result.stop_reason == "answered", result.error
    assert events.read_text().split() == [f"start-{first_name}", f"end-{first_name}", f"start-{second_name}",
                                          f"end-{second_name}"]
    # Each read-only command saw the other's start while it ran: they overlapped.
    assert json.loads(result.answer) == ["c1 saw 2 starts; mutating exited", "c2 saw 2 starts; mutating exited"]
    assert store.leases() == {}
    return result, store


def test_mutating_commands_of_two_children_serialise_and_read_only_ones_overlap(make_settings,
                                                                                tmp_path: Path) -> None:
    settings = make_settings(profile="python-bash", bash_lease_wait_s=60, step_timeout_s=120,
                             host_call_timeout_s=400)
    workspace = tmp_path / "work"
    workspace.mkdir()
    (workspace / "README.md").write_text("shared workspace\n")
    result, store = run_two_children_on_one_lease(settings, workspace, join_s=60)
    assert {j.root_id for j in store.jobs()} == {result.run_id}


# The root cancels once the child's command has started its grandchild: a read-only command of the root (it
# takes no lease, so it runs beside the child's) waits for the grandchild's pid file. Waiting for the job to be
# "running" raced the command's first line: a cancel could land before the grandchild existed (issue 40).
CANCELLER = """
h = rlm.run("block")
bash.run("for i in $(seq 3000); do [ -s grandchild ] && break; sleep 0.01; done", read_only=True, deadline_s=60)
h.cancel()
final_answer(h.status()["state"])
"""
BLOCKED_CHILD = "bash.run('sleep 300 & echo $! > grandchild; wait', deadline_s=200)\nfinal_answer('never')"


def test_cancelling_a_child_mid_command_stops_the_jobs_process_group_and_gives_back_its_lease(make_settings,
                                                                                              tmp_path: Path) -> None:
    settings = make_settings(profile="python-bash", max_sleep_s_per_step=30, child_cancel_grace_s=0.5)
    workspace = tmp_path / "work"
    workspace.mkdir()
    script = {"root": [{"code": CANCELLER}], "child": [{"pattern": "block", "root": [{"code": BLOCKED_CHILD}]}]}
    result = Session(context=Context.from_repository(workspace, settings), provider=ScriptedProvider(script),
                     settings=settings).run("q")
    assert result.answer == "cancelled", result.error
    [job] = [j for j in JobStore(settings.jobs_path).jobs() if not j.read_only]  # the child's, not the root's wait
    grandchild = int((workspace / "grandchild").read_text())
    from rlmfamily.family import procs

    wait_until(lambda: not job.process_alive() and not procs.alive(grandchild), "the job's group is gone")
    # The library killed the group and verified it gone: the job ended, its lease given back, no release needed.
    store = JobStore(settings.jobs_path)
    assert (store.job(job.id).state, store.job(job.id).stopped_by) == ("killed", "cancel")
    assert job.id not in store.leases()
