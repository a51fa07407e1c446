"""`specialists drill`: prove that a deployment refuses, cancels, recovers and settles as it promises.

``--local`` builds the topology on this machine (``ops.drill.topology``:
PostgreSQL, two API instances, two workers, a dispatcher or the Cloud Tasks
emulator's relay) and drills it with real signals; CI runs this. ``--target
URL[,URL]`` drills a deployment through its public URLs with the operator's
database access and key-signing secrets from the environment, and the
process-control scenarios through the ``SPECIALISTS_DRILL_*_HOOK`` commands
(skipped, naming the setting, when unset). Progress goes to standard error, a
table (or ``--json``) to standard output; the exit status is 1 when any
scenario failed. Each run's verdict is recorded (``ops.drill.record``) in the
deployment's database (``--target``) or, for ``--local``, in the one
DATABASE_URL names when it is at head; `specialists health` shows the last.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ops.drill import folders
from ops.output import EXIT_CONFIG, EXIT_OK, EXIT_REFUSED, emit_json, emit_table, fail, say
from ops.topology import RoleFailed, StartBounds


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _scenarios(requested: list[str] | None) -> list[str]:
    from ops.drill.scenarios import SCENARIOS

    if not requested:
        return list(SCENARIOS)
    names = [name for group in requested for name in group.split(",") if name]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {', '.join(unknown)}; the scenarios are {', '.join(SCENARIOS)}")
    return [name for name in SCENARIOS if name in names]  # always in the drill's order


@dataclass
class _Run:
    """One drill run as it is reported and recorded (``ops.drill.record``)."""

    target: str
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    run_id: str | None = None
    recorded: bool = False


def _record(ctx: Any, run: _Run, verdicts: list[Any], engine: Any) -> None:
    """Keep the run's verdict in the database it drilled (``--target``) or the one DATABASE_URL names (``--local``:
    its topology's own database is dropped), for `specialists health`; say so when it cannot be kept."""
    from core import db
    from ops.drill import record

    if run.run_id is None:
        return
    try:
        engine = engine if engine is not None else ctx.engine_at_head()
        record.record_run(engine, record.DrillRun(
            run_id=run.run_id, target=run.target[:record.MAX_TARGET_CHARS], operator=ctx.operator,
            started_at=run.started_at, finished_at=datetime.now(timezone.utc),
            verdict="fail" if any(v.verdict == "fail" for v in verdicts) else "pass",
            scenarios=tuple(record.outcome_of(v.scenario, v.verdict, v.seconds, v.evidence)
                            for v in verdicts[:record.MAX_SCENARIOS]),
        ))
        run.recorded = True
    except (db.SchemaNotAtHead, db.DatabaseUnavailable) as problem:
        _progress(f"drill {run.run_id}: its verdict is not recorded ({problem.message}); `specialists health` "
                  "shows the last drill recorded in the service's database")


def _drill(deployment: Any, names: list[str], settings: Any, run: _Run) -> list[Any]:
    from ops.drill.scenarios import Drill, run_scenario

    drill = Drill(deployment, slack_s=settings.drill.slack_s, credits=settings.drill.credits, progress=_progress)
    run.run_id = drill.run_id
    _progress(f"drill {drill.run_id}: {len(names)} scenarios against {', '.join(deployment.api_urls)}")
    verdicts = []
    try:
        for index, name in enumerate(names, 1):
            _progress(f"[{index}/{len(names)}] {name}")
            verdict = run_scenario(drill, name)
            _progress(f"[{index}/{len(names)}] {name}: {verdict.verdict.upper()} in {verdict.seconds:.1f} s")
            verdicts.append(verdict)
    finally:
        deployment.close()
        drill.close()
    return verdicts


def _report(ctx: Any, mode: str, verdicts: list[Any], started: float, logs: Path | None, run: _Run) -> int:
    failed = [v for v in verdicts if v.verdict == "fail"]
    report = {
        "mode": mode,
        "run_id": run.run_id,
        "recorded": run.recorded,
        "passed": not failed,
        "seconds": round(time.monotonic() - started, 1),
        "scenarios": [v.to_dict() for v in verdicts],
        **({"logs": str(logs)} if logs else {}),
    }
    if ctx.as_json:
        emit_json(report)
    else:
        rows = [{"scenario": v.scenario, "verdict": v.verdict, "seconds": f"{v.seconds:.1f}",
                 "evidence": v.evidence[-1] if v.evidence else "-"} for v in verdicts]
        emit_table(rows, ["scenario", "verdict", "seconds", "evidence"], title=f"drill ({mode})")
        for verdict in failed:
            say(f"\n{verdict.scenario} failed; its evidence:")
            for line in verdict.evidence:
                say(f"  {line}")
        if logs:
            say(f"\nthe processes' logs: {logs}")
    return EXIT_REFUSED if failed else EXIT_OK


