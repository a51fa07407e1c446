"""``verify``: recompute the ledger from its journal and list every invariant that does not hold.

Checks:

- lot_mismatch: a lot's granted/held/spent/expired/removed differ from its journal postings
- negative_availability: a lot's journal balance of available credits is below zero
- journal_unknown_lot: a posting names a lot that does not exist for that customer
- account_held_mismatch: an account's held total differs from its lots' held or its open holds
- open_count_mismatch: an account's open_reservations differs from its open/unknown reservations,
  or exceeds max_parallel
- lot_holds_mismatch: a lot's held differs from the holds its customer's open reservations keep on it
- hold_mismatch: a reservation's holds differ from its credits or from its reserve postings,
  or a job's held journal balance is not its credits while open and zero once resolved
- resolved_twice: a job has more than one resolution entry in the journal
- resolution_mismatch: a resolved reservation and its settlement record/postings disagree

Every check compares rows of one customer with rows of the same customer: a lot with its postings, a
reservation with its holds, its postings and its settlement, all under that customer's id. A row filed
under another customer's id than its job's or its lot's is therefore a violation of both customers
(their rows no longer agree), and a customer's verdict needs only its own rows. So one statement
(``_statement``) serves three scopes, each reading every table through its customer index:

- ``verify(conn, customer_id)``: that customer's rows only (``ledger verify --customer``).
- ``verify(conn)``: the whole ledger in one statement, one snapshot (the reference the tests compare with).
- ``verify_in_chunks(conn, ...)``: the whole ledger one range of customer ids at a time, inside the
  caller's one snapshot (``SNAPSHOT_SQL``), reporting progress after each range. The ranges are cut at
  account ids, keyset by id, and tile the whole key space, from below the first account to above the
  last: a row whose customer has no account (a posting naming a customer that does not exist) falls in
  one range and is checked there like any other. So no check needs a pass of its own; only the journal's
  account totals (``totals``) are one whole-table pass, after the ranges.

An empty list means the ledger is clean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, TextClause, text

from ledger.results import Violation
from ledger.errors import CustomerNotFound
from ledger.statements import customer_id_param

# The first statement of the transaction a chunked verify runs in: one snapshot for every range, and no
# write (a hot standby accepts it: REPEATABLE READ, not SERIALIZABLE).
SNAPSHOT_SQL = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

_VERIFY_TEMPLATE = """
WITH
journal AS (SELECT j.* FROM ledger_journal j WHERE {j}),
lots AS (SELECT l.* FROM ledger_lots l WHERE {l}),
accounts AS (SELECT a.* FROM ledger_accounts a WHERE {a}),
reservations AS (SELECT r.* FROM ledger_reservations r WHERE {r}),
settlements AS (SELECT s.* FROM ledger_settlements s WHERE {s}),
unresolved AS (SELECT * FROM reservations WHERE state IN ('open', 'unknown')),
lot_journal AS (
    SELECT lot_id, customer_id,
        coalesce(sum(credits) FILTER (WHERE to_account = 'customer_available'
                                      AND from_account IN ('issued', 'adjustments')), 0) AS granted,
        coalesce(sum(credits) FILTER (WHERE to_account = 'customer_held'), 0)
          - coalesce(sum(credits) FILTER (WHERE from_account = 'customer_held'), 0) AS held,
        coalesce(sum(credits) FILTER (WHERE to_account = 'revenue'), 0)
          - coalesce(sum(credits) FILTER (WHERE from_account = 'revenue'), 0) AS spent,
        coalesce(sum(credits) FILTER (WHERE to_account = 'breakage'), 0)
          - coalesce(sum(credits) FILTER (WHERE from_account = 'breakage'), 0) AS expired,
        coalesce(sum(credits) FILTER (WHERE to_account = 'adjustments'
                                      AND from_account IN ('customer_available', 'customer_held')), 0)
          AS removed,
        coalesce(sum(credits) FILTER (WHERE to_account = 'customer_available'), 0)
          - coalesce(sum(credits) FILTER (WHERE from_account = 'customer_available'), 0) AS available
    FROM journal GROUP BY lot_id, customer_id
),
open_holds AS (
    SELECT u.customer_id, h.lot_id, sum(h.credits) AS credits
      FROM unresolved u, unnest(u.hold_lot_ids, u.hold_credits) AS h(lot_id, credits)
     GROUP BY u.customer_id, h.lot_id
),
job_journal AS (
    SELECT job_id, customer_id,
        coalesce(sum(credits) FILTER (WHERE to_account = 'customer_held'), 0)
          - coalesce(sum(credits) FILTER (WHERE from_account = 'customer_held'), 0) AS held,
        coalesce(sum(credits) FILTER (WHERE to_account = 'revenue'), 0) AS charged,
        count(DISTINCT entry_id) FILTER (WHERE kind IN ('settle', 'void', 'reconcile')) AS resolutions
    FROM journal WHERE job_id IS NOT NULL GROUP BY job_id, customer_id
),
reserve_postings AS (
    SELECT customer_id, job_id, lot_id, sum(credits) AS credits
      FROM journal WHERE kind = 'reserve' GROUP BY customer_id, job_id, lot_id
),
reservation_holds AS (
    SELECT r.customer_id, r.job_id, h.lot_id, sum(h.credits) AS credits
      FROM reservations r, unnest(r.hold_lot_ids, r.hold_credits) AS h(lot_id, credits)
     GROUP BY r.customer_id, r.job_id, h.lot_id
)
SELECT 'lot_mismatch' AS check, 'lot ' || l.lot_id || ' of ' || l.customer_id AS subject,
       format('lot row granted/held/spent/expired/removed = %s/%s/%s/%s/%s, journal says %s/%s/%s/%s/%s (available %s)',
              l.granted, l.held, l.spent, l.expired, l.removed,
              coalesce(j.granted, 0), coalesce(j.held, 0), coalesce(j.spent, 0), coalesce(j.expired, 0),
              coalesce(j.removed, 0), coalesce(j.available, 0)) AS detail,
       l.customer_id
  FROM lots l LEFT JOIN lot_journal j ON j.lot_id = l.lot_id AND j.customer_id = l.customer_id
 WHERE j.lot_id IS NULL
    OR (l.granted, l.held, l.spent, l.expired, l.removed) <> (j.granted, j.held, j.spent, j.expired, j.removed)
    OR l.granted - l.held - l.spent - l.expired - l.removed <> j.available
