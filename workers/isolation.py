"""Where a job's runner runs: in a process of its own (the default), or in a thread of the worker (tests).

The worker process keeps what must never stall: the HTTP server (deliveries,
``/healthz``), every job's lease heartbeat, the cancel, deadline and grace
decisions, and the finish. A job's code runs elsewhere, so that whatever it does
(a C call that holds the GIL for minutes, a memory blow-up, a crash of the
interpreter) it cannot stop another job's heartbeat or the worker's answers
(issue 15: a catastrophic regex in one customer's run cost another customer's
job its lease).

``ProcessJobs`` (``SPECIALISTS_WORKER_JOB_ISOLATION=process``). Each job runs in
a one-use process forked from a *forkserver* of our own (``_serve``) that the worker starts once (and
again if it died), with the heavy modules imported (``PRELOAD``): a fork of a clean, single-threaded
server, never of the multi-threaded worker (whose other threads may hold locks).
The next job's process is forked ahead of its job and waits for it on its control
pipe, so a delivery does not wait for a fork (issue 17).
What no job changes is done once, before the fork (issue 44 §1): the forkserver prepares
the worker's runners from its picklable recipe (``RunnerBuild.prepare``, ``workers.job_template``:
the specs, the routes, the runners, their engine with no connection yet, Monty's digest), and
each job's process is forked from them; once its job came it takes its specialist's runner
(``RunnerBuild.start``: its telemetry) and runs it. What each job's process is given (the build,
the template's key, the recipe) is sent to the forkserver once per worker; a fork is asked for with
the child's pipes alone, and the child starts straight into its body (no multiprocessing bootstrap)
and ends with ``os._exit``. A forkserver without this worker's template
(another worker's in the same process, or one restarted by another) leaves each job's process to prepare its
own runners before its job comes. A process serves one job, then exits. The job itself, then the run's cancel, come on
the control pipe: after the job, a message on it, or its end (the worker gone), sets the child's cancel
event (a pipe, not a multiprocessing Event: those are named semaphores that a
worker stopped mid-job leaves behind, with a warning at exit); ``ctx.report`` writes task events from the child (fenced
by the claim's token, as from a thread); the child's log records and its
``RunOutcome`` come back over a pipe. A runner still going
``worker_cancel_grace_s`` after it was asked to stop is killed (SIGKILL to its
process group, so the Monty processes it started go too) and its slot is free
again. A child that dies (a signal, the kernel's OOM killer, its memory cap) is a
failed run whose detail says so, not a crashed worker. A child gets SIGKILL when
the forkserver ends, which it does when the worker dies.

``ThreadJobs`` (``SPECIALISTS_WORKER_JOB_ISOLATION=thread``): the runner in a
thread of the worker, sharing its GIL, as before issue 15. It exists for tests
that inject in-process Python callbacks (a runner object, a step observer that
blocks on a threading.Event); a runner past the grace is abandoned, not killed,
and holds its slot until it ends.
"""

from __future__ import annotations

import _thread
import dataclasses
import logging
import logging.handlers
import math
import multiprocessing.connection
import os
import pickle
import resource
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message as ProtoMessage

from core import telemetry
from workers.auth import VerifiedJob
from workers.cpu_share import CustomerJobs, JobCpu, JobGroups, customer_of, policy_of, prctl
from workers.runs import EventSink, RunContext, Runner, RunOutcome

log = logging.getLogger(__name__)

JobIsolation = Literal["process", "thread"]

# Imported once by the forkserver (``_serve``), so a job's process starts with them loaded (a fork, not an import).
PRELOAD = (
    "workers.job_signals",  # first: SIGINT ignored before anything else, and so in every job process
    "workers.assembly", "workers.hosted_rlm.runner", "rlmfamily.session", "rlmfamily.kernels.monty",
    "sqlalchemy.dialects.postgresql",  # imported by the first create_engine of a process: 50-100 ms a job
    "workers.job_template",  # last: the runners built once, from everything above (issue 44 §1)
)
# After its outcome a child only has to exit; one that does not within this long is killed.
EXIT_WAIT_S = 5.0
# On a job's control pipe after the job, the worker's word that its customer's count of running jobs changed
# (``CustomerJobs``), followed by the count; any other message, or the pipe's end, is the run's cancel.
CUSTOMER_JOBS = b"customer-jobs "
_PR_SET_PDEATHSIG = 1

Reported = Callable[[RunOutcome], None]
Ended = Callable[[], None]


class RunningJob(Protocol):
    def stop(self) -> None:
        """Ask the runner to stop (its context's cancel): a cancel, the deadline or a lost lease."""
        ...

    def kill(self) -> None:
        """The runner did not stop within the grace: end it (a process) or abandon it (a thread)."""
        ...


class JobHost(Protocol):
    isolation: JobIsolation

    def start(self, job: VerifiedJob, fencing_token: int, deadline_at: float, reported: Reported,
              ended: Ended) -> RunningJob:
        """Start the job's runner. From another thread, once each and in this order: ``reported(outcome)`` as soon
        as its outcome is known, so that the finish need not wait for its process to exit (a hosted run's process
        closes its Monty sessions and connections after it reported); ``ended()`` when the runner has ended (its
        process has exited): the slot it held is free then."""
        ...

    def close(self) -> None: ...


# --- in a thread of the worker ----------------------------------------------------------------


@dataclass
class _ThreadJob:
    cancel: threading.Event

    def stop(self) -> None:
        self.cancel.set()

    def kill(self) -> None:
        """A thread cannot be killed: it is abandoned, and its late outcome is dropped by the caller."""


