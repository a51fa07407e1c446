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
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine

from core.settings import Settings
from tests.rlm.holds import wait_until
from tests.workers.harness import TestWorker, worker_settings
from tests.workers.step_file import StepFile
from tests.workers.test_job_process import ANSWER_TIMEOUT_S, claim_row, job_processes, new_job_id, wait_for
from taskstate import claims
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


@dataclass(frozen=True)
class Spinning:
    job_id: str
    pid: int  # the job's process
    child: int  # its spinning child
    answer: Future  # the delivery's answer: it comes once the worker has seen the job's process exit


def _spinning_child(pid: int) -> int | None:
    children = [child for child in _children(pid) if b"while True" in Path(f"/proc/{child}/cmdline").read_bytes()]
    return children[0] if children else None


@contextmanager
def _spinning_jobs(worker: TestWorker, owners: list[str | None]) -> Iterator[list[Spinning]]:
    """Start a job that spins for each of ``owners`` (its payload's owner scope, ``<customer>:<specialist>``; None:
    a raw job naming none), one after the other, each waited for (its process and its spinning child) before the
    next is sent, so each job's process is known. However the test ends, the job processes are killed on the way
    out (the jobs end as dead processes; their share is what these tests are about), so a failed assertion fails at
    once instead of waiting out the spin."""
    found: list[Spinning] = []
    with ThreadPoolExecutor(len(owners)) as pool:
        try:
            for owner in owners:
                job_id = new_job_id()
                payload: dict[str, Any] = {"script": {"steps": [{"op": "spin", "seconds": 600}]}}
                if owner is not None:
                    payload["o"] = owner
                body = worker.signer.sign(job_id=job_id, specialist_id="scripted", deadline_s=300, payload=payload)
                answer = pool.submit(worker.post, body, timeout_s=300)
                known = {job.pid for job in found}

                def running() -> Spinning | None:
                    for pid in job_processes(worker):
                        child = None if pid in known else _spinning_child(pid)
                        if child is not None:
                            return Spinning(job_id, pid, child, answer)
                    return None

                found.append(wait_for(f"the process of job {job_id} and its spinning child", running))
            yield found
        finally:
            for pid in {job.pid for job in found} or set(job_processes(worker)):
                with suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


def _cancel(engine: Engine, job: Spinning) -> None:
    """End a job as a customer's cancel does: its run stops, its process winds down and exits, and the worker,
    having seen it exit, answers its delivery (its share left behind: the worker removed its cgroup before)."""
    with engine.begin() as conn:
        assert claims.request_cancel(conn, job.job_id, reason="the test is done with it") == "cancel_requested"
    assert job.answer.result(timeout=ANSWER_TIMEOUT_S).status_code == 200
    assert not Path(f"/proc/{job.pid}").exists() or _stat_state(job.pid) == "Z"


def _stat_state(pid: int) -> str | None:
    fields = cpu_share._stat_fields(pid)
    return None if fields is None else fields[0]


def test_past_its_threshold_a_jobs_processes_run_at_the_demoted_nice_and_the_next_jobs_process_does_not(serve):
    with serve(job_cpu_share="nice", job_cpu_demote_after_s=0.0, job_cpu_demoted_nice=17) as worker, \
            _spinning_jobs(worker, [None]) as [job]:
        job_pid, child_pid = job.pid, job.child
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


def _leave(group: cpu_share.Cgroup, pid: int) -> None:
    """The test's process ``pid``, which lives on, moved back to the worker's cgroup, then its groups removed as a
    worker removes a job's (``cpu_share.remove_cgroup``). A job's process never does this: its exit leaves its
    group."""
    (group.path.parent.parent / "cgroup.procs").write_text(str(pid))
    cpu_share.remove_cgroup(group)


def _weight_file(group: Path) -> Path:
    return group / ("cpu.weight" if (group / "cpu.weight").exists() else "cpu.shares")


def _weight_value(group: Path, weight: int) -> str:
    """What a weight reads as in ``group``'s file: itself in v2, 10.24 times it in v1 (at least 2)."""
    return str(weight) if _weight_file(group).name == "cpu.weight" else \
        str(max(cpu_share.V1_MIN_SHARES, round(weight * 10.24)))


def _customer_group(name: str) -> str:
    return f"{cpu_share.CUSTOMER_PREFIX}{cpu_share.customer_hash(name)}"


