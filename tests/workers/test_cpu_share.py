"""A job's CPU under a share, capped, and counted (issue 41 §2; ``workers.cpu_share``), with real job processes.

The worker runs in this test process; its jobs run in processes forked from its forkserver, and the scripted
``spin`` step starts a real child that loops (as Monty's process does on code that never ends). The figures
compared are CPU seconds the kernel counted, never wall-clock times.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine

from core.settings import Settings
from tests.rlm.holds import wait_until
from tests.workers.harness import TestWorker, worker_settings
from tests.workers.step_file import StepFile
from tests.workers.test_job_process import claim_row, job_processes, new_job_id, wait_for
from workers import cpu_share
from workers.settings import WorkerSettings

pytestmark = pytest.mark.timeout(120)

CAP_S = 1.0
POLL_S = 0.1
# How far past its cap a job can go: what its processes burn between two reads (at most every core for a poll),
# and the job process's own wind-down after the stop (the runner's return, its outcome).
OVERSHOOT_S = (os.cpu_count() or 1) * POLL_S + 0.1


def outcome_record(engine: Engine, job_id: str) -> dict:
    return claim_row(engine, job_id)["outcome_detail"]


@pytest.fixture
def serve(database_url: str, engine: Engine, tmp_path: Path):
    def served(**worker: object) -> TestWorker:
        steps = tmp_path / f"steps-{secrets.token_hex(4)}.log"
        steps.touch()
        settings = worker_settings(database_url, worker={"job_isolation": "process", "max_concurrent_jobs": 1,
                                                         "job_cpu_poll_s": POLL_S, **worker})
        return TestWorker(settings, engine, on_step=StepFile(steps))

    return served


def test_a_spinning_job_is_stopped_at_its_cpu_cap_and_its_recorded_cpu_is_the_cap(serve, engine: Engine):
    # No demotion here: the job spins at the worker's priority, so its CPU seconds come as fast as the machine gives.
    with serve(job_max_cpu_s=CAP_S, job_cpu_demote_after_s=3600.0) as worker:
        spinning, light = new_job_id(), new_job_id()
        answer = worker.post(worker.body(spinning, [{"op": "spin", "seconds": 600}, {"op": "complete"}], deadline_s=300),
                             timeout_s=300)
        assert (answer.status_code, answer.json()["outcome"]) == (200, "failed")
        record = outcome_record(engine, spinning)
        assert record["detail"]["error"] == "job_cpu_exceeded" and record["detail"]["max_cpu_s"] == CAP_S
        assert "limits.max_cpu_s" in record["message"] and "SPECIALISTS_WORKER_JOB_MAX_CPU_S" in record["message"]
        assert CAP_S <= record["cpu_seconds"] <= CAP_S + OVERSHOOT_S, record["cpu_seconds"]
        # The worker and its next job go on; a job under its cap completes with its CPU counted.
        assert worker.post(worker.body(light, [{"op": "complete", "text": "done"}])).json()["outcome"] == "completed"
        assert 0 <= outcome_record(engine, light)["cpu_seconds"] < CAP_S


def _nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@contextmanager
def _spinning_job(worker: TestWorker) -> Iterator[tuple[int, int]]:
    """Start a job that spins, wait for its process and its spinning child, and give (job pid, child pid). However
    the test ends, the job's processes are killed on the way out (the job ends as a dead process; its share is what
    these tests are about), so a failed assertion fails at once instead of waiting out the spin."""
    found: list[tuple[int, int]] = []

    def running() -> bool:
        for pid in job_processes(worker):
            children = [child for child in _children(pid) if b"while True" in Path(f"/proc/{child}/cmdline").read_bytes()]
            if children:
                found.append((pid, children[0]))
                return True
        return False

    with ThreadPoolExecutor(1) as pool:
        pool.submit(worker.post, worker.body(new_job_id(), [{"op": "spin", "seconds": 600}], deadline_s=300),
                    timeout_s=300)
        try:
            wait_until(running, "the job's process and its spinning child")
            yield found[-1]
        finally:
            for pid in {pid for pid, _ in found[-1:]} or set(job_processes(worker)):
                with suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


def test_past_its_threshold_a_jobs_processes_run_at_the_demoted_nice_and_the_next_jobs_process_does_not(serve):
    with serve(job_cpu_share="nice", job_cpu_demote_after_s=0.0, job_cpu_demoted_nice=17) as worker, \
            _spinning_job(worker) as (job_pid, child_pid):
        wait_until(lambda: _nice(job_pid) == 17 and _nice(child_pid) == 17, "the job's processes to be demoted")
        # The process forked ahead of the next job is forked after this one was taken: wait for it to exist.
        spare = wait_for("the process forked ahead of the next job", lambda: worker.service.jobs.waiting_pid)
        assert _nice(spare) == 0  # the share is the job's, not the worker's


def _cgroup_creatable() -> bool:
    """Whether this machine lets this process make a CPU cgroup under its own (probed here, apart from the code)."""
    root = Path("/sys/fs/cgroup")
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (root / "cgroup.controllers").exists():
            parent = root / path.lstrip("/")
            if "cpu" not in (parent / "cgroup.controllers").read_text().split():
                continue
        elif "cpu" in controllers.split(","):
            parent = root / controllers / path.lstrip("/")
        else:
            continue
        probe = parent / f"cpu-share-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
            return True
        except OSError:
            continue
    return False


def _job_cgroup(pid: int) -> Path | None:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if Path(path).name == f"{cpu_share.CGROUP_PREFIX}{pid}":
            return Path("/sys/fs/cgroup") / controllers / path.lstrip("/") if controllers else \
                Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


def test_each_job_runs_in_a_cgroup_of_its_own_at_the_weight_the_settings_give(serve):
    """With cgroups (auto, where the worker may make them): the job's process and what it starts are in
    specialists-job-<pid>, at SPECIALISTS_WORKER_JOB_CPU_WEIGHT until demoted, then the demoted weight. Where no
    cgroup can be made, auto falls back to the nice value."""
    with serve(job_cpu_weight=300, job_cpu_demote_after_s=0.0, job_cpu_demoted_weight=5,
               job_cpu_demoted_nice=16) as worker, _spinning_job(worker) as (job_pid, child_pid):
        if not _cgroup_creatable():
            wait_until(lambda: _nice(job_pid) == 16 == _nice(child_pid), "the job's processes to be demoted")
            return
        group = _job_cgroup(job_pid)
        assert group is not None, Path(f"/proc/{job_pid}/cgroup").read_text()
        assert str(child_pid) in (group / "cgroup.procs").read_text().split()
        weight = group / ("cpu.weight" if (group / "cpu.weight").exists() else "cpu.shares")
        demoted = "5" if weight.name == "cpu.weight" else str(max(cpu_share.V1_MIN_SHARES, round(5 * 10.24)))
        wait_until(lambda: weight.read_text().strip() == demoted, f"the job's cgroup weight to be {demoted}")
        assert _nice(job_pid) == 0  # a cgroup's share, not a nice value


def test_a_specs_max_cpu_s_is_its_cap_and_the_workers_setting_caps_the_specs_that_state_none(database_url, tmp_path):
    from tests.workers.hosted_rlm import support

    settings = worker_settings(database_url, worker={"job_max_cpu_s": 50.0})
    specs = {"capped": support.write_spec(tmp_path, "capped", limits={"max_cpu_s": 7.5}),
             "plain": support.write_spec(tmp_path, "plain")}
    recipe = SimpleNamespace(settings=settings, specs=specs)  # what a job's process has: workers.assembly's recipe
    assert cpu_share.policy_of(recipe, "capped").max_cpu_s == 7.5
    assert cpu_share.policy_of(recipe, "plain").max_cpu_s == 50.0
    assert cpu_share.policy_of(recipe, "scripted").max_cpu_s == 50.0  # a runner without a spec file
    # A recipe without the worker's settings (a test's own build) gets the settings' defaults, the cap included.
    default_cap_s = WorkerSettings.model_fields["job_max_cpu_s"].default
    assert default_cap_s > 0 and cpu_share.policy_of("a test's recipe", "scripted").max_cpu_s == default_cap_s


def test_a_demoted_weight_above_the_jobs_weight_is_refused_at_start_up_naming_both_settings():
    with pytest.raises(ValidationError, match="SPECIALISTS_WORKER_JOB_CPU_DEMOTED_WEIGHT") as refused:
        Settings(worker={"job_cpu_weight": 50, "job_cpu_demoted_weight": 60})
    assert "SPECIALISTS_WORKER_JOB_CPU_WEIGHT" in str(refused.value)
    assert Settings(worker={"job_cpu_weight": 50, "job_cpu_demoted_weight": 50}).worker.job_cpu_demoted_weight == 50


_GRANDCHILD = r"""
import json, os, subprocess, sys
from tests.rlm.holds import wait_until
from workers import cpu_share