class ThreadJobs:
    isolation: JobIsolation = "thread"

    def __init__(self, runners: Mapping[str, Runner], events: EventSink) -> None:
        self.runners = dict(runners)
        self.events = events

    def start(self, job: VerifiedJob, fencing_token: int, deadline_at: float, reported: Reported,
              ended: Ended) -> RunningJob:
        cancel = threading.Event()
        ctx = RunContext(job, fencing_token, deadline_at, cancel, self.events)
        runner = self.runners[job.specialist_id]

        def run() -> None:
            reported(_run_guarded(runner, ctx))
            ended()

        threading.Thread(target=run, name=f"job-{job.job_id}", daemon=True).start()
        return _ThreadJob(cancel)

    def close(self) -> None:
        return None


def _run_guarded(runner: Runner, ctx: RunContext) -> RunOutcome:
    """The runner's outcome, in the span that continues the worker's run span; a crash is a failed job, not a
    crashed worker. No span where there is none to continue or record (telemetry off, no span sent), as
    ``telemetry.span`` would give none: its machinery cost a no-op job's process 0.15 ms (issue 44)."""
    if ctx.job.trace_parent is None and not telemetry.is_on():
        return _said(ctx, _run_caught(runner, ctx))
    with telemetry.span("specialist.run", parent=telemetry.context_of(ctx.job.trace_parent),
                        attributes={"specialists.job_id": ctx.job.job_id,
                                    "specialists.specialist": ctx.job.specialist_id}) as span:
        outcome = _run_caught(runner, ctx)
        telemetry.annotate(span, **{"specialists.outcome": outcome.state})
        return _said(ctx, outcome)


def _said(ctx: RunContext, outcome: RunOutcome) -> RunOutcome:
    log.info("job %s: the specialist's run ended %s", ctx.job.job_id, outcome.state,
             extra={"event": "job_run", "job_id": ctx.job.job_id, "specialist": ctx.job.specialist_id,
                    "outcome": outcome.state})
    return outcome


def _run_caught(runner: Runner, ctx: RunContext) -> RunOutcome:
    try:
        return runner.run(ctx)
    except MemoryError:
        return RunOutcome("failed", "the specialist ran out of memory", detail={"error": "job_memory_exceeded"})
    except Exception as exc:
        log.exception("specialist %s crashed on job %s", ctx.job.specialist_id, ctx.job.job_id)
        return RunOutcome("failed", f"the specialist failed ({type(exc).__name__})", detail={"error": type(exc).__name__})


# --- in a process of its own ------------------------------------------------------------------


@dataclass
class BuiltRunner:
    """What a job's process builds from its recipe: the runner, where its events go, and how to let go."""

    runner: Runner
    events: EventSink
    close: Callable[[], None]


def _nothing_ahead(prepared: Any) -> None:
    return None


@dataclass(frozen=True)
class RunnerBuild:
    """How a job's process gets its runner, in parts (module-level functions: they are pickled by name).

    ``prepare(recipe)``: everything no job changes (the runners, their engine): once, in the forkserver
    (``workers.job_template``), or in a job's process before its job comes when the forkserver has no template
    of this worker. It starts no thread and opens no connection: the forkserver forks from it.
    ``ahead(prepared)``: in a job's process forked ahead of its job, while it waits for it: what every run of
    these runners does first and no job changes (a connection of their engine), so that its job does not wait
    for it. A failure is logged and left to the run, which does it again.
    ``start(prepared, specialist_id)``: in the job's process once its job came: the runner of that specialist,
    with what only a running process may have (its telemetry's exporters)."""

    prepare: Callable[[Any], Any]
    start: Callable[[Any, str], BuiltRunner]
    ahead: Callable[[Any], None] = _nothing_ahead


class _PipeQueue:
    """The child's log records go to the parent through the job's pipe (``conn``, set once the job's process has
    it), one record a message."""

    def __init__(self) -> None:
        self.conn: multiprocessing.connection.Connection | None = None
        self.lock = threading.Lock()  # a runner may log from several threads; a Connection is not thread-safe

    def put_nowait(self, record: logging.LogRecord) -> None:
        with self.lock:
            if self.conn is None:
                return
            try:
                self.conn.send(("log", record))
            except OSError:  # the worker is gone (it stopped while this job ran): nobody is left to read it
                pass


# A job process's log handler, made as the forkserver imports this module: each job's process inherits it and only
# points it at its pipe (making one in each cost a no-op job 0.1 ms, issue 44). logging gives it a new lock in each
# fork; the forkserver has one thread, so the queue's lock is free when it forks.
_JOB_LOG = _PipeQueue()
_JOB_LOG_HANDLER = logging.handlers.QueueHandler(_JOB_LOG)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _ProtoBytes:
    """A protobuf message across the pipe: a2a-sdk's generated classes do not pickle (their module, ``a2a_pb2``,
    is not importable by that name), so the final A2A event and the events written with it cross as their type's
    full name and their bytes."""

    full_name: str
    data: bytes


def _portable(outcome: RunOutcome) -> RunOutcome:
    if not isinstance(outcome.final_event, ProtoMessage) and not outcome.events:
        return outcome
    return dataclasses.replace(outcome, final_event=_to_bytes(outcome.final_event),
                               events=tuple(_to_bytes(event) for event in outcome.events))


def _restored(outcome: RunOutcome) -> RunOutcome:
    if not isinstance(outcome.final_event, _ProtoBytes) and not outcome.events:
        return outcome
    return dataclasses.replace(outcome, final_event=_from_bytes(outcome.final_event),
                               events=tuple(_from_bytes(event) for event in outcome.events))


def _to_bytes(event: Any) -> Any:
    if isinstance(event, ProtoMessage):
        return _ProtoBytes(event.DESCRIPTOR.full_name, event.SerializeToString())
    return event


def _from_bytes(event: Any) -> Any:
    if isinstance(event, _ProtoBytes):
        kind = message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName(event.full_name))
        return kind.FromString(event.data)
    return event


