"""Read-only views of the ledger for operators and the edge: accounts, lots, entitlements, journal, reservations,
usage by day.

Reads move no money, so they are plain queries (several per view is fine); every list
is bounded by the caller's limit, and each query is one index range whatever the
ledger's history (docs/LEDGER.md, "Indexes"). Reservation listings page with a keyset
cursor on (created_at, job_id).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import date, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, TextClause, text

from ledger.errors import LedgerInputInvalid, ReadTooLarge
from ledger.limits import SCHEMA_MAX_ID_CHARS
from ledger.statements import customer_id_param


@dataclass(frozen=True)
class LotView:
    lot_id: int
    source: str  # grant | adjustment
    grant_id: int | None
    priority: int
    granted: int
    held: int
    spent: int
    expired: int
    removed: int
    remaining: int  # granted - held - spent - expired - removed
    expires_at: datetime | None
    swept_at: datetime | None
    created_at: datetime
    usable: bool  # not expired at the time of the view: its remaining can be reserved


@dataclass(frozen=True)
class EntitlementView:
    skill: str
    grant_id: int
    expires_at: datetime | None
    active: bool


@dataclass(frozen=True)
class ReservationView:
    job_id: str
    customer_id: str
    skill: str
    credits: int
    state: str
    charged: int | None
    created_at: datetime
    unknown_at: datetime | None
    unknown_reason: str | None
    unknown_by: str | None
    resolved_at: datetime | None
    resolution_kind: str | None
    resolution_reason: str | None
    resolved_by: str | None
    hold_lot_ids: tuple[int, ...]
    hold_credits: tuple[int, ...]


@dataclass(frozen=True)
class AccountView:
    customer_id: str
    max_parallel: int
    open_reservations: int
    held: int
    available: int  # reservable now: the remaining credits of usable lots (all lots, whatever max_rows)
    expired_unswept: int  # remaining credits of lots past expiry that the next sweep moves to breakage
    lots: tuple[LotView, ...]  # at most max_rows, in draw-down order
    entitlements: tuple[EntitlementView, ...]
    unresolved: tuple[ReservationView, ...]  # open and unknown reservations, oldest first


@dataclass(frozen=True)
class CustomerView:
    customer_id: str
    created_at: datetime
    max_parallel: int | None  # None: no credit account yet (a customer only a key was issued to)
    open_reservations: int
    held: int
    available: int  # reservable now, as AccountView.available
    spent: int  # charged so far, over all its lots


@dataclass(frozen=True)
class CustomerPage:
    customers: tuple[CustomerView, ...]  # in id order
    next_after: str | None  # the page after it (pass it as ``after``); None: no more


@dataclass(frozen=True)
class JournalLine:
    posting_id: int
    entry_id: int
    at: datetime
    kind: str
    customer_id: str
    lot_id: int
    job_id: str | None
    from_account: str
    to_account: str
    credits: int
    reason: str | None
    operator: str | None


_RESERVATION_COLUMNS = """
    r.job_id, r.customer_id, r.skill, r.credits, r.state::text AS state, r.charged, r.created_at, r.unknown_at,
    r.unknown_reason, r.unknown_by, r.resolved_at, s.kind::text AS resolution_kind, s.reason AS resolution_reason,
    s.operator AS resolved_by, r.hold_lot_ids, r.hold_credits
