"""A job's CPU: its share of the worker's cores, its cap, and its count (issue 41 §2).

A job's process (``workers.isolation``) calls ``JobCpu.start`` once its job has come, and ``JobCpu.judged`` on its
outcome. In between a meter thread of the job's process reads the CPU time of the job's processes together (the job's
process, its threads, and what it started: Monty's processes are in its process group) every
``SPECIALISTS_WORKER_JOB_CPU_POLL_S``, more often as the cap nears, and:

* **shares**: every job starts with the same share. Where the worker may make cgroups (``job_cpu_share=auto``) the
  job's process moves into a cgroup of its own, ``specialists-job-<pid>``, under the worker's (v2: ``cpu.weight``
  = ``SPECIALISTS_WORKER_JOB_CPU_WEIGHT``; v1: ``cpu.shares``, 10.24 times it), and what it starts is born there:
  a job of eight Monty processes weighs what a job of one does. Past ``SPECIALISTS_WORKER_JOB_CPU_DEMOTE_AFTER_S``
  CPU seconds the job is *demoted*: its weight drops to ``SPECIALISTS_WORKER_JOB_CPU_DEMOTED_WEIGHT``. Without
  cgroups (or ``job_cpu_share=nice``) the demotion is a nice value, ``SPECIALISTS_WORKER_JOB_CPU_DEMOTED_NICE``, for
  every thread of the job's process group (their children inherit it); before it, a job's processes run at the
  worker's priority, one share each. Equal shares alone would not keep a short job fast beside three spinning
  ones (on two cores each would get half of one); the demotion does: a job that has spun for seconds yields to one
  that has not.
* **caps**: at ``max_cpu_s`` (the spec's ``limits.max_cpu_s``, else ``SPECIALISTS_WORKER_JOB_MAX_CPU_S``) the meter
  kills the job's other processes (SIGKILL), sets the run's cancel, and ``judged`` makes the outcome a failed run
  with the code ``job_cpu_exceeded``, charged as any failed run is. A job's process that spins itself, in a C call
  that never lets the meter's thread run, is stopped by its own RLIMIT_CPU (set past the cap by
  ``SPECIALISTS_WORKER_CANCEL_GRACE_S``): the kernel's SIGXCPU, a ``job_process_died`` run.
* **counts**: ``judged`` puts the job's CPU seconds in its outcome (``RunOutcome.cpu_seconds``), which the claim's
  record keeps, and ``specialists usage``, the console and the task's final metadata show.

The count is the kernel's: where the job's cgroup counts its processes' time (v2's ``cpu.stat``, v1's
``cpuacct.usage`` where cpuacct is mounted with cpu) one read of it; otherwise ``/proc/<pid>/stat`` of the job
process's live descendants alone (found through ``/proc/<pid>/task/*/children``; the job's process is their
subreaper, so a grandchild whose parent died stays one), plus the job process's own and its reaped children's
``getrusage``; never a scan of every process on the machine. Its granularity is the clock tick. How far past its
cap a job can go is what its processes burn between two reads: at most the worker's cores times the time between
them (shorter as the cap nears, ``MIN_POLL_S`` at the least).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import math
import os
import resource
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from core.specs import LoadedSpec
from workers.runs import RunOutcome
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)

ShareMechanism = Literal["cgroup2", "cgroup1", "nice", "off"]
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "specialists-job-"
MIN_POLL_S = 0.01  # the meter's shortest sleep, near the cap
V1_SHARES_PER_WEIGHT = 1024 / 100  # cgroup v1's default cpu.shares over v2's default cpu.weight
V1_MIN_SHARES = 2
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
CPU_EXCEEDED = "job_cpu_exceeded"


@dataclass(frozen=True)
class CpuPolicy:
    """A job's share and cap, from the worker's settings and its spec (``of``: the settings' fields, whose
    descriptions say what each one does)."""

    share: Literal["auto", "nice", "off"]
    weight: int
    demote_after_s: float
    demoted_weight: int
    demoted_nice: int
    max_cpu_s: float  # 0: no cap
    poll_s: float
    grace_s: float  # past the cap, the job's own RLIMIT_CPU

    @classmethod
    def of(cls, worker: WorkerSettings, spec_max_cpu_s: float | None) -> CpuPolicy:
        """``worker``: the worker's settings (``settings.worker``); ``spec_max_cpu_s``: the spec's cap, if it says."""
        return cls(share=worker.job_cpu_share, weight=worker.job_cpu_weight, demote_after_s=worker.job_cpu_demote_after_s,
                   demoted_weight=worker.job_cpu_demoted_weight, demoted_nice=worker.job_cpu_demoted_nice,
                   max_cpu_s=worker.job_max_cpu_s if spec_max_cpu_s is None else spec_max_cpu_s,
                   poll_s=worker.job_cpu_poll_s, grace_s=worker.cancel_grace_s)


def policy_of(recipe: Any, specialist_id: str) -> CpuPolicy:
    """The policy of a job of ``specialist_id`` from the job process's recipe (``workers.assembly.RunnerRecipe``:
    the worker's settings and the specs it loaded); a recipe without them (a test's) gets the settings' defaults."""
    settings = getattr(recipe, "settings", None)
    if settings is None:
        return CpuPolicy.of(WorkerSettings.model_construct(), None)  # the defaults, not the environment's
    loaded: Mapping[str, LoadedSpec] = getattr(recipe, "specs", None) or {}
    spec = loaded.get(specialist_id)  # none for a runner without a spec file (the scripted specialist)
    return CpuPolicy.of(settings.worker, None if spec is None else spec.spec.limits.max_cpu_s)


