"""``Ledger``: each ledger operation in its own transaction, for callers that have none of their own.

An operation is one statement sent on an autocommit connection, so it is its own
transaction and costs one round trip (no BEGIN, no COMMIT). Money-moving operations run
on the pooled psycopg connection directly: SQLAlchemy's per-statement machinery cost
more client CPU than the server spent on the call (measured ~110 us against ~45 us per
operation), and this is the path every own-transaction reserve and settle takes.
Callers that combine a ledger operation with their own writes use ``ledger.operations``
on their SQLAlchemy connection instead; both send the same statements.

Reserves, and settles whose caller names the customer, go through ``ledger.batching``:
the calls of one customer that arrive while another of its calls runs are sent together
as one ``ledger_batch`` call, so a hot account pays one lock hand-off and one commit
flush per batch instead of per call. A call with nobody of its customer running is sent
alone, at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy import Engine

from ledger import reads
from ledger import statements as st
from ledger.batching import Call, CustomerBatches
from ledger.errors import CustomerNotFound
from ledger.limits import LedgerSettings, check_period, default_limits
from ledger.results import (
    AccountResult,
    AdjustResult,
    ExpiredLot,
    GrantResult,
    ReserveResult,
    ResolveResult,
    UnknownResult,
    Violation,
)
from ledger.verify import (
    SNAPSHOT_SQL,
    AccountTotal,
    Audit,
    Progress,
    totals,
    verify,
    verify_customer,
    verify_in_chunks,
)


class Ledger:
    def __init__(self, engine: Engine, limits: LedgerSettings | None = None) -> None:
        self.engine = engine
        self.limits = limits or default_limits()
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.batches = CustomerBatches(self._run_alone, self._run_together, self.limits.max_operations_per_batch)

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

    def _run_alone(self, call: Call) -> Mapping[str, Any]:
        return self._rows(st.RESERVE_SQL if call.kind == "reserve" else st.SETTLE_SQL, call.params)[0]

    def _run_together(self, key: str, calls: list[Call]) -> list[Mapping[str, Any]]:
        return self.run_batch([(call.kind, call.params) for call in calls])

    def run_batch(self, operations: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Mapping[str, Any]]:
        """Run ("reserve" | "settle", params) operations in one transaction; their rows, in the order given.

        What ``reserve`` and ``settle`` send when calls of one customer overlap: settlements
        first (in job id order), then reservations in the order given. Parse each row with
        ``statements.parse_reserve`` or ``statements.parse_resolve``.
        """
        rows = self._rows(st.BATCH_SQL, st.batch_params(operations))
        by_index = {row["op_index"]: row for row in rows}
        return [by_index[index] for index in range(1, len(operations) + 1)]

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
        require_customer: bool = False,
    ) -> GrantResult:
        """See ``operations.grant``; ``require_customer`` refuses an id the service does not know (CustomerNotFound)."""
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
        if require_customer:
            return st.parse_grant_existing(self._rows(st.GRANT_EXISTING_SQL, params), customer_id)
        return st.parse_grant(self._rows(st.GRANT_SQL, params)[0])

    def open_account(
        self, customer_id: str, *, operator: str, max_parallel: int | None = None, reason: str = "",
        now: datetime | None = None,
    ) -> AccountResult:
        """Add a customer (see ``operations.open_account``)."""
        params = st.open_account_params(customer_id, max_parallel, operator, reason, now=now, limits=self.limits)
        return st.parse_account(self._rows(st.OPEN_ACCOUNT_SQL, params)[0])

    def set_max_parallel(
        self, customer_id: str, max_parallel: int, *, operator: str, reason: str, now: datetime | None = None
    ) -> AccountResult:
        """Change a customer's cap without a grant (see ``operations.set_max_parallel``)."""
        params = st.set_max_parallel_params(customer_id, max_parallel, operator, reason, now=now, limits=self.limits)
        return st.parse_account(self._rows(st.SET_MAX_PARALLEL_SQL, params)[0])

    def reserve(
        self, customer_id: str, job_id: str, fingerprint: str, skill: str, credits: int, *, now: datetime | None = None
    ) -> ReserveResult:
        params = st.reserve_params(customer_id, job_id, fingerprint, skill, credits, now=now, limits=self.limits)
        return st.parse_reserve(self.batches.call(customer_id, Call("reserve", params)))

    def settle(
        self,
        job_id: str,
        charged: int,
        reason: str = "",
        *,
        now: datetime | None = None,
        customer_id: str | None = None,
    ) -> ResolveResult:
        """Settle a job; ``customer_id`` (its reservation's customer) lets it share a batch with that customer's calls.

        The settlement is the job's whichever customer is named: a wrong name only groups it
        with another customer's calls (the batch then also takes the owner's lock).
        """
        params = st.settle_params(job_id, charged, reason, now=now, limits=self.limits)
        if customer_id is None:
            row = self._rows(st.SETTLE_SQL, params)[0]
        else:
            row = self.batches.call(st.customer_id_param(customer_id), Call("settle", params))
        return st.parse_resolve(row, charged=charged)

    def void(
        self, job_id: str, reason: str = "", *, now: datetime | None = None, customer_id: str | None = None
    ) -> ResolveResult:
        return self.settle(job_id, 0, reason, now=now, customer_id=customer_id)

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
        """Every broken invariant, of one customer or the whole ledger, in one statement (see ``ledger.verify``)."""
        with self._autocommit.connect() as conn:
            return verify(conn, customer_id)

    def audit(
        self, customer_id: str | None = None, *, on_progress: Callable[[Progress], None] | None = None
    ) -> Audit:
        """The operator's verify: one customer's rows, or the whole ledger ``verify_customers_per_chunk`` accounts
        at a time with progress after each range, and the journal's totals, all in one REPEATABLE READ, READ
        ONLY snapshot (which a hot standby serves too). Finds what ``verify`` finds."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql(SNAPSHOT_SQL)
            if customer_id is not None:
                found = verify_customer(conn, customer_id)
            else:
                found = verify_in_chunks(
                    conn, customers_per_chunk=self.limits.verify_customers_per_chunk, on_progress=on_progress
                )
            conn.rollback()
            return found

    def totals(self, customer_id: str | None = None) -> list[AccountTotal]:
        with self._autocommit.connect() as conn:
            return totals(conn, customer_id)

    def require_customer(self, customer_id: str) -> str:
        """The id, if it is well formed (LedgerInputInvalid) and the service knows the customer (CustomerNotFound):
        what every operator read of one customer checks first, so a typo is an error and never an empty answer."""
        st.customer_id_param(customer_id)
        with self._autocommit.connect() as conn:
            if not reads.customer_exists(conn, customer_id):
                raise CustomerNotFound.of(customer_id)
        return customer_id

    def customers(self, *, after: str | None = None, contains: str = "",
                  limit: int = reads.DEFAULT_LISTED_CUSTOMERS) -> reads.CustomerPage:
        """A page of customers in id order, after the id ``after``, whose ids contain ``contains`` (see
        ``reads.customer_page``)."""
        with self._autocommit.connect() as conn:
            return reads.customer_page(conn, after=after, contains=contains,
                                       limit=min(limit, self.limits.max_rows_per_listing))

    def customer(self, customer_id: str) -> reads.CustomerView:
        """One customer's balances (available, held, spent), as `customers list` shows them; CustomerNotFound
        for an id the service does not know."""
        st.customer_id_param(customer_id)
        with self._autocommit.connect() as conn:
            found = reads.customer(conn, customer_id)
        if found is None:
            raise CustomerNotFound.of(customer_id)
        return found

    def account(self, customer_id: str, *, now: datetime | None = None) -> reads.AccountView | None:
        # Several queries: one REPEATABLE READ snapshot so the parts agree with each other.
        with self.engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            view = reads.account(conn, customer_id, now=now, max_rows=self.limits.max_rows_per_listing)
            conn.rollback()
            return view

    def history(self, customer_id: str, *, limit: int = reads.DEFAULT_HISTORY_LINES) -> list[reads.JournalLine]:
        with self._autocommit.connect() as conn:
            return reads.history(conn, customer_id, limit=min(limit, self.limits.max_rows_per_listing))

    def journal(
        self,
        *,
        customer_id: str | None = None,
        operator: str | None = None,
        kinds: tuple[str, ...] | None = None,
        before: int | None = None,
        limit: int = reads.DEFAULT_JOURNAL_LINES,
    ) -> reads.JournalPage:
        """A page of the journal, newest posting first, below the posting id ``before`` (see ``reads.journal_page``);
        a customer the service does not know is refused (``require_customer``), never an empty page."""
        if customer_id is not None:
            self.require_customer(customer_id)
        with self._autocommit.connect() as conn:
            return reads.journal_page(
                conn, customer_id=customer_id, operator=operator, kinds=kinds, before=before,
                limit=min(limit, self.limits.max_rows_per_listing),
            )

    def usage(
        self, *, since: datetime, until: datetime, customer_id: str | None = None
    ) -> list[reads.UsageRow]:
        """Credits charged per UTC day, customer and specialist in [``since``, ``until``) (see ``reads.usage_by_day``):
        a period of at most ``max_usage_days`` (SPECIALISTS_LEDGER_MAX_USAGE_DAYS), at most ``max_rows_per_listing``
        rows; a customer the service does not know is refused."""
        check_period(since, until, self.limits)
        if customer_id is not None:
            self.require_customer(customer_id)
        with self._autocommit.connect() as conn:
            return reads.usage_by_day(conn, since=since, until=until, customer_id=customer_id,
                                      max_rows=self.limits.max_rows_per_listing)

    def reservation_page(
        self, *, customer_id: str | None = None, states: tuple[str, ...] | None = None,
        limit: int = reads.DEFAULT_LISTED_RESERVATIONS, before: str | None = None,
    ) -> reads.ReservationPage:
        """A page of reservations, newest first from the cursor ``before`` (see ``reads.reservation_page``)."""
        with self._autocommit.connect() as conn:
            return reads.reservation_page(
                conn, customer_id=customer_id, states=states, limit=min(limit, self.limits.max_rows_per_listing),
                before=before,
            )

    def reservations(
        self, *, customer_id: str | None = None, states: tuple[str, ...] | None = None,
        limit: int = reads.DEFAULT_LISTED_RESERVATIONS,
    ) -> list[reads.ReservationView]:
        """The newest ``limit`` reservations, oldest first: the first page of ``reservation_page``."""
        return list(self.reservation_page(customer_id=customer_id, states=states, limit=limit).reservations)

    def reservation(self, job_id: str) -> reads.ReservationView | None:
        with self._autocommit.connect() as conn:
            return reads.reservation(conn, job_id)

