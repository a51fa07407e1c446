"""`specialists health`: each specialist's readiness, the queue, the workers seen recently, the last drill
(``ops.health``; the console's health page shows the same record). Exit 1 when a specialist is not ready."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ops import output
from ops.health import health
from ops.output import EXIT_OK, EXIT_REFUSED, emit, say


def cmd_health(ctx, args: argparse.Namespace) -> int:
    found = health(ctx.settings, ctx.engine_at_head())
    if ctx.as_json:
        output.emit_json(found.as_record())
        return EXIT_OK if found.ready else EXIT_REFUSED
    if found.specs_problem is not None:
        say(f"the specs did not load, so no specialist is ready: {found.specs_problem}")
    emit([asdict(s) | {"ready": s.ready} for s in found.specialists], as_json=False,
         columns=["specialist_id", "skill", "executor", "ready", "problem"], title="specialists")
    emit([asdict(q) | {"oldest_age_s": f"{q.oldest_age_s:.0f}"} for q in found.queue], as_json=False,
         columns=["specialist_id", "queued", "oldest_queued_at", "oldest_age_s"],
         title="jobs no worker has taken yet")
    emit([asdict(w) for w in found.workers], as_json=False, columns=["worker_id", "last_seen_at", "running_jobs"],
         title=f"workers seen in the last {found.seen_window_s:g} s (SPECIALISTS_WORKER_SEEN_WINDOW_S)")
    drill = found.last_drill
    if drill is None:
        say("no drill recorded in this database (`specialists drill` records each run)")
    else:
        emit({"run_id": drill.run_id, "verdict": drill.verdict, "target": drill.target, "operator": drill.operator,
              "started_at": drill.started_at, "finished_at": drill.finished_at,
              "scenarios": ", ".join(f"{s.scenario} {s.verdict}" for s in drill.scenarios)},
             as_json=False, title="the last drill")
    not_ready = [s.specialist_id for s in found.specialists if not s.ready]
    if not found.ready:
        say(f"not ready: {', '.join(not_ready) or 'every specialist'}")
    return EXIT_OK if found.ready else EXIT_REFUSED


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `health` to the `specialists` parser."""
    health_cmd = groups.add_parser(
        "health", parents=[common],
        help="specialists' readiness, the queue, workers seen recently, the last drill; exit 1 if one is not ready",
    )
    health_cmd.set_defaults(func=cmd_health)