def _die_with_forkserver() -> None:
    """SIGKILL when the forkserver (the parent) ends; it ends when the worker dies, even by SIGKILL."""
    parent = os.getppid()
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) is None:
        return
    if os.getppid() != parent:  # it ended before the signal was armed
        os._exit(1)


def _cap_memory(max_memory_bytes: int) -> None:
    if max_memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (max_memory_bytes, max_memory_bytes))


def _start_watcher(control: multiprocessing.connection.Connection, cancel: threading.Event, cpu: JobCpu) -> None:
    """The one thread of the job's process beside its run: the worker's words, after its job (its customer's count
    of jobs to ``cpu``, until a stop, or the worker's end, sets the run's ``cancel``), and between them the meter's
    reads (``JobCpu.tick``), each when the one before said, until the meter is stopped. One thread for both: a
    thread's start cost a no-op job about 0.2 ms (issue 44)."""

    def watch() -> None:
        listening = True
        tick_at = time.monotonic() + cpu.first_wait_s()
        while True:
            wait_s = max(0.0, tick_at - time.monotonic())
            if listening:
                try:
                    if control.poll(wait_s):
                        message = control.recv_bytes()
                        if message.startswith(CUSTOMER_JOBS):
                            cpu.customer_jobs_changed(int(message[len(CUSTOMER_JOBS):]))
                        else:
                            listening = False
                            cancel.set()
                        continue
                except (EOFError, OSError):
                    listening = False
                    cancel.set()
                    continue
            elif cpu.stopped(wait_s):
                return
            tick_at = time.monotonic() + cpu.tick()
            if cpu.stopped(0):
                return

    def watched() -> None:
        try:
            watch()
        except Exception:  # a thread of its own has no excepthook: said here, and the run goes on without it
            log.exception("the job's watching thread failed")

    # A thread of ``_thread``, not a ``threading.Thread``: in a fresh fork threading's bookkeeping (its events, the
    # start's handshake) touched about 75 pages and cost a no-op job 0.4 ms (issue 44). Nothing needs to join it:
    # the job's process ends with ``os._exit``.
    _thread.start_new_thread(watched, ())


def _prepared(build: RunnerBuild, key: str, offered: bytes) -> tuple[Any, Any, Exception | None]:
    """(recipe, prepared runners, the error that prevented them): the forkserver's template of this worker, or
    prepared here from the recipe that came with this process (``offered``: the pickled ``(key, build, recipe, the
    worker's log level)``)."""
    from workers import job_template  # imported by the forkserver after this module (see PRELOAD)

    template = job_template.prepared(key)
    if template is not None:
        return template.recipe, template.prepared, None
    _, _, recipe, _ = pickle.loads(offered)
    try:
        return recipe, build.prepare(recipe), None
    except Exception as exc:  # said when the job comes, as the job's failure
        return recipe, None, exc


def _job_process(build: RunnerBuild, key: str, offered: bytes, control: multiprocessing.connection.Connection,
                 conn: multiprocessing.connection.Connection, max_memory_bytes: int, log_level: int) -> None:
    """The body of a job's process: take its runners (the forkserver's template, or prepared here), wait for its
    job on ``control`` (it was forked before the job came), start the runner, run it, send its outcome back.
    Later messages on ``control``, or its end, stop the run. It serves this one job, then exits."""
    os.setpgid(0, 0)  # its own process group: a kill reaches whatever it started (Monty's processes)
    _die_with_forkserver()
    root = logging.getLogger()
    _JOB_LOG.conn = conn
    root.handlers[:] = [_JOB_LOG_HANDLER]
    if root.level != log_level:  # the forkserver's template set the worker's level: a change clears every logger's
        root.setLevel(log_level)  # cache, touching (and so copying) the pages of each, about 0.5 ms a job
    _cap_memory(max_memory_bytes)
    recipe, prepared, unprepared = _prepared(build, key, offered)
    if unprepared is None:
        try:
            build.ahead(prepared)
        except Exception as exc:  # noqa: BLE001 - its run does the same, and says so if it fails then
            log.warning("a job's process could not get ready ahead of its job (%s); its run will", type(exc).__name__)
    try:
        job, fencing_token, deadline_at = control.recv()
    except (EOFError, OSError):  # the worker let its spare process go (it is stopping): no job came
        return
    cancel = threading.Event()
    cpu = JobCpu.start(recipe, job.specialist_id, job.payload, cancel)  # its share, cap and count (workers.cpu_share)
    _start_watcher(control, cancel, cpu)  # what the worker said meanwhile waits in the pipe
    built: BuiltRunner | None = None
    try:
        if unprepared is not None:
            raise unprepared
        built = build.start(prepared, job.specialist_id)
        # Linux's monotonic clock is the machine's: the worker's deadline means the same here.
        outcome = _run_guarded(built.runner, RunContext(job, fencing_token, deadline_at, cancel, built.events))
    except Exception as exc:
        log.exception("the runner of specialist %s could not be built for job %s", job.specialist_id, job.job_id)
        outcome = RunOutcome("failed", f"the specialist could not start ({type(exc).__name__})",
                             detail={"error": type(exc).__name__})
    if outcome.detail.get("error") == "job_memory_exceeded" and max_memory_bytes > 0:
        log.warning("job %s reached its memory cap of %d bytes (SPECIALISTS_WORKER_JOB_MAX_MEMORY_BYTES)",
                    job.job_id, max_memory_bytes)
        outcome = RunOutcome("failed", f"the specialist ran out of memory: a job may use {max_memory_bytes} bytes",
                             outcome.artifacts, {**outcome.detail, "max_memory_bytes": max_memory_bytes})
    outcome = cpu.judged(outcome)
    try:
        conn.send(("outcome", _portable(outcome)))
    except OSError:  # the worker is gone (it stopped while this job ran): the job becomes unknown after its lease
        os._exit(0)
    except Exception as exc:  # something in it does not pickle: say so, rather than die without an outcome
        log.exception("job %s: its outcome could not be sent to the worker", job.job_id)
        conn.send(("outcome", RunOutcome("failed", "the specialist's outcome could not be recorded",
                                         detail={"error": type(exc).__name__})))
    conn.close()
    # It stays in its cgroup: its exit takes it out, and its worker removes the group (``cpu_share.JobGroups``).
    if built is not None:
        built.close()