assert cpu_share.adopt_orphans()
before_s = cpu_share.group_cpu_s()
# A child that starts a spinning grandchild and exits at once: the grandchild is an orphan of the job.
spawn = ("import subprocess, sys; quiet = subprocess.DEVNULL; print(subprocess.Popen("
         "[sys.executable, '-c', 'while True: pass'], stdout=quiet, stderr=quiet).pid)")
middle = subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True)
grandchild = int(middle.stdout)

def spun_s():
    fields = cpu_share._stat_fields(grandchild)
    return sum(int(value) for value in fields[11:13]) * cpu_share.TICK_S

wait_until(lambda: spun_s() >= 0.3, "the grandchild to spin for 0.3 CPU seconds")
seen_s = spun_s()
counted_s = cpu_share.group_cpu_s() - before_s
parent = int(cpu_share._stat_fields(grandchild)[1])
os.kill(grandchild, 9)
os.waitpid(grandchild, 0)
print(json.dumps({"seen_s": seen_s, "counted_s": counted_s, "adopted": parent == os.getpid(),
                  "after_reaped_s": cpu_share.group_cpu_s() - before_s}))
"""


def test_the_cpu_of_a_grandchild_whose_parent_has_exited_is_counted():
    """The count reads only the job process's descendants (not every process on the machine); a grandchild
    orphaned by its parent stays one (the job's process is its subreaper), live and once reaped."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _GRANDCHILD], capture_output=True, text=True, timeout=100,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["adopted"], figures
    assert figures["counted_s"] >= figures["seen_s"] >= 0.3, figures
    assert figures["after_reaped_s"] >= figures["seen_s"], figures
