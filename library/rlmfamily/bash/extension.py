"""The python-bash profile as a session extension: ``bash`` in the namespace and the ``bash`` model tool.

Both surfaces call one ``CommandBroker``; a run of the default ``python`` profile
gets nothing from this extension (no names, no note, no tool). A job's request id
is the caller's, else derived from where the call stands: for ``bash.run`` in a
root run, its step and host-call position in the journal (so the step that runs
again after ``rlm resume`` asks for the same job and runs nothing), for the tool
its turn and tool-call id. Every answered request leaves a ``job`` event in the
trajectory (``rlm show`` prints the receipt) and the receipt in the history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlmfamily.bash import in_container
from rlmfamily.bash.broker import CommandBroker
from rlmfamily.bash.errors import BashUnavailable, JobRefused
from rlmfamily.bash.host import Launcher, prepare
from rlmfamily.bash.store import Job, JobStore
from rlmfamily.errors import RLMError
from rlmfamily.journal import current_call

if TYPE_CHECKING:
    from rlmfamily.context import Context
    from rlmfamily.extensions import RunInfo
    from rlmfamily.providers.base import ToolCall
    from rlmfamily.settings import RLMSettings

PROFILE = "python-bash"
MAX_LISTED_JOBS = 50  # of bash.jobs()

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run one Bash command in the workspace, as a fresh process. Files you change persist; shell variables, "
            "`cd` and background processes do not outlive the command. You get a receipt: exit status, byte counts "
            "and a preview of stdout and stderr; read more with bash.read(job_id, 'stdout', start, size) in python."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "Bash source to run"},
                "cwd": {"type": "string", "description": "a folder inside the workspace (default: its root)"},
                "read_only": {"type": "boolean", "description": "true if the command changes no file (trusted, "
                              "not enforced: read-only commands may run alongside others)"},
                "deadline_s": {"type": "number", "description": "seconds before the command is killed"},
            },
            "required": ["command"],
        },
    },
}

BASH_PRELUDE = r'''
class _BashJob:
    def __init__(self, d):
        self._rlm_kind = "bash_job"
        self.id = d["id"]
        self.command = d["command"]
        self.cwd = d["cwd"]
        self.state = d["state"]
        self.exit_code = d["exit_code"]
        self.ok = d["ok"]
        self.stdout_bytes = d["stdout_bytes"]
        self.stderr_bytes = d["stderr_bytes"]
        self.stdout_preview = d["stdout_preview"]
        self.stderr_preview = d["stderr_preview"]
        self.receipt = d["receipt"]

    def read(self, stream="stdout", start=0, size=None):
        return _bash_read(self.id, stream, start, size)

    def stdout(self, start=0, size=None):
        return _bash_read(self.id, "stdout", start, size)

    def stderr(self, start=0, size=None):
        return _bash_read(self.id, "stderr", start, size)

    def __repr__(self):
        return self.receipt

    def __str__(self):
        return self.receipt


class _Bash:
    def __init__(self):
        self._rlm_kind = "bash"

    def run(self, command, cwd=None, read_only=False, deadline_s=None, request_id=None):
        return _BashJob(_bash_run(command, cwd, read_only, deadline_s, request_id))

    def job(self, job_id):
        if getattr(job_id, "_rlm_kind", None) == "bash_job":
            job_id = job_id.id
        return _BashJob(_bash_job(job_id))

    def read(self, job_id, stream="stdout", start=0, size=None):
        if getattr(job_id, "_rlm_kind", None) == "bash_job":
            job_id = job_id.id
        return _bash_read(job_id, stream, start, size)

    def jobs(self):
        return _bash_jobs()

    def release(self, job_id, reason):
        if getattr(job_id, "_rlm_kind", None) == "bash_job":
            job_id = job_id.id
        return _BashJob(_bash_release(job_id, reason))

    def __repr__(self):
        return "<bash: run(command, cwd=None, read_only=False, deadline_s=None, request_id=None), job(id), read(id, stream, start, size), jobs(), release(id, reason)>"


bash = _Bash()
'''

PROMPT_NOTE = """