def _death(exitcode: int | None, killed: bool) -> RunOutcome:
    """The outcome of a job whose process ended without sending one."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else str(-exitcode)
        how = f"was killed by {name}"
        if not killed and -exitcode == signal.SIGKILL:
            how += " (the machine's out-of-memory killer, or an operator)"
    else:
        how = f"exited with status {exitcode}"
    return RunOutcome("failed", f"the specialist's process {how} before it reported an outcome",
                      detail={"error": "job_process_died", "exitcode": exitcode, "killed_by_worker": killed})


@dataclass
class _ProcessJob:
    process: _Child
    stopper: multiprocessing.connection.Connection  # the worker's end of the job's cancel pipe
    customer: str  # whose share the job runs under (``cpu_share.customer_of``): its groups, its count of jobs
    killed: bool = False
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # stop() and ended() race

    def stop(self) -> None:
        self._say(b"stop")

    def customer_jobs(self, jobs: int) -> None:
        """Its customer's count of jobs on this worker changed (``cpu_share.CustomerJobs``)."""
        self._say(CUSTOMER_JOBS + str(jobs).encode())

    def _say(self, message: bytes) -> None:
        with self.lock:
            if not self.stopper.closed:
                try:
                    self.stopper.send_bytes(message)
                except OSError:  # it has exited: nothing is left to tell
                    pass

    def ended(self) -> None:
        with self.lock:
            self.stopper.close()

    def kill(self) -> None:
        if self.process.exitcode is None:  # still running, so its pid and its group are still its own
            self.killed = True
            _kill_group(self.process.pid)


def _kill_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()  # the group, and the process itself in case it has not made its group yet
        except (ProcessLookupError, PermissionError):
            pass


# --- the job processes' fork server -------------------------------------------------------------
#
# One per worker process, started by the first ``ProcessJobs`` that forks and started again by the next fork if it
# died. It runs ``_serve``: a fresh interpreter (``python -c``) that imports ``PRELOAD`` (the last of which builds the
# template, ``workers.job_template``) and then only forks, on one thread. The worker speaks to it on one Unix
# socket, one way: a client's registration (what every job process of one ``ProcessJobs`` is given, sent once), its
# end, and a fork with the child's three pipe ends (its control pipe to read, its outcome pipe to write, its status
# pipe). The server writes the child's pid on the status pipe as it forks, and its exit code (as ``os.waitstatus_to_
# exitcode`` says it) when it reaps it: it is the parent, so only it can. The worker's end of the socket closing (the
# worker exited, however) ends the server, and each job process dies with it (``PR_SET_PDEATHSIG``).
# multiprocessing's forkserver did this before (issue 44): its child unpickled the preparation data and a Process
# object with the build, key and recipe of its worker, then ran multiprocessing's bootstrap, about 640 page faults
# and 1-2 ms of CPU a job above the bare fork.

_HEADER = struct.Struct("<cxxxI")  # a message to the server: its kind, then the length of its body
_CLIENT = struct.Struct("<q")  # a registration's (then its pickled arguments) or an end's body: the client
_FORK = struct.Struct("<qi")  # a fork's body: the client, the worker's log level now (the pipes' ends go beside it)
_SIGNED = struct.Struct("q")  # on a child's status pipe: its pid, then its exit code
_REGISTER, _UNREGISTER, _SPAWN = b"R", b"U", b"F"
_FORK_FDS = 3  # control (read), outcome (write), status (write)
_SERVER_COMMAND = ("import sys; sys.path[:] = {path!r}; import workers.job_signals; "
                   "from workers.isolation import _serve; _serve({fd})")


_MADV_COLLAPSE = 25  # <linux/mman.h>, Linux 6.1: the range's pages into huge pages now, whatever the THP mode says
_HUGE_PAGE_SIZE_FILE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"


def _heap_ranges(maps: str, huge_bytes: int) -> list[tuple[int, int]]:
    """The huge-page-aligned parts of each private, writable, anonymous mapping of ``maps`` (``/proc/<pid>/maps``'s
    text: the interpreter's arenas, malloc's heap and its mmaps), not the stack."""
    ranges = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or fields[1][:2] != "rw" or fields[1][3] != "p":
            continue
        if len(fields) == 6 and fields[5].strip() != "[heap]":  # a file's mapping, the stack, the vDSO's
            continue
        start, end = (int(address, 16) for address in fields[0].split("-"))
        first, last = -(-start // huge_bytes) * huge_bytes, end // huge_bytes * huge_bytes
        if last > first:
            ranges.append((first, last))
    return ranges


def collapse_heap() -> int:
    """The fork server's heap into transparent huge pages (``MADV_COLLAPSE``), once its preload is done: a fork
    copies one page-table entry, and an exit drops one, for 2 MiB the job's process never writes, instead of 512
    (issue 44: fork and exit were most of the 3 ms of CPU that a process of this 80 MB heap costs at the least). A
    page the job's process writes is copied alone, as before: the kernel splits the huge page's mapping in that
    process first. Nothing is asked of the mappings made after this (no MADV_HUGEPAGE): a job's own allocations stay
    in small pages. The bytes collapsed; 0 where the kernel has no huge pages or refuses."""
    from workers.cpu_share import libc_madvise

    madvise = libc_madvise()
    try:
        with open(_HUGE_PAGE_SIZE_FILE) as file:
            huge_bytes = int(file.read())
        with open("/proc/self/maps") as file:
            maps = file.read()
    except (OSError, ValueError):
        return 0
    if madvise is None or huge_bytes <= 0:
        return 0
    collapsed = 0
    for start, end in _heap_ranges(maps, huge_bytes):
        if madvise(start, end - start, _MADV_COLLAPSE) == 0:  # EINVAL on an older kernel, EAGAIN, ENOMEM: left as is
            collapsed += end - start
    return collapsed


def _read_signed(fd: int) -> int:
    data = b""
    while len(data) < _SIGNED.size:
        chunk = os.read(fd, _SIGNED.size - len(data))
        if not chunk:
            raise EOFError("the job processes' fork server ended")
        data += chunk
    return _SIGNED.unpack(data)[0]


def _receive(sock: socket.socket) -> tuple[bytes, bytes, list[int]] | None:
    """The next message on the server's socket (kind, body, the fds that came with it); None at its end."""
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, _FORK_FDS)
    if not head:
        return None
    while len(head) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(head))
        if not more:
            return None
        head += more
    kind, length = _HEADER.unpack(head)
    body = bytearray()
    while len(body) < length:
        more = sock.recv(length - len(body))
        if not more:
            return None
        body += more
    return kind, bytes(body), fds


