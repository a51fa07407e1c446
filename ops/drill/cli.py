"""`specialists drill`: prove that a deployment refuses, cancels, recovers and settles as it promises.

``--local`` builds the topology on this machine (``ops.drill.topology``:
PostgreSQL, two API instances, two workers, a dispatcher or the Cloud Tasks
emulator's relay) and drills it with real signals; CI runs this. ``--target
URL[,URL]`` drills a deployment through its public URLs with the operator's
database access and key-signing secrets from the environment, and the
process-control scenarios through the ``SPECIALISTS_DRILL_*_HOOK`` commands
(skipped, naming the setting, when unset). Progress goes to standard error, a
table (or ``--json``) to standard output; the exit status is 1 when any
scenario failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ops.output import EXIT_CONFIG, EXIT_OK, EXIT_REFUSED, emit_json, emit_table, fail, say


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


def _drill(deployment: Any, names: list[str], settings: Any) -> list[Any]:
    from ops.drill.scenarios import Drill, run_scenario

    drill = Drill(deployment, slack_s=settings.drill.slack_s, credits=settings.drill.credits, progress=_progress)
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


def _report(ctx: Any, mode: str, verdicts: list[Any], started: float, logs: Path | None) -> int:
    failed = [v for v in verdicts if v.verdict == "fail"]
    report = {
        "mode": mode,
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
        if logs and failed:
            say(f"\nthe processes' logs: {logs}")
    return EXIT_REFUSED if failed else EXIT_OK


def cmd_drill(ctx: Any, args: argparse.Namespace) -> int:
    from core import db
    from ops.drill.deployments import LocalDeployment, TargetDeployment
    from ops.drill.topology import Bounds, LocalTopology, TopologyFailed, server_url

    settings = ctx.settings
    try:
        names = _scenarios(args.scenario)
    except ValueError as problem:
        return fail("drill_scenario_unknown", str(problem), as_json=ctx.as_json, exit_code=2)
    started = time.monotonic()
    if args.target is None:
        folder = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="specialists-drill-"))
        topology = LocalTopology(folder, server_url(settings), dispatcher_kind=args.dispatcher, progress=_progress)
        try:
            with topology:
                verdicts = _drill(LocalDeployment(topology), names, settings)
        except TopologyFailed as problem:
            return fail(problem.code, problem.message, as_json=ctx.as_json)
        return _report(ctx, f"local, {args.dispatcher} dispatch", verdicts, started, folder / "logs")

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
    deployment = TargetDeployment(urls, ctx.engine_at_head(), ctx.signer(), Bounds.from_settings(settings),
                                  settings, _progress)
    del db
    return _report(ctx, "target", _drill(deployment, names, settings), started, None)


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
