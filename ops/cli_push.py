"""`specialists push failures`: push notifications that finally failed, newest first, for an operator.

A notification fails finally after ``SPECIALISTS_PUSH_MAX_ATTEMPTS`` attempts, past ``SPECIALISTS_PUSH_MAX_AGE_S``,
or at once when its webhook is refused (an address the service will not call, a redirect, a 4xx answer). The
list is ``taskstate.push.failed_deliveries`` (an index range), the same read the operator console calls.
"""

from __future__ import annotations

import argparse

from ops.cli_ledger import handler, positive_int
from ops.output import EXIT_OK, emit
from taskstate import push

_COLUMNS = ["finished_at", "customer_id", "task_id", "config_id", "event_id", "attempts", "last_status",
            "last_error", "url"]


@handler
def cmd_push_failures(ctx, args: argparse.Namespace) -> int:
    limit = min(args.limit, ctx.settings.ledger.max_rows_per_listing)
    with ctx.engine_at_head().connect() as conn:
        failed = push.failed_deliveries(conn, customer_id=args.customer, limit=limit)
    rows = [item.to_dict() for item in failed]
    if ctx.as_json:
        emit({"failures": rows}, as_json=True)
    else:
        emit(rows, as_json=False, columns=_COLUMNS, title="push notifications that failed (newest first)")
    return EXIT_OK


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `push` to the `specialists` parser."""
    pushes = groups.add_parser("push", parents=[common], help="push notifications: what failed").add_subparsers(
        dest="action", required=True
    )
    failures = pushes.add_parser("failures", parents=[common], help="notifications that finally failed, newest first")
    failures.add_argument("--customer", default=None, help="only this customer's")
    failures.add_argument("--limit", type=positive_int, default=50)
    failures.set_defaults(func=cmd_push_failures)