# --- the count ------------------------------------------------------------------------------------


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # it has gone
        return None
    return raw[raw.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses: skip past it


def _children(pid: int) -> list[int]:
    """The children of ``pid``, whichever of its threads started them (none once it has gone)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found.extend(int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except OSError:  # the thread has ended
            continue
    return found


def descendants(pid: int) -> list[int]:
    """The live processes ``pid`` started, and theirs, all the way down (zombies included: their time is still
    theirs). A process whose parent dies is re-parented to the job's process (``adopt_orphans``), so it stays."""
    found: list[int] = []
    pending = _children(pid)
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(_children(child))
    return found


def adopt_orphans() -> bool:
    """Make this process the child subreaper of what it starts (``PR_SET_CHILD_SUBREAPER``): a grandchild whose
    parent dies becomes its child rather than init's, so ``descendants`` keeps counting it. False where the kernel
    refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def group_cpu_s() -> float:
    """CPU seconds of this process (every thread), the children it has reaped, and its live descendants with the
    children they reaped (``/proc/<pid>/stat`` of those alone, not every process on the machine). Its own figures
    are read first: a child reaped between the two reads is missed once (counted at the next read), never counted
    twice."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    for child in descendants(os.getpid()):
        fields = _stat_fields(child)
        if fields is not None:
            total += sum(int(value) for value in fields[11:15]) * TICK_S  # utime stime cutime cstime
    return total


# --- the share ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cgroup:
    """The job's own cgroup, and how its weight is written."""

    path: Path
    version: Literal[2, 1]

    @property
    def weight_file(self) -> Path:
        return self.path / ("cpu.weight" if self.version == 2 else "cpu.shares")

    def weight_value(self, weight: int) -> int:
        return weight if self.version == 2 else max(V1_MIN_SHARES, round(weight * V1_SHARES_PER_WEIGHT))

    def set_weight(self, weight: int) -> None:
        self.weight_file.write_text(str(self.weight_value(weight)))

    def usage_s(self) -> float | None:
        """CPU seconds of every process that has been in the cgroup (v2's ``cpu.stat`` usage_usec; v1's
        ``cpuacct.usage`` where cpuacct is mounted with cpu); None where the cgroup does not count them."""
        try:
            if self.version == 2:
                for line in (self.path / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
                return None
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None


def _own_cgroup_dirs() -> list[tuple[Literal[2, 1], Path]]:
    """Where this process's CPU cgroup is, v2 first: (version, directory) for each hierarchy it could use."""
    found: list[tuple[Literal[2, 1], Path]] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            found.insert(0, (2, CGROUP_ROOT / relative))
        elif "cpu" in controllers.split(","):
            found.append((1, CGROUP_ROOT / controllers / relative))
    return found


def _sweep(parent: Path) -> None:
    """Remove the empty cgroups of jobs gone before (a job's process cannot remove its own while its children
    live); a cgroup still in use refuses (EBUSY) and stays, and one whose job's process lives is left alone (it may
    have made its cgroup and not yet moved in)."""
    try:
        entries = [entry for entry in parent.iterdir() if entry.name.startswith(CGROUP_PREFIX)]
    except OSError:
        return
    for entry in entries:
        if Path(f"/proc/{entry.name[len(CGROUP_PREFIX):]}").exists():
            continue
        try:
            entry.rmdir()
        except OSError:
            pass


def enter_cgroup(pid: int, weight: int) -> Cgroup | None:
    """Move process ``pid`` into a new cgroup of its own with ``weight``; None where no CPU cgroup can be made."""
    for version, parent in _own_cgroup_dirs():
        try:
            if version == 2:
                if "cpu" not in (parent / "cgroup.controllers").read_text().split():
                    continue
                if "cpu" not in (parent / "cgroup.subtree_control").read_text().split():
                    (parent / "cgroup.subtree_control").write_text("+cpu")
            _sweep(parent)
            group = Cgroup(parent / f"{CGROUP_PREFIX}{pid}", version)
            group.path.mkdir(exist_ok=True)
            group.set_weight(weight)
            (group.path / "cgroup.procs").write_text(str(pid))
            return group
        except OSError as exc:  # read-only, not delegated, or v2's rule against processes in inner cgroups
            log.debug("no cgroup v%d for job processes under %s (%s)", version, parent, exc)
    return None


def leave_cgroup(group: Cgroup, pid: int) -> None:
    """Move ``pid`` back to the parent and remove the job's cgroup if nothing is left in it."""
    try:
        (group.path.parent / "cgroup.procs").write_text(str(pid))
        group.path.rmdir()
    except OSError as exc:
        if exc.errno != errno.EBUSY:  # EBUSY: a process it started lives on; the next job's sweep removes it
            log.debug("the job's cgroup %s stays (%s)", group.path, exc)


def _renice_group(pgid: int, nice: int) -> None:
    """Every thread of every process in the group (setpriority with PRIO_PGRP reaches each thread on Linux)."""
    try:
        os.setpriority(os.PRIO_PGRP, pgid, nice)
    except OSError as exc:
        log.warning("could not lower the priority of job process group %d (%s)", pgid, exc)


# --- the meter ------------------------------------------------------------------------------------


class JobCpu:
    """The share, cap and count of the job in this process (its process group's leader)."""

    def __init__(self, policy: CpuPolicy, cancel: threading.Event, specialist_id: str = "") -> None:
        self.policy = policy
        self.specialist_id = specialist_id
        self.cancel = cancel
        self.pid = os.getpid()
        self.pgid = os.getpgid(0)
        self.start_cpu_s = group_cpu_s()  # what this process used before its job came (its start-up)
        self._cgroup_base_s: float | None = None  # the cgroup's count when this process entered it, where it counts
        self.used_s = 0.0
        self.exceeded = False
        self.demoted = False
        self.cgroup: Cgroup | None = None
        self.mechanism: ShareMechanism = "off"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls, recipe: Any, specialist_id: str, cancel: threading.Event) -> JobCpu:
        """The job's share applied and its meter running (the hook of ``workers.isolation._job_process``)."""
        adopt_orphans()  # before the run starts anything: what it starts stays among this process's descendants
        meter = cls(policy_of(recipe, specialist_id), cancel, specialist_id)
        meter._apply_share()
        meter._arm_rlimit()
        meter._thread = threading.Thread(target=meter._watch, name="job-cpu", daemon=True)
        meter._thread.start()
        return meter

    def _apply_share(self) -> None:
        if self.policy.share == "off":
            return
        if self.policy.share == "auto":
            self.cgroup = enter_cgroup(self.pid, self.policy.weight)
            if self.cgroup is not None:  # it counts from here what this process and all it starts use: one read
                self._cgroup_base_s = self.cgroup.usage_s()
        self.mechanism = "nice" if self.cgroup is None else ("cgroup2" if self.cgroup.version == 2 else "cgroup1")
        log.debug("job process %d shares the CPU by %s", self.pid, self.mechanism)

    def _arm_rlimit(self) -> None:
        """The backstop for a job's process that spins in a C call: SIGXCPU past its cap and the grace."""
        if self.policy.max_cpu_s <= 0:
            return
        own = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(own.ru_utime + own.ru_stime + self.policy.max_cpu_s + self.policy.grace_s)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1 if hard == resource.RLIM_INFINITY else hard))

    def read(self) -> float:
        """The job's CPU seconds so far (never less than an earlier read)."""
        with self._lock:
            counted = None if self._cgroup_base_s is None or self.cgroup is None else self.cgroup.usage_s()
            now_s = group_cpu_s() - self.start_cpu_s if counted is None else counted - self._cgroup_base_s
            self.used_s = max(self.used_s, now_s)
            return self.used_s

    def _watch(self) -> None:
        while not self._stop.is_set():
            used_s = self.read()
            if not self.demoted and self.mechanism != "off" and used_s >= self.policy.demote_after_s:
                self._demote()
            cap_s = self.policy.max_cpu_s
            if cap_s > 0 and used_s >= cap_s:
                self._over_cap(used_s)
            # Nearer the cap, sooner; past it, at the poll again (killing what the run starts while it stops).
            left_s = (cap_s - used_s) / (os.cpu_count() or 1) if cap_s > 0 and not self.exceeded else self.policy.poll_s
            self._stop.wait(max(MIN_POLL_S, min(self.policy.poll_s, left_s)))

    def _demote(self) -> None:
        self.demoted = True
        log.info("job process %d passed %g CPU seconds: its share is lowered (%s)", self.pid,
                 self.policy.demote_after_s, self.mechanism,
                 extra={"event": "job_cpu_demoted", "specialist": self.specialist_id, "share": self.mechanism})
        if self.cgroup is not None:
            try:
                self.cgroup.set_weight(self.policy.demoted_weight)
                return
            except OSError as exc:
                log.warning("could not lower the weight of %s (%s); lowering its priority", self.cgroup.path, exc)
        _renice_group(self.pgid, self.policy.demoted_nice)

    def _over_cap(self, used_s: float) -> None:
        """Stop the run: its other processes killed (again, for any it starts meanwhile), its cancel set."""
        if not self.exceeded:
            log.warning("job process %d used %.2f CPU seconds, past its cap of %g: stopping it", self.pid, used_s,
                        self.policy.max_cpu_s, extra={"event": "job_cpu_exceeded", "specialist": self.specialist_id,
                                                      "cpu_seconds": round(used_s, 3),
                                                      "max_cpu_s": self.policy.max_cpu_s})
        self.exceeded = True
        for pid in descendants(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cancel.set()

    def stop(self) -> float:
        """Stop the meter; the job's CPU seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        used_s = self.read()
        if self.cgroup is not None:
            leave_cgroup(self.cgroup, self.pid)
        return used_s

    def judged(self, outcome: RunOutcome) -> RunOutcome:
        """``outcome`` with the job's CPU seconds; a run stopped at its cap is a failed run that says why."""
        used_s = round(self.stop(), 3)
        if not self.exceeded:
            return replace(outcome, cpu_seconds=used_s)
        cap_s = self.policy.max_cpu_s
        message = (f"the specialist used its {cap_s:g} CPU seconds and was stopped; a task may use at most "
                   "limits.max_cpu_s of its spec (the worker's default: SPECIALISTS_WORKER_JOB_MAX_CPU_S)")
        return RunOutcome("failed", message, outcome.artifacts,
                          {**outcome.detail, "error": CPU_EXCEEDED, "code": CPU_EXCEEDED, "max_cpu_s": cap_s}, cpu_seconds=used_s)