UNION ALL
SELECT 'negative_availability', 'lot ' || j.lot_id || ' of ' || j.customer_id,
       format('the journal leaves %s credits available', j.available), j.customer_id
  FROM lot_journal j WHERE j.available < 0
UNION ALL
SELECT 'journal_unknown_lot', 'lot ' || j.lot_id || ' of ' || j.customer_id,
       'postings name a lot that does not exist for this customer', j.customer_id
  FROM lot_journal j LEFT JOIN lots l ON l.lot_id = j.lot_id AND l.customer_id = j.customer_id
 WHERE l.lot_id IS NULL
UNION ALL
SELECT 'account_held_mismatch', a.customer_id,
       format('account held %s, its lots hold %s, its open reservations hold %s', a.held,
              coalesce((SELECT sum(l.held) FROM lots l WHERE l.customer_id = a.customer_id), 0),
              coalesce((SELECT sum(u.credits) FROM unresolved u WHERE u.customer_id = a.customer_id), 0)),
       a.customer_id
  FROM accounts a
 WHERE a.held <> coalesce((SELECT sum(l.held) FROM lots l WHERE l.customer_id = a.customer_id), 0)
    OR a.held <> coalesce((SELECT sum(u.credits) FROM unresolved u WHERE u.customer_id = a.customer_id), 0)
UNION ALL
SELECT 'open_count_mismatch', a.customer_id,
       format('account counts %s open reservations (max_parallel %s); there are %s open or unknown',
              a.open_reservations, a.max_parallel,
              (SELECT count(*) FROM unresolved u WHERE u.customer_id = a.customer_id)),
       a.customer_id
  FROM accounts a
 WHERE a.open_reservations <> (SELECT count(*) FROM unresolved u WHERE u.customer_id = a.customer_id)
    OR a.open_reservations > a.max_parallel
