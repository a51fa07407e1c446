"""`specialists credits|reservations|reconcile|ledger` subcommands: the operator's view of the credit ledger
(and, for `reconcile`, of the unknown job behind a reservation: its claim and its A2A task).

Every command prints tables for people and JSON with ``--json``; exit codes come from
``ops.output`` (0 done, 1 refused or violations found, 2 bad arguments,
3 invalid settings, 4 database unreachable or not at head).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from functools import wraps
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from core import db
from core.specs import SkillCatalogue, SkillUnknown, load_specs
from ledger.client import Ledger
from ledger.errors import CustomerNotFound, LedgerInputInvalid
from ledger.verify import Audit, Progress
from ops import output
from ops.output import EXIT_DATABASE, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit, fail, progress, say

Handler = Callable[[Any, argparse.Namespace], int]


def ledger_of(ctx) -> Ledger:
    # Invalid ledger settings stopped the command before it got here (exit 3, naming the variable).
    return Ledger(ctx.engine_at_head(), ctx.settings.ledger)


def handler(func: Handler) -> Handler:
    """Bad input (a malformed value, a skill no card publishes) is a usage error (exit 2)."""

    @wraps(func)
    def run(ctx, args: argparse.Namespace) -> int:
        try:
            return func(ctx, args)
        except (LedgerInputInvalid, SkillUnknown) as invalid:
            return fail(invalid.code, invalid.message, as_json=ctx.as_json, exit_code=EXIT_USAGE)

    return run


def skills(ctx) -> SkillCatalogue:
    """The skills the specs publish (SPECIALISTS_SPECS_DIR): the names entitlements are granted and shown by."""
    folder = ctx.settings.hosted.specs_dir
    return SkillCatalogue.of(load_specs(folder), folder)


def _entitlement_record(catalogue: SkillCatalogue, entitlement) -> dict[str, Any]:
    """An entitlement as the operator names it: the card's skill, beside the specialist the ledger keeps it under
    (``skill`` None: an entitlement no loaded spec's card publishes, which admits nothing)."""
    return {"skill": catalogue.skill_of(entitlement.skill), "specialist_id": entitlement.skill,
            **{k: v for k, v in asdict(entitlement).items() if k != "skill"}}


def _instant(value: str) -> datetime:
    """An ISO 8601 date or time; without a zone it is read as UTC."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 date or time (e.g. 2030-01-31 or 2030-01-31T12:00:00+00:00)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return number


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of credits") from None


# --- credits ----------------------------------------------------------------


@handler
def cmd_credits_grant(ctx, args: argparse.Namespace) -> int:
    catalogue = skills(ctx)
    specialists = [catalogue.specialist_of(skill) for skill in args.skill or ()]  # refused before anything moves
    result = ledger_of(ctx).grant(
        args.customer,
        args.credits,
        operator=ctx.operator,
        skills=specialists,
        require_customer=True,  # creating a customer is `customers add`: a mistyped id opens no account
        expires_at=args.expires_at,
        expires_in=timedelta(days=args.expires_in_days) if args.expires_in_days is not None else None,
        skill_expires_at=args.skill_expires_at,
        max_parallel=args.max_parallel,
        priority=args.priority,
        idempotency_key=args.idempotency_key,
        reason=args.reason,
    )
    record = asdict(result)
    record["skills"] = [catalogue.skill_of(specialist) or specialist for specialist in result.skills]
    record["specialist_ids"] = list(result.skills)
    emit(
        record,
        as_json=ctx.as_json,
        title="credits granted" if result.outcome == "created" else "grant already recorded (idempotent replay)",
    )
    return EXIT_OK


_LOT_COLUMNS = ["lot_id", "source", "priority", "granted", "held", "spent", "expired", "removed", "remaining", "expires_at", "usable"]
# A reservation's ``skill`` is the specialist the edge reserved the task under: the table says so.
_RESERVATION_COLUMNS = ["job_id", "customer_id", "specialist", "credits", "state", "charged", "created_at", "unknown_reason", "resolved_by"]


def _reservation_row(row: dict[str, Any]) -> dict[str, Any]:
    return row | {"specialist": row.get("skill")}


@handler
def cmd_credits_show(ctx, args: argparse.Namespace) -> int:
    ledger = ledger_of(ctx)
    view = ledger.account(ledger.require_customer(args.customer))
    if view is None:
        return fail(
            "account_not_found",
            f"customer {args.customer} has no credit account yet; `specialists customers add --customer "
            f"{args.customer}` opens it",
            as_json=ctx.as_json,
        )
    catalogue = skills(ctx)
    entitlements = [_entitlement_record(catalogue, e) for e in view.entitlements]
    if ctx.as_json:
        output.emit_json(asdict(view) | {"entitlements": entitlements})
        return EXIT_OK
    emit(
        {
            "customer_id": view.customer_id,
            "available": view.available,
            "held": view.held,
            "expired, not yet swept": view.expired_unswept,
            "open reservations": f"{view.open_reservations} of max_parallel {view.max_parallel}",
        },
        as_json=False,
        title=f"credits of {view.customer_id}",
    )
    emit([asdict(lot) for lot in view.lots], as_json=False, columns=_LOT_COLUMNS, title="lots (draw-down order)")
    emit(
        [e | {"skill": e["skill"] or f"(none: no card publishes {e['specialist_id']})"} for e in entitlements],
        as_json=False,
        columns=["skill", "specialist_id", "grant_id", "expires_at", "active"],
        title="entitlements (by the skill on the specialist's card)",
    )
    emit(
        [_reservation_row(asdict(r)) for r in view.unresolved],
        as_json=False,
        columns=_RESERVATION_COLUMNS[:-1],
        title="open and unknown reservations",
    )
    return EXIT_OK


@handler
def cmd_credits_history(ctx, args: argparse.Namespace) -> int:
    ledger = ledger_of(ctx)
    lines = ledger.history(ledger.require_customer(args.customer), limit=args.limit)
    emit(
        [asdict(line) for line in lines],
        as_json=ctx.as_json,
        columns=["at", "entry_id", "kind", "lot_id", "job_id", "from_account", "to_account", "credits", "reason", "operator"],
        title=f"journal of {args.customer} (newest first)",
    )
    return EXIT_OK


@handler
def cmd_credits_adjust(ctx, args: argparse.Namespace) -> int:
    ledger = ledger_of(ctx)
    result = ledger.adjust(ledger.require_customer(args.customer), args.credits, args.reason, ctx.operator)
    if ctx.as_json:
        output.emit_json(asdict(result))
        return EXIT_OK
    sign = "+" if result.credits > 0 else "-"
    lots = ", ".join(f"lot {lot.lot_id}: {sign}{lot.credits}" for lot in result.lots)
    emit(asdict(result) | {"lots": lots}, as_json=False, title="adjustment journaled")
    return EXIT_OK


# How far back `credits usage` looks when no --since is given, in days (ending with today, UTC).
DEFAULT_USAGE_DAYS = 30
_USAGE_COLUMNS = ["day", "specialist_id", "customer_id", "credits_charged", "settlements"]


def _usage_period(args: argparse.Namespace) -> tuple[datetime, datetime]:
    """[since, until) of `credits usage`: by default the last DEFAULT_USAGE_DAYS UTC days, today included."""
    if args.until is not None:
        until = args.until
    else:
        today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        until = today + timedelta(days=1)
    since = args.since if args.since is not None else until - timedelta(days=DEFAULT_USAGE_DAYS)
    return since, until


@handler
def cmd_credits_usage(ctx, args: argparse.Namespace) -> int:
    if args.csv and ctx.as_json:
        return fail("usage_error", "--csv and --json both choose the output; give one", as_json=True,
                    exit_code=EXIT_USAGE)
    since, until = _usage_period(args)
    rows = [asdict(row) for row in ledger_of(ctx).usage(since=since, until=until, customer_id=args.customer)]
    if args.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=_USAGE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({column: row[column] for column in _USAGE_COLUMNS} for row in rows)
        return EXIT_OK
    if ctx.as_json:
        output.emit_json({"since": since, "until": until, "customer_id": args.customer, "usage": rows})
        return EXIT_OK
    whose = f" of {args.customer}" if args.customer else ""
    emit(rows, as_json=False, columns=_USAGE_COLUMNS,
         title=f"credits charged per day{whose}, {since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC (end excluded)")
    if rows:
        say(f"{sum(r['credits_charged'] for r in rows):,} credits charged in {sum(r['settlements'] for r in rows):,} "
            "settlements")
    return EXIT_OK


# --- reservations and reconcile ------------------------------------------------


@handler
def cmd_reservations_list(ctx, args: argparse.Namespace) -> int:
    states: tuple[str, ...] | None = None
    if args.unknown or args.open:
        states = (("unknown",) if args.unknown else ()) + (("open",) if args.open else ())
    ledger = ledger_of(ctx)
    if args.customer is not None:
        ledger.require_customer(args.customer)  # a typo is an error, never "nothing to show"
    page = ledger.reservation_page(customer_id=args.customer, states=states, limit=args.limit, before=args.before)
    rows = [asdict(r) for r in page.reservations]
    if args.unknown and args.before is None:
        # Tasks of free specialists reserve nothing, yet their unknown jobs wait for an operator too (first page only).
        from workers.reconcile import unknown_free_tasks

        rows += unknown_free_tasks(ledger.engine, customer_id=args.customer, limit=max(0, args.limit - len(rows)))
    if ctx.as_json:
        output.emit_json({"reservations": rows, "next_cursor": page.next_cursor})
        return EXIT_OK
    emit([_reservation_row(r) for r in rows], as_json=False, columns=_RESERVATION_COLUMNS,
         title="reservations (oldest first)")
    if page.next_cursor is not None:
        say(f"older reservations: the same command with --before {page.next_cursor}")
    return EXIT_OK


@handler
def cmd_reservations_show(ctx, args: argparse.Namespace) -> int:
    from taskstate import claims

    ledger = ledger_of(ctx)
    found = ledger.reservation(args.job_id)
    if found is None:
        return fail("reservation_not_found", f"no reservation for job {args.job_id}", as_json=ctx.as_json)
    with ledger.engine.connect() as conn:  # the evidence: the claims of the task's jobs (the console shows it too)
        jobs = claims.task_claims(conn, args.job_id)
    if ctx.as_json:
        output.emit_json(asdict(found) | {"jobs": jobs})
        return EXIT_OK
    emit(asdict(found), as_json=False, title=f"reservation {args.job_id}")
    if jobs:
        emit(jobs, as_json=False, columns=_CLAIM_COLUMNS, title="its jobs' claims (the evidence)")
    return EXIT_OK


_CLAIM_COLUMNS = ["job_id", "state", "worker_id", "claims", "deliveries", "renewed_at", "unknown_at", "unknown_reason"]


@handler
def cmd_reservations_mark_unknown(ctx, args: argparse.Namespace) -> int:
    result = ledger_of(ctx).mark_unknown(args.job_id, args.reason, ctx.operator)
    emit(
        asdict(result),
        as_json=ctx.as_json,
        title="marked unknown (hold and slot kept until reconciled)" if result.outcome == "marked" else "already unknown",
    )
    return EXIT_OK


@handler
def cmd_reconcile(ctx, args: argparse.Namespace) -> int:
    """The ledger's reconcile; for an A2A task also its unknown job's claim and the task's final state,
    all in one transaction (workers.reconcile)."""
    from workers.assembly import USAGE
    from workers.reconcile import ReconcileRefused, reconcile

    ledger = ledger_of(ctx)
    try:
        result = reconcile(
            ledger.engine,
            args.job_id,
            charged=args.charged,
            state=args.state,
            reason=args.reason,
            operator=ctx.operator,
            usage=USAGE,
            limits=ledger.limits,
        )
    except ReconcileRefused as refused:
        return fail(refused.code, refused.message, as_json=ctx.as_json, exit_code=EXIT_USAGE)
    record = result.as_record()
    emit(
        record,
        as_json=ctx.as_json,
        title="reconciled" if record["outcome"] == "reconciled" else "already reconciled the same way",
    )
    return EXIT_OK


# --- ledger -----------------------------------------------------------------


@dataclass(frozen=True)
class _VerifySource:
    engine: Engine
    url: str  # redacted: safe to print
    own: bool  # an engine of its own (the verify database setting), disposed after the command


def _verify_source(ctx) -> _VerifySource:
    """The database the verify reads: SPECIALISTS_LEDGER_VERIFY_DATABASE_URL (e.g. a read replica), or the service's."""
    url = ctx.settings.ledger.verify_database_url
    if url is None:
        return _VerifySource(ctx.engine_at_head(), db.redact_url(ctx.settings.database.url or ctx.url), own=False)
    engine = db.make_engine(db.sqlalchemy_url(url), ctx.settings)
    try:
        db.require_schema_at_head(engine)
    except db.DatabaseUnavailable as unreachable:
        engine.dispose()
        raise db.DatabaseUnavailable(
            f"cannot reach the verify database at {db.redact_url(url)}; check SPECIALISTS_LEDGER_VERIFY_DATABASE_URL "
            "(unset it to verify the service's database)"
        ) from unreachable
    except BaseException:
        engine.dispose()
        raise
    return _VerifySource(engine, db.redact_url(url), own=True)


def _role(audit: Audit) -> str:
    if not audit.standby:
        return "primary"
    return f"standby, replayed to {audit.replayed_at:%Y-%m-%d %H:%M:%S}" if audit.replayed_at else "standby"


@handler
def cmd_ledger_verify(ctx, args: argparse.Namespace) -> int:
    source = _verify_source(ctx)
    started = time.monotonic()

    def report(at: Progress) -> None:
        if at.customers_done == 0:
            progress(f"ledger verify: {at.customers_total:,} customers from {source.url}, "
                     f"{ctx.settings.ledger.verify_customers_per_chunk:,} per statement, in one snapshot")
        else:
            progress(f"ledger verify: {at.customers_done:,} of {at.customers_total:,} customers, "
                     f"{at.violations:,} violation(s), {time.monotonic() - started:.1f} s")

    try:  # one customer's verify takes milliseconds: progress is for the whole ledger's
        audit = Ledger(source.engine, ctx.settings.ledger).audit(args.customer, on_progress=report)
    except CustomerNotFound as unknown:  # nothing is filed under the id in the database the verify reads
        return fail(unknown.code, f"{unknown.message}; nothing of it is in {source.url}", as_json=ctx.as_json)
    except DBAPIError as failed:  # e.g. a standby canceled the read (a conflict with its replay), or the link broke
        return fail(
            "verify_interrupted",
            f"the verify's read of {source.url} failed ({type(failed.orig).__name__}, SQLSTATE "
            f"{getattr(failed.orig, 'sqlstate', None) or 'unknown'}); nothing was changed: run it again. On a "
            "standby a long read is canceled by conflicts with recovery unless hot_standby_feedback is on there.",
            as_json=ctx.as_json,
            exit_code=EXIT_DATABASE,
        )
    finally:
        if source.own:
            source.engine.dispose()
    _emit_audit(ctx, args.customer, source, audit, seconds=time.monotonic() - started)
    if audit.violations:
        if not ctx.as_json:
            say(f"{len(audit.violations)} violation(s): the ledger does not match its journal. Do not adjust "
                "around it; investigate.")
        return EXIT_REFUSED
    return EXIT_OK


def _emit_audit(ctx, customer: str | None, source: _VerifySource, audit: Audit, *, seconds: float) -> None:
    if ctx.as_json:
        output.emit_json(
            {
                "clean": not audit.violations,
                "violations": [asdict(v) for v in audit.violations],
                "totals": {t.account: t.balance for t in audit.totals},  # of the customer's postings with --customer
                "customer_id": customer,
                "customers": audit.customers,
                "database": {"url": source.url, "standby": audit.standby, "replayed_at": audit.replayed_at},
            }
        )
        return
    if audit.violations:
        emit([asdict(v) for v in audit.violations], as_json=False,
             columns=["check", "subject", "customer_id", "detail"], title="ledger violations")
    else:
        whose = f"{customer}'s postings" if customer is not None else "the journal"
        emit([asdict(t) for t in audit.totals], as_json=False, columns=["account", "balance"],
             title=f"ledger is clean; account balances of {whose}")
    say(f"read {audit.customers:,} customer(s) from {source.url} ({_role(audit)}) in {seconds:.1f} s")


_JOURNAL_COLUMNS = ["posting_id", "at", "customer_id", "kind", "lot_id", "job_id", "from_account", "to_account",
                    "credits", "operator", "reason"]


@handler
def cmd_ledger_journal(ctx, args: argparse.Namespace) -> int:
    page = ledger_of(ctx).journal(customer_id=args.customer, operator=args.operator_filter,
                                  kinds=tuple(args.kind) if args.kind else None, before=args.before, limit=args.limit)
    output.emit_page([asdict(line) for line in page.lines], as_json=ctx.as_json, key="lines", columns=_JOURNAL_COLUMNS,
                     title="journal postings (newest first)", next_flag="--before", next_value=page.next_before,
                     older="older postings")
    return EXIT_OK


@handler
def cmd_ledger_expire(ctx, args: argparse.Namespace) -> int:
    moved = ledger_of(ctx).expire(max_lots=args.max_lots)
    emit(
        [asdict(lot) for lot in moved],
        as_json=ctx.as_json,
        columns=["customer_id", "lot_id", "credits", "expires_at"],
        title="expired credits moved to breakage",
    )
    return EXIT_OK


# --- wiring -----------------------------------------------------------------


def _without_operator(common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The common flags but ``--operator``, for a read whose own ``--operator`` filters by who acted."""
    parent = argparse.ArgumentParser(add_help=False)
    for action in common._actions:
        if "--operator" not in action.option_strings:
            parent._add_action(action)
    return parent


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the ledger's subcommands to the `specialists` parser."""
    credits = groups.add_parser("credits", parents=[common], help="customer credits and entitlements").add_subparsers(
        dest="action", required=True
    )
    grant = credits.add_parser("grant", parents=[common], help="grant a lot of credits and/or skill entitlements")
    grant.add_argument("--customer", required=True)
    grant.add_argument("--credits", type=_whole, required=True, help="credits in this lot (0: entitlements only)")
    grant.add_argument("--skill", action="append",
                       help="entitle the skill a specialist's Agent Card publishes, e.g. review (repeat for several)")
    expiry = grant.add_mutually_exclusive_group()
    expiry.add_argument("--expires-at", type=_instant, help="when this lot expires (ISO 8601; UTC if no zone)")
    expiry.add_argument("--expires-in-days", type=positive_int, help="this lot expires this many days from now")
    grant.add_argument("--skill-expires-at", type=_instant, help="when these skill entitlements expire (default: never)")
    grant.add_argument("--max-parallel", type=int,
                       help="the customer's cap on tasks at once from now on, 1 or more (also: `customers set`)")
    grant.add_argument("--priority", type=int, help="lower is drawn down first (default SPECIALISTS_LEDGER_DEFAULT_PRIORITY)")
    grant.add_argument("--idempotency-key", help="repeat the command with the same key safely: nothing moves twice")
    grant.add_argument("--reason", default="", help="why, for the audit record")
    grant.set_defaults(func=cmd_credits_grant)

    show = credits.add_parser("show", parents=[common], help="lots, available, held, entitlements, open reservations")
    show.add_argument("--customer", required=True)
    show.set_defaults(func=cmd_credits_show)

    history = credits.add_parser("history", parents=[common], help="the customer's journal, newest first")
    history.add_argument("--customer", required=True)
    history.add_argument("--limit", type=positive_int, default=50)
    history.set_defaults(func=cmd_credits_history)

    usage = credits.add_parser(
        "usage", parents=[common],
        help=f"credits charged per UTC day, specialist and customer (default: the last {DEFAULT_USAGE_DAYS} days)",
    )
    usage.add_argument("--since", type=_instant, default=None,
                       help="the period's start (ISO 8601 date or time; UTC if no zone)")
    usage.add_argument("--until", type=_instant, default=None,
                       help="the period's end, excluded (default: the end of today, UTC); at most "
                            "SPECIALISTS_LEDGER_MAX_USAGE_DAYS after --since")
    usage.add_argument("--customer", default=None, help="only this customer")
    usage.add_argument("--csv", action="store_true", help="write CSV to standard output (for a spreadsheet)")
    usage.set_defaults(func=cmd_credits_usage)

    adjust = credits.add_parser("adjust", parents=[common], help="an operator correction (+ adds, - removes)")
    adjust.add_argument("--customer", required=True)
    adjust.add_argument("--credits", type=_whole, required=True, help="e.g. 25 or -25")
    adjust.add_argument("--reason", required=True)
    adjust.set_defaults(func=cmd_credits_adjust)

    reservations = groups.add_parser("reservations", parents=[common], help="reservations held for jobs").add_subparsers(
        dest="action", required=True
    )
    lst = reservations.add_parser(
        "list", parents=[common], help="the newest reservations, oldest first; --before pages to older ones"
    )
    lst.add_argument("--customer", default=None)
    lst.add_argument("--unknown", action="store_true", help="only those whose outcome is unknown (to reconcile)")
    lst.add_argument("--open", action="store_true", help="only open ones")
    lst.add_argument("--limit", type=positive_int, default=100)
    lst.add_argument("--before", metavar="CURSOR", default=None,
                     help="the page of older reservations: the cursor printed under the previous page")
    lst.set_defaults(func=cmd_reservations_list)
    one = reservations.add_parser("show", parents=[common], help="one reservation and its resolution")
    one.add_argument("job_id")
    one.set_defaults(func=cmd_reservations_show)
    mark = reservations.add_parser(
        "mark-unknown", parents=[common], help="record that a job's outcome cannot be established (keeps its hold)"
    )
    mark.add_argument("job_id")
    mark.add_argument("--reason", required=True)
    mark.set_defaults(func=cmd_reservations_mark_unknown)

    reconcile = groups.add_parser(
        "reconcile",
        parents=[common],
        help="resolve an unknown job once, with an audit record: its reservation, its claim and its A2A task",
    )
    reconcile.add_argument("job_id", help="the reservation's job id (an A2A task's id)")
    reconcile.add_argument("--charged", type=_whole, required=True, help="credits to charge (0 releases it all)")
    reconcile.add_argument(
        "--state",
        choices=("completed", "failed", "canceled"),
        default=None,
        help="how the task ended, as the customer will see it (required for an A2A task)",
    )
    reconcile.add_argument("--reason", required=True)
    reconcile.set_defaults(func=cmd_reconcile)

    ledger = groups.add_parser("ledger", parents=[common], help="ledger integrity and expiry").add_subparsers(
        dest="action", required=True
    )
    verify = ledger.add_parser(
        "verify", parents=[common],
        help="recompute from the journal, in one snapshot (SPECIALISTS_LEDGER_VERIFY_DATABASE_URL: from a replica); "
             "exit 1 on any violation",
    )
    verify.add_argument("--customer", default=None, help="only this customer (reads only its rows)")
    verify.set_defaults(func=cmd_ledger_verify)
    journal = ledger.add_parser(
        "journal", parents=[_without_operator(common)],
        help="the append-only journal, newest first; --before pages to older postings",
    )
    journal.add_argument("--customer", default=None, help="only this customer's postings")
    journal.add_argument("--operator", dest="operator_filter", metavar="OPERATOR", default=None,
                         help="only the postings this operator journalled (after `journal` it filters; a read "
                              "acts as nobody)")
    journal.add_argument("--kind", action="append", default=None,
                         help="only postings of this kind (repeat for several): grant, reserve, settle, void, "
                              "reconcile, expire, adjust")
    journal.add_argument("--before", type=positive_int, metavar="POSTING_ID", default=None,
                         help="the page of older postings: the posting id printed under the previous page")
    journal.add_argument("--limit", type=positive_int, default=100,
                         help="postings per page (at most SPECIALISTS_LEDGER_MAX_ROWS_PER_LISTING)")
    journal.set_defaults(func=cmd_ledger_journal)
    expire = ledger.add_parser("expire", parents=[common], help="move expired, unreserved credits to breakage now")
    expire.add_argument("--max-lots", type=positive_int, default=None)
    expire.set_defaults(func=cmd_ledger_expire)