def test_each_job_runs_in_a_cgroup_of_its_own_at_the_weight_the_settings_give(serve):
    """With cgroups (auto, where the worker may make them): the job's process and what it starts are in
    specialists-job-<pid>, in its customer's group, at SPECIALISTS_WORKER_JOB_CPU_WEIGHT until demoted, then the
    demoted weight, and its customer (it is its customer's only job) weighs what it does. Where no cgroup can be
    made, auto falls back to the nice value."""
    with serve(job_cpu_weight=300, job_cpu_demote_after_s=0.0, job_cpu_demoted_weight=5,
               job_cpu_demoted_nice=16) as worker, _spinning_jobs(worker, [None]) as [job]:
        job_pid, child_pid = job.pid, job.child
        if not _cgroup_creatable():
            wait_until(lambda: _nice(job_pid) == 16 == _nice(child_pid), "the job's processes to be demoted")
            return
        group = _job_cgroup(job_pid)
        assert group is not None, Path(f"/proc/{job_pid}/cgroup").read_text()
        assert str(child_pid) in (group / "cgroup.procs").read_text().split()
        assert group.parent.name == _customer_group(cpu_share.NO_CUSTOMER)  # a raw job names no customer
        weight, demoted = _weight_file(group), _weight_value(group, 5)
        wait_until(lambda: weight.read_text().strip() == demoted, f"the job's cgroup weight to be {demoted}")
        customer = _weight_file(group.parent)
        wait_until(lambda: customer.read_text().strip() == demoted, f"its customer's weight to be {demoted}")
        assert _nice(job_pid) == 0  # a cgroup's share, not a nice value


def test_a_customers_jobs_share_its_customer_group_and_its_last_job_to_end_removes_it(serve, engine: Engine):
    """Two jobs of one customer are in one group, specialists-customer-<hash of its id>, at one customer's weight
    (SPECIALISTS_WORKER_JOB_CPU_WEIGHT, not twice it); another customer's job is in a group of its own at the same
    weight. A job that ends removes its cgroup, and the customer's last one its customer's group."""
    if not _cgroup_creatable():
        pytest.skip("no CPU cgroup can be made here: the nice mode's share per customer is tested below")
    with serve(max_concurrent_jobs=3, job_cpu_weight=300, job_cpu_demote_after_s=3600.0) as worker, \
            _spinning_jobs(worker, ["acme:scripted", "acme:reviewer", "globex:scripted"]) as [first, second, other]:
        groups = {job: _job_cgroup(job.pid) for job in (first, second, other)}
        assert None not in groups.values(), groups
        acme, globex = groups[first].parent, groups[other].parent
        assert groups[second].parent == acme != globex
        assert (acme.name, globex.name) == (_customer_group("acme"), _customer_group("globex"))
        assert all("acme" not in str(group) and "globex" not in str(group) for group in groups.values())
        for job, group in groups.items():
            assert str(job.child) in (group / "cgroup.procs").read_text().split()
            assert _weight_file(group).read_text().strip() == _weight_value(group, 300)
        one_customer = _weight_value(acme, 300)
        assert _weight_file(acme).read_text().strip() == one_customer == _weight_file(globex).read_text().strip()

        _cancel(engine, first)
        assert not groups[first].exists() and acme.exists()  # its second job still runs in it
        _cancel(engine, second)
        assert not groups[second].exists() and not acme.exists()
        assert globex.exists() and _weight_file(globex).read_text().strip() == one_customer


