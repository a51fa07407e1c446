"""``rlm jobs``: command jobs and their receipts; ``rlm jobs release JOB --reason ...`` gives back a lease.

``rlm jobs`` lists jobs newest first (``--run RUN``: one family, found as ``rlm
show`` finds a run; a child's is its root's family), with their agent, state,
exit status, output bytes, whether each holds the workspace lease and whether its
process still runs. ``rlm jobs JOB`` prints one job's receipt. A job whose run
ended while it ran is ``unknown`` and keeps its lease; once a person has checked
what the command did, ``rlm jobs release JOB --reason TEXT`` gives the lease back
(refused while its process group still runs) and keeps the reason. ``--json``
for scripts.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from rlmfamily.bash.extension import receipt_text
from rlmfamily.bash.store import Job, JobStore
from rlmfamily.errors import SettingsInvalid
from rlmfamily.family.store import family_root
from rlmfamily.output import print_table
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import find_run

COMMANDS = ("jobs",)
EXIT_OK = 0
COMMAND_COLUMN_CHARS = 28


def add_parsers(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="command jobs of the python-bash profile: receipts, leases, release")
    jobs.add_argument("words", nargs="*", metavar="JOB | release JOB",
                      help="nothing: list jobs; JOB: its receipt; release JOB: give back an unknown job's lease")
    jobs.add_argument("--run", help="one family's jobs: run id, unique prefix or 'last' (a child's is its root's)")
    jobs.add_argument("--reason", help="with release: what you checked (which files the command changed)")
    jobs.add_argument("--limit", type=int, default=100, help="jobs listed (default 100)")
    jobs.add_argument("--json", action="store_true")


def main(args: argparse.Namespace, settings: RLMSettings, out: Console, err: Console) -> int:
    store = JobStore(settings.jobs_path, output_dir=settings.runs_dir)
    words = list(args.words)
    if words and words[0] == "release":
        if len(words) != 2 or not args.reason:
            raise SettingsInvalid("release takes one job and a reason: rlm jobs release JOB --reason TEXT")
        job = store.release(words[1], args.reason)
        if args.json:
            out.print_json(json.dumps(describe(job, store.leases())))
        else:
            out.print(f"job {job.id} released: its outcome stays unknown; reason: {job.release_reason}",
                      markup=False, highlight=False)
        return EXIT_OK
    if len(words) > 1:
        raise SettingsInvalid("rlm jobs takes at most one job id (or: rlm jobs release JOB --reason TEXT)")
    if words:
        job = store.job(words[0])
        if args.json:
            out.print_json(json.dumps(describe(job, store.leases())))
        else:
            out.print(receipt_text(job), markup=False, highlight=False)
            _print_notes([job], store.leases(), out)
        return EXIT_OK
    if args.limit < 1:
        raise SettingsInvalid("--limit must be at least 1")
    root = _root(settings, args.run) if args.run else None
    jobs = store.jobs(root, limit=args.limit)
    leases = store.leases()
    if args.json:
        out.print_json(json.dumps({"jobs": [describe(j, leases) for j in jobs], "leases": leases}))
        return EXIT_OK
    print_table(out, _table(settings, jobs, leases), ids=("job", "agent"))
    _print_notes(jobs, leases, out)
    return EXIT_OK


def describe(job: Job, leases: dict[str, str]) -> dict[str, Any]:
    data = job.to_dict()
    data["holds_lease"] = job.id in leases
    data["process_running"] = job.process_alive()
    return data


def _root(settings: RLMSettings, run: str) -> str:
    return family_root(settings.family_path, find_run(settings.runs_dir, run).parent.name)


def _table(settings: RLMSettings, jobs: list[Job], leases: dict[str, str]) -> Table:
    table = Table(title=f"command jobs ({settings.jobs_path})", title_justify="left", box=box.SIMPLE, pad_edge=False)
    for column in ("job", "agent", "state", "exit", "bytes", "lease", "command"):  # the receipt has the rest
        table.add_column(column, justify="right" if column in ("exit", "bytes") else "left", no_wrap=True)
    for job in jobs:
        state = job.state + (" (released)" if job.released_at else "") + (" · still running" if job.state == "unknown"
                                                                           and job.process_alive() else "")
        table.add_row(
            job.id, "root" if job.agent_id == job.root_id else job.agent_id.removeprefix(job.root_id + "."), state,
            "-" if job.exit_code is None else str(job.exit_code), f"{job.stdout_bytes + job.stderr_bytes:,}",
            "held" if job.id in leases else ("read-only" if job.read_only else "-"), _one_line(job.command),
            style="yellow" if job.state == "unknown" else None,
        )
    return table


def _print_notes(jobs: list[Job], leases: dict[str, str], out: Console) -> None:
    unknown = [j for j in jobs if j.state == "unknown" and j.released_at is None]
    if not unknown:
        return
    out.print("\nunknown outcome (its run ended while it ran; check what it did, then "
              "rlm jobs release JOB --reason TEXT):", style="yellow")
    for job in unknown:
        running = f"; its process group {job.pid} still runs" if job.process_alive() else ""
        lease = f"; holds the lease of {leases[job.id]}" if job.id in leases else ""
        out.print(f"  {job.id} ({job.agent_id}): {_one_line(job.command)}{lease}{running}", markup=False,
                  highlight=False)


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= COMMAND_COLUMN_CHARS else flat[: COMMAND_COLUMN_CHARS - 1] + "…"