# How many times the fork server rehearses a job's generic path (``rehearse``): CPython 3.11 quickens a function
# after 8 calls and specialises an instruction after its first runs; 30 passes all of that with room.
REHEARSAL_ROUNDS = 30
REHEARSAL_ID = "rehearsal"  # the job id and specialist of the rehearsal's job: no customer's, no spec's


class _RehearsalRunner:
    """What the rehearsal runs in place of a specialist: nothing (no specialist's run is rehearsed)."""

    def run(self, ctx: RunContext) -> RunOutcome:
        return RunOutcome("completed", REHEARSAL_ID)


class _NoEvents:
    def emit(self, job: VerifiedJob, fencing_token: int, kind: str, data: dict[str, Any]) -> None:
        raise AssertionError("the fork server's rehearsal writes no task event")


def rehearse(rounds: int = REHEARSAL_ROUNDS) -> None:
    """In the fork server, before its heap is collapsed and frozen: the generic part of a job's path ``rounds``
    times, so that what its first run writes (3.11's quickened code and its counters, the type caches' misses, the
    lazy imports and caches of pickle, logging, dataclasses) is written once here, not again in each job's process
    (issue 44: a no-op job's process copied about 1,090 pages of the server's heap). Its job is no one's (``REHEARSAL_ID``,
    an empty payload); it runs no specialist's runner, starts no thread, enters no cgroup (``JobCpu`` is made, not
    started), connects nowhere and exports nothing: the job's tuple and its outcome cross a pipe of this process,
    as a job's do, and the log records the run says cross it too and are dropped."""
    from datetime import datetime, timezone

    from workers import job_template
    from workers.cpu_share import customer_hash, policy_of

    template = job_template.TEMPLATE
    recipe = None if template is None else template.recipe
    root = logging.getLogger()
    handlers = root.handlers[:]
    for _ in range(rounds):
        job = VerifiedJob(job_id=REHEARSAL_ID, specialist_id=REHEARSAL_ID, deadline_s=60.0, payload={},
                          signed_at=datetime.now(timezone.utc), secret_id=REHEARSAL_ID)
        control_r, control_w = os.pipe()
        outcome_r, outcome_w = os.pipe()
        control = multiprocessing.connection.Connection(control_r, writable=False)
        conn = multiprocessing.connection.Connection(outcome_w, readable=False)
        try:
            with multiprocessing.connection.Connection(control_w, readable=False) as worker_side:
                worker_side.send((job, 1, time.monotonic() + job.deadline_s))
            job, fencing_token, deadline_at = control.recv()
            control.poll(0)
            cancel = threading.Event()
            customer = customer_of(job.payload)
            customer_hash(customer)
            cpu = JobCpu(policy_of(recipe, job.specialist_id), cancel, job.specialist_id, customer)
            _JOB_LOG.conn = conn
            root.handlers[:] = [_JOB_LOG_HANDLER]
            outcome = _run_guarded(_RehearsalRunner(), RunContext(job, fencing_token, deadline_at, cancel, _NoEvents()))
            outcome = cpu.judged(outcome)
            conn.send(("outcome", _portable(outcome)))
        finally:
            _JOB_LOG.conn = None
            root.handlers[:] = handlers
            conn.close()
            control.close()
            # What it said (a log record or two, its outcome: far below a pipe's 64 KiB, so its writes above could
            # not block), read to the pipe's end and dropped.
            with multiprocessing.connection.Connection(outcome_r, writable=False) as reader:
                try:
                    while True:
                        reader.recv_bytes()
                except EOFError:
                    pass
    assert threading.active_count() == 1, "the fork server's rehearsal started a thread"


