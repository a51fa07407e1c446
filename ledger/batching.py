"""Group commit of one customer's own-transaction calls: concurrent reserves and settles share a transaction.

Every reserve and settle of a customer takes that customer's lock, and a transaction's
lock is held until its commit's WAL flush is done, so on a hot account each call cost a
critical section plus a flush, one after another (issue 17). Here at most two statements
of one customer are in flight; the calls of that customer that arrive meanwhile wait in a
queue. When a statement returns, the first waiting call leads: it takes up to
``max_operations`` waiting calls (its own first), sends them as one ``ledger_batch`` call
(one lock, one commit, one flush), and hands each caller its own row. A call that finds
a free slot goes at once, alone, as its single statement: nothing waits for a timer or a
batch to fill.

If the batch's statement raises, its transaction rolled back as a whole, and every call
in it runs again alone: a failure (or a dead connection) reaches only the callers whose
own call fails. Refusals are rows, never exceptions, so they never take the batch down.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ledger.errors import LedgerError

Row = Mapping[str, Any]


@dataclass(eq=False)
class Call:
    """One reserve or settle waiting for its answer: a row, or the exception its own run raised."""

    kind: Literal["reserve", "settle"]
    params: dict[str, Any]
    done: threading.Event | None = None  # made when the call has to wait, so a call that runs at once makes none
    leads: bool = False  # set when the call is woken to run the next batch rather than with an answer
    row: Row | None = None
    error: BaseException | None = None

    def answer(self) -> Row:
        if self.error is not None:
            raise self.error
        assert self.row is not None, "a call is answered with a row or an error"
        return self.row


def _wake(call: Call) -> None:
    assert call.done is not None, "only a call that waits in the queue is woken"
    call.done.set()


# Statements of one customer in flight at once. With two, the next batch is already waiting at
# the server when the lock is released, so the lock never idles through a client round trip,
# and two calls of one customer that meet by chance (the common collision on many accounts)
# queue on the database's lock as before, without a hop through this process. Measured
# against one in flight, alternating in one process: the same within this machine's noise
# on one hot account and on 1,000 accounts (docs/BENCHMARKS.md).
STATEMENTS_IN_FLIGHT_PER_CUSTOMER = 2


@dataclass
class _Customer:
    running: int = 0  # statements of this customer in flight (at most STATEMENTS_IN_FLIGHT_PER_CUSTOMER)
    # The calls waiting for a statement of their own: at most one per calling thread (each waits
    # for its own answer), as many as waited on the database's lock before.
    waiting: deque[Call] = field(default_factory=deque)


class CustomerBatches:
    """The queue of waiting calls per customer, and the leader hand-off."""

    def __init__(
        self,
        run_alone: Callable[[Call], Row],
        run_together: Callable[[str, list[Call]], list[Row]],
        max_operations: int,
    ) -> None:
        if max_operations < 1:
            raise ValueError(f"max_operations must be at least 1, got {max_operations}")
        self._run_alone = run_alone
        self._run_together = run_together
        self.max_operations = max_operations
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._watchers = 0  # threads in wait_until: only then is a change announced
        self._customers: dict[str, _Customer] = {}  # present while a statement of the customer is in flight
        self.batches_run = 0  # statements that carried more than one call
        self.largest_batch = 0

    def call(self, customer_id: str, call: Call) -> Row:
        if self.max_operations == 1:  # batching off: every call alone, none waits in the process
            self._run(customer_id, [call])
            return call.answer()
        with self._lock:
            customer = self._customers.setdefault(customer_id, _Customer())
            if customer.running < STATEMENTS_IN_FLIGHT_PER_CUSTOMER:
                customer.running += 1
            else:
                call.done = threading.Event()
                customer.waiting.append(call)
            if self._watchers:
                self._changed.notify_all()
        if call.done is not None:
            call.done.wait()
            if not call.leads:
                return call.answer()
        self._lead(customer_id, call)
        return call.answer()

    def wait_until(self, customer_id: str, *, running: int, waiting: int, timeout_s: float) -> bool:
        """True once ``running`` statements of the customer are in flight and ``waiting`` calls queue (for tests)."""

        def reached() -> bool:
            customer = self._customers.get(customer_id)
            return customer is not None and customer.running >= running and len(customer.waiting) >= waiting

        with self._changed:
            self._watchers += 1
            try:
                return self._changed.wait_for(reached, timeout=timeout_s)
            finally:
                self._watchers -= 1

    def _lead(self, customer_id: str, first: Call) -> None:
        with self._lock:
            waiting = self._customers[customer_id].waiting
            batch = [first] + [waiting.popleft() for _ in range(min(len(waiting), self.max_operations - 1))]
        try:
            self._run(customer_id, batch)
        finally:
            with self._lock:
                customer = self._customers[customer_id]
                successor = customer.waiting.popleft() if customer.waiting else None
                if successor is None:  # its statement slot is free again
                    customer.running -= 1
                    if not customer.running:
                        del self._customers[customer_id]
            for follower in batch[1:]:
                if follower.row is None and follower.error is None:  # the leader was interrupted
                    follower.error = LedgerError("the ledger call was interrupted before it ran; retry it")
                _wake(follower)
            if successor is not None:  # it takes over this statement slot
                successor.leads = True
                _wake(successor)

    def _run(self, customer_id: str, batch: list[Call]) -> None:
        if len(batch) > 1:
            try:
                rows = self._run_together(customer_id, batch)
            except Exception:  # rolled back as a whole: each call runs alone below
                pass
            else:
                for call, row in zip(batch, rows, strict=True):
                    call.row = row
                with self._lock:
                    self.batches_run += 1
                    self.largest_batch = max(self.largest_batch, len(batch))
                return
        for call in batch:
            try:
                call.row = self._run_alone(call)
            except Exception as problem:  # this call's own failure, raised in its caller's thread
                call.error = problem
