"""Running a role of the service as a process of its own: the one owner of start, wait-until-ready and stop.

A ``Role`` is one process: its argv, its environment (built by the caller from the settings object), where its
output goes, how it says it is ready (``Ready``: an HTTP path answering 200, a byte on a pipe it is handed, a
line it prints) and how long it may take to stop (SIGTERM, then SIGKILL); ``stop`` stops a group at once.
`specialists serve` (its worker,
dispatcher and console), the local drill topology (ops/drill/topology.py), the benchmarks and the test
harnesses all start their processes here.

A start-up deadline waits on progress, not on a wall clock (``StartClock``): a role still using CPU time (itself
and its descendants, from /proc: a worker's forkserver imports too) or still writing its log is starting, slowly
on a loaded machine; one that does neither for ``StartBounds.stall_s`` is stuck, and is reported with the end of
its log. ``StartBounds.max_s`` bounds a start that makes progress for ever. The service's bounds are
SPECIALISTS_SERVE_CHILD_START_TIMEOUT_S and SPECIALISTS_SERVE_CHILD_START_MAX_S (``StartBounds.from_settings``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from core.errors import ServiceError
from core.settings import PROJECT_ROOT, Settings

POLL_S = 0.05  # between two looks at a role that announces nothing (an HTTP port, a log)
LOG_TAIL_LINES = 20  # of a role's log, in the report of a role that failed to start
OPS_CLI = [sys.executable, "-m", "ops.cli"]  # `specialists <command>` as this interpreter runs it


class RoleFailed(ServiceError):
    """A role exited while starting, or stopped making progress before it was ready."""

    code = "role_failed"

    def __init__(self, message: str, *, role: Role | None = None) -> None:
        super().__init__(message)
        self.role = role


@dataclass(frozen=True)
class StartBounds:
    """How long a role may take to be ready: ``stall_s`` without progress, ``max_s`` at all."""

    stall_s: float = 30.0
    max_s: float = 600.0

    def __post_init__(self) -> None:
        assert self.stall_s > 0 and self.max_s > 0, self

    @classmethod
    def from_settings(cls, settings: Settings) -> StartBounds:
        return cls(stall_s=settings.serve.child_start_timeout_s, max_s=settings.serve.child_start_max_s)

    def setting_names(self, stalled: bool) -> str:
        return "SPECIALISTS_SERVE_CHILD_START_TIMEOUT_S" if stalled else "SPECIALISTS_SERVE_CHILD_START_MAX_S"


def cpu_ticks(pid: int) -> int | None:
    """CPU time (clock ticks) used so far by ``pid`` and its descendants, from /proc; None where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)'s stat
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            ticks += sum(cpu_ticks(int(child)) or 0 for child in task.read_text().split())
        except OSError:
            continue
    return ticks


class StartClock:
    """Whether a starting role may still start: while it makes progress (CPU time, or its log grows), up to
    ``bounds.max_s``; ``bounds.stall_s`` without progress and it has failed to start."""

    def __init__(self, pid: int, bounds: StartBounds, log_path: Path | None = None) -> None:
        self.pid, self.bounds, self.log_path = pid, bounds, log_path
        self.started = self.progressed = time.monotonic()
        self.mark = self._mark()

    def _mark(self) -> tuple[int | None, int]:
        size = 0
        if self.log_path is not None:
            try:
                size = self.log_path.stat().st_size
            except OSError:
                pass
        return cpu_ticks(self.pid), size

    def expired(self) -> str | None:
        """None while the role may still start; else how it failed, naming the setting to change."""
        now = time.monotonic()
        mark = self._mark()
        if mark != self.mark:
            self.mark, self.progressed = mark, now
        if now - self.started > self.bounds.max_s:
            return f"within {self.bounds.max_s:g} s ({self.bounds.setting_names(stalled=False)})"
        if now - self.progressed > self.bounds.stall_s:
            if mark[0] is None:
                return f"within {self.bounds.stall_s:g} s ({self.bounds.setting_names(stalled=True)})"
            return (f"and made no progress (no CPU time, no log) for {self.bounds.stall_s:g} s "
                    f"({self.bounds.setting_names(stalled=True)})")
        return None