def _serve(fd: int) -> None:
    """The fork server: ``PRELOAD`` imported (``workers.job_signals`` already is: SIGINT ignored from the start),
    a job's path rehearsed (``rehearse``), then each fork asked for on the socket ``fd``, until its other end
    closes."""
    import gc
    import importlib
    import select

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # as multiprocessing's forkserver: a job's process that needs it fails, and says why
            pass
    try:
        rehearse()
    except AssertionError:  # it started a thread: this server must not fork
        raise
    except Exception:  # noqa: BLE001 - a job's process does it all again; the server serves anyway
        logging.getLogger(__name__).warning("the fork server could not rehearse a job's path", exc_info=True)
    gc.collect()
    gc.freeze()  # what the rehearsal left (its caches) joins what job_template froze: a job's collector leaves it
    collapse_heap()
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears of each child's exit
    signal.set_wakeup_fd(wake_w)
    clients: dict[int, tuple | BaseException] = {}  # each client's (target, build, key, offered, max memory)
    statuses: dict[int, int] = {}  # each live child's status pipe, by pid
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready == wake_r:
                _reap(wake_r, statuses)
                continue
            message = _receive(sock)
            if message is None:  # the worker is gone: so is this server, and each job process with it
                sys.exit(0)
            kind, body, fds = message
            if kind == _SPAWN and len(fds) == _FORK_FDS:
                client, log_level = _FORK.unpack(body)
                _spawn(clients.get(client), log_level, fds, sock, (wake_r, wake_w), statuses)
                continue
            for unused in fds:
                os.close(unused)
            if kind == _REGISTER:
                [client] = _CLIENT.unpack_from(body)
                try:
                    clients[client] = pickle.loads(body[_CLIENT.size:])
                except Exception as exc:  # noqa: BLE001 - each job process of this client fails with it, said there
                    clients[client] = exc
            elif kind == _UNREGISTER:
                clients.pop(_CLIENT.unpack(body)[0], None)


def _reap(wake_r: int, statuses: dict[int, int]) -> None:
    """Each child that exited, reaped, and its exit code written on its status pipe."""
    try:
        os.read(wake_r, 4096)
    except BlockingIOError:
        pass
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is None:
            continue
        try:
            os.write(fd, _SIGNED.pack(os.waitstatus_to_exitcode(status)))
        except OSError:  # its worker let go of it
            pass
        os.close(fd)


def _spawn(client: tuple | BaseException | None, log_level: int, fds: list[int], sock: socket.socket,
           wake: tuple[int, int], statuses: dict[int, int]) -> None:
    control, outcome, status = fds
    try:
        pid = os.fork()
    except OSError as exc:  # no process now (EAGAIN, ENOMEM): the worker's fork fails, this server goes on
        pid = -(exc.errno or 1)
    if pid == 0:
        _child(client, log_level, control, outcome, [status, *wake, *statuses.values()], sock)
    os.close(control)
    os.close(outcome)
    try:
        os.write(status, _SIGNED.pack(pid))
    except OSError:  # its worker let go of it: it reads its job's end on its control pipe and exits
        pass
    if pid > 0:
        statuses[pid] = status
    else:
        os.close(status)


def _child(client: tuple | BaseException | None, log_level: int, control: int, outcome: int, unused: list[int],
           sock: socket.socket) -> None:
    """A job's process, just forked from the server: straight into its body (``_job_process``, as its client
    registered it), then ``os._exit``."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in unused:
            os.close(fd)
        if client is None:
            raise RuntimeError("a fork for a client the job processes' fork server does not know")
        if isinstance(client, BaseException):
            raise client
        target, build, key, offered, max_memory_bytes = client
        target(build, key, offered, multiprocessing.connection.Connection(control, writable=False),
               multiprocessing.connection.Connection(outcome, readable=False), max_memory_bytes, log_level)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - said on the worker's stderr (inherited); its exit code says it failed
        sys.excepthook(*sys.exc_info())
    finally:
        try:
            # What multiprocessing's bootstrap did too: the threads that are not daemons are waited for (what the
            # run left letting go of its runner, after its outcome); no atexit handler runs, nor any finalizer.
            threading._shutdown()  # type: ignore[attr-defined]
        except BaseException:  # noqa: BLE001
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


class _ForkFailed(OSError):
    """The fork server is there but could not fork (its ``os.fork`` failed): not a reason to start another."""


class _ForkServer:
    """The worker's side of the fork server: it starts it (again, if it died), registers each ``ProcessJobs``
    with it, and asks it for processes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.registrations: dict[int, bytes] = {}  # each client's registration's body, sent to each server once
        self.registered: set[int] = set()  # the clients the running server knows
        self.clients = 0

    @property
    def pid(self) -> int | None:
        with self.lock:
            return None if self.process is None else self.process.pid

    def register(self, target: Callable[..., None], build: RunnerBuild, key: str, offered: bytes,
                 max_memory_bytes: int) -> int:
        """A client: what each of its processes is given, pickled here once (sent at its first fork)."""
        with self.lock:
            self.clients += 1
            client = self.clients
            self.registrations[client] = _CLIENT.pack(client) + pickle.dumps(
                (target, build, key, offered, max_memory_bytes))
        return client

    def unregister(self, client: int) -> None:
        with self.lock:
            self.registrations.pop(client, None)
            if client in self.registered and self.sock is not None:
                self.registered.discard(client)
                try:
                    self._send(_UNREGISTER, _CLIENT.pack(client))
                except OSError:  # it died: a new one never hears of this client
                    pass

    def spawn(self, client: int, control: int, outcome: int, offer: Callable[[], str | None]) -> _Child:
        """A process of ``client``, forked with the ends ``control`` (it reads) and ``outcome`` (it writes), which
        stay the caller's to close. ``offer()`` offers the client's template (its file's path, or None) if the
        server must be started for this fork; the offer is withdrawn once the child is forked."""
        with self.lock:
            offered: str | None = None
            try:
                for attempt in range(2):
                    if self.process is None or self.process.poll() is not None:
                        if offered is not None:  # the server this call started died at once: offered again
                            from workers import job_template

                            job_template.withdraw(offered)
                        offered = self._start(offer)
                    try:
                        return self._fork(client, control, outcome)
                    except _ForkFailed:
                        raise
                    except (OSError, EOFError):
                        if attempt:
                            raise
                        self._stop()  # it died since it was last asked: once more, from a new one
                raise AssertionError("unreachable")
            finally:
                if offered is not None:
                    from workers import job_template

                    job_template.withdraw(offered)

    def _fork(self, client: int, control: int, outcome: int) -> _Child:
        assert self.sock is not None
        for pending in self.registrations.keys() - self.registered:
            self._send(_REGISTER, self.registrations[pending])
            self.registered.add(pending)
        status, status_w = os.pipe()
        try:
            try:
                self._send(_SPAWN, _FORK.pack(client, logging.getLogger().getEffectiveLevel()),
                           [control, outcome, status_w])
            finally:
                os.close(status_w)
            pid = _read_signed(status)
            if pid < 0:
                raise _ForkFailed(-pid, f"the job processes' fork server could not fork ({os.strerror(-pid)})")
            return _Child(pid, status)
        except BaseException:
            os.close(status)
            raise

    def _send(self, kind: bytes, body: bytes, fds: list[int] | None = None) -> None:
        assert self.sock is not None
        message = _HEADER.pack(kind, len(body)) + body
        sent = socket.send_fds(self.sock, [message], fds) if fds else 0
        if sent < len(message):
            self.sock.sendall(message[sent:])

    def _start(self, offer: Callable[[], str | None]) -> str | None:
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        offered = offer()
        try:
            command = _SERVER_COMMAND.format(path=sys.path, fd=theirs.fileno())
            self.process = subprocess.Popen(
                [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", command],  # type: ignore[attr-defined]
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            if offered is not None:
                from workers import job_template

                job_template.withdraw(offered)
            raise
        finally:
            theirs.close()
        self.sock = ours
        return offered

    def _stop(self) -> None:
        """Forget a server that died (its job processes died with it)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
        self.registered.clear()


_SERVER = _ForkServer()


def forkserver_pid() -> int | None:
    """The pid of this worker process's fork server, if it started one."""
    return _SERVER.pid


class _Child:
    """A job's process as its worker sees it: its pid, and its exit code once the fork server (its parent) reaped
    it and wrote it on its status pipe (255 if the server died first, as multiprocessing says it)."""

    def __init__(self, pid: int, status: int) -> None:
        self.pid = pid
        self._status: int | None = status
        self._exitcode: int | None = None
        self._lock = threading.Lock()  # the watching thread's join and a kill's look race

    @property
    def exitcode(self) -> int | None:
        self.join(0)
        return self._exitcode

    def join(self, timeout: float | None = None) -> None:
        import select

        status = self._status
        if self._exitcode is not None or status is None:
            return
        poller = select.poll()
        poller.register(status, select.POLLIN)
        if not poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))):
            return
        with self._lock:
            if self._exitcode is None and self._status is not None:
                try:
                    self._exitcode = _read_signed(self._status)
                except (OSError, EOFError):
                    self._exitcode = 255

    def close(self) -> None:
        with self._lock:
            if self._status is not None:
                os.close(self._status)
                self._status = None


