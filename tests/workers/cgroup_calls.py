"""A job's process's calls on cgroups, counted (issue 44; tests/workers/test_cpu_share.py).

``counted_job_process`` is a job's process's body (``workers.isolation._job_process``) run with the calls a job's
CPU share makes wrapped: ``cpu_share._write`` (a control file, ``cgroup.procs`` among them), ``os.mkdir``,
``os.rmdir`` and ``os.scandir`` (making, removing and sweeping groups) and ``cpu_share.descendants`` (the count's
scan of /proc). A test sets it in place of the body before its worker registers with the fork server (which imports
this module by name as it unpickles the registration); each job's process then writes what it called, as its body
returns and before it exits, to a file named by its pid. Counted in the process itself, never timed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from workers import cpu_share, isolation

CALLS_DIR = Path(tempfile.gettempdir()) / "specialists-test-cgroup-calls"
_BODY = isolation._job_process  # the real body, as imported (before a test puts this module's in its place)


def calls_file(pid: int) -> Path:
    return CALLS_DIR / f"{pid}.json"


def forget(pid: int) -> None:
    """Remove what an earlier process of ``pid`` wrote (before the process that has it now takes its job)."""
    calls_file(pid).unlink(missing_ok=True)


def calls_of(pid: int) -> list[tuple[str, str]]:
    """What job process ``pid`` called, in order: (``write``/``mkdir``/``rmdir``/``scandir``/``descendants``, the
    path or pid it was called on)."""
    return [(kind, target) for kind, target in json.loads(calls_file(pid).read_text())]


def counted_job_process(*args: Any) -> None:
    calls: list[tuple[str, str]] = []

    def wrap(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def counted(*called: Any, **named: Any) -> Any:
            calls.append((name.lstrip("_"), str(called[0]) if called else ""))
            return real(*called, **named)

        setattr(owner, name, counted)

    wrap(cpu_share, "_write")
    wrap(cpu_share, "descendants")
    for name in ("mkdir", "rmdir", "scandir"):
        wrap(os, name)  # this process's alone: it is a fork, and exits after its body
    try:
        _BODY(*args)
    finally:
        CALLS_DIR.mkdir(exist_ok=True)
        calls_file(os.getpid()).write_text(json.dumps(calls))
