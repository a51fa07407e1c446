"""A job's CPU: its share of the worker's cores, its cap, and its count (issue 41 §2).

A job's process (``workers.isolation``) calls ``JobCpu.start`` once its job has come and ``JobCpu.judged`` on its
outcome, and exits: its exit takes it out of its cgroup, and its worker removes the group once it knows the process
has exited (``JobGroups``, from ``isolation.ProcessJobs``). In between the job process's watching thread (the one
that also hears the worker's words on the job's control pipe) calls ``JobCpu.tick``, which reads the CPU time of the
job's processes together (the job's process, its threads, and what it started: Monty's processes are in its process
group) every ``SPECIALISTS_WORKER_JOB_CPU_POLL_S``, more often as the cap nears, the first time a poll after the
start, and:

* **shares**, per customer, then per job: a customer's jobs on this worker together weigh what one customer's job
  would (its customer is its signed payload's owner, ``customer_of``). Where the worker may make cgroups
  (``job_cpu_share=auto``) the job's process moves into a cgroup of its own inside its customer's, under the
  worker's: ``specialists-customer-<hash of the customer id>/specialists-job-<pid>`` (v2: ``cpu.weight``; v1:
  ``cpu.shares``, 10.24 times it), and what it starts is born there: a job of eight Monty processes weighs what a
  job of one does. The job's group starts at ``SPECIALISTS_WORKER_JOB_CPU_WEIGHT``; its customer's is the least of
  that one weight and its jobs' weights together (``Cgroup.share_customer``, set by each job as it enters, but the
  job that made it, whose new group holds one customer's weight already, at its demotion, at each read of its meter,
  and by the worker as each of its jobs ends), so that three jobs of one customer weigh what the next
  customer's one job does. Customer groups are made on demand by their first job and removed by the worker once
  their last job's process has exited (``JobGroups.ended``); what no worker removed (a worker that died with its
  jobs, a job whose processes outlived it) goes at a worker's next sweep: as it starts, and after every
  ``SWEEP_EVERY_JOBS`` ended jobs. A customer id never appears in a path, only its hash. Past
  ``SPECIALISTS_WORKER_JOB_CPU_DEMOTE_AFTER_S`` CPU seconds the job is *demoted*: its weight drops to
  ``SPECIALISTS_WORKER_JOB_CPU_DEMOTED_WEIGHT``, inside its
  customer (the customer's other, fresh jobs go first) and so across customers (a customer of demoted jobs only
  weighs what they do together). Without cgroups (or ``job_cpu_share=nice``) the share is a nice value for every
  thread of the job's process group (their children inherit it): the worker tells each job's process how many
  jobs its customer runs on this worker (``CustomerJobs``), and n jobs run at ``customer_nice(n)`` (1.25 ** nice
  ~= n: together about one job at the worker's priority); demoted, at
  ``SPECIALISTS_WORKER_JOB_CPU_DEMOTED_NICE``. A process may raise its nice value but, without CAP_SYS_NICE, never
  lower it: where that is refused a job keeps the higher value when its customer's other jobs end. Equal shares
  alone would not keep a short job fast beside three spinning ones (on two cores each would get half of one); the
  share per customer and the demotion do.
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
import hashlib
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
from typing import Any, Literal, Protocol

from core.specs import LoadedSpec
from taskstate import ids
from workers.runs import RunOutcome
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)

ShareMechanism = Literal["cgroup2", "cgroup1", "nice", "off"]
CGROUP_ROOT = Path("/sys/fs/cgroup")
_CGROUP_ROOT_TEXT = str(CGROUP_ROOT)
_V2_CONTROLLERS = str(CGROUP_ROOT / "cgroup.controllers")  # there only where the root is a cgroup v2 hierarchy
CGROUP_PREFIX = "specialists-job-"
CUSTOMER_PREFIX = "specialists-customer-"
CUSTOMER_HASH_CHARS = 16  # of the customer id's sha256, in hex: its group's name, never the id itself
NO_CUSTOMER = ""  # a raw job's (a test's, naming no owner): all such jobs are one customer
# A customer's group removed (by the worker as its last job ended, or a sweep) between a job's making it and making its
# own group in it: made again, this many times at most.
ENTER_ATTEMPTS = 5
# A worker sweeps the groups no worker removed as it starts and after this many of its jobs ended (``JobGroups``): the
# sweep reads every customer's group, so not at every job (issue 44: 0.27 ms of each job's process when it did).
SWEEP_EVERY_JOBS = 100
NICE_WEIGHT_RATIO = 1.25  # the kernel's: each nice step weighs about 1.25 times less (sched_prio_to_weight)
MAX_NICE = 19
MIN_POLL_S = 0.01  # the meter's shortest sleep, near the cap
V1_SHARES_PER_WEIGHT = 1024 / 100  # cgroup v1's default cpu.shares over v2's default cpu.weight
V1_MIN_SHARES = 2
KERNEL_DEFAULT_WEIGHT = {2: 100, 1: 1024}  # a new cgroup's cpu.weight (v2) and cpu.shares (v1), as the kernel sets them
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# The worker's cores, read once (in the forkserver, for every job's process): os.cpu_count() opens and reads
# /sys/devices/system/cpu/online at each call, and the meter's wait asks at each poll.
CORES = os.cpu_count() or 1
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


def customer_of(payload: Mapping[str, Any]) -> str:
    """The customer whose share a job runs under: the customer of the owner scope its signed payload names
    (``<customer>:<specialist>``, ``app.identity``; a customer id has no ``:``, an anonymous caller is ``~anonymous``),
    ``NO_CUSTOMER`` for a raw job that names none."""
    owner = ids.owner_of_payload(payload)
    return NO_CUSTOMER if owner is None else owner.partition(":")[0]


def customer_hash(customer: str) -> str:
    """The name a customer's group carries: a hash, so that no customer id is ever written in a path."""
    return hashlib.sha256(f"specialists-cpu-customer:{customer}".encode()).hexdigest()[:CUSTOMER_HASH_CHARS]