def test_a_jobs_process_moves_into_its_group_and_out_of_none_and_once_it_ended_no_group_of_it_is_left(
        serve, monkeypatch: pytest.MonkeyPatch):
    """Issue 44: a job's process makes its group and moves in (one write of ``cgroup.procs``), and nothing more: no
    move back out, no removal, no sweep, and one scan of its descendants (its count as it ends; at the start it has
    none). Its exit leaves the group, and the worker removes it, and its customer's, before it answers the delivery;
    a job of a customer whose group another job left has it made again. Counted in the job's processes
    (``tests/workers/cgroup_calls.py``), real cgroups."""
    if not _cgroup_creatable():
        pytest.skip("no CPU cgroup can be made here")
    from tests.workers import cgroup_calls
    from workers import isolation

    monkeypatch.setattr(isolation, "_job_process", cgroup_calls.counted_job_process)
    _, home = cpu_share._own_cgroup_dirs()[0]
    acme, globex = f"acme-{secrets.token_hex(4)}", f"globex-{secrets.token_hex(4)}"
    # A poll longer than a no-op job: its meter is read once, as it ends.
    with serve(job_cpu_poll_s=10.0, job_cpu_demote_after_s=3600.0) as worker:
        for customer in (acme, globex, acme):
            pid = wait_for("the process forked ahead of the next job", lambda: worker.service.jobs.waiting_pid)
            cgroup_calls.forget(pid)
            job_id = new_job_id()
            body = worker.signer.sign(job_id=job_id, specialist_id="scripted", deadline_s=60,
                                      payload={"o": f"{customer}:scripted", "script": {"steps": [{"op": "complete"}]}})
            assert worker.post(body).json()["outcome"] == "completed"
            customer_group = home / _customer_group(customer)
            group = customer_group / f"{cpu_share.CGROUP_PREFIX}{pid}"
            calls = cgroup_calls.calls_of(pid)
            assert [path for kind, path in calls if kind == "write" and path.endswith("/cgroup.procs")] == [
                f"{group}/cgroup.procs"], calls
            assert [(kind, path) for kind, path in calls if kind in ("rmdir", "scandir")
                    and path.startswith(str(cpu_share.CGROUP_ROOT))] == [], calls
            assert calls.count(("descendants", str(pid))) == 1, calls
            assert ("mkdir", str(customer_group)) in calls  # made, by each of acme's jobs: the first's was removed
            assert not group.exists() and not customer_group.exists()


def _gone_process_and_test_home() -> tuple[Any, Literal[2, 1], Path]:
    """A process that has exited (its pid names no process now), and a home of the test's own in this process's CPU
    cgroup, as the worker's sweep and ``JobGroups`` see theirs: (the process, the cgroup's version, the home). Skips
    where no CPU cgroup can be made."""
    if not _cgroup_creatable():
        pytest.skip("no CPU cgroup can be made here")
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    version, own = cpu_share._own_cgroup_dirs()[0]
    home = own / f"specialists-test-{secrets.token_hex(4)}"
    home.mkdir()
    return gone, version, home


def test_a_workers_groups_go_as_its_jobs_end_and_what_no_worker_removed_goes_at_its_start_and_its_sweeps():
    """The worker's side (``cpu_share.JobGroups``), under a home of the test's own: as a job's process has exited,
    its group goes, and its customer's too unless another job's group is in it, which then weighs that job's
    weight alone; a group whose process lives on stays (``busy``). What a worker that died left goes at the next
    worker's start, what stayed at the sweep after ``SWEEP_EVERY_JOBS`` ended jobs, not one job before. Real
    processes, real cgroups."""
    import subprocess
    import sys

    gone, version, home = _gone_process_and_test_home()
    acme, other = home / _customer_group("acme"), home / _customer_group("other")
    left = home / _customer_group("dead worker's") / f"{cpu_share.CGROUP_PREFIX}{gone.pid}"
    processes = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
                 for _ in range(3)]
    first, second, lasting = processes
    try:
        left.mkdir(parents=True)
        groups = cpu_share.JobGroups("auto", 100, homes=[(version, home)])
        assert (groups.sweeps, left.exists(), left.parent.exists()) == (1, False, False)  # swept as it starts
        for process, customer, weight in ((first, "acme", 100), (second, "acme", 40), (lasting, "other", 100)):
            cpu_share._enter(version, home, customer, process.pid, weight, 100)
        for process in (first, second):
            process.kill()
            process.wait()
        assert groups.ended(first.pid, "acme") == "removed"
        assert acme.exists() and _weight_file(acme).read_text().strip() == _weight_value(acme, 40)
        assert groups.ended(second.pid, "acme") == "removed" and not acme.exists()
        assert groups.ended(lasting.pid, "other") == "busy"  # its process lives: it stays, for a sweep
        lasting.kill()
        lasting.wait()
        for _ in range(cpu_share.SWEEP_EVERY_JOBS - 1 - 3):  # three ended so far: one short of a sweep
            assert groups.ended(gone.pid, "no such customer") == "absent"
        assert (groups.sweeps, other.exists()) == (1, True)
        groups.ended(gone.pid, "no such customer")
        assert (groups.sweeps, other.exists()) == (2, False)
        assert cpu_share.JobGroups("nice", 100).ended(gone.pid, "acme") == "absent"  # no group to look for
    finally:
        for process in processes:
            process.kill()
            process.wait()
        for group in (left, left.parent, *acme.glob("specialists-job-*"), acme, *other.glob("specialists-job-*"),
                      other, home):
            with suppress(OSError):
                group.rmdir()


