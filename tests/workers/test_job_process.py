"""Each job in a process of its own (``SPECIALISTS_WORKER_JOB_ISOLATION=process``, the default), over real HTTP.

The worker runs in this test process (served on loopback); its jobs run in processes forked from its
forkserver, found here through /proc. What changes from a thread: a runner that ignores the stop is killed
after the grace and its slot is free again, and a job whose process dies is a failed run while the worker goes
on. tests/workers/test_isolation.py shows the reason for all this with real worker processes.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import Engine

from taskstate import claims
from tests.rlm.holds import POLL_LIMIT_S, wait_until
from tests.workers.harness import TestWorker, worker_settings
from tests.workers.step_file import GATE_LIMIT_S, StepFile

pytestmark = pytest.mark.timeout(90)

ANSWER_TIMEOUT_S = 30.0
BOUND_MARGIN_FACTOR = 5  # as tests/workers/test_server.py: the bound is respected at all, with room for load
T = TypeVar("T")


def new_job_id() -> str:
    return "job-" + secrets.token_hex(8)


def claim_row(engine: Engine, job_id: str) -> dict:
    with engine.connect() as conn:
        row = claims.get(conn, job_id)
    assert row is not None
    return row


@pytest.fixture
def worker(database_url: str, engine: Engine, tmp_path: Path) -> Iterator[TestWorker]:
    steps = tmp_path / "steps.log"
    steps.touch()
    settings = worker_settings(database_url, worker={"job_isolation": "process", "max_concurrent_jobs": 1})
    with TestWorker(settings, engine, on_step=StepFile(steps)) as served:
        yield served


def job_processes(worker: TestWorker) -> list[int]:
    """The running job processes of the worker in this process: the children of its fork server, but the one forked
    ahead of the next job (it waits; it runs nothing)."""
    from workers.isolation import forkserver_pid

    server = forkserver_pid()
    assert server is not None
    children = [int(child) for child in Path(f"/proc/{server}/task/{server}/children").read_text().split()]
    return [pid for pid in children if pid != worker.service.jobs.waiting_pid]


def wait_for(what: str, check: Callable[[], T], limit_s: float = POLL_LIMIT_S) -> T:
    """``check()``'s first truthy value, waited for by ``wait_until``."""
    seen: list[T] = []
    wait_until(lambda: seen.append(check()) or seen[-1], what, limit_s=limit_s)
    return seen[-1]


def started(worker: TestWorker, job_id: str) -> bool:
    return any(line[1:3] == [job_id, "0"] for line in worker.log.lines())


def test_a_job_runs_in_a_process_of_its_own_and_finishes_as_it_did_in_a_thread(worker: TestWorker, engine: Engine):
    job = new_job_id()
    answer = worker.post(worker.body(job, [{"op": "progress", "text": "reading"}, {"op": "artifact", "text": "report"},
                                           {"op": "complete", "text": "all good"}]))
    assert (answer.status_code, answer.json()["code"], answer.json()["outcome"]) == (200, "job_finished", "completed")
    row = claim_row(engine, job)
    assert row["outcome_detail"]["artifacts"] == [{"name": "artifact-1", "text": "report"}]
    assert [line[3] for line in worker.log.lines() if line[1] == job] == ["progress", "artifact", "complete"]
    crashed = new_job_id()
    assert worker.post(worker.body(crashed, [{"op": "raise", "text": "boom"}])).json()["outcome"] == "failed"
    assert claim_row(engine, crashed)["outcome_detail"]["detail"] == {"error": "RuntimeError"}


def test_a_runner_that_ignores_the_stop_is_killed_after_the_grace_and_its_slot_is_free_again(
    worker: TestWorker, engine: Engine
):
    stubborn, next_job = new_job_id(), new_job_id()
    deadline_s = 0.3
    bound_s = BOUND_MARGIN_FACTOR * (deadline_s + worker.settings.worker.heartbeat_s + worker.settings.worker.cancel_grace_s)
    began = time.monotonic()
    # It ignores the stop for 60 s; the worker's one slot (max_concurrent_jobs=1) is what the next job needs.
    answer = worker.post(worker.body(stubborn, [{"op": "stubborn_sleep", "seconds": 60}], deadline_s=deadline_s))
    assert time.monotonic() - began < bound_s
    assert answer.json()["outcome"] == "failed"
    assert "did not stop within worker_cancel_grace_s" in claim_row(engine, stubborn)["outcome_detail"]["message"]
    # Killed, not abandoned: the slot comes back (a thread would keep it for the 60 s of its sleep).
    body = worker.body(next_job, [{"op": "complete"}])
    served = wait_for("the slot to be free again",
                      lambda: (a := worker.post(body)).json()["code"] != "worker_at_capacity" and a, limit_s=bound_s)
    assert served.json()["code"] == "job_finished"
    wait_for("no job process but the one waiting for the next job", lambda: job_processes(worker) == [])