# The first sha256 of a process fetches OpenSSL's implementation (0.1 ms); taken as this module is imported, in the
# forkserver (``workers.isolation.PRELOAD``), every job's process inherits it (issue 44).
customer_hash(NO_CUSTOMER)


def customer_nice(jobs: int) -> int:
    """The nice value (over the worker's) of each of a customer's ``jobs`` running jobs, where the share is a nice
    value: the nearest k with 1.25 ** k ~= jobs, so that together they weigh about one job at the worker's priority
    (1 job: 0; 2: 3, 526 + 526 against 1024; 3: 5, 3 x 335; 4: 6, 4 x 272; 8: 9, 8 x 137)."""
    assert jobs >= 1, jobs
    return min(MAX_NICE, round(math.log(jobs) / math.log(NICE_WEIGHT_RATIO)))


# --- the count ------------------------------------------------------------------------------------


# The count's reads use the os module's calls on strings, not pathlib or text files: a job's process reads its count
# as its job starts and ends, and the first use of those in a fresh fork copies pages of the fork server's heap.
def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as file:
            raw = file.read()
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
        listed = _read_small(f"/proc/{pid}/task/{task}/children")
        if listed is not None:  # None: the thread has ended
            found.extend(int(child) for child in listed.split())
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


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# libc's prctl, loaded as this module is imported: in the forkserver (``workers.isolation.PRELOAD``), so that every
# job's process inherits it rather than loading it, twice, after its fork (issue 44).
_PRCTL = _libc_prctl()


def libc_madvise() -> Any:
    """libc's ``madvise(address, length, advice)`` (0, or -1 where the kernel refuses); None where libc has none."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def prctl(option: int, value: int) -> int | None:
    """``prctl(option, value)``'s result (0, or -1 where the kernel refuses); None where libc has no prctl."""
    return None if _PRCTL is None else int(_PRCTL(option, value, 0, 0, 0))


