"""Read-only views of the ledger for operators and the edge: accounts, lots, entitlements, journal, reservations.

Reads move no money, so they are plain queries (several per view is fine); every list
is bounded by the caller's limit, and each query is one index range whatever the
ledger's history (docs/LEDGER.md, "Indexes"). Reservation listings page with a keyset
cursor on (created_at, job_id).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, TextClause, text

from ledger.errors import LedgerInputInvalid
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
HISTORY_SQL = text(
    "SELECT posting_id, entry_id, at, kind, lot_id, job_id, from_account, to_account, credits, reason, "
    "operator FROM ledger_journal WHERE customer_id = :c ORDER BY posting_id DESC LIMIT :n"
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
    "WHERE c.customer_id > :after ORDER BY c.customer_id LIMIT :n"
)

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


def customer_page(conn: Connection, *, after: str | None = None, limit: int = DEFAULT_LISTED_CUSTOMERS) -> CustomerPage:
    """The first ``limit`` customers after the id ``after`` (none: from the first), in id order, with balances."""
    if limit < 1:
        raise LedgerInputInvalid(f"a listing shows at least 1 row, got {limit}")
    rows = conn.execute(CUSTOMERS_SQL, {"after": after or "", "n": limit + 1}).mappings().all()
    page = tuple(
        CustomerView(**{**row, "held": int(row["held"]), "available": int(row["available"]), "spent": int(row["spent"])})
        for row in rows[:limit]
    )
    return CustomerPage(customers=page, next_after=page[-1].customer_id if len(rows) > limit else None)


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
