"""Where a job's runner runs: in a process of its own (the default), or in a thread of the worker (tests).

The worker process keeps what must never stall: the HTTP server (deliveries,
``/healthz``), every job's lease heartbeat, the cancel, deadline and grace
decisions, and the finish. A job's code runs elsewhere, so that whatever it does
(a C call that holds the GIL for minutes, a memory blow-up, a crash of the
interpreter) it cannot stop another job's heartbeat or the worker's answers
(issue 15: a catastrophic regex in one customer's run cost another customer's
job its lease).

``ProcessJobs`` (``SPECIALISTS_WORKER_JOB_ISOLATION=process``). Each job runs in
a one-use process forked from a multiprocessing *forkserver* that the worker starts once,
with the heavy modules imported (``PRELOAD``): a fork of a clean, single-threaded
server, never of the multi-threaded worker (whose other threads may hold locks).
The next job's process is forked ahead of its job and waits for it on its control
pipe, so a delivery does not wait for a fork (issue 17).
What no job changes is done once, before the fork (issue 44 §1): the forkserver prepares
the worker's runners from its picklable recipe (``RunnerBuild.prepare``, ``workers.job_template``:
the specs, the routes, the runners, their engine with no connection yet, Monty's digest), and
each job's process is forked from them; once its job came it takes its specialist's runner
(``RunnerBuild.start``: its telemetry) and runs it. A forkserver without this worker's template
(another worker's in the same process, or one restarted) leaves each job's process to prepare its
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
import io
import logging
import logging.handlers
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.popen_forkserver
import multiprocessing.reduction
import multiprocessing.spawn
import multiprocessing.util
import os
import pickle
import resource
import secrets
import signal
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
from workers.cpu_share import CustomerJobs, JobCpu, customer_of, prctl
from workers.runs import EventSink, RunContext, Runner, RunOutcome

log = logging.getLogger(__name__)

JobIsolation = Literal["process", "thread"]

# Imported once by the forkserver, so a job's process starts with them loaded (a fork, not an import).
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
    cpu.leave()  # after the outcome: the finish does not wait for the cgroup's move
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
    process: Any  # a forkserver context's Process
    stopper: multiprocessing.connection.Connection  # the worker's end of the job's cancel pipe
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


@dataclass
class _Spare:
    """A job's process forked before its job came, waiting for it on ``control``."""

    process: Any  # a forkserver context's Process
    control: multiprocessing.connection.Connection  # the worker's end: the job, then a stop
    reader: multiprocessing.connection.Connection  # the worker's end of the child's log records and outcome

    def discard(self) -> None:
        """Let it go unused: its control pipe ends, so it exits without a job."""
        self.control.close()
        self.reader.close()
        self.process.join(EXIT_WAIT_S)
        if self.process.exitcode is None:
            _kill_group(self.process.pid)


# The Python whose ``popen_forkserver.Popen._launch`` ``_JobPopen._launch`` copies, and the digest of that method's
# source there; tests/workers/test_job_template.py checks the digest against the running Python's.
LAUNCH_COPIED_FROM = (3, 11)
LAUNCH_SOURCE_SHA256 = "214844899bd3407f72082111e993b40f7c271620be27195b878ea1e44a5f3837"


