"""`specialists push`: push notifications for an operator: what failed, what waits for a retry, whose webhooks are off.

A notification fails finally after ``SPECIALISTS_PUSH_MAX_ATTEMPTS`` attempts, past ``SPECIALISTS_PUSH_MAX_AGE_S``,
or at once when its webhook is refused (an address the service will not call, a redirect, a 4xx answer). Before
that it is retried (``push retries``: the next attempt's time, the attempts so far and the last reason). A dead
webhook holds each of its task's events in turn (a webhook receives them in order), so it takes a while to fail
them all: `push disable --customer C` turns the customer's webhooks off at once (docs/OPERATIONS.md, "Push
notifications"). The lists are ``taskstate.push``'s reads (index ranges), the same the operator console calls.
"""

from __future__ import annotations

import argparse

from ledger.client import Ledger
from ops.cli_ledger import handler, positive_int
from ops.output import EXIT_OK, EXIT_USAGE, emit, fail
from taskstate import push

_COLUMNS = ["finished_at", "customer_id", "task_id", "config_id", "event_id", "attempts", "last_status",
            "last_error", "url"]
_RETRY_COLUMNS = ["next_attempt_at", "customer_id", "task_id", "config_id", "event_id", "attempts", "in_flight",
                  "last_status", "last_error", "url"]


def _known(ctx, customer: str) -> None:
    """A typo is refused (with the near ids), never a webhook switch for nobody."""
    Ledger(ctx.engine_at_head(), ctx.settings.ledger).require_customer(customer)


@handler
def cmd_push_failures(ctx, args: argparse.Namespace) -> int:
    limit = min(args.limit, ctx.settings.ledger.max_rows_per_listing)
    if args.customer is not None:
        _known(ctx, args.customer)  # a typo is refused, never an empty list that reads as "none failed"
    with ctx.engine_at_head().connect() as conn:
        failed = push.failed_deliveries(conn, customer_id=args.customer, limit=limit)
    rows = [item.to_dict() for item in failed]
    if ctx.as_json:
        emit({"failures": rows}, as_json=True)
    else:
        emit(rows, as_json=False, columns=_COLUMNS, title="push notifications that failed (newest first)")
    return EXIT_OK


@handler
def cmd_push_retries(ctx, args: argparse.Namespace) -> int:
    limit = min(args.limit, ctx.settings.ledger.max_rows_per_listing)
    if args.customer is not None:
        _known(ctx, args.customer)
    with ctx.engine_at_head().connect() as conn:
        retrying = push.retrying_deliveries(conn, customer_id=args.customer, limit=limit)
    rows = [item.to_dict() for item in retrying]
    if ctx.as_json:
        emit({"retries": rows}, as_json=True)
    else:
        limits = ctx.settings.push
        emit(rows, as_json=False, columns=_RETRY_COLUMNS,
             title=f"push notifications waiting for a retry (next first; at most {limits.max_attempts} attempts, "
                   f"SPECIALISTS_PUSH_MAX_ATTEMPTS)")
    return EXIT_OK


@handler
def cmd_push_disable(ctx, args: argparse.Namespace) -> int:
    reason = args.reason.strip()
    max_chars = min(push.MAX_DISABLE_REASON_CHARS, ctx.settings.ledger.max_reason_chars)
    if not 1 <= len(reason) <= max_chars:
        return fail("reason_invalid", f"--reason takes 1 to {max_chars} characters, not {len(reason)} "
                    f"(SPECIALISTS_LEDGER_MAX_REASON_CHARS, at most {push.MAX_DISABLE_REASON_CHARS})",
                    as_json=ctx.as_json, exit_code=EXIT_USAGE)
    _known(ctx, args.customer)
    with ctx.engine_at_head().begin() as conn:
        stopped = push.disable_customer(conn, args.customer, reason=reason, by=ctx.operator)
    emit({"customer_id": args.customer, "disabled": True, "pending_failed": stopped, "reason": reason,
          "disabled_by": ctx.operator, "undo": f"specialists push enable --customer {args.customer}"},
         as_json=ctx.as_json, title="push notifications disabled for the customer")
    return EXIT_OK


@handler
def cmd_push_enable(ctx, args: argparse.Namespace) -> int:
    _known(ctx, args.customer)
    with ctx.engine_at_head().begin() as conn:
        changed = push.enable_customer(conn, args.customer)
    emit({"customer_id": args.customer, "enabled": True, "was_disabled": changed}, as_json=ctx.as_json,
         title="push notifications enabled for the customer (from its next event)" if changed
         else "push notifications were not disabled for the customer")
    return EXIT_OK


@handler
def cmd_push_disabled(ctx, args: argparse.Namespace) -> int:
    limit = min(args.limit, ctx.settings.ledger.max_rows_per_listing)
    with ctx.engine_at_head().connect() as conn:
        rows = [item.to_dict() for item in push.disabled_customers(conn, limit=limit)]
    if ctx.as_json:
        emit({"disabled": rows}, as_json=True)
    else:
        emit(rows, as_json=False, columns=["customer_id", "disabled_at", "disabled_by", "reason"],
             title="customers whose push notifications are disabled")
    return EXIT_OK


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `push` to the `specialists` parser."""
    pushes = groups.add_parser("push", parents=[common], help="push notifications: failures, retries, disable"
                               ).add_subparsers(dest="action", required=True)
    failures = pushes.add_parser("failures", parents=[common], help="notifications that finally failed, newest first")
    failures.add_argument("--customer", default=None, help="only this customer's")
    failures.add_argument("--limit", type=positive_int, default=50)
    failures.set_defaults(func=cmd_push_failures)
    retries = pushes.add_parser("retries", parents=[common],
                                help="notifications attempted and not finished: the next retry first")
    retries.add_argument("--customer", default=None, help="only this customer's")
    retries.add_argument("--limit", type=positive_int, default=50)
    retries.set_defaults(func=cmd_push_retries)
    disable = pushes.add_parser("disable", parents=[common],
                                help="turn off a customer's webhooks: its pending notifications fail now, none are "
                                     "written for its events until enabled")
    disable.add_argument("--customer", required=True)
    disable.add_argument("--reason", required=True)
    disable.set_defaults(func=cmd_push_disable)
    enable = pushes.add_parser("enable", parents=[common], help="turn a customer's webhooks back on")
    enable.add_argument("--customer", required=True)
    enable.set_defaults(func=cmd_push_enable)
    disabled = pushes.add_parser("disabled", parents=[common], help="customers whose webhooks are off")
    disabled.add_argument("--limit", type=positive_int, default=50)
    disabled.set_defaults(func=cmd_push_disabled)
