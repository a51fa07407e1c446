"""``verify``: recompute the ledger from its journal and list every invariant that does not hold.

One statement, so it reads one consistent snapshot even while money moves. Checks:

- lot_mismatch: a lot's granted/held/spent/expired/removed differ from its journal postings
- negative_availability: a lot's journal balance of available credits is below zero
- journal_unknown_lot: a posting names a lot that does not exist for that customer
- account_held_mismatch: an account's held total differs from its lots' held or its open holds
- open_count_mismatch: an account's open_reservations differs from its open/unknown reservations,
  or exceeds max_parallel
- lot_holds_mismatch: a lot's held differs from the holds open reservations keep on it
- hold_mismatch: a reservation's holds differ from its credits or from its reserve postings,
  or a job's held journal balance is not its credits while open and zero once resolved
- resolved_twice: a job has more than one resolution entry in the journal
- resolution_mismatch: a resolved reservation and its settlement record/postings disagree

An empty list means the ledger is clean.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, text

from ledger.results import Violation

_VERIFY_SQL = text(
    """
WITH
scope AS (SELECT CAST(:customer_id AS text) AS customer_id),
journal AS (
    SELECT j.* FROM ledger_journal j, scope s WHERE s.customer_id IS NULL OR j.customer_id = s.customer_id
),
lots AS (
    SELECT l.* FROM ledger_lots l, scope s WHERE s.customer_id IS NULL OR l.customer_id = s.customer_id
),
accounts AS (
    SELECT a.* FROM ledger_accounts a, scope s WHERE s.customer_id IS NULL OR a.customer_id = s.customer_id
),
reservations AS (
    SELECT r.* FROM ledger_reservations r, scope s WHERE s.customer_id IS NULL OR r.customer_id = s.customer_id
),
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
    SELECT job_id, min(customer_id) AS customer_id,
        coalesce(sum(credits) FILTER (WHERE to_account = 'customer_held'), 0)
          - coalesce(sum(credits) FILTER (WHERE from_account = 'customer_held'), 0) AS held,
        coalesce(sum(credits) FILTER (WHERE to_account = 'revenue'), 0) AS charged,
        count(DISTINCT entry_id) FILTER (WHERE kind IN ('settle', 'void', 'reconcile')) AS resolutions
    FROM journal WHERE job_id IS NOT NULL GROUP BY job_id
),
reserve_postings AS (
    SELECT job_id, lot_id, sum(credits) AS credits FROM journal WHERE kind = 'reserve' GROUP BY job_id, lot_id
),
reservation_holds AS (
    SELECT r.job_id, h.lot_id, sum(h.credits) AS credits
      FROM reservations r, unnest(r.hold_lot_ids, r.hold_credits) AS h(lot_id, credits)
     GROUP BY r.job_id, h.lot_id
)
SELECT 'lot_mismatch' AS check, 'lot ' || l.lot_id || ' of ' || l.customer_id AS subject,
       format('lot row granted/held/spent/expired/removed = %s/%s/%s/%s/%s, journal says %s/%s/%s/%s/%s (available %s)',
              l.granted, l.held, l.spent, l.expired, l.removed,
              coalesce(j.granted, 0), coalesce(j.held, 0), coalesce(j.spent, 0), coalesce(j.expired, 0),
              coalesce(j.removed, 0), coalesce(j.available, 0)) AS detail
  FROM lots l LEFT JOIN lot_journal j ON j.lot_id = l.lot_id AND j.customer_id = l.customer_id
 WHERE j.lot_id IS NULL
    OR (l.granted, l.held, l.spent, l.expired, l.removed) <> (j.granted, j.held, j.spent, j.expired, j.removed)
    OR l.granted - l.held - l.spent - l.expired - l.removed <> j.available
UNION ALL
SELECT 'negative_availability', 'lot ' || j.lot_id || ' of ' || j.customer_id,
       format('the journal leaves %s credits available', j.available)
  FROM lot_journal j WHERE j.available < 0
UNION ALL
SELECT 'journal_unknown_lot', 'lot ' || j.lot_id || ' of ' || j.customer_id,
       'postings name a lot that does not exist for this customer'
  FROM lot_journal j LEFT JOIN lots l ON l.lot_id = j.lot_id AND l.customer_id = j.customer_id
 WHERE l.lot_id IS NULL
UNION ALL
SELECT 'account_held_mismatch', a.customer_id,
       format('account held %s, its lots hold %s, its open reservations hold %s', a.held,
              coalesce((SELECT sum(l.held) FROM lots l WHERE l.customer_id = a.customer_id), 0),
              coalesce((SELECT sum(u.credits) FROM unresolved u WHERE u.customer_id = a.customer_id), 0))
  FROM accounts a
 WHERE a.held <> coalesce((SELECT sum(l.held) FROM lots l WHERE l.customer_id = a.customer_id), 0)
    OR a.held <> coalesce((SELECT sum(u.credits) FROM unresolved u WHERE u.customer_id = a.customer_id), 0)