def test_a_jobs_outcome_is_recorded_while_its_process_lets_go_and_the_answer_waits_for_its_exit(
    worker: TestWorker, engine: Engine, monkeypatch: pytest.MonkeyPatch
):
    """The finish (the claim's outcome, the task's final state, the settlement) does not wait for the job's process
    to let go of its runner and exit (issue 44 §2: a hosted run's process closes its Monty sessions and connections
    after its outcome); the delivery's answer does, so an answered delivery is a free slot."""
    from concurrent.futures import ThreadPoolExecutor

    from workers import isolation

    # The worker kills a process that has not exited this long after its outcome; here the test decides when it does.
    monkeypatch.setattr(isolation, "EXIT_WAIT_S", 4 * GATE_LIMIT_S)

    def finished() -> bool:
        with engine.connect() as conn:
            row = claims.get(conn, job)
        return row is not None and row["state"] == "finished"

    job = new_job_id()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(worker.post, worker.body(job, [{"op": "progress", "text": "linger:let-go"},
                                                             {"op": "complete"}]))
        wait_for("the job's outcome to be recorded", finished)
        assert claim_row(engine, job)["outcome"] == "completed"
        assert len(job_processes(worker)) == 1, "its process still runs: it cannot exit before the gate opens"
        assert not pending.done(), "the delivery was answered before the job's process exited"
        worker.log.open_gate("let-go")
        answer = pending.result(timeout=ANSWER_TIMEOUT_S)
    assert (answer.status_code, answer.json()["code"], answer.json()["outcome"]) == (200, "job_finished", "completed")
    assert job_processes(worker) == []  # exited before the answer: the one slot is free
    assert worker.post(worker.body(new_job_id(), [{"op": "complete"}])).json()["code"] == "job_finished"


def test_a_job_whose_process_dies_is_a_failed_run_and_the_worker_goes_on(worker: TestWorker, engine: Engine):
    from concurrent.futures import ThreadPoolExecutor

    doomed, after = new_job_id(), new_job_id()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(worker.post, worker.body(doomed, [{"op": "sleep", "seconds": 60}]))
        wait_for("the job to start", lambda: started(worker, doomed))
        [pid] = wait_for("one running job process", lambda: (lambda running: running if len(running) == 1 else None)(job_processes(worker)))
        os.kill(pid, signal.SIGKILL)  # what the kernel's OOM killer, or a crash in native code, looks like
        answer = pending.result(timeout=ANSWER_TIMEOUT_S)
    assert (answer.status_code, answer.json()["outcome"]) == (200, "failed")
    record = claim_row(engine, doomed)["outcome_detail"]
    assert "killed by SIGKILL" in record["message"]
    assert record["detail"] == {"error": "job_process_died", "exitcode": -9, "killed_by_worker": False}
    assert worker.post(worker.body(after, [{"op": "complete"}])).json()["outcome"] == "completed"


def test_a_job_over_its_memory_cap_is_a_failed_run_and_the_worker_and_the_next_job_go_on(
    database_url: str, engine: Engine, tmp_path: Path
):
    cap_bytes = 1 << 30
    steps = tmp_path / "steps.log"
    steps.touch()
    settings = worker_settings(database_url, worker={"job_isolation": "process", "max_concurrent_jobs": 1,
                                                     "job_max_memory_bytes": cap_bytes})
    with TestWorker(settings, engine, on_step=StepFile(steps)) as worker:
        greedy, within, after = new_job_id(), new_job_id(), new_job_id()
        answer = worker.post(worker.body(greedy, [{"op": "allocate", "megabytes": 2 * (cap_bytes >> 20)},
                                                  {"op": "complete"}]))
        assert (answer.status_code, answer.json()["outcome"]) == (200, "failed")
        record = claim_row(engine, greedy)["outcome_detail"]
        assert record["message"] == f"the specialist ran out of memory: a job may use {cap_bytes} bytes"
        assert record["detail"] == {"error": "job_memory_exceeded", "max_memory_bytes": cap_bytes}
        # Under the cap the same step runs; the cap is the job's, not the worker's.
        within_cap = [{"op": "allocate", "megabytes": 64}, {"op": "complete"}]
        assert worker.post(worker.body(within, within_cap)).json()["outcome"] == "completed"
        assert worker.post(worker.body(after, [{"op": "complete"}])).json()["outcome"] == "completed"