def adopt_orphans() -> bool:
    """Make this process the child subreaper of what it starts (``PR_SET_CHILD_SUBREAPER``): a grandchild whose
    parent dies becomes its child rather than init's, so ``descendants`` keeps counting it. False where the kernel
    refuses."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1) == 0


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


def _weight_name(version: Literal[2, 1]) -> str:
    return "cpu.weight" if version == 2 else "cpu.shares"


def _weight_value(weight: int, version: Literal[2, 1]) -> int:
    return weight if version == 2 else max(V1_MIN_SHARES, round(weight * V1_SHARES_PER_WEIGHT))


@dataclass(frozen=True)
class Cgroup:
    """The job's own cgroup, ``<the worker's>/specialists-customer-<hash>/specialists-job-<pid>``, and how its
    weight and its customer's are written. Its directory is text (``dir``), and the job's process makes no pathlib
    object of it: the first one made in a fresh fork copies pages of the fork server's heap (issue 44)."""

    dir: str
    version: Literal[2, 1]
    customer_weight: int  # one customer's weight (SPECIALISTS_WORKER_JOB_CPU_WEIGHT): its group's at most

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @property
    def customer(self) -> Path:
        return Path(os.path.dirname(self.dir))

    def weight_value(self, weight: int) -> int:
        return _weight_value(weight, self.version)

    def set_weight(self, weight: int) -> None:
        _write(f"{self.dir}/{_weight_name(self.version)}", str(self.weight_value(weight)))

    def share_customer(self) -> None:
        """Set the customer's group to the least of one customer's weight and its jobs' weights together: n fresh
        jobs weigh one customer, n demoted ones what they weigh. Each of the customer's jobs sets it as it enters
        (but the one that made the group: ``_enter``), at its demotion and at every read of its meter, and the
        worker as each of them ends (``remove_cgroup``), so a value two of them raced on (one read the jobs before
        another's group was made) is set right at the next read. A group gone meanwhile (its last job ended) is
        left gone. The os module's calls on text paths, not pathlib: the worker calls it as jobs end, and a job's
        process as it enters a customer's group another job made (issue 44)."""
        weight_name = _weight_name(self.version)
        customer = os.path.dirname(self.dir)
        try:
            with os.scandir(customer) as entries:
                jobs = [entry.path for entry in entries if entry.name.startswith(CGROUP_PREFIX)]
            values: list[int] = []
            for job in jobs:
                try:
                    values.append(int(_read_or_raise(f"{job}/{weight_name}")))
                except (OSError, ValueError):  # removed meanwhile
                    continue
            if not values:
                return
            target = min(self.weight_value(self.customer_weight), sum(values))
            file = f"{customer}/{weight_name}"
            if int(_read_or_raise(file)) != target:
                _write(file, str(target))
        except (OSError, ValueError) as exc:
            log.debug("the customer group %s keeps its weight (%s)", customer, exc)

    def usage_s(self) -> float | None:
        """CPU seconds of every process that has been in the cgroup (v2's ``cpu.stat`` usage_usec; v1's
        ``cpuacct.usage`` where cpuacct is mounted with cpu); None where the cgroup does not count them."""
        path = self.dir
        try:
            if self.version == 2:
                for line in _read_or_raise(f"{path}/cpu.stat").splitlines():
                    key, _, value = line.partition(b" ")
                    if key == b"usage_usec":
                        return int(value) / 1e6
                return None
            if "cpuacct" not in path[len(_CGROUP_ROOT_TEXT) + 1:].partition("/")[0].split(","):
                return None  # a v1 hierarchy of cpu without cpuacct: nothing to read (its open failed at every job)
            return int(_read_or_raise(f"{path}/cpuacct.usage")) / 1e9
        except (OSError, ValueError):
            return None


def _own_cgroup_dirs() -> list[tuple[Literal[2, 1], Path]]:
    """Where this process's CPU cgroup is, v2 first: (version, directory) for each hierarchy it could use. The last
    text of ``/proc/self/cgroup`` read and what it gave are kept: a job's process reads the text the forkserver read
    as it imported this module (a fork stays in its parent's cgroups), and parses nothing (issue 44: 0.1-0.2 ms of
    each job's process)."""
    global _DIRS_READ
    text = _read_small("/proc/self/cgroup")
    if text is None:
        return []
    read = _DIRS_READ
    if read is not None and read[0] == text:
        return list(read[1])
    found: list[tuple[Literal[2, 1], Path]] = []
    for line in text.decode().splitlines():
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "" and os.path.exists(_V2_CONTROLLERS):
            found.insert(0, (2, CGROUP_ROOT / relative))
        elif "cpu" in controllers.split(","):
            found.append((1, CGROUP_ROOT / controllers / relative))
    for _, home in found:
        str(home)  # pathlib keeps its text once made: made here, in the forkserver, not in each job's process
    _DIRS_READ = (text, tuple(found))
    return found


def _read_small(path: str) -> bytes | None:
    """A small file of /proc read whole, with the os module's calls alone; None where it cannot be read."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(descriptor, 4096):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(descriptor)


def _read_or_raise(path: str) -> bytes:
    """A small file of /sys or /proc read whole with the os module's calls; OSError as open's."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(descriptor, 4096):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def _write(path: str, text: str) -> None:
    """``text`` written to a control file of a cgroup in one write, with the os module's calls; OSError as the
    kernel says it (EBUSY, ENOENT, EACCES)."""
    descriptor = os.open(path, os.O_WRONLY)
    try:
        os.write(descriptor, text.encode())
    finally:
        os.close(descriptor)