def cmd_drill(ctx: Any, args: argparse.Namespace) -> int:
    from core import db
    from ops.drill.deployments import LocalDeployment, TargetDeployment
    from ops.drill.topology import Bounds, LocalTopology, server_url

    settings = ctx.settings
    try:
        names = _scenarios(args.scenario)
    except ValueError as problem:
        return fail("drill_scenario_unknown", str(problem), as_json=ctx.as_json, exit_code=2)
    started = time.monotonic()
    if args.target is None:
        run_folder = None if args.logs else folders.RunFolder()
        folder = Path(args.logs) if args.logs else run_folder.path
        if run_folder is not None:
            keep = settings.drill.keep_local_runs
            removed = folders.prune(keep, current=folder)
            _progress(f"the processes' logs: {folder / 'logs'} (the newest {keep} drills' folders in "
                      f"{folder.parent} are kept, SPECIALISTS_DRILL_KEEP_LOCAL_RUNS; {len(removed)} older removed)")
        topology = LocalTopology(folder, server_url(settings), dispatcher_kind=args.dispatcher, progress=_progress,
                                 start_bounds=StartBounds.from_settings(settings))
        mode = f"local, {args.dispatcher} dispatch"
        run = _Run(target=mode)
        try:
            with topology:
                verdicts = _drill(LocalDeployment(topology), names, settings, run)
        except RoleFailed as problem:  # a process of the topology did not start
            return fail(f"{problem.code}", f"{problem.message}; the processes' logs: {folder / 'logs'}",
                        as_json=ctx.as_json)
        finally:
            if run_folder is not None:
                run_folder.release()
        _record(ctx, run, verdicts, None)
        return _report(ctx, mode, verdicts, started, folder / "logs", run)

    urls = [url.strip().rstrip("/") for url in args.target.split(",") if url.strip()]
    if not urls or not all(url.startswith(("http://", "https://")) for url in urls):
        return fail("drill_target_invalid", f"--target takes one or more comma-separated http(s) URLs, got "
                    f"{args.target!r}", as_json=ctx.as_json, exit_code=2)
    if settings.database.embedded:
        return fail("drill_needs_database", "drill --target needs the deployment's database (it issues drill keys, "
                    "grants their credits and reads the ledger): set DATABASE_URL", as_json=ctx.as_json,
                    exit_code=EXIT_CONFIG)
    if not settings.keys.signing_secrets:
        return fail("drill_needs_signing_secret", "drill --target signs its customers' keys with the deployment's "
                    "secret: set SPECIALISTS_KEY_SIGNING_SECRETS (and SPECIALISTS_KEY_ENVIRONMENT)",
                    as_json=ctx.as_json, exit_code=EXIT_CONFIG)
    from ops.drill.deployments import wait_ready

    for url in urls:
        try:
            wait_ready(url, 30)
        except RuntimeError as problem:
            return fail("drill_target_not_ready", f"{problem}; is the URL right and the revision deployed?",
                        as_json=ctx.as_json)
    engine = ctx.engine_at_head()
    deployment = TargetDeployment(urls, engine, ctx.signer(), Bounds.from_settings(settings), settings, _progress)
    del db
    run = _Run(target=",".join(urls))
    verdicts = _drill(deployment, names, settings, run)
    _record(ctx, run, verdicts, engine)
    return _report(ctx, "target", verdicts, started, None, run)


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from ops.drill import SCENARIO_NAMES

    drill = groups.add_parser("drill", parents=[common], help="drill refusal, cancellation, recovery and settlement",
                              description=__doc__)
    where = drill.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="build the topology on 127.0.0.1 and drill it")
    where.add_argument("--target", default=None, metavar="URL[,URL]",
                       help="drill a deployment: its API URLs (two drill the cross-instance scenario)")
    drill.add_argument("--dispatcher", choices=["embedded", "cloud-tasks"], default="embedded",
                       help="--local: the embedded dispatcher, or the relay to the Cloud Tasks emulator")
    drill.add_argument("--scenario", action="append", default=None, metavar="NAME[,NAME]",
                       help=f"only these scenarios (of {', '.join(SCENARIO_NAMES)}); default: all")
    drill.add_argument("--logs", default=None, help="--local: keep the processes' logs in this folder")
    drill.set_defaults(func=cmd_drill)