def test_what_a_jobs_process_logs_reaches_its_workers_log_through_the_jobs_pipe(
    database_url: str, engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The job's process's log handler is made once, in the forkserver, and pointed at each job's pipe: a record
    logged in one job's process (its memory cap's warning) comes to the worker's log as that process's, and the
    next job's process logs through its own pipe."""
    cap_bytes = 1 << 30
    steps = tmp_path / "steps.log"
    steps.touch()
    settings = worker_settings(database_url, worker={"job_isolation": "process", "max_concurrent_jobs": 1,
                                                     "job_max_memory_bytes": cap_bytes})
    greedy = [{"op": "allocate", "megabytes": 2 * (cap_bytes >> 20)}, {"op": "complete"}]
    with caplog.at_level(logging.WARNING), TestWorker(settings, engine, on_step=StepFile(steps)) as worker:
        first, second = new_job_id(), new_job_id()
        for job_id in (first, second):
            assert worker.post(worker.body(job_id, greedy)).json()["outcome"] == "failed"
    relayed = {record.getMessage(): record.process for record in caplog.records
               if "reached its memory cap" in record.getMessage()}
    assert set(relayed) == {f"job {job_id} reached its memory cap of {cap_bytes} bytes "
                            "(SPECIALISTS_WORKER_JOB_MAX_MEMORY_BYTES)" for job_id in (first, second)}
    assert os.getpid() not in relayed.values() and len(set(relayed.values())) == 2  # each from its job's process


def test_a_job_runs_in_the_process_forked_ahead_of_it_and_the_next_one_is_forked_meanwhile(
    worker: TestWorker, engine: Engine
):
    from concurrent.futures import ThreadPoolExecutor

    ahead = wait_for("a process forked ahead of the first job", lambda: worker.service.jobs.waiting_pid)
    job = new_job_id()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(worker.post, worker.body(job, [{"op": "sleep", "seconds": 60}], deadline_s=2))
        wait_for("the job to start", lambda: started(worker, job))
        wait_for("the job to run in the process forked ahead of it", lambda: job_processes(worker) == [ahead])
        assert wait_for("the next one forked", lambda: worker.service.jobs.waiting_pid) != ahead
        answer = pending.result(timeout=ANSWER_TIMEOUT_S)
    assert answer.json()["outcome"] == "failed"  # stopped at its deadline


def test_jobs_that_come_together_fork_no_process_that_runs_no_job(database_url: str, engine: Engine, tmp_path: Path):
    """Issue 44: a job that found no process waiting (the one forked ahead was still being forked, for the job
    before it) forked its own and another ahead, and when two were ready one was let go unused: a whole job
    process forked and ended for nothing, about one job in six on a busy worker. Jobs that come together now fork
    one process each, and one more waits for the next job."""
    from concurrent.futures import ThreadPoolExecutor

    slots = 4
    settings = worker_settings(database_url, worker={"job_isolation": "process", "max_concurrent_jobs": slots})
    steps = tmp_path / "steps.log"
    steps.touch()
    with TestWorker(settings, engine, on_step=StepFile(steps)) as served:
        jobs = served.service.jobs
        wait_for("a process forked ahead of the first job", lambda: jobs.waiting_pid)
        sent = [new_job_id() for _ in range(slots)]
        with ThreadPoolExecutor(slots) as pool:  # together: each job's start comes while the one before it forks ahead
            answers = list(pool.map(lambda job: served.post(served.body(job, [{"op": "complete"}])), sent))
        assert [answer.json()["code"] for answer in answers] == ["job_finished"] * slots
        wait_for("no process being forked ahead", lambda: jobs.waiting_pid and not jobs.forking_ahead)
        assert jobs.forked == len(sent) + 1


def _ignored_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn for {pid}")


def test_a_job_process_ignores_ctrl_c_from_its_first_instruction(worker: TestWorker):
    """A Ctrl-C to `serve`'s terminal reaches every process of its group, a job process forked at that moment
    too: it must not die of it in multiprocessing's bootstrap (CI saw that traceback). The process forked ahead
    of the next job ignores SIGINT already, as every job process does from its fork."""
    ahead = wait_for("a process forked ahead of the first job", lambda: worker.service.jobs.waiting_pid)
    assert _ignored_signals(ahead) & (1 << (signal.SIGINT - 1))