class _JobPopen(multiprocessing.popen_forkserver.Popen):
    """The forkserver's launch, without the worker's main module: multiprocessing sends its name with each process,
    and the child runs that module again (as ``__mp_main__``: ops.cli, about 8 ms a job) for a body that needs
    nothing of it. The rest is ``popen_forkserver.Popen._launch`` as it is in ``LAUNCH_COPIED_FROM``: on another
    Python a job's process is launched by multiprocessing's own (``_JobProcess``), main module and all."""

    def _launch(self, process_obj: Any) -> None:
        prep_data = multiprocessing.spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_name", None)
        prep_data.pop("init_main_from_path", None)
        buf = io.BytesIO()
        multiprocessing.context.set_spawning_popen(self)
        try:
            multiprocessing.reduction.dump(prep_data, buf)
            multiprocessing.reduction.dump(process_obj, buf)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        self.sentinel, w = multiprocessing.forkserver.connect_to_new_process(self._fds)
        parent_w = os.dup(w)  # the child's sentinel of its parent, as multiprocessing keeps it
        self.finalizer = multiprocessing.util.Finalize(self, multiprocessing.util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = multiprocessing.forkserver.read_signed(self.sentinel)


class _JobProcess(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> multiprocessing.popen_forkserver.Popen:
        if sys.version_info[:2] != LAUNCH_COPIED_FROM:  # a launch copied from another Python may be wrong here
            return multiprocessing.popen_forkserver.Popen(process_obj)
        return _JobPopen(process_obj)


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
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(PRELOAD))
        # Each job's process gets the key of this worker's template and, for a forkserver without it, the recipe
        # (pickled once, here: it crosses as bytes); the template takes the worker's log level too.
        self._key = secrets.token_hex(16)
        self._offered = pickle.dumps((self._key, build, recipe, logging.getLogger().getEffectiveLevel()))
        self._spare_lock = threading.Lock()
        self._closed = False
        self._forking_ahead = False  # a process is being forked ahead of the next job (``_replenish``), or asked for
        self._asked = threading.Condition(self._spare_lock)  # the forking thread's: a process is asked for, or the close
        self._forker: threading.Thread | None = None  # the forking thread, started at the first ask
        self.forked = 0  # processes forked so far: each ran a job, or waits for one (``waiting_pid``), or was let go
        self.customers = CustomerJobs()  # each customer's running jobs, told their count (the nice mode's share)
        # At start-up, not on the first job: the forkserver imports PRELOAD and prepares the runners (seconds on a
        # loaded machine), and the first process forked from it waits for that. A forkserver already running (an
        # earlier worker in this process) reads no offer: its job processes prepare their own.
        from workers import job_template  # not at the top: the forkserver must import it last (PRELOAD)

        try:
            offer: str | None = job_template.offer(self._key, self._offered)
        except OSError as exc:  # no private file to hand it over in: each job's process prepares its own
            log.warning("the job processes' template could not be written to a private file (%s; TMPDIR names where):"
                        " each job's process prepares its own runners, before its job comes", type(exc).__name__)
            offer = None
        try:
            self._spare: _Spare | None = self._fork()
        finally:
            if offer is not None:
                job_template.withdraw(offer)

    def _fork(self) -> _Spare:
        reader, writer = self.context.Pipe(duplex=False)
        control_reader, control = self.context.Pipe(duplex=False)
        process = _JobProcess(
            target=_job_process,
            args=(self.build, self._key, self._offered, control_reader, writer, self.max_memory_bytes,
                  logging.getLogger().getEffectiveLevel()),
            name="job",
            daemon=True,  # a worker that exits ends its jobs' processes (they become unknown after their lease)
        )
        try:
            process.start()
        except BaseException:
            reader.close()
            control.close()
            raise
        finally:
            writer.close()
            control_reader.close()
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
        running = _ProcessJob(spare.process, spare.control)
        self.customers.started(customer_of(job.payload), running)
        threading.Thread(target=self._watch, args=(job, running, spare.reader, reported, ended),
                         name=f"job-{job.job_id}", daemon=True).start()
        return running

    def _watch(self, job: VerifiedJob, running: _ProcessJob, reader: multiprocessing.connection.Connection,
               reported: Reported, ended: Ended) -> None:
        """Relay the child's log records until its outcome, and report that at once: the finish does not wait for
        the child to let go of its runner. Then wait for it to exit, and report it ended. A child that dies without
        an outcome is reported once it has exited, as its death."""
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
        process.close()
        running.ended()
        self.customers.ended(customer_of(job.payload), running)
        ended()

    def close(self) -> None:
        with self._spare_lock:
            self._closed = True
            spare, self._spare = self._spare, None
            self._asked.notify()
        if spare is not None:
            spare.discard()