UNION ALL
SELECT 'open_count_mismatch', a.customer_id,
       format('account counts %s open reservations (max_parallel %s); there are %s open or unknown',
              a.open_reservations, a.max_parallel,
              (SELECT count(*) FROM unresolved u WHERE u.customer_id = a.customer_id))
  FROM accounts a
 WHERE a.open_reservations <> (SELECT count(*) FROM unresolved u WHERE u.customer_id = a.customer_id)
    OR a.open_reservations > a.max_parallel
UNION ALL
SELECT 'lot_holds_mismatch', 'lot ' || l.lot_id || ' of ' || l.customer_id,
       format('lot holds %s, open reservations hold %s on it', l.held, coalesce(o.credits, 0))
  FROM lots l LEFT JOIN open_holds o ON o.lot_id = l.lot_id
 WHERE l.held <> coalesce(o.credits, 0)
UNION ALL
SELECT 'hold_mismatch', 'job ' || r.job_id,
       format('reserves %s credits, its holds sum to %s', r.credits,
              (SELECT sum(c) FROM unnest(r.hold_credits) AS c))
  FROM reservations r
 WHERE r.credits <> (SELECT sum(c) FROM unnest(r.hold_credits) AS c)
UNION ALL
SELECT 'hold_mismatch', 'job ' || coalesce(p.job_id, h.job_id),
       format('lot %s: reservation holds %s, reserve postings say %s',
              coalesce(p.lot_id, h.lot_id), coalesce(h.credits, 0), coalesce(p.credits, 0))
  FROM reserve_postings p FULL JOIN reservation_holds h ON h.job_id = p.job_id AND h.lot_id = p.lot_id
 WHERE p.credits IS DISTINCT FROM h.credits
UNION ALL
SELECT 'hold_mismatch', 'job ' || r.job_id,
       format('state %s with %s credits reserved, but the journal holds %s for it',
              r.state, r.credits, coalesce(j.held, 0))
  FROM reservations r LEFT JOIN job_journal j ON j.job_id = r.job_id
 WHERE coalesce(j.held, 0) <> CASE WHEN r.state IN ('open', 'unknown') THEN r.credits ELSE 0 END
UNION ALL
SELECT 'resolved_twice', 'job ' || j.job_id, format('%s resolution entries in the journal', j.resolutions)
  FROM job_journal j WHERE j.resolutions > 1
UNION ALL
SELECT 'resolution_mismatch', 'job ' || coalesce(r.job_id, s.job_id),
       format('reservation state %s charged %s; settlement %s charged %s; journal charged %s',
              coalesce(r.state::text, 'missing'), coalesce(r.charged::text, '-'), coalesce(s.kind::text, 'missing'),
              coalesce(s.charged::text, '-'), coalesce(j.charged, 0))
  FROM reservations r
  FULL JOIN (SELECT st.* FROM ledger_settlements st, scope sc
              WHERE sc.customer_id IS NULL OR st.customer_id = sc.customer_id) s ON s.job_id = r.job_id
  LEFT JOIN job_journal j ON j.job_id = coalesce(r.job_id, s.job_id)
 WHERE (r.state IN ('settled', 'voided', 'reconciled')) IS DISTINCT FROM (s.job_id IS NOT NULL)
    OR r.charged IS DISTINCT FROM s.charged
    OR (s.job_id IS NOT NULL AND s.charged <> coalesce(j.charged, 0))
    OR (coalesce(s.kind::text, '') = 'reconcile') <> (coalesce(r.state::text, '') = 'reconciled')
ORDER BY 1, 2
"""
)

_TOTALS_SQL = text(
    """
SELECT account, sum(delta) AS balance FROM (
    SELECT to_account::text AS account, credits AS delta FROM ledger_journal
    UNION ALL
    SELECT from_account::text, -credits FROM ledger_journal
) postings GROUP BY account ORDER BY account
"""
)


def verify(conn: Connection, customer_id: str | None = None) -> list[Violation]:
    """Every broken invariant, for one customer or the whole ledger. Empty means clean."""
    rows = conn.execute(_VERIFY_SQL, {"customer_id": customer_id}).all()
    return [Violation(check=row[0], subject=row[1], detail=row[2]) for row in rows]


@dataclass(frozen=True)
class AccountTotal:
    account: str  # issued, customer_available, customer_held, revenue, breakage, adjustments
    balance: int


def totals(conn: Connection) -> list[AccountTotal]:
    """The balance of every journal account. They sum to zero: each posting has two sides."""
    return [AccountTotal(row[0], int(row[1])) for row in conn.execute(_TOTALS_SQL)]