@pytest.mark.parametrize("serves_rlm", [True, False], ids=["a worker serving rlm specs", "a scripted-only worker"])
def test_a_job_process_connects_ahead_of_its_job_only_when_its_worker_serves_an_rlm_specialist(
    database_url: str, tmp_path: Path, serves_rlm: bool
):
    """Issue 44 §1: a job's database work uses a connection made before the job needs it. An rlm run opens its
    journal first thing, so a job's process of a worker that serves one connects while it waits for its job
    (``workers.assembly.connect_ahead``, run by ``workers.isolation`` as the build's ``ahead``) and keeps the
    connection in its pool; a worker that serves none (a no-op scripted job sends no statement) connects nothing."""
    from core.settings import PROJECT_ROOT, Settings
    from core.specs import load_specs
    from tests.workers.conftest import WORKER_SECRET
    from tests.workers.system import SCRIPTED_SPEC
    from workers.assembly import RunnerRecipe, connect_ahead, prepare_job_runners

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "scripted.yaml").write_text(SCRIPTED_SPEC)  # the worker's scripted runner
    hosted: dict = {"specs_dir": specs}
    if serves_rlm:
        for spec in (PROJECT_ROOT / "specs").glob("*.yaml"):
            (specs / spec.name).write_text(spec.read_text())
        hosted.update(checkpoint_key="test-checkpoint-key-" + "k" * 40, model_routes_allow_scripted=True)
    settings = Settings(database={"url": database_url}, hosted=hosted,
                        worker={"job_secrets": [WORKER_SECRET], "oidc_verify": False})
    prepared = prepare_job_runners(RunnerRecipe(settings, database_url, load_specs(specs)))
    try:
        assert prepared.engine.pool.checkedin() == 0  # prepared (as in the forkserver) without a connection
        connect_ahead(prepared)
        assert prepared.engine.pool.checkedin() == (1 if serves_rlm else 0)
    finally:
        prepared.engine.dispose()


def test_a_forkserver_that_dies_is_started_again_by_the_next_job_and_its_job_runs(worker: TestWorker):
    """The forkserver killed (an operator, the OOM killer): the process it forked ahead of the next job dies with it
    (PR_SET_PDEATHSIG), and the next job forks its own from a forkserver started again, and runs."""
    from workers.isolation import forkserver_pid

    ahead = wait_for("a process forked ahead of the first job", lambda: worker.service.jobs.waiting_pid)
    server = forkserver_pid()
    assert server is not None
    os.kill(server, signal.SIGKILL)
    wait_for("the process forked ahead to die with its forkserver", lambda: not Path(f"/proc/{ahead}").exists()
             or Path(f"/proc/{ahead}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
    answer = worker.post(worker.body(new_job_id(), [{"op": "complete"}]))
    assert (answer.status_code, answer.json()["code"], answer.json()["outcome"]) == (200, "job_finished", "completed")
    assert forkserver_pid() not in (None, server)
    assert worker.post(worker.body(new_job_id(), [{"op": "complete"}])).json()["outcome"] == "completed"


def test_the_forkservers_heap_is_in_huge_pages_where_the_kernel_collapses_them(worker: TestWorker):
    """After its preload the forkserver collapses its heap into huge pages (``isolation.collapse_heap``), so that each
    fork and exit handles one page-table entry for 2 MiB of it instead of 512; where the kernel cannot, it forks as
    before. tests/workers/test_isolation_heap.py shows that a job's process still copies only what it writes."""
    import subprocess
    import sys

    from workers.isolation import forkserver_pid

    wait_for("a process forked ahead of the first job", lambda: worker.service.jobs.waiting_pid)
    server = forkserver_pid()
    assert server is not None
    rollup = Path(f"/proc/{server}/smaps_rollup").read_text().splitlines()
    huge_kb = next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:"))
    collapses = subprocess.run([sys.executable, "-c", "from workers.isolation import collapse_heap; "
                                "print(collapse_heap())"], capture_output=True, text=True, check=True).stdout
    if int(collapses) == 0:  # what the kernel allows, in a process of its own
        pytest.skip("this kernel does not collapse a heap into huge pages on demand (MADV_COLLAPSE, Linux 6.1)")
    assert huge_kb >= 2048
    answer = worker.post(worker.body(new_job_id(), [{"op": "complete"}]))
    assert (answer.status_code, answer.json()["outcome"]) == (200, "completed")


def test_the_forkserver_rehearses_a_jobs_path_and_stays_one_thread_in_its_workers_cgroup(worker: TestWorker):
    """The forkserver runs a job's generic path before it forks (``isolation.rehearse``): it still has one thread
    (it forks; a second thread could hold a lock in every child) and sits in the cgroup its worker started it in
    (the rehearsal makes a ``JobCpu`` but enters no group), and the jobs forked from it run."""
    from workers.isolation import forkserver_pid

    wait_for("a process forked ahead of the first job", lambda: worker.service.jobs.waiting_pid)
    server = forkserver_pid()
    assert server is not None
    assert os.listdir(f"/proc/{server}/task") == [str(server)]
    assert Path(f"/proc/{server}/cgroup").read_text() == Path("/proc/self/cgroup").read_text()
    answer = worker.post(worker.body(new_job_id(), [{"op": "complete"}]))
    assert (answer.status_code, answer.json()["outcome"]) == (200, "completed")
    assert os.listdir(f"/proc/{server}/task") == [str(server)]
