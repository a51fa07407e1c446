"""Read-only views of the ledger for operators and the edge: accounts, lots, entitlements, journal, reservations.

Reads move no money, so they are plain queries (several per view is fine); every list
is bounded by the caller's limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text


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
    head = conn.execute(
        text(
            "SELECT a.customer_id, a.max_parallel, a.open_reservations, a.held, t.at, "
            "COALESCE(SUM(l.granted - l.held - l.spent - l.expired - l.removed) FILTER (WHERE l.swept_at IS NULL "
            "AND (l.expires_at IS NULL OR l.expires_at > t.at)), 0) AS available, "
            "COALESCE(SUM(l.granted - l.held - l.spent - l.expired - l.removed) FILTER (WHERE l.swept_at IS NOT NULL "
            "OR l.expires_at <= t.at), 0) AS expired_unswept "
            "FROM ledger_accounts a CROSS JOIN (SELECT COALESCE(CAST(:now AS timestamptz), now()) AS at) t "
            "LEFT JOIN ledger_lots l ON l.customer_id = a.customer_id "
            "WHERE a.customer_id = :c GROUP BY a.customer_id, a.max_parallel, a.open_reservations, a.held, t.at"
        ),
        {"c": customer_id, "now": now},
    ).mappings().first()
    if head is None:
        return None
    at = head["at"]
    lots = tuple(
        LotView(**dict(row))
        for row in conn.execute(
            text(
                "SELECT lot_id, CASE WHEN grant_id IS NULL THEN 'adjustment' ELSE 'grant' END AS source, grant_id, priority, granted, held, spent, expired, removed, "
                "granted - held - spent - expired - removed AS remaining, expires_at, swept_at, created_at, "
                "(swept_at IS NULL AND (expires_at IS NULL OR expires_at > :at)) AS usable "
                "FROM ledger_lots WHERE customer_id = :c ORDER BY priority, expires_at NULLS LAST, lot_id LIMIT :n"
            ),
            {"c": customer_id, "at": at, "n": max_rows},
        ).mappings()
    )
    entitlements = tuple(
        EntitlementView(**dict(row))
        for row in conn.execute(
            text(
                "SELECT skill, grant_id, expires_at, (expires_at IS NULL OR expires_at > :at) AS active "
                "FROM ledger_entitlements WHERE customer_id = :c ORDER BY skill, grant_id LIMIT :n"
            ),
            {"c": customer_id, "at": at, "n": max_rows},
        ).mappings()
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


def history(conn: Connection, customer_id: str, *, limit: int = DEFAULT_HISTORY_LINES) -> list[JournalLine]:
    """The customer's journal postings, newest first."""
    rows = conn.execute(
        text(
            "SELECT posting_id, entry_id, at, kind, lot_id, job_id, from_account, to_account, credits, reason, "
            "operator FROM ledger_journal WHERE customer_id = :c ORDER BY posting_id DESC LIMIT :n"
        ),
        {"c": customer_id, "n": limit},
    ).mappings()
    return [JournalLine(**dict(row)) for row in rows]


def list_reservations(
    conn: Connection,
    *,
    customer_id: str | None = None,
    states: tuple[str, ...] | None = None,
    limit: int = DEFAULT_LISTED_RESERVATIONS,
) -> list[ReservationView]:
    """The newest ``limit`` reservations (optionally of one customer, in some states), oldest first.

    Served by the customer index, or for unknown-only lists by the index of reservations
    ever marked unknown. Open reservations of all customers at once need a table scan:
    an operator command, not a hot path (see docs/LEDGER.md).
    """
    only_ever_unknown = states is not None and set(states) <= {"unknown", "reconciled"}
    rows = conn.execute(
        text(
            f"SELECT {_RESERVATION_COLUMNS} FROM ledger_reservations r "
            "LEFT JOIN ledger_settlements s ON s.job_id = r.job_id "
            "WHERE (CAST(:c AS text) IS NULL OR r.customer_id = :c) "
            "AND (CAST(:states AS text[]) IS NULL OR r.state = ANY(CAST(:states AS ledger_reservation_state[]))) "
            + ("AND r.unknown_at IS NOT NULL " if only_ever_unknown else "")
            + "ORDER BY r.created_at DESC, r.job_id DESC LIMIT :n"
        ),
        {"c": customer_id, "states": list(states) if states is not None else None, "n": limit},
    ).mappings()
    return [_reservation(row) for row in reversed(list(rows))]


def reservation(conn: Connection, job_id: str) -> ReservationView | None:
    row = conn.execute(
        text(
            f"SELECT {_RESERVATION_COLUMNS} FROM ledger_reservations r "
            "LEFT JOIN ledger_settlements s ON s.job_id = r.job_id WHERE r.job_id = :j"
        ),
        {"j": job_id},
    ).mappings().first()
    return _reservation(row) if row else None
