"""`specialists customers add|list|show|set`: who the service's customers are, added explicitly, and their caps.

A customer exists only once an operator adds it (``customers add``): the grant, the key and every read of one
customer refuse an id the service does not know (``customer_not_found``), so a typo is an error, never a new
account or an empty answer. ``customers set`` changes a customer's cap on tasks at once without a grant. Both
are recorded with the operator and the reason (``ledger_account_changes``). ``customers set --weight`` changes
the customer's weight in the fair order of worker slots (``taskstate.outbox``: ``dispatch_weights`` keeps the last
change's operator, time and reason), and ``customers show`` prints that share: the weight, the customer's jobs in
flight and those waiting for a slot (docs/OPERATIONS.md, "Fair share of worker slots").
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ledger import keys
from ops import output
from ops.cli_ledger import handler, ledger_of, positive_int
from ops.output import EXIT_OK, EXIT_USAGE, emit, fail, say
from taskstate import outbox
from taskstate import reads as task_reads

_CUSTOMER_COLUMNS = ["customer_id", "created_at", "max_parallel", "open_reservations", "held", "available", "spent"]


@handler
def cmd_customers_add(ctx, args: argparse.Namespace) -> int:
    result = ledger_of(ctx).open_account(args.customer, operator=ctx.operator, max_parallel=args.max_parallel,
                                       reason=args.reason)
    emit(
        asdict(result),
        as_json=ctx.as_json,
        title="customer added" if result.outcome == "created" else "customer already exists (nothing changed)",
    )
    return EXIT_OK


@handler
def cmd_customers_list(ctx, args: argparse.Namespace) -> int:
    page = ledger_of(ctx).customers(after=args.after, limit=args.limit)
    output.emit_page([asdict(c) for c in page.customers], as_json=ctx.as_json, key="customers",
                     columns=_CUSTOMER_COLUMNS, title="customers (by id)", next_flag="--after",
                     next_value=page.next_after, older="more customers")
    return EXIT_OK


_TASK_COLUMNS = ["task_id", "specialist_id", "state", "created_at", "updated_at", "reserved_credits",
                 "charged_credits", "job_ids"]
_KEY_COLUMNS = ["key_id", "tier", "label", "issued_at", "issued_by", "expires_at", "revoked_at", "revoked_by"]
# How many of its newest tasks `customers show` lists when its caller names no number.
DEFAULT_SHOWN_TASKS = 20


@handler
def cmd_customers_show(ctx, args: argparse.Namespace) -> int:
    """One customer: its balances, its fair share of worker slots, its keys and its newest tasks (lots and
    entitlements: `credits show`)."""
    ledger = ledger_of(ctx)
    customer = ledger.require_customer(args.customer)
    view = ledger.account(customer)
    with ledger.engine.connect() as conn:
        tasks = task_reads.customer_tasks(conn, customer, limit=min(args.limit, ctx.settings.ledger.max_rows_per_listing))
        share = asdict(outbox.share_of(conn, customer, default_weight=ctx.settings.dispatch.default_weight))
    held_keys = keys.list_keys(ledger.engine, customer)
    share.pop("customer_id")
    balances = None if view is None else {
        "available": view.available, "held": view.held, "expired_unswept": view.expired_unswept,
        "open_reservations": view.open_reservations, "max_parallel": view.max_parallel,
    }
    if ctx.as_json:
        output.emit_json({"customer_id": customer, "balances": balances, "fair_share": share, "keys": held_keys,
                          "tasks": tasks})
        return EXIT_OK
    if balances is None:
        say(f"{customer} has no credit account yet")
    else:
        emit(balances, as_json=False, title=f"customer {customer}")
    emit(share, as_json=False, title="fair share of worker slots (weight; jobs in flight; jobs waiting for a slot)")
    emit(held_keys, as_json=False, columns=_KEY_COLUMNS, title="keys")
    emit(tasks, as_json=False, columns=_TASK_COLUMNS, title=f"newest tasks (at most {args.limit})")
    say(f"lots and entitlements: `specialists credits show --customer {customer}`")
    return EXIT_OK


@handler
def cmd_customers_set(ctx, args: argparse.Namespace) -> int:
    if args.max_parallel is None and args.weight is None:
        return fail("nothing_to_set", "name what to change: --max-parallel N, --weight W or both",
                    as_json=ctx.as_json, exit_code=EXIT_USAGE)
    if args.weight is not None and not 1 <= args.weight <= outbox.MAX_WEIGHT:
        return fail("weight_invalid", f"--weight is 1 to {outbox.MAX_WEIGHT}, not {args.weight} (the default of "
                    "customers without one is SPECIALISTS_DISPATCH_DEFAULT_WEIGHT)", as_json=ctx.as_json,
                    exit_code=EXIT_USAGE)
    if args.weight is not None and not 1 <= len(args.reason) <= outbox.MAX_WEIGHT_REASON_CHARS:
        return fail("reason_invalid", f"--reason is 1 to {outbox.MAX_WEIGHT_REASON_CHARS} characters: why, for the "
                    "audit record", as_json=ctx.as_json, exit_code=EXIT_USAGE)
    ledger = ledger_of(ctx)
    customer = ledger.require_customer(args.customer)
    results: dict[str, dict] = {}
    if args.max_parallel is not None:
        result = ledger.set_max_parallel(customer, args.max_parallel, operator=ctx.operator, reason=args.reason)
        results["max_parallel"] = asdict(result)
        if not ctx.as_json:
            emit(asdict(result), as_json=False, title="max_parallel changed" if result.outcome == "changed"
                 else "max_parallel already at that value")
    if args.weight is not None:
        with ledger.engine.begin() as conn:
            change = outbox.set_weight(conn, customer, args.weight, changed_by=ctx.operator, reason=args.reason)
        results["weight"] = asdict(change)
        if not ctx.as_json:
            emit(asdict(change), as_json=False,
                 title="weight changed" if change.outcome == "changed" else "weight already at that value")
    if ctx.as_json:
        output.emit_json(results["max_parallel"] if list(results) == ["max_parallel"] else results)
    return EXIT_OK


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `customers` to the `specialists` parser."""
    customers = groups.add_parser("customers", parents=[common], help="add customers, list them, change their caps").add_subparsers(
        dest="action", required=True
    )
    add = customers.add_parser("add", parents=[common], help="add a customer (its credit account): the one way to")
    add.add_argument("--customer", required=True, help="1-63 of a-z, 0-9, '_', '.', '-'")
    add.add_argument("--max-parallel", type=int, default=None,
                     help="its cap on tasks at once, 1 or more (default SPECIALISTS_LEDGER_DEFAULT_MAX_PARALLEL)")
    add.add_argument("--reason", default="", help="why, for the audit record")
    add.set_defaults(func=cmd_customers_add)

    lst = customers.add_parser("list", parents=[common], help="customers in id order, with their balances")
    lst.add_argument("--limit", type=positive_int, default=100)
    lst.add_argument("--after", metavar="CUSTOMER", default=None,
                     help="the page after this id: the one printed under the previous page")
    lst.set_defaults(func=cmd_customers_list)

    show = customers.add_parser("show", parents=[common], help="one customer: balances, keys and its newest tasks")
    show.add_argument("--customer", required=True)
    show.add_argument("--limit", type=positive_int, default=DEFAULT_SHOWN_TASKS, help="how many of its newest tasks")
    show.set_defaults(func=cmd_customers_show)

    cap = customers.add_parser("set", parents=[common],
                               help="change a customer's cap on tasks at once (no grant) or its weight for worker slots")
    cap.add_argument("--customer", required=True)
    cap.add_argument("--max-parallel", type=int, default=None,
                     help="1 or more; at least its open and unknown reservations")
    cap.add_argument("--weight", type=int, default=None,
                     help=f"1 to {outbox.MAX_WEIGHT}: while customers wait for worker slots, one of weight w holds w "
                     "slots for each slot of a weight-1 customer (default SPECIALISTS_DISPATCH_DEFAULT_WEIGHT)")
    cap.add_argument("--reason", required=True, help="why, for the audit record")
    cap.set_defaults(func=cmd_customers_set)
