"""``Ledger``: each ledger operation in its own transaction, for callers that have none of their own.

An operation is one statement sent on an autocommit connection, so it is its own
transaction and costs one round trip (no BEGIN, no COMMIT). Money-moving operations run
on the pooled psycopg connection directly: SQLAlchemy's per-statement machinery cost
more client CPU than the server spent on the call (measured ~110 us against ~45 us per
operation), and this is the path every own-transaction reserve and settle takes.
Callers that combine a ledger operation with their own writes use ``ledger.operations``
on their SQLAlchemy connection instead; both send the same statements.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy import Engine

from ledger import reads
from ledger import statements as st
from ledger.limits import LedgerSettings, default_limits
from ledger.results import (
    AdjustResult,
    ExpiredLot,
    GrantResult,
    ReserveResult,
    ResolveResult,
    UnknownResult,
    Violation,
)
from ledger.verify import AccountTotal, totals, verify


class Ledger:
    def __init__(self, engine: Engine, limits: LedgerSettings | None = None) -> None:
        self.engine = engine
        self.limits = limits or default_limits()
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    def _rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run one statement as its own transaction on a pooled connection; return its rows."""
        pooled = self.engine.raw_connection()
        try:
            driver = pooled.driver_connection
            restore = not driver.autocommit  # hand the connection back in the mode the engine gave it
            if restore:
                driver.autocommit = True
            with driver.cursor(row_factory=dict_row) as cursor:
                cursor.execute(sql, params)
                rows = cursor.fetchall()
            if restore:
                driver.autocommit = False
            return rows
        except BaseException:
            pooled.invalidate()  # whatever state it is in now, it does not go back to the pool
            raise
        finally:
            pooled.close()

    def grant(
        self,
        customer_id: str,
        credits: int,
        *,
        operator: str,
        skills: Sequence[str] = (),
        expires_at: datetime | None = None,
        expires_in: timedelta | None = None,
        skill_expires_at: datetime | None = None,
        max_parallel: int | None = None,
        priority: int | None = None,
        idempotency_key: str | None = None,
        reason: str = "",
        now: datetime | None = None,
    ) -> GrantResult:
        params = st.grant_params(
            customer_id,
            credits,
            skills=skills,
            expires_at=expires_at,
            expires_in=expires_in,
            skill_expires_at=skill_expires_at,
            max_parallel=max_parallel,
            priority=priority,
            idempotency_key=idempotency_key,
            operator=operator,
            reason=reason,
            now=now,
            limits=self.limits,
        )
        return st.parse_grant(self._rows(st.GRANT_SQL, params)[0])

    def reserve(
        self, customer_id: str, job_id: str, fingerprint: str, skill: str, credits: int, *, now: datetime | None = None
    ) -> ReserveResult:
        params = st.reserve_params(customer_id, job_id, fingerprint, skill, credits, now=now, limits=self.limits)
        return st.parse_reserve(self._rows(st.RESERVE_SQL, params)[0])

    def settle(self, job_id: str, charged: int, reason: str = "", *, now: datetime | None = None) -> ResolveResult:
        params = st.settle_params(job_id, charged, reason, now=now, limits=self.limits)
        return st.parse_resolve(self._rows(st.SETTLE_SQL, params)[0], charged=charged)

    def void(self, job_id: str, reason: str = "", *, now: datetime | None = None) -> ResolveResult:
        return self.settle(job_id, 0, reason, now=now)

    def mark_unknown(self, job_id: str, reason: str, operator: str, *, now: datetime | None = None) -> UnknownResult:
        params = st.mark_unknown_params(job_id, reason, operator, now=now, limits=self.limits)
        return st.parse_mark_unknown(self._rows(st.MARK_UNKNOWN_SQL, params)[0])

    def reconcile(
        self, job_id: str, charged: int, reason: str, operator: str, *, now: datetime | None = None
    ) -> ResolveResult:
        params = st.reconcile_params(job_id, charged, reason, operator, now=now, limits=self.limits)
        return st.parse_resolve(self._rows(st.RECONCILE_SQL, params)[0], charged=charged)

    def expire(self, *, now: datetime | None = None, max_lots: int | None = None) -> list[ExpiredLot]:
        params = st.expire_params(now=now, max_lots=max_lots, limits=self.limits)
        return [st.parse_expired(row) for row in self._rows(st.EXPIRE_SQL, params)]

    def adjust(
        self, customer_id: str, credits: int, reason: str, operator: str, *, now: datetime | None = None
    ) -> AdjustResult:
        params = st.adjust_params(customer_id, credits, reason, operator, now=now, limits=self.limits)
        return st.parse_adjust(self._rows(st.ADJUST_SQL, params)[0])

    # --- reads ------------------------------------------------------------------

    def verify(self, customer_id: str | None = None) -> list[Violation]:
        with self._autocommit.connect() as conn:
            return verify(conn, customer_id)

    def totals(self) -> list[AccountTotal]:
        with self._autocommit.connect() as conn:
            return totals(conn)

    def account(self, customer_id: str, *, now: datetime | None = None) -> reads.AccountView | None:
        # Several queries: one REPEATABLE READ snapshot so the parts agree with each other.
        with self.engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            view = reads.account(conn, customer_id, now=now, max_rows=self.limits.max_rows_per_listing)
            conn.rollback()
            return view

    def history(self, customer_id: str, *, limit: int = reads.DEFAULT_HISTORY_LINES) -> list[reads.JournalLine]:
        with self._autocommit.connect() as conn:
            return reads.history(conn, customer_id, limit=min(limit, self.limits.max_rows_per_listing))

    def reservations(
        self, *, customer_id: str | None = None, states: tuple[str, ...] | None = None,
        limit: int = reads.DEFAULT_LISTED_RESERVATIONS,
    ) -> list[reads.ReservationView]:
        with self._autocommit.connect() as conn:
            return reads.list_reservations(
                conn, customer_id=customer_id, states=states, limit=min(limit, self.limits.max_rows_per_listing)
            )

    def reservation(self, job_id: str) -> reads.ReservationView | None:
        with self._autocommit.connect() as conn:
            return reads.reservation(conn, job_id)
