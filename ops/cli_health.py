"""`specialists health`: each specialist's readiness and live workers, the queue and its redeliveries, the push
backlog, unknown jobs, the workers seen recently, the last drill (``ops.health``; the console's health page shows
the same record). Exit 1 with any problem, each named with its code."""

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
    facts = found.facts
    emit([asdict(s) | {"ready": s.ready, "live_workers": facts.live_workers.get(s.specialist_id, 0)}
          for s in found.specialists], as_json=False,
         columns=["specialist_id", "skill", "executor", "ready", "live_workers", "problem"], title="specialists")
    emit([{"worker_id": w.worker_id, "live": w.live, "beat_age_s": f"{w.beat_age_s:.0f}",
           "specialists": ", ".join(w.specialists)} for w in facts.workers], as_json=False,
         columns=["worker_id", "live", "beat_age_s", "specialists"],
         title=f"workers' beats (live: within {facts.live_s:g} s, SPECIALISTS_HEALTH_WORKER_LIVE_S)")
    if not facts.workers:
        say("no worker has beaten in the last day: none is running against this database")
    emit([asdict(q) | {"oldest_age_s": f"{q.oldest_age_s:.0f}"} for q in found.queue], as_json=False,
         columns=["specialist_id", "queued", "redelivery", "oldest_queued_at", "oldest_age_s"],
         title="jobs no worker has taken yet (redelivery: tried, to be delivered again)")
    push = facts.push
    say(f"push notifications: {push.pending} pending"
        + (f", the oldest due waiting {push.oldest_due_age_s:.0f} s" if push.oldest_due_age_s is not None else "")
        + f"; {push.failed} failed in the last {found.limits.failures_window_s:g} s (`specialists push failures`)")
    say(f"jobs whose outcome is unknown: {facts.unknown_jobs} (`specialists reservations list --unknown`)")
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
    problems = found.problems
    for problem in problems:
        say(f"NOT READY {problem.code}: {problem.message}")
    return EXIT_OK if not problems else EXIT_REFUSED


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `health` to the `specialists` parser."""
    health_cmd = groups.add_parser(
        "health", parents=[common],
        help="specialists' readiness and live workers, the queue, push backlog, the last drill; exit 1 on a problem",
    )
    health_cmd.set_defaults(func=cmd_health)