_DIRS_READ: tuple[bytes, tuple[tuple[Literal[2, 1], Path], ...]] | None = None  # the last text read, what it gave
_own_cgroup_dirs()  # as this module is imported: in the forkserver, for every job's process forked from it


def _sweep_jobs(parent: str) -> bool:
    """Remove the empty cgroups of jobs gone before that no worker removed (their worker died with them, or their
    processes outlived them: ``remove_cgroup`` was refused); a cgroup still in use refuses (EBUSY) and stays, and
    one whose job's process lives is left alone (it may have made its cgroup and not yet moved in). True when a
    job's cgroup stays in ``parent``."""
    try:
        with os.scandir(parent) as entries:
            names = [entry.name for entry in entries if entry.name.startswith(CGROUP_PREFIX)]
    except OSError:
        return False
    stays = False
    for name in names:
        if os.path.exists(f"/proc/{name[len(CGROUP_PREFIX):]}"):
            stays = True
            continue
        try:
            os.rmdir(os.path.join(parent, name))
        except OSError:
            stays = True
    return stays


def _sweep(home: Path) -> None:
    """The jobs' cgroups left behind in every customer's group, then the customers' groups left empty (one whose
    job is entering it may go: that job makes it again, ``enter_cgroup``), and job cgroups made directly under the
    worker's (before the share per customer). The worker sweeps (``JobGroups``: as it starts, then after every
    ``SWEEP_EVERY_JOBS`` ended jobs; each job's process did as it entered until issue 44), with ``os.scandir``,
    trying no removal it knows will be refused."""
    _sweep_jobs(str(home))
    try:
        with os.scandir(home) as entries:
            customers = [entry.path for entry in entries if entry.name.startswith(CUSTOMER_PREFIX)]
    except OSError:
        return
    for customer in customers:
        if _sweep_jobs(customer):  # a job's group is still in it: the customer's group is not empty
            continue
        try:
            os.rmdir(customer)
        except OSError:  # a job's group came meanwhile (EBUSY), or it is already gone
            pass


def _enter(version: Literal[2, 1], home: Path, customer: str, pid: int, weight: int, customer_weight: int) -> Cgroup:
    """One attempt: the customer's group (made if it is not there), the job's in it, ``pid`` moved in. Raises
    FileNotFoundError when the customer's group was removed between the two mkdirs. Paths as text and the os
    module's calls: pathlib's objects and text files cost a job's process 0.3-0.5 ms here (issue 44), most of it in
    the pages of the fork server's heap that their first use in a fresh fork copies."""
    customer_dir = f"{home}/{CUSTOMER_PREFIX}{customer_hash(customer)}"
    try:
        os.mkdir(customer_dir)
        made_customer = True
    except FileExistsError:
        made_customer = False
    if version == 2 and b"cpu" not in (_read_or_raise(f"{customer_dir}/cgroup.subtree_control")).split():
        _write(f"{customer_dir}/cgroup.subtree_control", "+cpu")
    job_dir = f"{customer_dir}/{CGROUP_PREFIX}{pid}"
    group = Cgroup(job_dir, version, customer_weight)
    try:
        os.mkdir(job_dir)  # from here the customer's group is not empty: no rmdir removes it
        made = True
    except FileExistsError:  # left by an earlier process of this pid (its weight may be a demoted job's)
        made = False
    if not made or group.weight_value(weight) != KERNEL_DEFAULT_WEIGHT[version]:  # a new group has the default
        group.set_weight(weight)
    _write(f"{job_dir}/cgroup.procs", str(pid))
    # A customer's group this job made holds the kernel's default weight, which is one customer's when the job weighs
    # at least that: its share is right as it is, and reading its jobs' weights to say so cost a job 0.2-0.4 ms (issue
    # 44). Any other job of the customer entered it after this one made it, so it is fresh too, or sets the share
    # itself (as it enters, at its demotion, at each read of its meter).
    default = KERNEL_DEFAULT_WEIGHT[version]
    if not (made_customer and group.weight_value(weight) >= group.weight_value(customer_weight) == default):
        group.share_customer()
    return group