# --- how a role says it is ready ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """How a role says it is ready. ``kind``: ``http`` (``value`` is a URL answering 200), ``listening`` (any HTTP
    answer at ``value``: a server with no health path), ``pipe`` (the role is
    handed a pipe's write end in place of ``{ready_fd}`` in its argv and writes a byte once ready), ``line``
    (it prints a line starting with ``value`` on its stdout, which is then a pipe), or ``none`` (ready once
    started)."""

    kind: Literal["http", "listening", "pipe", "line", "none"]
    value: str = ""

    @classmethod
    def http(cls, url: str) -> Ready:
        return cls("http", url)

    @classmethod
    def listening(cls, url: str) -> Ready:
        return cls("listening", url)

    @classmethod
    def pipe(cls) -> Ready:
        return cls("pipe")

    @classmethod
    def line(cls, prefix: str) -> Ready:
        return cls("line", prefix)


READY_FD = "{ready_fd}"  # in a role's argv: the descriptor of its ready pipe (Ready.pipe)


@dataclass
class Role:
    """One process of the service, restartable with the same argv and environment (see the module doc).

    ``log_path`` None: its output goes where this process's does (serve's children print to serve's terminal).
    """

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    ready: Ready = Ready("none")
    log_path: Path | None = None
    bounds: StartBounds = StartBounds()  # how long it may take to be ready (``wait_ready``)
    stop_grace_s: float = 15.0
    stop_signal: int = signal.SIGTERM
    cwd: Path = PROJECT_ROOT
    new_session: bool = False  # its own process group: a Ctrl-C at this terminal is not its to handle
    preexec: Callable[[], None] | None = None
    popen: subprocess.Popen | None = None
    starts: int = 0
    ready_line: str = ""  # the line a Ready.line role printed
    _ready_read: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode if self.popen else None

    def start(self) -> Role:
        """Start the process (not waiting for it: ``wait_ready``)."""
        self.starts += 1
        argv, pass_fds, write_end = list(self.argv), (), None
        if self.ready.kind == "pipe":
            self._ready_read, write_end = os.pipe()
            argv = [str(write_end) if part == READY_FD else part for part in argv]
            pass_fds = (write_end,)
        out: IO[bytes] | int | None = None
        if self.log_path is not None:
            with self.log_path.open("ab") as log:
                log.write(f"--- {self.name}: start {self.starts} ---\n".encode())
            out = self.log_path.open("ab")
        try:
            self.popen = subprocess.Popen(
                argv, cwd=self.cwd, env=dict(self.env), pass_fds=pass_fds, preexec_fn=self.preexec,
                start_new_session=self.new_session,
                stdout=subprocess.PIPE if self.ready.kind == "line" else out,
                stderr=subprocess.STDOUT if out is not None and self.ready.kind != "line" else out,
                text=self.ready.kind == "line" or None,
            )
        finally:
            if write_end is not None:
                os.close(write_end)
            if out is not None:
                out.close()
        return self

    def wait_ready(self, bounds: StartBounds | None = None, stop_waiting: Callable[[], bool] = lambda: False) -> None:
        """Until the role says it is ready; RoleFailed if it exits or stops making progress first (with the end of
        its log). Returns early, not ready, once ``stop_waiting()`` (serve's Ctrl-C)."""
        assert self.popen is not None, f"start {self.name} first"
        clock = StartClock(self.popen.pid, bounds or self.bounds, self.log_path)
        try:
            while not stop_waiting():
                if self._is_ready():
                    return
                if self.popen.poll() is not None:
                    raise RoleFailed(f"the {self.name} exited with status {self.popen.returncode} while starting"
                                     f"{self._log_note()}", role=self)
                expired = clock.expired()
                if expired:
                    raise RoleFailed(f"the {self.name} was not ready {expired}{self._log_note()}", role=self)
        finally:
            self._close_ready_pipe()

    def _is_ready(self) -> bool:
        """One look; waits up to POLL_S for a role that announces (a pipe, a line), sleeps POLL_S otherwise."""
        assert self.popen is not None
        kind = self.ready.kind
        if kind == "none":
            return True
        if kind == "pipe":
            assert self._ready_read is not None
            readable, _, _ = select.select([self._ready_read], [], [], POLL_S)
            if readable and os.read(self._ready_read, 1):
                self._close_ready_pipe()
                return True
            if readable:  # closed without a byte: it ended before it was ready; its exit is reported next
                self.popen.wait()
            return False
        if kind == "line":
            assert self.popen.stdout is not None
            readable, _, _ = select.select([self.popen.stdout], [], [], POLL_S)
            if readable:
                line = self.popen.stdout.readline()
                if line.startswith(self.ready.value):
                    self.ready_line = line.strip()
                    return True
                if not line:
                    self.popen.wait()
            return False
        import httpx  # the web client loads only for a role that is asked over HTTP

        try:
            if httpx.get(self.ready.value, timeout=2).status_code == 200 or kind == "listening":
                return True
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)  # a port of another process, which nothing announces
        return False

    def _close_ready_pipe(self) -> None:
        if self._ready_read is not None:
            os.close(self._ready_read)
            self._ready_read = None

    def run(self, bounds: StartBounds | None = None) -> Role:
        """Start it and wait until it is ready; stopped again if it fails to start."""
        self.start()
        try:
            self.wait_ready(bounds)
        except BaseException:
            self.stop()
            raise
        return self

    def signal(self, signum: int) -> None:
        if self.alive:
            assert self.popen is not None
            os.kill(self.popen.pid, signum)

    def kill(self) -> None:
        """SIGKILL to the role's process (to its group too when it is stopped as a group, with SIGINT as Ctrl-C):
        no handler runs, nothing is flushed or finished."""
        if self.alive:
            assert self.popen is not None
            if self._stopped_as_group:
                os.killpg(self.popen.pid, signal.SIGKILL)
            else:
                self.popen.kill()
        self._reap(self.stop_grace_s)

    @property
    def _stopped_as_group(self) -> bool:
        return self.new_session and self.stop_signal == signal.SIGINT

    def stop(self, grace_s: float | None = None) -> None:
        """``stop_signal`` (SIGTERM, as Cloud Run stops an instance), then SIGKILL after ``grace_s``."""
        stop([self], grace_s)

    def _reap(self, timeout_s: float) -> None:
        if self.popen is not None:
            self.popen.wait(timeout_s)
            if self.popen.stdout is not None:
                self.popen.stdout.close()
        self._close_ready_pipe()

    def log_text(self) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _log_note(self) -> str:
        if self.log_path is None:
            return " (see its log above)"
        return f"; its log: {self.log_path}\n{self.log_tail()}"


def stop(roles: Iterable[Role], grace_s: float | None = None, on_kill: Callable[[Role], None] = lambda role: None) -> None:
    """Every role asked at once (each drains on its own), then each waited for until one shared deadline (each
    role's ``stop_grace_s``, or ``grace_s``), and SIGKILLed past it (``on_kill`` is told first)."""
    asked = [role for role in roles if role.popen is not None]
    for role in asked:
        if role.alive:
            assert role.popen is not None
            if role._stopped_as_group:  # as Ctrl-C: to the whole group
                os.killpg(role.popen.pid, signal.SIGINT)
            else:
                role.popen.send_signal(role.stop_signal)
    started = time.monotonic()
    for role in asked:
        assert role.popen is not None
        deadline = started + (role.stop_grace_s if grace_s is None else grace_s)
        try:
            role.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            on_kill(role)
            role.kill()
        role._reap(role.stop_grace_s)


def ops_cli(*command: str) -> list[str]:
    """The argv of `specialists <command>` run by this interpreter."""
    return [*OPS_CLI, *command]


__all__ = ["READY_FD", "Ready", "Role", "RoleFailed", "StartBounds", "StartClock", "cpu_ticks", "ops_cli", "stop"]