UNION ALL
SELECT 'lot_holds_mismatch', 'lot ' || l.lot_id || ' of ' || l.customer_id,
       format('lot holds %s, open reservations hold %s on it', l.held, coalesce(o.credits, 0)), l.customer_id
  FROM lots l LEFT JOIN open_holds o ON o.lot_id = l.lot_id AND o.customer_id = l.customer_id
 WHERE l.held <> coalesce(o.credits, 0)
UNION ALL
SELECT 'hold_mismatch', 'job ' || r.job_id,
       format('reserves %s credits, its holds sum to %s', r.credits,
              (SELECT sum(c) FROM unnest(r.hold_credits) AS c)),
       r.customer_id
  FROM reservations r
 WHERE r.credits <> (SELECT sum(c) FROM unnest(r.hold_credits) AS c)
UNION ALL
SELECT 'hold_mismatch', 'job ' || coalesce(p.job_id, h.job_id),
       format('lot %s: reservation holds %s, reserve postings say %s',
              coalesce(p.lot_id, h.lot_id), coalesce(h.credits, 0), coalesce(p.credits, 0)),
       coalesce(p.customer_id, h.customer_id)
  FROM reserve_postings p
  FULL JOIN reservation_holds h ON h.customer_id = p.customer_id AND h.job_id = p.job_id AND h.lot_id = p.lot_id
 WHERE p.credits IS DISTINCT FROM h.credits
UNION ALL
SELECT 'hold_mismatch', 'job ' || r.job_id,
       format('state %s with %s credits reserved, but the journal holds %s for it',
              r.state, r.credits, coalesce(j.held, 0)),
       r.customer_id
  FROM reservations r LEFT JOIN job_journal j ON j.job_id = r.job_id AND j.customer_id = r.customer_id
 WHERE coalesce(j.held, 0) <> CASE WHEN r.state IN ('open', 'unknown') THEN r.credits ELSE 0 END
UNION ALL
SELECT 'resolved_twice', 'job ' || j.job_id, format('%s resolution entries in the journal', j.resolutions),
       j.customer_id
  FROM job_journal j WHERE j.resolutions > 1
UNION ALL
SELECT 'resolution_mismatch', 'job ' || coalesce(r.job_id, s.job_id),
       format('reservation state %s charged %s; settlement %s charged %s; journal charged %s',
              coalesce(r.state::text, 'missing'), coalesce(r.charged::text, '-'), coalesce(s.kind::text, 'missing'),
              coalesce(s.charged::text, '-'), coalesce(j.charged, 0)),
       coalesce(r.customer_id, s.customer_id)
  FROM reservations r
  FULL JOIN settlements s ON s.job_id = r.job_id AND s.customer_id = r.customer_id
  LEFT JOIN job_journal j ON j.job_id = coalesce(r.job_id, s.job_id)
                         AND j.customer_id = coalesce(r.customer_id, s.customer_id)
 WHERE (r.state IN ('settled', 'voided', 'reconciled')) IS DISTINCT FROM (s.job_id IS NOT NULL)
    OR r.charged IS DISTINCT FROM s.charged
    OR (s.job_id IS NOT NULL AND s.charged <> coalesce(j.charged, 0))
    OR (coalesce(s.kind::text, '') = 'reconcile') <> (coalesce(r.state::text, '') = 'reconciled')
"""

# Both sides of each posting, from one read of the journal.
_TOTALS_TEMPLATE = """
SELECT p.account, sum(p.delta) AS balance
  FROM ledger_journal j,
       LATERAL (VALUES (j.to_account::text, j.credits), (j.from_account::text, -j.credits)) AS p(account, delta)
 WHERE {j}
 GROUP BY p.account ORDER BY p.account