def enter_cgroup(pid: int, weight: int, customer: str = NO_CUSTOMER, customer_weight: int | None = None
                 ) -> Cgroup | None:
    """Move process ``pid`` into a new cgroup of its own with ``weight``, inside ``customer``'s group (at most
    ``customer_weight``, ``weight`` if not given); None where no CPU cgroup can be made. It sweeps nothing: the
    worker does (``JobGroups``)."""
    for version, home in _own_cgroup_dirs():
        try:
            if version == 2:
                if b"cpu" not in _read_or_raise(f"{home}/cgroup.controllers").split():
                    continue
                if b"cpu" not in _read_or_raise(f"{home}/cgroup.subtree_control").split():
                    _write(f"{home}/cgroup.subtree_control", "+cpu")
            for attempt in range(1, ENTER_ATTEMPTS + 1):
                try:
                    return _enter(version, home, customer, pid, weight,
                                  weight if customer_weight is None else customer_weight)
                except FileNotFoundError:  # the customer's group went between our two mkdirs: make it again
                    if attempt == ENTER_ATTEMPTS:
                        raise
        except OSError as exc:  # read-only, not delegated, or v2's rule against processes in inner cgroups
            log.debug("no cgroup v%d for job processes under %s (%s)", version, home, exc)
    return None


RemovedAs = Literal["removed", "absent", "busy"]


def remove_cgroup(group: Cgroup) -> RemovedAs:
    """Remove a job's cgroup whose process has left it (it exited, or was moved out), then its
    customer's if no other job's group is in that, else set the customer's share without it. ``absent``: there is
    no such group (the job's process made none: the nice mode, or it died before it entered); ``busy``: a process
    the job started lives on in it, and the worker's next sweep removes it (``JobGroups``)."""
    job_dir = group.dir
    try:
        os.rmdir(job_dir)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return "absent"
        if exc.errno != errno.EBUSY:
            log.debug("the job's cgroup %s stays (%s)", job_dir, exc)
        return "busy"
    try:
        os.rmdir(os.path.dirname(job_dir))
    except OSError:  # another job of the customer is in it (EBUSY; its share is now theirs), or it is gone
        group.share_customer()
    return "removed"


class JobGroups:
    """The worker's side of the cgroup share (issue 44): the cgroups of its jobs removed once their processes have
    exited (``ended``, from the job's watching thread in ``isolation.ProcessJobs``), so that a job's process makes
    its group and moves in, and nothing more. Its exit takes it out; the worker knows its pid, its customer and so
    the path, and learns of the exit from the fork server that reaped it. The groups no worker removed (a worker
    that died with its jobs; a job whose processes outlived it, ``busy``) go at a sweep (``_sweep``): as the worker
    starts, and after every ``SWEEP_EVERY_JOBS`` of its jobs ended, so they never pile up past what one
    ``SWEEP_EVERY_JOBS`` leaves. Nothing where the share is not ``auto``, nor where the worker may not write its
    cgroup (its jobs' processes make none either)."""

    def __init__(self, share: Literal["auto", "nice", "off"], customer_weight: int,
                 homes: list[tuple[Literal[2, 1], Path]] | None = None) -> None:
        """``homes``: where the jobs' groups are, as ``enter_cgroup`` tries them (this process's CPU cgroups, which
        its fork server's job processes start in); a test's own."""
        if homes is None:
            homes = [(version, home) for version, home in _own_cgroup_dirs() if os.access(home, os.W_OK)] \
                if share == "auto" else []
        self._homes = homes
        self.customer_weight = customer_weight
        self._lock = threading.Lock()
        self._ended = 0  # jobs ended since the last sweep
        self.sweeps = 0  # sweeps so far
        self.sweep()

    def ended(self, pid: int, customer: str) -> RemovedAs:
        """Job process ``pid`` (of ``customer``) has exited: its group removed, and its customer's if it was the
        last, else the customer's share set; a sweep, if it is due. Never raises: the job has ended whatever its
        group became."""
        removed: RemovedAs = "absent"
        if not self._homes:  # the nice mode, or no cgroup the worker may write: its jobs made no group
            return removed
        try:
            customer_dir = f"{CUSTOMER_PREFIX}{customer_hash(customer)}"
            for version, home in self._homes:
                group = Cgroup(f"{home}/{customer_dir}/{CGROUP_PREFIX}{pid}", version, self.customer_weight)
                removed = remove_cgroup(group)
                if removed != "absent":
                    break
            with self._lock:
                self._ended += 1
                due = self._ended >= SWEEP_EVERY_JOBS
            if due:
                self.sweep()
        except Exception:  # noqa: BLE001 - said; the slot is freed all the same, and the next sweep retries
            log.exception("the cgroup of job process %d could not be removed", pid)
        return removed

    def sweep(self) -> None:
        with self._lock:
            self._ended = 0
            self.sweeps += 1
        for _, home in self._homes:
            _sweep(home)


