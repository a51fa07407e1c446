"""The operator command's sections of the settings: `specialists serve` (``settings.serve``) and the drills
(``settings.drill``).

Part of the one ``Settings`` object (core/settings.py); this module imports only core/settings_base.py.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from core.settings_base import Section

class ServeSettings(Section):
    """`specialists serve`: the one command that runs the whole service on one machine."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_SERVE_")

    worker: bool = Field(default=True, description="`specialists serve` also starts a worker (a child process).")
    dispatcher: bool = Field(default=True, description="`specialists serve` also starts a dispatcher (a child process).")
    console: bool | None = Field(
        default=None, description="`specialists serve` also starts the operator console (a child process), at the "
        "URL it prints (SPECIALISTS_CONSOLE_HOST, SPECIALISTS_CONSOLE_PORT). Unset: only on one machine (the "
        "embedded database); in production the console is a service of its own (`specialists console`).",
    )
    child_start_timeout_s: float = Field(
        default=30.0, gt=0, le=600,
        description="How long any role started as a process (ops/topology.py: `specialists serve`'s worker, "
        "dispatcher and console, a drill's roles) may start without progress: not ready yet, using no CPU time "
        "(itself and its processes, from /proc) and not writing to its log; where there is no /proc, how long it "
        "may take at all. A loaded machine's slow start, its CPU time or its growing log, is progress.",
    )
    child_start_max_s: float = Field(
        default=600.0, gt=0, le=3600,
        description="The longest any role started as a process (`specialists serve`'s children, a drill's roles; "
        "ops/topology.py) may take to start, progress or not.",
    )
    child_stop_margin_s: float = Field(
        default=5.0, gt=0, le=300,
        description="After its drain (SPECIALISTS_WORKER_DRAIN_S), how long a child of `specialists serve` may take "
        "to exit once asked before it is killed.",
    )


class DrillSettings(Section):
    """Drills (`specialists drill`, docs/OPERATIONS.md): the hooks that restart and roll a deployment."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_DRILL_")

    restart_api_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that restarts the API instances (say, a new revision "
        "with the same image) while a drill task runs; DRILL_API_URL names the instance. Unset: skipped.",
    )
    roll_api_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that rolls the API to a new revision mid-task. Unset: skipped.",
    )
    restart_worker_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that restarts the workers gracefully while DRILL_JOB_ID "
        "runs. Unset: skipped.",
    )
    kill_worker_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that kills the worker running DRILL_JOB_ID without "
        "warning (the retained unknown scenario). Unset: skipped.",
    )
    hook_timeout_s: float = Field(
        default=600.0, ge=1.0, le=3600.0, description="How long a drill hook may run, and the API then take to be ready."
    )
    slack_s: float = Field(
        default=2.0,
        ge=0.0,
        le=120.0,
        description="Time a drill allows above a stated bound (cancel, unknown, revocation) for network and "
        "load before it calls the bound broken.",
    )
    credits: int = Field(default=200, ge=20, le=100_000, description="Credits granted to each customer a drill creates.")
    keep_local_runs: int = Field(
        default=5, ge=1, le=1000,
        description="`drill --local` without --logs: the newest runs' folders (logs, data) kept in the temporary "
        "folder; a new run removes older ones, never one still running.",
    )
