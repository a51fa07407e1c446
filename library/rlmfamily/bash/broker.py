"""The one command broker: ``bash.run(...)`` in the namespace and the ``bash`` tool both end here.

Whichever surface asks, a command gets the same workspace, environment,
deadline, permissions, output limits and record: the surface is only written
down. Each invocation is a fresh ``bash --noprofile --norc -c COMMAND`` process
in its own process group (its own session), with an explicit working directory
inside the workspace; files persist between invocations, shell variables and
``cd`` do not.

A job's output goes through pipes into its two files, at most
``bash_max_stored_bytes`` each (the rest is counted, not kept), while only the
head and tail of each stream (``bash_preview_bytes``) stay in memory: a command
that prints 50 MB costs a few hundred kilobytes here. The model reads more by
handle (``read``), at most ``bash_max_read_bytes`` at a time.

When the command's main process ends, whatever it left running in its group is
killed (a background process does not outlive its job). When the deadline passes,
the group gets SIGTERM, then SIGKILL after ``bash_kill_grace_s``, and the
receipt says ``killed`` by ``deadline``. A process that left the group (its own
``setsid``) is out of reach, as with any process-group supervisor.

Where the command runs is the launcher's (``Launcher.launch``, rlmfamily/bash/host.py):
on this machine, or in the run's container (the container kernel), where the job
runner keeps the deadline and the group's end and reports how it ended
(rlmfamily/bash/in_container.py). Everything above holds in both.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from rlmfamily.bash.errors import JobRefused, WorkspaceBusy
from rlmfamily.bash.host import Launcher
from rlmfamily.bash.in_container import split_report
from rlmfamily.bash.store import Ending, Job, JobStore
from rlmfamily.family import procs
from rlmfamily.settings import RLMSettings

READ_CHUNK_BYTES = 65_536
LEASE_POLL_FIRST_S = 0.01
LEASE_POLL_MAX_S = 0.2
READER_JOIN_S = 5.0  # after the group is gone, the pipes close; a process that escaped it may hold them
STREAMS = ("stdout", "stderr")
REPORT_MAX_BYTES = 4096  # a container job runner's report, the last line of its stderr


@dataclass
class _Capture:
    """One stream: written to its file up to ``max_stored``, its head and tail kept for the preview."""

    file: BinaryIO
    max_stored: int
    head_max: int
    tail_max: int
    total: int = 0
    stored: int = 0
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)

    def take(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.stored < self.max_stored:
            kept = chunk[: self.max_stored - self.stored]
            self.file.write(kept)
            self.stored += len(kept)
        if len(self.head) < self.head_max:
            self.head += chunk[: self.head_max - len(self.head)]
        self.tail += chunk[-self.tail_max:] if self.tail_max else b""
        if len(self.tail) > self.tail_max:
            del self.tail[: len(self.tail) - self.tail_max]

    def preview(self) -> str:
        if self.total <= self.head_max + self.tail_max:  # all of it: the head, then what came after it
            rest = self.total - len(self.head)
            return (bytes(self.head) + (bytes(self.tail[-rest:]) if rest else b"")).decode("utf-8", errors="replace")
        omitted = self.total - len(self.head) - len(self.tail)
        return (bytes(self.head).decode("utf-8", errors="replace") + f"\n[... {omitted:,} bytes ...]\n"
                + bytes(self.tail).decode("utf-8", errors="replace"))


class _Reported:
    """A container job's stderr: the command's, then the job runner's report after ``marker`` (held back here).

    At most ``REPORT_MAX_BYTES`` are held back at a time; the rest goes to the capture as it comes.
    """

    def __init__(self, capture: _Capture, marker: bytes) -> None:
        self.capture, self.marker = capture, marker
        self.held = bytearray()

    def take(self, chunk: bytes) -> None:
        self.held += chunk
        spill = len(self.held) - REPORT_MAX_BYTES
        if spill > 0:
            self.capture.take(bytes(self.held[:spill]))
            del self.held[:spill]

    def ending(self, client_code: int | None, stopped_by: str | None) -> tuple[int | None, str | None, str | None]:
        """The exit status, who stopped the job, and an error: from the report, else from the engine client.

        No exit status with an error: Bash never started (the report says why), as when a host spawn fails.
        """
        rest, report = split_report(bytes(self.held), self.marker)
        self.held.clear()
        self.capture.take(rest)
        if report is not None and isinstance(report.get("error"), str):
            return None, None, report["error"]
        if report is not None and isinstance(report.get("exit_code"), int):
            return report["exit_code"], stopped_by or report.get("stopped_by"), None
        if stopped_by:
            return client_code, stopped_by, None
        return client_code, None, (f"the job runner in the container gave no report (the engine client ended "
                                    f"with {client_code}): the container may have stopped or run out of memory")


def fingerprint(command: str, cwd: str, read_only: bool) -> str:
    return hashlib.sha256(json.dumps([command, cwd, bool(read_only)]).encode()).hexdigest()


class CommandBroker:
    """Runs one agent's commands as durable jobs in one workspace."""

    def __init__(self, settings: RLMSettings, host: Launcher, store: JobStore, *, workspace: Path, root_id: str,
                 agent_id: str, run_id: str, on_job: Callable[[Job, bool], None] | None = None) -> None:
        self.settings = settings
        self.host = host
        self.store = store
        self.workspace = workspace.resolve()
        self.root_id, self.agent_id, self.run_id = root_id, agent_id, run_id
        self.on_job = on_job  # called once per answered request: (job, replayed)

    # ---------- run ----------

    def run(self, command: str, *, cwd: str | None = None, read_only: bool = False, deadline_s: float | None = None,
            request_id: str | None = None, surface: str = "python") -> tuple[Job, bool]:
        """Run ``command`` as a job and return its receipt (and whether the request id was a replay)."""
        settings = self.settings
        if not isinstance(command, str) or not command.strip():
            raise JobRefused("the command is empty; pass Bash source as a string")
        if len(command) > settings.bash_max_command_chars:
            raise JobRefused(f"the command has {len(command):,} characters; at most {settings.bash_max_command_chars:,} "
                             "(RLM_BASH_MAX_COMMAND_CHARS): write a script file and run it", setting="bash_max_command_chars")
        where = self.working_directory(cwd)
        deadline = self.deadline(deadline_s)
        relative = str(where.relative_to(self.workspace)) or "."
        job, replayed = self.store.admit(
            root_id=self.root_id, agent_id=self.agent_id, run_id=self.run_id,
            request_id=request_id or f"{self.run_id}:{secrets.token_hex(8)}",
            fingerprint=fingerprint(command, relative, read_only), surface=surface, command=command,
            workspace=str(self.workspace), cwd=relative, read_only=bool(read_only), deadline_s=deadline,
            max_jobs=settings.bash_max_jobs,
        )
        if not replayed:
            job = self._wait_for_turn(job)
            if job.state == "running":
                job = self._execute(job, where)
        if self.on_job is not None:
            self.on_job(job, replayed)
        return job, replayed

    def working_directory(self, cwd: str | None) -> Path:
        """The job's working directory: the workspace, or a folder inside it (never outside, via .. or a link)."""
        target = (self.workspace / (cwd or ".")).resolve()
        if target != self.workspace and self.workspace not in target.parents:
            raise JobRefused(f"cwd {cwd!r} is outside the workspace {self.workspace}; give a folder inside it")
        if not target.is_dir():
            raise JobRefused(f"cwd {cwd!r} is not a folder of the workspace {self.workspace}")
        return target

    def deadline(self, deadline_s: float | None) -> float:
        settings = self.settings
        if deadline_s is None:
            return settings.bash_default_deadline_s
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not deadline_s > 0:
            raise JobRefused(f"deadline_s must be a positive number of seconds, not {deadline_s!r}")
        if deadline_s > settings.bash_max_deadline_s:
            raise JobRefused(f"deadline_s={deadline_s:g} is over the limit of {settings.bash_max_deadline_s:g} s "
                             "(RLM_BASH_MAX_DEADLINE_S)", setting="bash_max_deadline_s")
        return float(deadline_s)

    def _wait_for_turn(self, job: Job) -> Job:
        """Wait for the workspace lease (a mutating job) or a read-only slot, at most ``bash_lease_wait_s``."""
        give_up = time.monotonic() + self.settings.bash_lease_wait_s
        pause = LEASE_POLL_FIRST_S
        try:
            while not self.store.try_start(job.id, max_read_only=self.settings.bash_max_read_only_jobs):
                if time.monotonic() >= give_up:
                    what = "a read-only slot" if job.read_only else f"the workspace lease (held by job {self.store.lease_holder(job.workspace)})"
                    message = (f"waited {self.settings.bash_lease_wait_s:g} s for {what}; try again later, or raise "
                               "RLM_BASH_LEASE_WAIT_S")
                    self.store.fail(job.id, message)
                    raise WorkspaceBusy(message, setting="bash_lease_wait_s")
                time.sleep(pause)
                pause = min(2 * pause, LEASE_POLL_MAX_S)
        except BaseException as exc:
            if not isinstance(exc, WorkspaceBusy):
                self.store.fail(job.id, f"refused before it started: {exc}")
            raise
        return self.store.job(job.id)

    def _execute(self, job: Job, where: Path) -> Job:
        settings = self.settings
        head = settings.bash_preview_bytes // 2
        paths = {name: Path(getattr(job, f"{name}_path")) for name in STREAMS}
        try:
            paths["stdout"].parent.mkdir(parents=True, exist_ok=True)
            files = {name: path.open("wb") for name, path in paths.items()}
        except OSError as exc:
            return self.store.fail(job.id, f"its output files cannot be written: {exc} (RLM_DATA_DIR)")
        captures = {name: _Capture(files[name], settings.bash_max_stored_bytes, head, settings.bash_preview_bytes - head)
                    for name in STREAMS}
        launch = self.host.launch(job.command, where, workspace=self.workspace, deadline_s=job.deadline_s)
        sinks: dict[str, _Capture | _Reported] = dict(captures)
        if launch.marker is not None:
            sinks["stderr"] = _Reported(captures["stderr"], launch.marker)
        try:
            try:
                process = subprocess.Popen(
                    launch.argv, cwd=launch.cwd, env=launch.env,
                    stdin=subprocess.DEVNULL if launch.request is None else subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                return self.store.fail(job.id, f"bash could not be started ({self.host.where}): {exc}")
            self.store.set_process(job.id, process.pid, procs.start_time(process.pid))
            readers = [threading.Thread(target=_pump, args=(getattr(process, name), sinks[name]), daemon=True,
                                        name=f"job-{job.id}-{name}") for name in STREAMS]
            if launch.request is not None:
                readers.append(threading.Thread(target=_tell, args=(process.stdin, launch.request), daemon=True,
                                                name=f"job-{job.id}-stdin"))
            for reader in readers:
                reader.start()
            stopped_by = _supervise(process, launch.supervise_s, settings.bash_kill_grace_s)
            if process.stdin is not None:
                _close(process.stdin)  # the job runner's stdin ends only now: before, its end is a cancel
            for reader in readers:
                reader.join(READER_JOIN_S)
            code, error = process.returncode, None
            if isinstance(reported := sinks["stderr"], _Reported):
                code, stopped_by, error = reported.ending(code, stopped_by)
        finally:
            for file in files.values():
                file.close()
        if code is None:
            return self.store.fail(job.id, f"bash could not be started ({self.host.where}): {error}")
        out, err = captures["stdout"], captures["stderr"]
        return self.store.finish(job.id, Ending(
            state="killed" if stopped_by else "exited", exit_code=code, stopped_by=stopped_by,
            stdout_bytes=out.total, stderr_bytes=err.total, stdout_stored=out.stored, stderr_stored=err.stored,
            stdout_preview=out.preview(), stderr_preview=err.preview(), error=error,
        ))

    # ---------- read by handle ----------

    def read(self, job_id: str, stream: str = "stdout", start: int = 0, size: int | None = None) -> str:
        """Bytes ``start`` to ``start + size`` of a job's stored stream, as text; at most ``bash_max_read_bytes``."""
        if stream not in STREAMS:
            raise JobRefused(f"stream must be 'stdout' or 'stderr', not {stream!r}")
        cap = self.settings.bash_max_read_bytes
        size = cap if size is None else int(size)
        start = int(start)
        if start < 0 or size < 0:
            raise JobRefused("start and size must be 0 or more")
        if size > cap:
            raise JobRefused(f"size={size:,} is over {cap:,} bytes per read (RLM_BASH_MAX_READ_BYTES); read in slices",
                             setting="bash_max_read_bytes")
        job = self.store.job(job_id)
        if job.root_id != self.root_id:
            raise JobRefused(f"job {job_id} belongs to another family")
        try:
            with open(getattr(job, f"{stream}_path"), "rb") as fh:
                fh.seek(start)
                return fh.read(size).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""


def _pump(pipe: BinaryIO, capture: _Capture | _Reported) -> None:
    try:
        while chunk := pipe.read1(READ_CHUNK_BYTES):  # type: ignore[attr-defined]
            capture.take(chunk)
    except (OSError, ValueError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _tell(pipe: BinaryIO, request: bytes) -> None:
    """The job runner's request; its stdin then stays open (its end would mean a cancel)."""
    try:
        pipe.write(request)
        pipe.flush()
    except (OSError, ValueError):
        pass  # it ended before it read: its exit status and stderr say why


def _close(pipe: BinaryIO) -> None:
    try:
        pipe.close()
    except OSError:
        pass


def _supervise(process: subprocess.Popen[bytes], deadline_s: float, grace_s: float) -> str | None:
    """Wait for the command; at its deadline stop its whole group. Its leftovers in the group never outlive it.

    The leader is waited for without being reaped (``WNOWAIT``): while it is a zombie its process group id
    cannot be reused, so the group signalled is certainly this job's.
    """
    ended = threading.Event()

    def wait_unreaped() -> None:
        try:
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        ended.set()

    threading.Thread(target=wait_unreaped, daemon=True, name=f"job-wait-{process.pid}").start()
    stopped_by = None
    if not ended.wait(deadline_s):
        stopped_by = "deadline"
        _signal_group(process.pid, signal.SIGTERM)
        ended.wait(grace_s)
    _signal_group(process.pid, signal.SIGKILL)  # what is left of the group: all of it at a deadline
    process.wait()
    return stopped_by


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