def _no_job(*args: Any) -> None:
    """A process forked as a job's is, that runs nothing (``bench/job_process.py``'s baseline)."""


@dataclass
class _Spare:
    """A job's process forked before its job came, waiting for it on ``control``."""

    process: _Child
    control: multiprocessing.connection.Connection  # the worker's end: the job, then a stop
    reader: multiprocessing.connection.Connection  # the worker's end of the child's log records and outcome

    def discard(self) -> None:
        """Let it go unused: its control pipe ends, so it exits without a job."""
        self.control.close()
        self.reader.close()
        self.process.join(EXIT_WAIT_S)
        if self.process.exitcode is None:
            _kill_group(self.process.pid)
            self.process.join(EXIT_WAIT_S)
        self.process.close()


class ProcessJobs:
    """Each job in a one-use process, forked from the forkserver, which holds the runners prepared once
    (``workers.job_template``). The next one is forked while the current one starts (``_spare``): a job's start
    sends its job to a process already waiting, and the fork is off the delivery's path. Two jobs at once: the
    second forks its own, and does not fork another ahead while the first one's is being forked (issue 44: it
    did, and one of the two was let go unused: a fork and an exit of a whole job process, for about one job in
    six of a busy worker)."""

    isolation: JobIsolation = "process"

    def __init__(self, build: RunnerBuild, recipe: Any, *, max_memory_bytes: int) -> None:
        self.build = build
        self.max_memory_bytes = max_memory_bytes
        # Each job's process gets the key of this worker's template and, for a fork server without it, the recipe
        # (pickled once, here: it crosses as bytes); the template takes the worker's log level too. They are the
        # fork server's from the registration on: a fork sends only the pipes' ends and the log level.
        self._key = secrets.token_hex(16)
        self._offered = pickle.dumps((self._key, build, recipe, logging.getLogger().getEffectiveLevel()))
        self._client = _SERVER.register(_job_process, build, self._key, self._offered, max_memory_bytes)
        self._spare_lock = threading.Lock()
        self._closed = False
        self._forking_ahead = False  # a process is being forked ahead of the next job (``_replenish``), or asked for
        self._asked = threading.Condition(self._spare_lock)  # the forking thread's: a process is asked for, or the close
        self._forker: threading.Thread | None = None  # the forking thread, started at the first ask
        self.forked = 0  # processes forked so far: each ran a job, or waits for one (``waiting_pid``), or was let go
        self.customers = CustomerJobs()  # each customer's running jobs, told their count (the nice mode's share)
        # Each job's cgroup removed once its process has exited (not by the process itself), and the groups a worker
        # that died left swept, here at the start and then now and again (issue 44).
        policy = policy_of(recipe, "")
        self.groups = JobGroups(policy.share, policy.weight)
        # At start-up, not on the first job: the fork server imports PRELOAD and prepares the runners (seconds on a
        # loaded machine), and the first process forked from it waits for that. A fork server already running (an
        # earlier worker in this process) is not offered this one's template: its job processes prepare their own.
        self._spare: _Spare | None = self._fork()

    def _offer(self) -> str | None:
        """This worker's template, offered to the fork server it is about to start (``job_template.offer``)."""
        from workers import job_template  # not at the top: the fork server must import it last (PRELOAD)

        try:
            return job_template.offer(self._key, self._offered)
        except OSError as exc:  # no private file to hand it over in: each job's process prepares its own
            log.warning("the job processes' template could not be written to a private file (%s; TMPDIR names where):"
                        " each job's process prepares its own runners, before its job comes", type(exc).__name__)
            return None

    def _fork(self) -> _Spare:
        reader_fd, writer_fd = os.pipe()
        control_reader_fd, control_fd = os.pipe()
        reader = multiprocessing.connection.Connection(reader_fd, writable=False)
        control = multiprocessing.connection.Connection(control_fd, readable=False)
        try:
            process = _SERVER.spawn(self._client, control_reader_fd, writer_fd, self._offer)
        except BaseException:
            reader.close()
            control.close()
            raise
        finally:
            os.close(writer_fd)
            os.close(control_reader_fd)
        with self._spare_lock:
            self.forked += 1
        return _Spare(process, control, reader)

    @property
    def waiting_pid(self) -> int | None:
        """The process forked ahead of the next job, waiting for it (None while it is being forked)."""
        with self._spare_lock:
            return None if self._spare is None else self._spare.process.pid

    def _take_spare(self) -> _Spare:
        with self._spare_lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.process.exitcode is None:
            return spare
        if spare is not None:  # it died waiting (killed by an operator, the OOM killer): fork another
            spare.discard()
        return self._fork()

    @property
    def forking_ahead(self) -> bool:
        """Whether the next job's process is being forked ahead of it now."""
        with self._spare_lock:
            return self._forking_ahead

    def _fork_ahead(self) -> None:
        """Have the next job's process forked by the forking thread, unless one waits already, or is being forked:
        that one is the next job's (a job that came meanwhile forked its own, and may find it ready when it is
        done). One thread for the worker's life, asked on a condition, not one started per job (issue 44: a thread's
        start and end cost the worker 0.043-0.048 ms, the ask 0.008)."""
        with self._spare_lock:
            if self._forking_ahead or self._spare is not None or self._closed:
                return
            self._forking_ahead = True
            if self._forker is None:
                self._forker = threading.Thread(target=self._forking, name="job-spare", daemon=True)
                self._forker.start()
            self._asked.notify()

    def _forking(self) -> None:
        """The forking thread: each time it is asked, the next job's process, until the worker stops."""
        while True:
            with self._spare_lock:
                while not self._forking_ahead and not self._closed:
                    self._asked.wait()
                if self._closed:
                    self._forking_ahead = False
                    return
            self._replenish()

    def _replenish(self) -> None:
        try:
            spare = self._fork()
        except Exception as exc:  # the next job forks its own, and says so if it cannot
            with self._spare_lock:
                self._forking_ahead = False
            log.warning("could not fork the next job's process ahead of its job (%s)", type(exc).__name__)
            return
        with self._spare_lock:
            self._forking_ahead = False
            if not self._closed:
                assert self._spare is None, "two processes forked ahead of the next job (one at a time: _fork_ahead)"
                self._spare = spare
                return
        spare.discard()  # the worker is stopping: this one goes unused

    def start(self, job: VerifiedJob, fencing_token: int, deadline_at: float, reported: Reported,
              ended: Ended) -> RunningJob:
        spare = self._take_spare()
        try:
            spare.control.send((job, fencing_token, deadline_at))
        except BaseException:
            spare.discard()
            raise
        self._fork_ahead()
        running = _ProcessJob(spare.process, spare.control, customer_of(job.payload))
        self.customers.started(running.customer, running)
        threading.Thread(target=self._watch, args=(job, running, spare.reader, reported, ended),
                         name=f"job-{job.job_id}", daemon=True).start()
        return running

    def _watch(self, job: VerifiedJob, running: _ProcessJob, reader: multiprocessing.connection.Connection,
               reported: Reported, ended: Ended) -> None:
        """Relay the child's log records until its outcome, and report that at once: the finish does not wait for
        the child to let go of its runner. Then wait for it to exit, remove its cgroup (``JobGroups.ended``: before
        the slot is free, so a job that ended left no group), and report it ended. A child that dies without an
        outcome is reported once it has exited, as its death."""
        outcome: RunOutcome | None = None
        try:
            while outcome is None:
                kind, value = reader.recv()
                if kind == "log":
                    logger = logging.getLogger(value.name)
                    if logger.isEnabledFor(value.levelno):
                        logger.handle(value)
                elif kind == "outcome":
                    outcome = _restored(value)
        except (EOFError, OSError):
            pass  # it died, or was killed: its exit code says how
        except Exception as exc:  # a message that did not unpickle: the run's outcome is lost, not the worker
            log.error("job %s: its process sent what could not be read (%s)", job.job_id, type(exc).__name__)
        finally:
            reader.close()
        if outcome is not None:
            reported(outcome)
        process = running.process
        process.join(EXIT_WAIT_S)
        if process.exitcode is None:  # it closed its pipe but goes on: it has nothing left to say
            log.warning("job %s: its process did not exit after its pipe closed; killing it", job.job_id)
            _kill_group(process.pid)
            process.join()
        if outcome is None:
            outcome = _death(process.exitcode, running.killed)
            if not running.killed:
                log.error("job %s: %s", job.job_id, outcome.message)
            reported(outcome)
        self.groups.ended(process.pid, running.customer)  # exited (its fork server reaped it): its group is empty
        process.close()
        running.ended()
        self.customers.ended(running.customer, running)
        ended()

    def close(self) -> None:
        with self._spare_lock:
            self._closed = True
            spare, self._spare = self._spare, None
            self._asked.notify()
        if spare is not None:
            spare.discard()
        _SERVER.unregister(self._client)