def test_a_workers_sweep_removes_the_groups_of_jobs_gone_and_customers_left_empty_and_nothing_in_use():
    """What a worker sweeps (``cpu_share._sweep``), under a home of the test's own: the group a gone job left
    behind, then its customer's if that is empty now; never a group whose job's process lives, nor its customer's.
    Real cgroups."""
    gone, _, home = _gone_process_and_test_home()
    left, living = home / _customer_group("left"), home / _customer_group("living")
    groups = {
        "a gone job's, directly under the worker's": home / f"{cpu_share.CGROUP_PREFIX}{gone.pid}",
        "a gone job's, in its customer's": left / f"{cpu_share.CGROUP_PREFIX}{gone.pid}",
        "a living job's": living / f"{cpu_share.CGROUP_PREFIX}{os.getpid()}",
        "a gone job's beside a living one": living / f"{cpu_share.CGROUP_PREFIX}{gone.pid}",
    }
    try:
        for group in groups.values():
            group.mkdir(parents=True)
        cpu_share._sweep(home)
        assert {name: group.exists() for name, group in groups.items()} == {
            "a gone job's, directly under the worker's": False, "a gone job's, in its customer's": False,
            "a living job's": True, "a gone job's beside a living one": False}
        assert (left.exists(), living.exists()) == (False, True)
    finally:
        for group in (*groups.values(), left, living, home):
            with suppress(OSError):
                group.rmdir()


def test_a_new_job_group_keeps_the_kernels_default_weight_and_one_left_by_an_earlier_process_of_its_pid_is_set():
    """A job's group made anew at the kernel's default weight is not written to (``KERNEL_DEFAULT_WEIGHT``); one
    of the same pid left behind (a demoted job's, whose process's pid came back) gets the job's weight all the same;
    a weight other than the default is written. Real processes, real cgroups."""
    if not _cgroup_creatable():
        pytest.skip("no CPU cgroup can be made here")
    import subprocess
    import sys

    customer = f"weights-{secrets.token_hex(4)}"
    processes = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
                 for _ in range(3)]
    fresh, stale, heavy = processes
    _, own = cpu_share._own_cgroup_dirs()[0]
    left = own / _customer_group(customer) / f"{cpu_share.CGROUP_PREFIX}{stale.pid}"
    groups: list[cpu_share.Cgroup] = []
    try:
        left.mkdir(parents=True)
        _weight_file(left).write_text(_weight_value(left, 1))  # a demoted job's weight
        for process, weight in ((fresh, 100), (stale, 100), (heavy, 300)):
            group = cpu_share.enter_cgroup(process.pid, weight, customer)
            assert group is not None
            groups.append(group)
            assert _weight_file(group.path).read_text().strip() == _weight_value(group.path, weight)
        assert groups[1].path == left
    finally:
        for process, group in zip(processes, [*groups, None, None, None]):
            if group is not None:
                _leave(group, process.pid)
            process.kill()
            process.wait()
        for directory in (left, left.parent):
            with suppress(OSError):
                directory.rmdir()


def test_a_customers_group_made_by_its_job_keeps_one_customers_weight_unread_and_every_other_share_is_set(
        monkeypatch: pytest.MonkeyPatch):
    """The job that makes its customer's group leaves it at the kernel's default weight, one customer's, without
    reading its jobs' weights (``Cgroup.share_customer``); a second job of the customer, entering the group it found,
    sets the share (still one customer's); a job lighter than one customer, in a group it made, sets it to its own
    weight. Real processes, real cgroups."""
    if not _cgroup_creatable():
        pytest.skip("no CPU cgroup can be made here")
    import subprocess
    import sys

    shared: list[Path] = []
    share_customer = cpu_share.Cgroup.share_customer

    def counted(self: cpu_share.Cgroup) -> None:
        shared.append(self.path)
        share_customer(self)

    monkeypatch.setattr(cpu_share.Cgroup, "share_customer", counted)
    acme, light = f"acme-{secrets.token_hex(4)}", f"light-{secrets.token_hex(4)}"
    processes = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
                 for _ in range(3)]
    entered: list[tuple[cpu_share.Cgroup, int]] = []
    try:
        first = cpu_share.enter_cgroup(processes[0].pid, 100, acme)
        assert first is not None
        entered.append((first, processes[0].pid))
        one_customer = _weight_value(first.customer, 100)
        assert shared == [] and _weight_file(first.customer).read_text().strip() == one_customer
        second = cpu_share.enter_cgroup(processes[1].pid, 100, acme)
        assert second is not None
        entered.append((second, processes[1].pid))
        assert shared == [second.path] and _weight_file(second.customer).read_text().strip() == one_customer
        lighter = cpu_share.enter_cgroup(processes[2].pid, 40, light, 100)
        assert lighter is not None
        entered.append((lighter, processes[2].pid))
        assert shared[-1] == lighter.path
        assert _weight_file(lighter.customer).read_text().strip() == _weight_value(lighter.customer, 40)
    finally:
        for group, pid in reversed(entered):
            _leave(group, pid)
        for process in processes:
            process.kill()
            process.wait()
    assert not any(group.customer.exists() for group, _ in entered)