# --- the meter ------------------------------------------------------------------------------------


class JobCpu:
    """The share, cap and count of the job in this process (its process group's leader)."""

    def __init__(self, policy: CpuPolicy, cancel: threading.Event, specialist_id: str = "",
                 customer: str = NO_CUSTOMER) -> None:
        self.policy = policy
        self.specialist_id = specialist_id
        self.customer = customer
        self.cancel = cancel
        self.pid = os.getpid()
        self.pgid = os.getpgid(0)
        self.base_nice = os.getpriority(os.PRIO_PROCESS, 0)  # the worker's: the nice mode's values are over it
        self.nice = self.base_nice  # what the job's processes run at now, in the nice mode
        self.customer_jobs = 1  # its customer's jobs running on this worker, as the worker last said (nice mode)
        # What this process used before its job came (its start-up): its own time alone. A process forked for a job
        # has started and reaped nothing before it (``RunnerBuild.ahead`` opens a connection at most), so
        # ``group_cpu_s``'s scan of its descendants found none (issue 44: 0.1 ms of each job's process).
        own = resource.getrusage(resource.RUSAGE_SELF)
        self.start_cpu_s = own.ru_utime + own.ru_stime
        self._cgroup_base_s: float | None = None  # the cgroup's count when this process entered it, where it counts
        self.used_s = 0.0
        self.exceeded = False
        self.demoted = False
        self.cgroup: Cgroup | None = None
        self.mechanism: ShareMechanism = "off"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ticking = threading.Lock()  # a tick and the stop never interleave: no judgment after the outcome's

    @classmethod
    def start(cls, recipe: Any, specialist_id: str, payload: Mapping[str, Any], cancel: threading.Event) -> JobCpu:
        """The job's share applied and its meter ready (the hook of ``workers.isolation._job_process``, whose
        watching thread then calls ``tick`` when the last tick said, the first ``first_wait_s`` from now):
        ``payload``, the job's signed payload, names its customer."""
        adopt_orphans()  # before the run starts anything: what it starts stays among this process's descendants
        meter = cls(policy_of(recipe, specialist_id), cancel, specialist_id, customer_of(payload))
        meter._apply_share()
        meter._arm_rlimit()
        return meter

    def _apply_share(self) -> None:
        if self.policy.share == "off":
            return
        if self.policy.share == "auto":
            self.cgroup = enter_cgroup(self.pid, self.policy.weight, self.customer, self.policy.weight)
            if self.cgroup is not None:  # it counts from here what this process and all it starts use: one read
                self._cgroup_base_s = self.cgroup.usage_s()
        self.mechanism = "nice" if self.cgroup is None else ("cgroup2" if self.cgroup.version == 2 else "cgroup1")
        log.debug("job process %d shares the CPU by %s", self.pid, self.mechanism)

    def _arm_rlimit(self) -> None:
        """The backstop for a job's process that spins in a C call: SIGXCPU past its cap and the grace (from its own
        time at the start, ``start_cpu_s``: RLIMIT_CPU counts this process's alone)."""
        if self.policy.max_cpu_s <= 0:
            return
        soft = math.ceil(self.start_cpu_s + self.policy.max_cpu_s + self.policy.grace_s)
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

    def customer_jobs_changed(self, jobs: int) -> None:
        """The worker's word: its customer runs ``jobs`` jobs on this worker now (this one among them). In the nice
        mode the job's processes follow it (``customer_nice``); a cgroup's share needs no word (the kernel weighs
        the customer's group)."""
        assert jobs >= 1, jobs
        with self._lock:
            self.customer_jobs = jobs
            if self.mechanism == "nice":
                self._renice()

    def _renice(self) -> None:
        """The job's processes to its customer's value, or the demoted one (whichever is lower in priority). Called
        with ``_lock`` held: the worker's word and the demotion never interleave."""
        target = min(MAX_NICE, self.base_nice + customer_nice(self.customer_jobs))
        if self.demoted:
            target = max(target, self.policy.demoted_nice)
        if target == self.nice:
            return
        try:  # every thread of every process in the group (setpriority with PRIO_PGRP reaches each thread on Linux)
            os.setpriority(os.PRIO_PGRP, self.pgid, target)
        except OSError as exc:  # lower than now without CAP_SYS_NICE: it keeps its value
            log.log(logging.DEBUG if target < self.nice else logging.WARNING,
                    "job process group %d stays at nice %d, not %d (%s)", self.pgid, self.nice, target, exc)
            return
        self.nice = target

    def first_wait_s(self) -> float:
        """Until the first ``tick``: a wait, not at once. The job has used nothing yet and its share was set as it
        entered, so a job that ends within a poll is read once, by ``stop`` (issue 44: a read and a customer's
        share at the start, on a thread of their own, cost a no-op job 0.5 ms)."""
        return self._wait_s(0.0)

    def tick(self) -> float:
        """One read of the meter, and what it decides (the demotion, the customer's share, the cap); the seconds
        until the next. Nothing once stopped."""
        with self._ticking:
            if self._stop.is_set():
                return self.policy.poll_s
            used_s = self.read()
            if not self.demoted and self.mechanism != "off" and used_s >= self.policy.demote_after_s:
                self._demote()
            if self.cgroup is not None:  # a value two of the customer's jobs raced on is set right here
                self.cgroup.share_customer()
            cap_s = self.policy.max_cpu_s
            if cap_s > 0 and used_s >= cap_s:
                self._over_cap(used_s)
            return self._wait_s(used_s)

    def _wait_s(self, used_s: float) -> float:
        """The poll, sooner as the cap nears; past it, the poll again (killing what the run starts while it stops)."""
        cap_s = self.policy.max_cpu_s
        left_s = (cap_s - used_s) / CORES if cap_s > 0 and not self.exceeded else self.policy.poll_s
        return max(MIN_POLL_S, min(self.policy.poll_s, left_s))

    def stopped(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for the stop; whether it came (the watching thread's wait once nothing else is
        left for it to wait on)."""
        return self._stop.wait(wait_s)

    def _demote(self) -> None:
        log.info("job process %d passed %g CPU seconds: its share is lowered (%s)", self.pid,
                 self.policy.demote_after_s, self.mechanism,
                 extra={"event": "job_cpu_demoted", "specialist": self.specialist_id, "share": self.mechanism})
        with self._lock:
            self.demoted = True
            if self.cgroup is not None:
                try:
                    self.cgroup.set_weight(self.policy.demoted_weight)
                    self.cgroup.share_customer()
                    return
                except OSError as exc:
                    log.warning("could not lower the weight of %s (%s); lowering its priority", self.cgroup.dir, exc)
            self._renice()

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
        """Stop the meter (after a tick under way); the job's CPU seconds. Its process stays in its cgroup to its
        exit, which takes it out; the worker then removes the group (``JobGroups.ended``). Moving it out here cost
        a write of ``cgroup.procs``, which waits for the kernel's RCU grace period (issue 44)."""
        with self._ticking:
            self._stop.set()
        return self.read()

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


class Told(Protocol):
    """A running job's process as the worker holds it: it can be told its customer's count of jobs."""

    def customer_jobs(self, jobs: int) -> None: ...


class CustomerJobs:
    """The worker's side of the share per customer in the nice mode: the jobs each customer runs on this worker,
    and each of them told its customer's count whenever it changes (``JobCpu.customer_jobs_changed``). Told under
    the lock, so a job hears its customer's counts in the order they changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, list[Told]] = {}

    def started(self, customer: str, job: Told) -> None:
        with self._lock:
            jobs = self._running.setdefault(customer, [])
            jobs.append(job)
            self._tell(jobs)

    def ended(self, customer: str, job: Told) -> None:
        with self._lock:
            jobs = self._running.get(customer, [])
            left = [other for other in jobs if other is not job]
            if len(left) == len(jobs):
                return
            jobs[:] = left
            if jobs:
                self._tell(jobs)
            else:
                del self._running[customer]

    def count(self, customer: str) -> int:
        with self._lock:
            return len(self._running.get(customer, []))

    @staticmethod
    def _tell(jobs: list[Told]) -> None:
        for job in jobs:
            job.customer_jobs(len(jobs))