Bash is on (the python-bash profile). `r = bash.run(command, cwd=None, read_only=False, deadline_s=None,
request_id=None)` runs one command in the workspace {workspace} as a fresh process and returns its receipt
(`print(r)`: exit status, byte counts, a preview of stdout and stderr; `r.ok`, `r.exit_code`, `r.stdout(start,
size)`, `r.stderr(...)`, `bash.read(job_id, stream, start, size)` read more by handle; `bash.jobs()` lists jobs).
Files persist between commands; shell variables and `cd` do not (pass `cwd`). Mutating commands run one at a
time across the family; pass read_only=True for a command that changes nothing (trusted, not checked) to run it
alongside others. A job whose run was interrupted is `unknown` and holds the workspace until its effects are
checked: `bash.release(job_id, reason)` once you have (say what you checked). Deadline per command: {deadline:g} s by default, at most {max_deadline:g} s. `context` is the
corpus as it was when the run started: read files you changed with bash.{tool}"""
TOOL_NOTE = " The `bash` tool runs a command the same way and gives you its receipt."


@dataclass(frozen=True)
class ToolResult:
    """What a model tool call produced: the whole output, its compact receipt, and fields for the trajectory."""

    ok: bool
    full: str
    receipt: str
    record: dict[str, Any]


@dataclass(frozen=True)
class ModelTool:
    schema: dict[str, Any]
    run: Callable[[ToolCall, int], ToolResult]


def clipped(preview: str, max_chars: int | None) -> str:
    """A stream's preview within ``max_chars``: its head and tail (the receipts strategy's shorter preview)."""
    if max_chars is None or len(preview) <= max_chars:
        return preview
    head = max_chars // 2
    return f"{preview[:head]}\n[...]\n{preview[len(preview) - (max_chars - head):]}"


def receipt_text(job: Job, *, replayed: bool = False, preview_chars: int | None = None) -> str:
    """A job's receipt as the model sees it, on both surfaces: what ran, how it ended, previews, handles.

    ``preview_chars`` clips each stream's preview further (RLM_RECEIPT_PREVIEW_CHARS under the receipts strategy).
    """
    if job.state == "exited":
        how = f"exit {job.exit_code}"
    elif job.state == "killed":
        how = f"killed at its {job.deadline_s:g} s {job.stopped_by or 'deadline'} (its whole process group)"
    elif job.state == "unknown":
        how = "outcome UNKNOWN: its run ended while it ran" + (
            f"; released: {job.release_reason}" if job.released_at else "; it holds the workspace lease until "
            f"someone checks its effects and releases it: `rlm jobs release {job.id} --reason ...` or "
            f"bash.release({job.id!r}, reason)")
    else:
        how = f"{job.state}" + (f": {job.error}" if job.error else "")
    took = f" after {job.duration_s:.2f} s" if job.duration_s is not None else ""
    lines = [(f"[job {job.id} {how}{took}; cwd {job.cwd}{'; read-only' if job.read_only else ''}"
             f"{'; replayed request, nothing ran again' if replayed else ''}]"), f"$ {job.command}"]
    for stream in ("stdout", "stderr"):
        total, stored = getattr(job, f"{stream}_bytes"), getattr(job, f"{stream}_stored")
        preview = getattr(job, f"{stream}_preview")
        if not total:
            lines.append(f"{stream}: (empty)")
            continue
        kept = "" if stored == total else f", {stored:,} kept (RLM_BASH_MAX_STORED_BYTES)"
        lines.append(f"{stream} ({total:,} bytes{kept}):")
        shown = clipped(preview, preview_chars)
        lines.append(shown.rstrip("\n"))
        if len(shown.encode()) < total:
            lines.append(f"[read more: bash.read({job.id!r}, {stream!r}, start, size)]")
    return "\n".join(lines)


def receipt(job: Job, *, replayed: bool = False) -> dict[str, Any]:
    """What the sandbox gets for a job: its fields and the receipt text. JSON-like, no secrets."""
    return {
        "id": job.id, "command": job.command, "cwd": job.cwd, "state": job.state, "exit_code": job.exit_code,
        "ok": job.state == "exited" and job.exit_code == 0, "stdout_bytes": job.stdout_bytes,
        "stderr_bytes": job.stderr_bytes, "stdout_preview": job.stdout_preview, "stderr_preview": job.stderr_preview,
        "read_only": job.read_only, "replayed": replayed, "receipt": receipt_text(job, replayed=replayed),
    }


def workspace_of(settings: RLMSettings, context: Context, *, needed_by: str = "the python-bash profile",
                 fallback: Path | None = None) -> Path:
    """Where a run's commands run: RLM_BASH_WORKSPACE, else the run's repository, else ``fallback`` if given."""
    if settings.bash_workspace is not None:
        return settings.bash_workspace
    if context.source == "repository" and context.root:
        return Path(context.root)
    if fallback is not None:
        return fallback
    raise BashUnavailable(f"{needed_by} needs a workspace: run over a repository (--repo) or set "
                          "RLM_BASH_WORKSPACE", setting="bash_workspace")


def command_broker(info: RunInfo, *, settings: RLMSettings | None = None,
                   on_job: Callable[[Job, bool], None] | None = None) -> CommandBroker:
    """The run's command broker, over its workspace: the one place a run builds one (the bash extension's, and
    the completion gates' with their own ``settings``: rlmfamily/gates)."""
    from rlmfamily.a2a.run import secret_env_names

    settings = settings or info.settings
    workspace = workspace_of(info.settings, info.context)
    hidden = secret_env_names(settings)
    container = info.environment
    # A run of the container kernel has its container: its jobs run there, never on this machine.
    host: Launcher = (prepare(settings, hidden) if container is None
                      else in_container.prepare(settings, hidden, container, workspace=workspace))
    return CommandBroker(settings, host, JobStore(settings.jobs_path, output_dir=settings.runs_dir),
                         workspace=workspace, root_id=info.root_id,
                         agent_id=info.agent_id, run_id=info.run_id, on_job=on_job)