"""


# The queries of the views, each served by an index (docs/LEDGER.md, "Indexes"); tests/test_query_plans.py
# reads their plans on a seeded database.
# The account's row (primary key) and the totals of its lots (ledger_lots_drawdown: the customer's lots).
ACCOUNT_SQL = text(
    "SELECT a.customer_id, a.max_parallel, a.open_reservations, a.held, t.at, "
    "COALESCE(SUM(l.granted - l.held - l.spent - l.expired - l.removed) FILTER (WHERE l.swept_at IS NULL "
    "AND (l.expires_at IS NULL OR l.expires_at > t.at)), 0) AS available, "
    "COALESCE(SUM(l.granted - l.held - l.spent - l.expired - l.removed) FILTER (WHERE l.swept_at IS NOT NULL "
    "OR l.expires_at <= t.at), 0) AS expired_unswept "
    "FROM ledger_accounts a CROSS JOIN (SELECT COALESCE(CAST(:now AS timestamptz), now()) AS at) t "
    "LEFT JOIN ledger_lots l ON l.customer_id = a.customer_id "
    "WHERE a.customer_id = :c GROUP BY a.customer_id, a.max_parallel, a.open_reservations, a.held, t.at"
)
# The customer's lots in draw-down order (ledger_lots_drawdown).
LOTS_SQL = text(
    "SELECT lot_id, CASE WHEN grant_id IS NULL THEN 'adjustment' ELSE 'grant' END AS source, grant_id, priority, "
    "granted, held, spent, expired, removed, granted - held - spent - expired - removed AS remaining, expires_at, "
    "swept_at, created_at, (swept_at IS NULL AND (expires_at IS NULL OR expires_at > :at)) AS usable "
    "FROM ledger_lots WHERE customer_id = :c ORDER BY priority, expires_at NULLS LAST, lot_id LIMIT :n"
)
# The customer's entitlements (the primary key, customer first).
ENTITLEMENTS_SQL = text(
    "SELECT skill, grant_id, expires_at, (expires_at IS NULL OR expires_at > :at) AS active "
    "FROM ledger_entitlements WHERE customer_id = :c ORDER BY skill, grant_id LIMIT :n"
)
# The customer's newest postings (ledger_journal_customer, read backwards).
_JOURNAL_COLUMNS = (
    "posting_id, entry_id, at, kind::text AS kind, customer_id, lot_id, job_id, from_account::text AS from_account, "
    "to_account::text AS to_account, credits, reason, operator"
)
HISTORY_SQL = text(
    f"SELECT {_JOURNAL_COLUMNS} FROM ledger_journal WHERE customer_id = :c ORDER BY posting_id DESC LIMIT :n"
)
# One reservation and its settlement (both primary keys).
RESERVATION_SQL = text(
    f"SELECT {_RESERVATION_COLUMNS} FROM ledger_reservations r "
    "LEFT JOIN ledger_settlements s ON s.job_id = r.job_id WHERE r.job_id = :j"
)

# Whether the service knows a customer (the primary key).
CUSTOMER_EXISTS_SQL = text("SELECT EXISTS (SELECT 1 FROM customers WHERE customer_id = :c)")
# A page of customers in id order with their balances: the customers' key from the cursor on, each one's account
# by its key and its lots by ledger_lots_drawdown (the customer's lots).
CUSTOMERS_SQL = text(
    "SELECT c.customer_id, c.created_at, a.max_parallel, COALESCE(a.open_reservations, 0) AS open_reservations, "
    "COALESCE(a.held, 0) AS held, COALESCE(l.available, 0) AS available, COALESCE(l.spent, 0) AS spent "
    "FROM customers c LEFT JOIN ledger_accounts a ON a.customer_id = c.customer_id "
    "LEFT JOIN LATERAL (SELECT SUM(granted - held - spent - expired - removed) FILTER (WHERE swept_at IS NULL "
    "AND (expires_at IS NULL OR expires_at > now())) AS available, SUM(spent) AS spent "
    "FROM ledger_lots WHERE customer_id = c.customer_id) l ON true "
    "WHERE c.customer_id > :after AND strpos(c.customer_id, :contains) > 0 ORDER BY c.customer_id LIMIT :n"
)
CUSTOMER_SQL = text(str(CUSTOMERS_SQL).replace(
    "WHERE c.customer_id > :after AND strpos(c.customer_id, :contains) > 0 ORDER BY c.customer_id LIMIT :n",
    "WHERE c.customer_id = :c"))
# The longest text a customer search may contain (a customer id is at most 63 characters).
MAX_CUSTOMER_SEARCH_CHARS = 63

# How many customers a listing shows when its caller names no number (within max_rows_per_listing).
DEFAULT_LISTED_CUSTOMERS = 100
# How many reservations a listing shows when its caller names no number (within max_rows_per_listing).
DEFAULT_LISTED_RESERVATIONS = 100
# How many journal lines a customer's history shows when its caller names no number.
DEFAULT_HISTORY_LINES = 50


def _reservation(row) -> ReservationView:
    data = dict(row)
    data["hold_lot_ids"] = tuple(data["hold_lot_ids"])
    data["hold_credits"] = tuple(data["hold_credits"])
    return ReservationView(**data)


def account(conn: Connection, customer_id: str, *, max_rows: int, now: datetime | None = None) -> AccountView | None:
    """The customer's account with its lots, entitlements and unresolved reservations; None if it has none.

    ``max_rows`` bounds each listed part; the totals always cover every lot.
    """
    head = conn.execute(ACCOUNT_SQL, {"c": customer_id, "now": now}).mappings().first()
    if head is None:
        return None
    at = head["at"]
    lots = tuple(
        LotView(**dict(row))
        for row in conn.execute(LOTS_SQL, {"c": customer_id, "at": at, "n": max_rows}).mappings()
    )
    entitlements = tuple(
        EntitlementView(**dict(row))
        for row in conn.execute(ENTITLEMENTS_SQL, {"c": customer_id, "at": at, "n": max_rows}).mappings()
    )
    unresolved = tuple(
        list_reservations(conn, customer_id=customer_id, states=("open", "unknown"), limit=max_rows)
    )
    return AccountView(
        customer_id=head["customer_id"],
        max_parallel=head["max_parallel"],
        open_reservations=head["open_reservations"],
        held=head["held"],
        available=int(head["available"]),
        expired_unswept=int(head["expired_unswept"]),
        lots=lots,
        entitlements=entitlements,
        unresolved=unresolved,
    )


def customer_exists(conn: Connection, customer_id: str) -> bool:
    return bool(conn.execute(CUSTOMER_EXISTS_SQL, {"c": customer_id}).scalar_one())


def customer_page(conn: Connection, *, after: str | None = None, contains: str = "",
                  limit: int = DEFAULT_LISTED_CUSTOMERS) -> CustomerPage:
    """The first ``limit`` customers after the id ``after`` (none: from the first), in id order, with balances;
    only those whose id contains ``contains`` when it is given (a search: it reads the ids in order until the page
    is full, which is the whole table for a rare text: fine for a service's customers, not for millions)."""
    if limit < 1:
        raise LedgerInputInvalid(f"a listing shows at least 1 row, got {limit}")
    if len(contains) > MAX_CUSTOMER_SEARCH_CHARS:
        raise LedgerInputInvalid(f"a customer search is at most {MAX_CUSTOMER_SEARCH_CHARS} characters (a customer "
                                 "id's length)")
    rows = conn.execute(CUSTOMERS_SQL, {"after": after or "", "contains": contains, "n": limit + 1}).mappings().all()
    page = tuple(
        CustomerView(**{**row, "held": int(row["held"]), "available": int(row["available"]), "spent": int(row["spent"])})
        for row in rows[:limit]
    )
    return CustomerPage(customers=page, next_after=page[-1].customer_id if len(rows) > limit else None)


def customer(conn: Connection, customer_id: str) -> CustomerView | None:
    """One customer with its balances, as ``customer_page`` lists it; None if the service does not know it."""
    row = conn.execute(CUSTOMER_SQL, {"c": customer_id}).mappings().first()
    if row is None:
        return None
    return CustomerView(**{**row, "held": int(row["held"]), "available": int(row["available"]), "spent": int(row["spent"])})


def history(conn: Connection, customer_id: str, *, limit: int = DEFAULT_HISTORY_LINES) -> list[JournalLine]:
    """The customer's journal postings, newest first."""
    rows = conn.execute(HISTORY_SQL, {"c": customer_id, "n": limit}).mappings()
    return [JournalLine(**dict(row)) for row in rows]


# The states a reservation listing may ask for (the enum ledger_reservation_state, migration 0002).
RESERVATION_STATES = ("open", "unknown", "settled", "voided", "reconciled")
_UNRESOLVED = {"open", "unknown"}
# A listing's cursor is a job id (at most SCHEMA_MAX_ID_CHARS) and an instant, encoded: far below this.
MAX_CURSOR_CHARS = 1024


@dataclass(frozen=True)
class ReservationPage:
    reservations: tuple[ReservationView, ...]  # oldest first: the newest ones older than the page's cursor
    next_cursor: str | None  # the page of older ones (pass it as ``before``); None: nothing older is left


def encode_cursor(created_at: datetime, job_id: str) -> str:
    """The opaque cursor of a listing page that starts below (``created_at``, ``job_id``)."""
    raw = json.dumps([created_at.isoformat(), job_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """(created_at, job_id) of a cursor ``encode_cursor`` made; ``LedgerInputInvalid`` for anything else."""
    refused = LedgerInputInvalid(
        "the cursor is not one a reservation listing printed; copy the `--before` value again, "
        "or list without it to start from the newest"
    )
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR_CHARS:
        raise refused
    try:
        at, job_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        created_at = datetime.fromisoformat(at)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise refused from None
    if not isinstance(job_id, str) or not job_id or created_at.tzinfo is None:
        raise refused
    return created_at, job_id


@lru_cache(maxsize=64)
def listing_sql(by_customer: bool, states: frozenset[str] | None, paged: bool) -> TextClause:
    """The listing's statement, with only the conditions it needs, each as a plain comparison the planner
    can serve with an index: the customer's (customer_id, created_at); for open and unknown ones the
    partial index of unresolved reservations (its predicate is written out, for the planner to match);
    for unknown and reconciled ones the small index of reservations ever marked unknown; otherwise the
    index on created_at. The cursor is a keyset on (created_at, job_id), newest first."""
    where = []
    if by_customer:
        where.append("r.customer_id = :c")
    if states is not None:
        where.append("r.state = ANY(CAST(:states AS ledger_reservation_state[]))")
        if states <= _UNRESOLVED:
            where.append("r.state IN ('open', 'unknown')")
        elif states <= {"unknown", "reconciled"}:
            where.append("r.unknown_at IS NOT NULL")
    if paged:
        where.append("(r.created_at, r.job_id) < (CAST(:before_at AS timestamptz), CAST(:before_job AS text))")
    return text(
        f"SELECT {_RESERVATION_COLUMNS} FROM ledger_reservations r "
        "LEFT JOIN ledger_settlements s ON s.job_id = r.job_id "
        + (f"WHERE {' AND '.join(where)} " if where else "")
        + "ORDER BY r.created_at DESC, r.job_id DESC LIMIT :n"
    )


def listing(
    *,
    customer_id: str | None = None,
    states: tuple[str, ...] | None = None,
    limit: int = DEFAULT_LISTED_RESERVATIONS,
    before: str | None = None,
) -> tuple[TextClause, dict[str, Any]]:
    """The statement of a reservation page and its parameters (``limit`` + 1 rows: the one more says a page
    follows). Refuses an unknown state and a cursor no listing made (``LedgerInputInvalid``)."""
    if limit < 1:
        raise LedgerInputInvalid(f"a listing shows at least 1 row, got {limit}")
    wanted = None if states is None else frozenset(states)
    if wanted is not None and not wanted <= set(RESERVATION_STATES):
        raise LedgerInputInvalid(
            f"reservation states are {', '.join(RESERVATION_STATES)}; got {', '.join(sorted(wanted))}"
        )
    params: dict[str, Any] = {"n": limit + 1}
    if customer_id is not None:
        params["c"] = customer_id_param(customer_id)
    if wanted is not None:
        params["states"] = sorted(wanted)
    if before is not None:
        params["before_at"], params["before_job"] = decode_cursor(before)
    return listing_sql(customer_id is not None, wanted, before is not None), params


def reservation_page(
    conn: Connection,
    *,
    customer_id: str | None = None,
    states: tuple[str, ...] | None = None,
    limit: int = DEFAULT_LISTED_RESERVATIONS,
    before: str | None = None,
) -> ReservationPage:
    """The newest ``limit`` reservations older than the cursor ``before`` (none: from the newest), optionally of
    one customer and in some states, oldest first; and the cursor of the page before them.

    Each page is one index range read from where the previous one stopped, so a page costs the same at
    any depth and however long the history; paging on from the first page lists every reservation that
    existed at the first page exactly once, newest page first.
    """
    sql, params = listing(customer_id=customer_id, states=states, limit=limit, before=before)
    rows = [_reservation(row) for row in conn.execute(sql, params).mappings()]
    page, rest = rows[:limit], rows[limit:]
    next_cursor = encode_cursor(page[-1].created_at, page[-1].job_id) if rest else None
    return ReservationPage(reservations=tuple(reversed(page)), next_cursor=next_cursor)


def list_reservations(
    conn: Connection,
    *,
    customer_id: str | None = None,
    states: tuple[str, ...] | None = None,
    limit: int = DEFAULT_LISTED_RESERVATIONS,
) -> list[ReservationView]:
    """The newest ``limit`` reservations (optionally of one customer, in some states), oldest first: the
    first page of ``reservation_page``."""
    return list(reservation_page(conn, customer_id=customer_id, states=states, limit=limit).reservations)


def reservation(conn: Connection, job_id: str) -> ReservationView | None:
    row = conn.execute(RESERVATION_SQL, {"j": job_id}).mappings().first()
    return _reservation(row) if row else None


# --- the journal, a page at a time -----------------------------------------------------------------------------

# The kinds of journal entries (the enum ledger_entry_kind, migration 0002).
JOURNAL_KINDS = ("grant", "reserve", "settle", "void", "reconcile", "expire", "adjust")
# The kinds operators and the expiry sweep post: few whatever the traffic, indexed apart (ledger_journal_operator_kinds,
# migration 0230). Reserves, settlements and voids are dense in the journal's key.
_RARE_KINDS = frozenset({"grant", "expire", "adjust", "reconcile"})
# How many journal lines a page shows when its caller names no number (within max_rows_per_listing).
DEFAULT_JOURNAL_LINES = 100


@dataclass(frozen=True)
class JournalPage:
    lines: tuple[JournalLine, ...]  # newest first
    next_before: int | None  # the page of older postings (pass it as ``before``); None: nothing older is left


@lru_cache(maxsize=64)
def journal_sql(by_customer: bool, by_operator: bool, kinds: frozenset[str] | None, paged: bool) -> TextClause:
    """The journal page's statement with only the conditions it needs, newest posting first. Each filter has its
    index: a customer's postings (ledger_journal_customer, backwards), an operator's (ledger_journal_operator), the
    rare kinds (ledger_journal_operator_kinds: its predicate is written out, for the planner to match); otherwise
    the journal's key read backwards from ``before``."""
    where = []
    if by_customer:
        where.append("customer_id = :c")
    if by_operator:
        where.append("operator = :o")
    if kinds is not None:
        where.append("kind = ANY(CAST(:kinds AS ledger_entry_kind[]))")
        if kinds <= _RARE_KINDS:
            where.append("kind IN ('grant', 'expire', 'adjust', 'reconcile')")
    if paged:
        where.append("posting_id < :before")
    return text(
        f"SELECT {_JOURNAL_COLUMNS} FROM ledger_journal "
        + (f"WHERE {' AND '.join(where)} " if where else "")
        + "ORDER BY posting_id DESC LIMIT :n"
    )


def journal_page(
    conn: Connection,
    *,
    customer_id: str | None = None,
    operator: str | None = None,
    kinds: tuple[str, ...] | None = None,
    before: int | None = None,
    limit: int,
) -> JournalPage:
    """The newest ``limit`` postings below the posting id ``before`` (none: from the newest), optionally of one
    customer, by one operator, of some kinds (empty: any); and where the next page starts. Refuses an unknown
    kind, listing the kinds (``LedgerInputInvalid``). Checks the customer id's form only: whether the service
    knows it is the caller's check (``Ledger.require_customer``)."""
    if limit < 1:
        raise LedgerInputInvalid(f"a listing shows at least 1 row, got {limit}")
    wanted = frozenset(kinds) if kinds else None
    if wanted is not None and not wanted <= set(JOURNAL_KINDS):
        unknown = ", ".join(sorted(wanted - set(JOURNAL_KINDS)))
        raise LedgerInputInvalid(f"journal kinds are {', '.join(JOURNAL_KINDS)}; got {unknown}")
    params: dict[str, Any] = {"n": limit + 1}
    if customer_id is not None:
        params["c"] = customer_id_param(customer_id)
    if operator is not None:
        if not isinstance(operator, str) or not 0 < len(operator) <= SCHEMA_MAX_ID_CHARS:
            raise LedgerInputInvalid(f"an operator is 1-{SCHEMA_MAX_ID_CHARS} characters, as journalled")
        params["o"] = operator
    if wanted is not None:
        params["kinds"] = sorted(wanted)
    if before is not None:
        if not isinstance(before, int) or isinstance(before, bool) or before < 1:
            raise LedgerInputInvalid(f"`before` is a posting id (a whole number, 1 or more), got {before!r}")
        params["before"] = before
    sql = journal_sql(customer_id is not None, operator is not None, wanted, before is not None)
    rows = [JournalLine(**dict(row)) for row in conn.execute(sql, params).mappings()]
    page = tuple(rows[:limit])
    return JournalPage(lines=page, next_before=page[-1].posting_id if len(rows) > limit else None)


# --- usage ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsageRow:
    day: date  # UTC
    customer_id: str
    specialist_id: str  # the reservation's skill: the specialist the edge reserved the task under
    credits_charged: int
    settlements: int  # settlements, voids and reconciles resolved that day (a void charges 0)


# Settlements resolved in [since, until), summed per UTC day, customer and specialist: the settlements' time index
# (ledger_settlements_at, or ledger_settlements_customer_at for one customer, migration 0230), each one's
# reservation by its key.
_USAGE_SQL = (
    "SELECT CAST(s.at AT TIME ZONE 'UTC' AS date) AS day, s.customer_id, r.skill AS specialist_id, "
    "SUM(s.charged) AS credits_charged, count(*) AS settlements "
    "FROM ledger_settlements s JOIN ledger_reservations r ON r.job_id = s.job_id "
    "WHERE s.at >= :since AND s.at < :until {customer}"
    "GROUP BY 1, 2, 3 ORDER BY day, specialist_id, s.customer_id LIMIT :n"
)
USAGE_SQL = text(_USAGE_SQL.format(customer=""))
USAGE_OF_CUSTOMER_SQL = text(_USAGE_SQL.format(customer="AND s.customer_id = :c "))


def usage_by_day(
    conn: Connection, *, since: datetime, until: datetime, customer_id: str | None = None, max_rows: int
) -> list[UsageRow]:
    """Credits charged per UTC day, customer and specialist, from the settlements resolved in [``since``,
    ``until``), ordered by day, specialist, customer. More than ``max_rows`` rows is refused (``ReadTooLarge``),
    never cut: a chart or a CSV of part of a period would show wrong totals. The period's bound is the caller's
    (``Ledger.usage``)."""
    if since.tzinfo is None or until.tzinfo is None:
        raise LedgerInputInvalid("a usage period's instants carry a time zone")
    if not since < until:
        raise LedgerInputInvalid(f"a usage period ends after it starts; got {since.isoformat()} to {until.isoformat()}")
    params: dict[str, Any] = {"since": since, "until": until, "n": max_rows + 1}
    if customer_id is not None:
        params["c"] = customer_id_param(customer_id)
    rows = conn.execute(USAGE_OF_CUSTOMER_SQL if customer_id is not None else USAGE_SQL, params).mappings().all()
    if len(rows) > max_rows:
        raise ReadTooLarge(
            f"the period holds more than {max_rows} rows of usage (day, customer, specialist); choose a shorter "
            "period or one customer, or raise SPECIALISTS_LEDGER_MAX_ROWS_PER_LISTING"
        )
    return [
        UsageRow(day=row["day"], customer_id=row["customer_id"], specialist_id=row["specialist_id"],
                 credits_charged=int(row["credits_charged"]), settlements=int(row["settlements"]))
        for row in rows
    ]


def reservations_relation() -> str:
    """Every reservation as a sub-query (job_id, customer_id, specialist_id, credits, state, charged), for the task
    state room's reads that show what a task reserved and was charged (joined by the reservation's key)."""
    return ("(SELECT job_id, customer_id, skill AS specialist_id, credits, state::text AS state, charged "
            "FROM ledger_reservations)")