"""

# The next accounts in id order, from a range's lower bound on: the first ``n`` are the range's, the one
# after them (if any) is where the next range starts. Served by the accounts' primary key.
_FIRST_ACCOUNTS_SQL = text("SELECT customer_id FROM ledger_accounts ORDER BY customer_id LIMIT :n")
_NEXT_ACCOUNTS_SQL = text(
    "SELECT customer_id FROM ledger_accounts WHERE customer_id >= :from_customer ORDER BY customer_id LIMIT :n"
)
_ACCOUNT_COUNT_SQL = text("SELECT count(*) FROM ledger_accounts")
# Whether the snapshot is a standby's, and how far it had replayed the primary's log.
_SOURCE_SQL = text("SELECT pg_is_in_recovery(), pg_last_xact_replay_timestamp()")
_HAS_ACCOUNT_SQL = text("SELECT count(*) FROM ledger_accounts WHERE customer_id = :c")
# Whether anything of the ledger's is filed under an id: the customer's row, or (without one) postings or
# reservations, which a verify of that id has to check. Each is one probe of a customer index.
_KNOWN_SQL = text(
    "SELECT EXISTS (SELECT 1 FROM customers WHERE customer_id = :c) "
    "OR EXISTS (SELECT 1 FROM ledger_journal WHERE customer_id = :c) "
    "OR EXISTS (SELECT 1 FROM ledger_reservations WHERE customer_id = :c)"
)


@dataclass(frozen=True)
class Scope:
    """The rows a verify statement reads: one customer's, or those of the customer ids in
    ``[from_customer, to_customer)`` (``None``: unbounded on that side; both ``None``: the whole ledger)."""

    customer_id: str | None = None
    from_customer: str | None = None
    to_customer: str | None = None

    def predicate(self, alias: str) -> str:
        if self.customer_id is not None:
            return f"{alias}.customer_id = :customer_id"
        parts = []
        if self.from_customer is not None:
            parts.append(f"{alias}.customer_id >= :from_customer")
        if self.to_customer is not None:
            parts.append(f"{alias}.customer_id < :to_customer")
        return " AND ".join(parts) or "true"

    def params(self) -> dict[str, str]:
        named = {"customer_id": self.customer_id, "from_customer": self.from_customer, "to_customer": self.to_customer}
        return {name: value for name, value in named.items() if value is not None}

    def shape(self) -> tuple[bool, bool, bool]:
        return (self.customer_id is not None, self.from_customer is not None, self.to_customer is not None)


WHOLE_LEDGER = Scope()


@lru_cache(maxsize=16)
def _statement(template: str, shape: tuple[bool, bool, bool]) -> TextClause:
    """The template with each table's scope written out as plain comparisons, so every table is read
    through its customer index (a ``:param IS NULL OR ...`` scope would hide the index from the planner)."""
    scope = Scope(*("x" if present else None for present in shape))
    return text(template.format(**{alias: scope.predicate(alias) for alias in ("j", "l", "a", "r", "s")}))


def verify_sql(scope: Scope) -> TextClause:
    """The verify statement of ``scope`` (for EXPLAIN; ``scope.params()`` are its parameters)."""
    return _statement(_VERIFY_TEMPLATE, scope.shape())


def totals_sql(scope: Scope) -> TextClause:
    return _statement(_TOTALS_TEMPLATE, scope.shape())


def _violations(conn: Connection, scope: Scope) -> list[Violation]:
    rows = conn.execute(verify_sql(scope), scope.params()).all()
    return [Violation(check=row[0], subject=row[1], detail=row[2], customer_id=row[3]) for row in rows]


def _ordered(violations: list[Violation]) -> list[Violation]:
    return sorted(violations, key=lambda v: (v.check, v.subject, v.customer_id or "", v.detail))


def verify(conn: Connection, customer_id: str | None = None) -> list[Violation]:
    """Every broken invariant, for one customer (its rows only) or the whole ledger, in one statement
    (one snapshot). Empty means clean."""
    scope = Scope(customer_id=customer_id) if customer_id is not None else WHOLE_LEDGER
    return _ordered(_violations(conn, scope))


def verify_range(conn: Connection, from_customer: str | None, to_customer: str | None) -> list[Violation]:
    """Every broken invariant of the customer ids in ``[from_customer, to_customer)`` (``None``: unbounded):
    one statement of ``verify_in_chunks``."""
    return _ordered(_violations(conn, Scope(from_customer=from_customer, to_customer=to_customer)))


@dataclass(frozen=True)
class AccountTotal:
    account: str  # issued, customer_available, customer_held, revenue, breakage, adjustments
    balance: int


def totals(conn: Connection, customer_id: str | None = None) -> list[AccountTotal]:
    """The balance of every journal account, over the whole journal or one customer's postings. They sum to
    zero: each posting has two sides."""
    scope = Scope(customer_id=customer_id) if customer_id is not None else WHOLE_LEDGER
    return [AccountTotal(row[0], int(row[1])) for row in conn.execute(totals_sql(scope), scope.params())]


@dataclass(frozen=True)
class Progress:
    """Where a chunked verify stands after a range: accounts checked of all, and violations found so far."""

    customers_done: int
    customers_total: int
    violations: int


@dataclass(frozen=True)
class Audit:
    """What a verify found, and what it read."""

    violations: list[Violation]
    totals: list[AccountTotal]
    customers: int  # accounts checked
    chunks: int  # statements of the verify proper (1 for one customer)
    standby: bool  # read from a hot standby
    replayed_at: datetime | None  # a standby's last replayed transaction: what the verify saw of the primary


def _source(conn: Connection) -> dict[str, Any]:
    standby, replayed_at = conn.execute(_SOURCE_SQL).one()
    return {"standby": bool(standby), "replayed_at": replayed_at}


def verify_in_chunks(
    conn: Connection, *, customers_per_chunk: int, on_progress: Callable[[Progress], None] | None = None
) -> Audit:
    """The whole ledger, ``customers_per_chunk`` accounts' ids at a time, then the journal's totals.

    Finds exactly what ``verify(conn)`` finds (see the module's docstring). Run it inside one
    snapshot: ``SNAPSHOT_SQL`` as the transaction's first statement, or the ranges may disagree.
    """
    if customers_per_chunk < 1:
        raise ValueError("customers_per_chunk must be at least 1")
    source = _source(conn)
    total = int(conn.execute(_ACCOUNT_COUNT_SQL).scalar_one())
    found: list[Violation] = []
    done = chunks = 0
    lower: str | None = None
    if on_progress is not None:
        on_progress(Progress(customers_done=0, customers_total=total, violations=0))
    while True:
        limit = {"n": customers_per_chunk + 1}
        ids = (
            conn.execute(_FIRST_ACCOUNTS_SQL, limit) if lower is None
            else conn.execute(_NEXT_ACCOUNTS_SQL, limit | {"from_customer": lower})
        ).scalars().all()
        upper = ids[customers_per_chunk] if len(ids) > customers_per_chunk else None
        found += verify_range(conn, lower, upper)
        done += min(len(ids), customers_per_chunk)
        chunks += 1
        if on_progress is not None:
            on_progress(Progress(customers_done=done, customers_total=total, violations=len(found)))
        if upper is None:
            break
        lower = upper
    return Audit(violations=_ordered(found), totals=totals(conn), customers=done, chunks=chunks, **source)


def verify_customer(conn: Connection, customer_id: str) -> Audit:
    """One customer's verify and the totals of its postings (in the caller's snapshot, if it holds one).

    Raises CustomerNotFound for an id nothing is filed under: a typo answers an error, not "clean"."""
    customer_id_param(customer_id)
    if not conn.execute(_KNOWN_SQL, {"c": customer_id}).scalar_one():
        raise CustomerNotFound.of(customer_id)
    source = _source(conn)
    checked = int(conn.execute(_HAS_ACCOUNT_SQL, {"c": customer_id}).scalar_one())
    return Audit(violations=verify(conn, customer_id), totals=totals(conn, customer_id), customers=checked, chunks=1,
                 **source)