def test_jobs_of_one_customer_entering_and_leaving_at_once_each_get_their_group_and_leave_none_behind():
    """Creation races with removal: one job's leave removes its customer's group while another job of the customer
    makes its own in it; the second makes the group again. Real processes, real cgroups, two threads at once."""
    if not _cgroup_creatable():
        pytest.skip("no CPU cgroup can be made here")
    import subprocess
    import sys
    import threading

    rounds, customer = 20, f"race-{secrets.token_hex(4)}"
    start = threading.Barrier(2)
    failures: list[str] = []
    customer_groups: set[Path] = set()

    def job() -> None:
        for _ in range(rounds):
            process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
            try:
                start.wait(timeout=60)
                group = cpu_share.enter_cgroup(process.pid, 100, customer)
                if group is None or str(process.pid) not in (group.path / "cgroup.procs").read_text().split():
                    failures.append(f"process {process.pid} is not in a group of its own: {group}")
                else:
                    customer_groups.add(group.customer)
                    _leave(group, process.pid)
            finally:
                process.kill()
                process.wait()

    threads = [threading.Thread(target=job) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert [group.name for group in customer_groups] == [_customer_group(customer)]
    assert not any(group.exists() for group in customer_groups)


def test_in_the_nice_mode_a_customers_jobs_run_at_the_nice_value_of_its_count_of_jobs(serve, engine: Engine):
    """Without cgroups the worker tells each job's process its customer's count of jobs on the worker, and n jobs
    run at customer_nice(n); another customer's job is not lowered. When one ends the other goes back up, where
    this process may lower a nice value (root, or CAP_SYS_NICE); without, it keeps the lower priority."""
    with serve(job_cpu_share="nice", max_concurrent_jobs=3, job_cpu_demote_after_s=3600.0) as worker, \
            _spinning_jobs(worker, ["acme:scripted", "acme:reviewer", "globex:scripted"]) as [first, second, other]:
        two = cpu_share.customer_nice(2)
        for job in (first, second):
            wait_until(lambda job=job: _nice(job.pid) == two == _nice(job.child), f"job {job.job_id} at nice {two}")
        assert _nice(other.pid) == 0 == _nice(other.child)
        _cancel(engine, second)
        back = 0 if _may_lower_nice() else two
        wait_until(lambda: _nice(first.pid) == back == _nice(first.child), f"the customer's last job at nice {back}")


def _may_lower_nice() -> bool:
    import subprocess
    import sys

    probe = "import os; os.nice(1); os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) - 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


# The kernel's weight of each nice value (kernel/sched/core.c, sched_prio_to_weight), 0 to 9.
KERNEL_NICE_WEIGHT = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137)


def test_a_customers_jobs_at_its_nice_value_weigh_about_one_job_at_the_workers_priority():
    """The nice mode's rule against the kernel's own table: n jobs at customer_nice(n) weigh together within 10% of
    one job at nice 0, for as many jobs as a worker runs."""
    assert cpu_share.customer_nice(1) == 0
    for jobs in range(1, 9):
        together = jobs * KERNEL_NICE_WEIGHT[cpu_share.customer_nice(jobs)]
        assert abs(together - 1024) <= 0.1 * 1024, (jobs, cpu_share.customer_nice(jobs), together)
    assert cpu_share.customer_nice(10_000) == 19  # never past the kernel's lowest priority


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