class BashExtension:
    """One agent's command broker for one run (inert unless RLM_PROFILE=python-bash)."""

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self.settings = settings = info.settings
        self.active = settings.profile == PROFILE
        self.prelude = BASH_PRELUDE if self.active else ""
        self.notes = ""
        self.model_tools: dict[str, ModelTool] = {}
        self.jobs_answered = 0
        if not self.active:
            return
        self.broker = command_broker(info, on_job=self._record)
        self.notes = PROMPT_NOTE.format(workspace=self.broker.host.seen_as(self.broker.workspace),
                                        deadline=settings.bash_default_deadline_s,
                                        max_deadline=settings.bash_max_deadline_s,
                                        tool=TOOL_NOTE if settings.bash_tool else "")
        offered = settings.bash_tool and settings.protocol != "text"  # no tools are sent in text
        self.notes = self.notes.replace(TOOL_NOTE, "") if not offered else self.notes
        if offered:
            self.model_tools["bash"] = ModelTool(BASH_TOOL, self._tool)

    def functions(self) -> dict[str, Callable[..., Any]]:
        if not self.active:
            return {}
        return {"_bash_run": self._bash_run, "_bash_read": self._bash_read, "_bash_job": self._bash_job,
                "_bash_jobs": self._bash_jobs, "_bash_release": self._bash_release}

    # ---------- the namespace ----------

    def _bash_run(self, command: str, cwd: str | None = None, read_only: bool = False,
                  deadline_s: float | None = None, request_id: str | None = None) -> dict[str, Any]:
        if request_id is None and (position := current_call()) is not None:
            request_id = f"{self.info.run_id}:step{position[0]}:call{position[1]}"
        job, replayed = self.broker.run(command, cwd=cwd, read_only=bool(read_only), deadline_s=deadline_s,
                                        request_id=None if request_id is None else str(request_id), surface="python")
        return receipt(job, replayed=replayed)

    def _bash_read(self, job_id: str, stream: str = "stdout", start: int = 0, size: int | None = None) -> str:
        return self.broker.read(str(job_id), str(stream), start, size)

    def _bash_job(self, job_id: str) -> dict[str, Any]:
        job = self.broker.store.job(str(job_id))
        if job.root_id != self.info.root_id:
            raise JobRefused(f"job {job_id} belongs to another family")
        return receipt(job)

    def _bash_release(self, job_id: str, reason: str) -> dict[str, Any]:
        """The model checked an unknown job of its family: the lease goes back, the reason is kept."""
        job = self.broker.store.job(str(job_id))
        if job.root_id != self.info.root_id:
            raise JobRefused(f"job {job.id} belongs to another family; a person releases it: "
                             f"rlm jobs release {job.id} --reason TEXT")
        released = self.broker.store.release(job.id, str(reason))
        self.info.trajectory.write("job_released", turn=self.info.current_turn(), job_id=released.id,
                                   reason=released.release_reason)
        return receipt(released)

    def _bash_jobs(self) -> list[dict[str, Any]]:
        return [{"id": j.id, "state": j.state, "exit_code": j.exit_code, "command": j.command[:200], "cwd": j.cwd,
                 "agent_id": j.agent_id, "read_only": j.read_only}
                for j in self.broker.store.jobs(self.info.root_id, limit=MAX_LISTED_JOBS)]

    # ---------- the tool ----------

    def _tool(self, call: ToolCall, turn: int) -> ToolResult:
        args = call.arguments or {}
        try:
            job, replayed = self.broker.run(
                call.code, cwd=args.get("cwd"), read_only=bool(args.get("read_only", False)),
                deadline_s=args.get("deadline_s"), request_id=f"{self.info.run_id}:turn{turn}:{call.id}",
                surface="tool")
        except RLMError as exc:
            text = f"[error: {exc.code}: {exc.message}]"
            return ToolResult(False, text, text, {"error_code": exc.code})
        text = receipt_text(job, replayed=replayed, preview_chars=self.settings.receipt_preview_chars)
        full = self._whole(job, text)
        return ToolResult(job.state == "exited" and job.exit_code == 0, full, text,
                          {"job_id": job.id, "job_state": job.state, "exit_code": job.exit_code})

    def _whole(self, job: Job, receipt_shown: str) -> str:
        """The output the transcript strategy shows: the receipt's first two lines (how it ended, the command),
        then stdout and stderr whole, up to ``bash_max_read_bytes`` each (past that, the receipt's preview)."""
        cap = self.settings.bash_max_read_bytes
        parts = receipt_shown.splitlines()[:2]
        for stream in ("stdout", "stderr"):
            total = getattr(job, f"{stream}_bytes")
            if total:
                text = (self.broker.read(job.id, stream, 0, total) if total <= cap
                        else getattr(job, f"{stream}_preview"))
                parts.append(f"{stream}:\n{text}")
        return "\n".join(parts)

    # ---------- the record ----------

    def _record(self, job: Job, replayed: bool) -> None:
        self.jobs_answered += 1
        text = receipt_text(job, replayed=replayed)
        history_id = self.info.history.add("job", text, turn=self.info.current_turn(), title=f"job {job.id}: "
                                           + job.command.splitlines()[0][:60] if job.command else f"job {job.id}")
        self.info.trajectory.write(
            "job", turn=self.info.current_turn(), job_id=job.id, surface=job.surface, command=job.command,
            cwd=job.cwd, read_only=job.read_only, state=job.state, exit_code=job.exit_code, stopped_by=job.stopped_by,
            duration_s=job.duration_s, stdout_bytes=job.stdout_bytes, stderr_bytes=job.stderr_bytes,
            stdout_preview=job.stdout_preview, stderr_preview=job.stderr_preview, replayed=replayed,
            history_id=history_id, receipt=text)
        self.info.emit({"event": "job", "job_id": job.id, "state": job.state})

    def finish(self) -> None:
        return None

    def record(self) -> dict[str, Any]:
        return {"jobs": self.jobs_answered} if self.active else {}

    def close(self) -> None:
        return None
