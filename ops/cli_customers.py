"""`specialists customers add|list|set`: who the service's customers are, added explicitly, and their caps.

A customer exists only once an operator adds it (``customers add``): the grant, the key and every read of one
customer refuse an id the service does not know (``customer_not_found``), so a typo is an error, never a new
account or an empty answer. ``customers set`` changes a customer's cap on tasks at once without a grant. Both
are recorded with the operator and the reason (``ledger_account_changes``).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ops import output
from ops.cli_ledger import handler, ledger_of, positive_int
from ops.output import EXIT_OK, emit, say

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
    rows = [asdict(c) for c in page.customers]
    if ctx.as_json:
        output.emit_json({"customers": rows, "next_after": page.next_after})
        return EXIT_OK
    emit(rows, as_json=False, columns=_CUSTOMER_COLUMNS, title="customers (by id)")
    if page.next_after is not None:
        say(f"more customers: the same command with --after {page.next_after}")
    return EXIT_OK


@handler
def cmd_customers_set(ctx, args: argparse.Namespace) -> int:
    ledger = ledger_of(ctx)
    result = ledger.set_max_parallel(ledger.require_customer(args.customer), args.max_parallel,
                                     operator=ctx.operator, reason=args.reason)
    emit(
        asdict(result),
        as_json=ctx.as_json,
        title="max_parallel changed" if result.outcome == "changed" else "max_parallel already at that value",
    )
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

    cap = customers.add_parser("set", parents=[common], help="change a customer's cap on tasks at once (no grant)")
    cap.add_argument("--customer", required=True)
    cap.add_argument("--max-parallel", type=int, required=True,
                     help="1 or more; at least its open and unknown reservations")
    cap.add_argument("--reason", required=True, help="why, for the audit record")
    cap.set_defaults(func=cmd_customers_set)
