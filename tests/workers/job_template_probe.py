"""Run by tests/workers/test_job_template.py as a process of its own, so that its forkserver is its own too.

Two ``ProcessJobs`` of different recipes, as two workers in one process: the first starts the forkserver with its
template, the second finds it running. Each runs two jobs whose runner tells where its runners were prepared, which
recipe they came from, and which process ran it; then each lets its spare go. Prints what it saw as JSON.
With ``--unhappy``: a ``ProcessJobs`` whose template fails to build in the forkserver, then one whose template's
file cannot be written (no space), two jobs each.
"""

from __future__ import annotations

import errno
import json
import signal
import os
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.auth import VerifiedJob  # noqa: E402
from workers.isolation import BuiltRunner, ProcessJobs, RunnerBuild, forkserver_pid  # noqa: E402
from workers.runs import RunContext, RunOutcome  # noqa: E402


class Where:
    def __init__(self, prepared: dict[str, Any]) -> None:
        self.prepared = prepared

    def run(self, ctx: RunContext) -> RunOutcome:
        return RunOutcome("completed", json.dumps({**self.prepared, "ran_in": os.getpid(), "ahead_in": AHEAD_IN}))


AHEAD_IN: int | None = None  # the process whose ``ahead`` ran, set in it


def ahead(prepared: dict[str, Any]) -> None:
    global AHEAD_IN
    AHEAD_IN = os.getpid()


FAILS_IN_FORKSERVER = "fails-in-forkserver"


def prepare(recipe: str) -> dict[str, Any]:
    # A job's process leads its own process group (workers.isolation._job_process); the forkserver does not.
    if recipe == FAILS_IN_FORKSERVER and os.getpgid(0) != os.getpid():
        raise RuntimeError("this recipe fails in the forkserver")
    return {"recipe": recipe, "prepared_in": os.getpid()}


def start(prepared: dict[str, Any], specialist_id: str) -> BuiltRunner:
    return BuiltRunner(runner=Where(prepared), events=None, close=lambda: None)  # type: ignore[arg-type]


BUILD = RunnerBuild(prepare=prepare, start=start, ahead=ahead)


def run_one(jobs: ProcessJobs, job_id: str) -> dict[str, Any]:
    done = threading.Event()
    outcomes: list[RunOutcome] = []

    def ended() -> None:
        done.set()

    job = VerifiedJob(job_id=job_id, specialist_id="where", deadline_s=60.0, payload={},
                      signed_at=datetime.now(timezone.utc), secret_id="probe")
    jobs.start(job, 1, time.monotonic() + 60, outcomes.append, ended)
    assert done.wait(120), f"job {job_id} did not finish"
    seen = json.loads(outcomes[0].message)
    seen["exited_when_finished"] = not Path(f"/proc/{seen['ran_in']}").exists()  # ended() follows its exit
    return seen


def main() -> None:

    # By its module's name: the fork server imports it (it is not the worker's __main__).
    from tests.workers.job_template_probe import BUILD as build

    report: dict[str, Any] = {"probe": os.getpid()}
    if sys.argv[1:] == ["--unhappy"]:
        # A template that fails to build in the forkserver (this one starts it).
        failing = ProcessJobs(build, FAILS_IN_FORKSERVER, max_memory_bytes=0)
        report["forkserver"] = forkserver_pid()
        report["failed"] = [run_one(failing, f"failed-{index}") for index in range(2)]
        failing.close()
        # The fork server dies (killed by an operator, the OOM killer): the next worker's first fork starts another,
        # and offers it that worker's template.
        os.kill(report["forkserver"], signal.SIGKILL)

        # A worker that cannot write its template: a full disk, here only for the template's file.
        def no_space(*args: Any, **kwargs: Any) -> Any:
            raise OSError(errno.ENOSPC, "No space left on device")

        tempfile.mkstemp = no_space  # type: ignore[assignment]
        unwritten = ProcessJobs(build, "unwritten-recipe", max_memory_bytes=0)
        report["restarted"] = forkserver_pid()
        report["unwritten"] = [run_one(unwritten, f"unwritten-{index}") for index in range(2)]
        unwritten.close()
        print(json.dumps(report))
        return
    first = ProcessJobs(build, "first-recipe", max_memory_bytes=0)
    report["forkserver"] = forkserver_pid()
    second = ProcessJobs(build, "second-recipe", max_memory_bytes=0)
    for name, jobs in (("first", first), ("second", second)):
        report[name] = [run_one(jobs, f"{name}-{index}") for index in range(2)]
        spare = jobs._spare
        assert spare is not None
        jobs.close()
        report[name + "_spare_exitcode"] = spare.process.exitcode
    print(json.dumps(report))


if __name__ == "__main__":
    main()
