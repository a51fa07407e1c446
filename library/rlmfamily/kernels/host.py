"""The ``host`` kernel: the user's own Python, in a child process, with guardrails.

GUARDRAILS, NOT A SECURITY BOUNDARY. The child is an ordinary Python process with
the user's permissions, filesystem and (unless ``env=`` is given) environment,
credentials included; model code in it can do anything the user can. Use the
``monty`` kernel for code you do not trust.

Owns ``HostKernel`` (the parent side). A separate process is what makes the limits
real: a step's time is enforced from outside (SIGINT first, so the namespace
survives; SIGKILL after ``interrupt_grace_s``, then a new child restored from the
last checkpoint), printed output is capped inside the child (the first
``max_output_bytes`` kept, so a huge print costs the tail, not the state), the
child's address space is limited (RLIMIT_AS), and a crash of the child costs one
step, not the session.

Host functions (the bridge) run here in the parent, which owns providers and
budgets: the child's proxies send a call over a pipe and wait for the answer; the
parent runs it with its own deadline (``host_call_timeout_s``), and time spent in
host calls does not count against the step's time.

After each successful step the child sends a checkpoint (the pickled values, the
source of top-level defs, imported modules by name); a restore reports the names
it could not bring back (``StepResult.lost_names``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Final

from rlmfamily.errors import KernelUnavailable
from rlmfamily.kernels._calls import HOST_CALL_TIMEOUT_MARK, HostCaller
from rlmfamily.kernels._host_child import ChannelClosed, FrameReader, FrameTimeout, encode_frame, write_all
from rlmfamily.kernels.base import Bridge, ErrorCode, KernelLimits, KernelNotStarted, StepResult, check_bridge_names, clip_text

CHILD_SCRIPT: Final = Path(__file__).with_name("_host_child.py")
SPAWN_TIMEOUT_S: Final = 30.0  # a child that is not ready by then will not be
EXIT_GRACE_S: Final = 1.0
STDERR_TAIL_BYTES: Final = 2000


class HostKernel:
    """The user's own Python in a child process. Use from one thread at a time."""

    name = "host"

    def __init__(
        self,
        limits: KernelLimits | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> None:
        self.limits = limits or KernelLimits()
        self._cwd = cwd
        self._python = python
        self._env = env
        self._bridge: Bridge = {}
        self._prelude = ""
        self._caller: HostCaller | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._to_child = -1
        self._reader: FrameReader | None = None
        self._stderr: IO[bytes] | None = None
        self._checkpoint: bytes | None = None
        self._child_pid: int | None = None  # as the child sees itself (the container kernel's is inside)
        self._step = 0
        # JSON escaping can grow text up to 6x (\u0000); the checkpoint payload travels raw.
        self._max_message_bytes = (
            self.limits.host_max_checkpoint_bytes + 6 * (self.limits.max_output_bytes + self.limits.max_error_bytes) + (1 << 20)
        )

    @property
    def pid(self) -> int | None:
        """The child's process id (None when not running)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, bridge: Bridge, prelude: str) -> None:
        check_bridge_names(bridge)
        self._bridge = dict(bridge)
        self._prelude = prelude
        self._caller = HostCaller(
            bridge, timeout_s=self.limits.host_call_timeout_s, max_abandoned=self.limits.max_abandoned_host_calls
        )
        self._spawn()

    def __enter__(self) -> HostKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ask the child to exit, then kill its process group; the child is reaped. Idempotent."""
        if self._proc is not None:
            try:
                write_all(self._to_child, encode_frame({"op": "exit"}))
                self._proc.wait(timeout=EXIT_GRACE_S)
            except (ChannelClosed, OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        if self._caller is not None:
            self._caller.close()
            self._caller = None

    # ---- one step --------------------------------------------------------------------------

    def execute(self, code: str) -> StepResult:
        if self._proc is None or self._reader is None or self._caller is None:
            raise KernelNotStarted("the host kernel is not started; call start() first")
        started = time.perf_counter()
        self._step += 1
        try:
            write_all(self._to_child, encode_frame({"op": "step", "step": self._step, "code": code}))
            return self._await_step(started)
        except (ChannelClosed, OSError) as exc:
            tail = self._stderr_tail()
            code, cause = self._death(exc)
            lost = self._restart()
            detail = f"; its stderr ends with: {tail}" if tail else ""
            return self._failed(code, f"{cause}{detail}; a new one was started from the last checkpoint", started, lost)

    def _await_step(self, started: float) -> StepResult:
        assert self._reader is not None and self._proc is not None and self._caller is not None
        deadline = time.monotonic() + self.limits.step_timeout_s
        interrupted = False
        calls = 0
        while True:
            try:
                header, payload = self._reader.read(deadline)
            except FrameTimeout:
                if not interrupted:
                    interrupted = True
                    self._interrupt()
                    deadline = time.monotonic() + self.limits.interrupt_grace_s
                    continue
                lost = self._restart()
                return self._failed(
                    "timeout",
                    f"the step exceeded step_timeout_s={self.limits.step_timeout_s:g} and ignored the interrupt for "
                    f"interrupt_grace_s={self.limits.interrupt_grace_s:g}; the process was killed and the namespace "
                    "restored from the last checkpoint",
                    started,
                    lost,
                )
            op = header.get("op")
            if op == "call":
                calls += 1
                began = time.monotonic()
                reply = self._answer(header, refuse_reason=self._refusal(interrupted, calls))
                write_all(self._to_child, encode_frame(reply))
                if not interrupted:
                    deadline += time.monotonic() - began  # host-call time is not step time
            elif op == "done":
                if header["ok"] and header.get("has_checkpoint"):
                    self._checkpoint = payload
                error_code: ErrorCode | None = header["error_code"]
                error = header["error"]
                if header.get("exc_type") == "TimeoutError" and HOST_CALL_TIMEOUT_MARK in (error or ""):
                    error_code = "host_call_timeout"
                if interrupted and not header["ok"]:
                    error_code = "timeout"
                    error = (
                        f"the step exceeded step_timeout_s={self.limits.step_timeout_s:g} and was interrupted; "
                        "the namespace keeps what the step did before the interrupt"
                    )
                return StepResult(
                    ok=bool(header["ok"]),
                    stdout=header["stdout"],
                    stdout_truncated=bool(header["stdout_truncated"]),
                    stdout_bytes=int(header["stdout_bytes"]),
                    error_code=error_code,
                    error=None if error is None else clip_text(error, self.limits.max_error_bytes),
                    duration_s=time.perf_counter() - started,
                    restored_from_checkpoint=False,
                )
            else:
                raise ChannelClosed(f"unexpected frame {op!r} from the kernel process")

    def _death(self, exc: BaseException) -> tuple[ErrorCode, str]:
        """Why the child's channel closed mid-step: the error code and the sentence the model reads."""
        return "killed", f"the kernel process died during the step ({exc})"

    def _refusal(self, interrupted: bool, calls: int) -> str | None:
        if interrupted:
            return "the step was interrupted (step_timeout_s); host calls are refused"
        if calls > self.limits.max_suspensions_per_step:
            return f"the step made more than max_suspensions_per_step={self.limits.max_suspensions_per_step} host calls"
        return None

    def _answer(self, header: dict[str, Any], *, refuse_reason: str | None) -> dict[str, Any]:
        assert self._caller is not None
        call_id = header.get("id")
        if refuse_reason is not None:
            return {"op": "result", "id": call_id, "ok": False, "exc_type": "RuntimeError", "message": refuse_reason}
        name = str(header.get("name"))
        args = header.get("args") or []
        kwargs = header.get("kwargs") or {}
        outcome = self._caller.call(name, tuple(args), dict(kwargs))
        if outcome.ok:
            return {"op": "result", "id": call_id, "ok": True, "value": outcome.value}
        return {"op": "result", "id": call_id, "ok": False, "exc_type": outcome.exc_type, "message": outcome.message}

    def _failed(self, code: ErrorCode, message: str, started: float, lost: list[str]) -> StepResult:
        if lost:
            message += f"; names that could not be restored: {', '.join(lost)}"
        return StepResult(
            ok=False,
            stdout="",
            stdout_truncated=False,
            stdout_bytes=0,
            error_code=code,
            error=clip_text(message, self.limits.max_error_bytes),
            duration_s=time.perf_counter() - started,
            restored_from_checkpoint=True,
            lost_names=tuple(lost),
        )

    # ---- the child process -----------------------------------------------------------------

    def _spawn(self) -> None:
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        self._stderr = tempfile.TemporaryFile(prefix="rlm-host-kernel-")
        try:
            self._proc = self._launch(child_in, child_out, self._stderr)
        except OSError as exc:
            for fd in (child_in, parent_out, parent_in, child_out):
                os.close(fd)
            raise KernelUnavailable(f"could not start the {self.name} kernel's process: {exc}") from None
        os.close(child_in)
        os.close(child_out)
        self._to_child = parent_out
        self._reader = FrameReader(parent_in, max_frame_bytes=self._max_message_bytes)
        try:
            write_all(
                self._to_child,
                encode_frame(
                    {
                        "op": "init",
                        "bridge": list(self._bridge),
                        "prelude": self._prelude,
                        "max_output_bytes": self.limits.max_output_bytes,
                        "max_error_bytes": self.limits.max_error_bytes,
                        "max_checkpoint_bytes": self.limits.host_max_checkpoint_bytes,
                        "max_message_bytes": self._max_message_bytes,
                        "max_address_space_bytes": self.limits.host_max_address_space_bytes,
                    }
                ),
            )
            header, _ = self._reader.read(time.monotonic() + SPAWN_TIMEOUT_S)
            if header.get("op") != "ready":
                raise ChannelClosed(f"unexpected first frame {header.get('op')!r}")
            self._child_pid = int(header["pid"])
        except (ChannelClosed, FrameTimeout, OSError) as exc:
            tail = self._stderr_tail()
            self._kill()
            raise KernelUnavailable(
                f"the {self.name} kernel's process did not start ({type(exc).__name__}: {exc}); "
                f"stderr: {tail or '(empty)'}"
            ) from None

    def _launch(self, child_in: int, child_out: int, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start the child process with the channel's two pipe ends (the container kernel starts it elsewhere)."""
        return subprocess.Popen(
            [self._python, str(CHILD_SCRIPT), str(child_in), str(child_out), str(os.getpid())],  # dies with us
            pass_fds=(child_in, child_out),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=self._cwd,
            env=self._env,
            start_new_session=True,  # its own process group: a terminal's Ctrl-C is ours, not the child's
        )

    def _interrupt(self) -> None:
        """SIGINT to the child: the step's code gets KeyboardInterrupt, the namespace stays."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGINT)

    def _restart(self) -> list[str]:
        """Kill the child, start a new one and restore the last checkpoint; the names it lost."""
        self._kill()
        self._spawn()
        if self._checkpoint is None:
            return []
        assert self._reader is not None
        try:
            write_all(self._to_child, encode_frame({"op": "restore"}, self._checkpoint))
            header, _ = self._reader.read(time.monotonic() + SPAWN_TIMEOUT_S)
        except (ChannelClosed, FrameTimeout, OSError) as exc:
            self._kill()
            raise KernelUnavailable(f"the host kernel could not restore its checkpoint: {exc}") from None
        return list(header.get("lost", []))

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        for fd in (self._to_child, self._reader.fd if self._reader is not None else -1):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_child = -1
        self._reader = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - STDERR_TAIL_BYTES))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""
