"""The embedded dispatcher: on one machine the outbox is the queue, delivered to the worker endpoint over HTTP.

Each round takes due rows (``workers.dispatch.outbox.take``: ``FOR UPDATE SKIP
LOCKED``, a delivery lease, the attempt counted) up to the free delivery slots,
and delivers each on a delivery thread (``DeliveryThreads``, kept between deliveries) with ``deliver_over_http``, to the worker
endpoint with the fewest deliveries in flight (``dispatch_worker_url`` may list
several; each gets at most ``worker_max_concurrent_jobs`` at once, what a worker
runs), never one that just failed to answer while another did not (a dead
worker's job must reach a live one to be resumed). A delivery holds its HTTP request for the job's whole run, so the lease
of rows in flight is renewed every third of ``dispatch_delivery_lease_s``.

What the worker's answer means (``workers.dispatch.delivery``):
``done`` (finished, already finished, unknown, stale) marks the row delivered, unless the worker's finish
closed it in its own transaction (``row_closed``: every job that ran and finished there);
``retry`` (busy, unreachable, failing) reschedules it with backoff, never sooner
than the worker's ``Retry-After``; ``worker_at_capacity`` (the worker claimed
nothing: its slots are taken, by another dispatcher's deliveries or by a job
still ending) makes the row due again at once, in its place in the fair order, and it is the worker that waits:
no delivery goes to it before its ``Retry-After``. That neither grows the row's backoff nor counts towards
``dispatch_max_attempts``: a full worker is a reason to wait, not a sign the job cannot be delivered; ``refused``
(authentication, a specialist no worker serves: configuration) reschedules it at the longest backoff and says so
in the log, and a ``specialist_not_served`` asks the workers again what they serve. A worker that gave no answer
(killed, restarting) or answered ``worker_stopping`` (its stop signal came; it claimed nothing) gets no delivery for
a while, longer each time in a row, and while another worker answers, the row goes back as a full worker's does,
to that worker at once instead of after a backoff (issue 44 §4).

**Which rows, in which order** (issue 41): a take is fair across customers (``taskstate.outbox.take``: the next
slot goes to the customer furthest behind its weighted share, ``SPECIALISTS_DISPATCH_DEFAULT_WEIGHT`` and
`specialists customers set --weight`), and takes only jobs of a specialist one of the dispatcher's workers serves
(``workers.dispatch.served``: their ``/readyz``). A job goes to a worker URL that serves its specialist. After ``dispatch_max_attempts`` a job no worker
ever claimed is given up (``workers.dispatch.sweeper.give_up``).

Each of the dispatcher's writes is one statement in autocommit (a take, a
renewal, an outcome): no BEGIN or COMMIT around it (issue 17), run once more on
a new connection when its pooled one was dead (``core.db.retrying_once``). A
delivery that ends wakes the next round only when the last one left due rows
behind (every slot taken, or a full batch): otherwise the next round would only
find nothing, a statement per job for nothing; what comes due later wakes it by
notification or by the poll.

A row leaves the set whose lease is renewed before its outcome is recorded, and
both happen under ``_renewing``: a renewal that read the set just before a
delivery ended can never push a rescheduled row's ``available_at`` out to a
whole delivery lease (it did: a job refused as busy waited 30 s instead of 1 s).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

from collections.abc import Callable

import httpx
from opentelemetry.trace import Span, SpanKind
from sqlalchemy import Connection, Engine

from core import db, telemetry
from core.settings import Settings
from workers.auth import JobSigner
from taskstate import outbox
from workers.dispatch import jobs
from workers.dispatch.delivery import DeliveryResult, WorkerConnections, deliver_over_http, retry_delay_s
from workers.dispatch.served import ServedSpecialists
from workers.dispatch.sweeper import give_up
from taskstate.updates import TaskEvents

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 70  # a recovery drill's abrupt exit (dispatch_crash_point)
WORKER_FULL = "worker_at_capacity"  # the worker's answer when it claimed nothing because its slots are taken
NOT_SERVED = "specialist_not_served"  # the worker's answer when it does not run the job's specialist
WORKER_STOPPING = "worker_stopping"  # the worker's answer from its stop signal on: nothing claimed, deliver elsewhere


def crash_here(point: str, settings: Settings) -> None:
    """The recovery-drill hook: die without cleanup, as a killed process would."""
    if settings.dispatch.crash_point == point:
        log.error("dispatch_crash_point=%s: exiting abruptly (a recovery drill)", point)
        logging.shutdown()
        os._exit(CRASH_EXIT_CODE)


def fair_order(settings: Settings, served: tuple[str, ...] | None = None) -> outbox.FairOrder:
    """The fair order a dispatcher with these settings takes in (the embedded one's and the relay's): the default
    weight, the cap per customer the reserve leaves (``Settings.customer_max_slots``), over ``served``."""
    return outbox.FairOrder(default_weight=settings.dispatch.default_weight, served=served,
                            max_per_customer=settings.customer_max_slots)


class DeliveryThreads:
    """The threads that run deliveries, each one delivery at a time, kept from one delivery to the next (issue 44: a
    thread started for each delivery was 15% of the dispatcher's profile, its round waiting for the new thread to
    start). A delivery goes to an idle thread, or to a new one while fewer than ``max_threads`` run; past that it
    waits for the first to end. Daemon threads: stopping the dispatcher abandons deliveries in flight, which is safe
    (their rows come due again after the lease and a redelivery is answered from the job's claim)."""

    def __init__(self, deliver: Callable[[outbox.OutboxRow, str], None], *, max_threads: int) -> None:
        assert max_threads >= 1, max_threads
        self._deliver = deliver
        self.max_threads = max_threads
        self._queue: queue.SimpleQueue[tuple[outbox.OutboxRow, str]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.started = 0  # threads started so far (at most ``max_threads``)
        self._unfinished = 0  # deliveries submitted and not yet ended

    def submit(self, row: outbox.OutboxRow, url: str) -> None:
        with self._lock:
            self._unfinished += 1
            start = self._unfinished > self.started and self.started < self.max_threads
            if start:
                self.started += 1
        if start:
            threading.Thread(target=self._run, name=f"deliver-{self.started}", daemon=True).start()
        self._queue.put((row, url))

    def _run(self) -> None:
        while True:
            row, url = self._queue.get()
            try:
                self._deliver(row, url)
            except Exception:  # the delivery logs its own failures; its thread goes on to the next one
                log.exception("delivering job %s failed; it comes due again after its delivery lease", row.job_id)
            finally:
                with self._lock:
                    self._unfinished -= 1


class EmbeddedDispatcher:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        signer: JobSigner,
        tasks: TaskEvents,
        *,
        name: str,
        wake: threading.Event,
        client: httpx.Client | None = None,
        connections: WorkerConnections | None = None,
    ) -> None:
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.settings = settings
        self.signer = signer
        self.tasks = tasks
        self.name = name
        self.wake = wake
        self.urls = settings.dispatch.worker_urls
        self.slots_per_url = settings.worker.max_concurrent_jobs
        self.capacity = self.slots_per_url * len(self.urls)
        self.client = client or httpx.Client(limits=httpx.Limits(max_connections=len(self.urls) + 1))  # /readyz
        # The deliveries' (``workers.dispatch.delivery``): a URL has at most its slots in flight, and a spare.
        self.connections = connections or WorkerConnections(max_idle_per_url=self.slots_per_url + 1)
        self._lock = threading.Lock()
        self._renewing = threading.Lock()  # a renewal's read of _in_flight and its UPDATE, against a row leaving it
        self._in_flight: dict[int, str] = {}  # dispatch id -> worker URL
        self._full_since: float | None = None  # when every delivery slot was last found taken (for the log)
        self._left_due = False  # the last round may have left due rows behind: a delivery that ends wakes the next
        # Deliveries in a row that got no HTTP answer, per URL: a dead worker is tried only when every other
        # one failed too (a job whose worker died must reach another one to be resumed).
        self._unanswered: dict[str, int] = {url: 0 for url in self.urls}
        self._unreachable_logged_at: float | None = None  # when "no worker answers" was last logged (monotonic)
        self._renew_every_s = settings.dispatch.delivery_lease_s / 3
        self._next_renewal = time.monotonic() + self._renew_every_s
        # No delivery goes to a worker URL before this (monotonic): its Retry-After when it answered
        # worker_at_capacity, a growing pause when it gave no answer or was stopping. Every URL has its entry from
        # the start: delivery threads write it while the loop iterates it, and a dict whose keys never change cannot
        # change size under that iteration ("dictionary changed size during iteration").
        self._full_until: dict[str, float] = {url: 0.0 for url in self.urls}
        self.served = ServedSpecialists(self.urls, self.client, refresh_s=settings.dispatch.served_refresh_s)
        # What can be in flight: every slot, and a delivery whose thread still ends while its slot is taken again.
        self._threads = DeliveryThreads(self._deliver, max_threads=self.capacity + len(self.urls))

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def round(self) -> float:
        """Take and start what is due and fits; return how soon the next round is worth running (s)."""
        self._renew_due()
        # Until this round's take says otherwise, a delivery that ends wakes the next round: one that ends after the
        # slots were counted must not find the flag of an earlier round that had found nothing (issue 17: a closed
        # loop waited for the poll interval).
        self._left_due = True
        now = time.monotonic()
        open_urls = [url for url in self.urls if self._full_until[url] <= now]
        with self._lock:
            load = self._load()
            # A URL whose last delivery got no answer (a worker killed or restarting) gets one delivery at a time, a
            # probe, not a worker's share of the slots.
            free = sum(max(0, (1 if self._unanswered[url] else self.slots_per_url) - load[url]) for url in open_urls)
        if free <= 0:
            self._note_full()
            held_s = [until - now for until in self._full_until.values() if until > now]
            return min([self._renew_every_s, *held_s])  # a delivery ending wakes us sooner
        self._full_since = None
        limit = min(free, self.settings.dispatch.batch_size)
        order = fair_order(self.settings, served=self.served.current())
        rows = db.retrying_once(lambda: self._take(limit, order))
        self._left_due = len(rows) == limit
        if rows:
            crash_here("before_enqueue", self.settings)
        for row in rows:
            with self._lock:
                load = self._load()
                url = min(open_urls, key=lambda u: (not self.served.serves(u, row.specialist_id),
                                                    self._unanswered[u], load[u]))
                self._in_flight[row.dispatch_id] = url
            self._threads.submit(row, url)
        return 0.0 if len(rows) == limit else self.settings.dispatch.poll_interval_s

    def _load(self) -> dict[str, int]:
        """Deliveries in flight per worker URL (under ``_lock``)."""
        load = {url: 0 for url in self.urls}
        for url in self._in_flight.values():
            load[url] += 1
        return load

    def _take(self, limit: int, order: outbox.FairOrder) -> list[outbox.OutboxRow]:
        with self._autocommit.connect() as conn:
            return outbox.take(conn, limit=limit, lease_s=self.settings.dispatch.delivery_lease_s, me=self.name,
                               order=order)

    def _note_full(self) -> None:
        """Say, once a delivery lease, that due jobs wait for a slot (what an operator sees as 'nothing moves')."""
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        elif now - self._full_since >= self.settings.dispatch.delivery_lease_s:
            self._full_since = now
            with self._lock:
                jobs = sorted(self._in_flight)
            log.info(
                "every delivery slot has been taken for %g s (%d per worker, SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS); "
                "due jobs wait; in flight: dispatch ids %s",
                self.settings.dispatch.delivery_lease_s, self.slots_per_url, jobs,
                extra={"event": "dispatch_full"},
            )

    def _note_reachability(self) -> None:
        """WARNING, once a delivery lease while it lasts, when no worker answers at all: every URL's last delivery
        got no HTTP answer. The line counts the deliveries in a row that got none (``unanswered``), so an operator
        (and a log-based alert) sees that nothing can run, not one INFO ``dispatch_retry`` per job."""
        with self._lock:
            unanswered = sum(self._unanswered.values())
            all_down = all(self._unanswered[url] > 0 for url in self.urls)
        now = time.monotonic()
        if all_down:
            last = self._unreachable_logged_at
            if last is None or now - last >= self.settings.dispatch.delivery_lease_s:
                self._unreachable_logged_at = now
                log.warning(
                    "no worker answers: %d delivery(ies) in a row got no answer from %d worker URL(s) "
                    "(SPECIALISTS_DISPATCH_WORKER_URL); jobs wait for redelivery. Start a worker or check the URLs",
                    unanswered, len(self.urls),
                    extra={"event": "workers_unreachable", "count": unanswered},
                )
        elif self._unreachable_logged_at is not None:
            self._unreachable_logged_at = None
            log.info("a worker answers again", extra={"event": "workers_reachable"})

    def _renew_due(self) -> None:
        if time.monotonic() < self._next_renewal:
            return
        self._next_renewal = time.monotonic() + self._renew_every_s
        with self._renewing:
            with self._lock:
                ids = list(self._in_flight)
            if ids:
                try:
                    with self._autocommit.connect() as conn:
                        outbox.renew(conn, ids, lease_s=self.settings.dispatch.delivery_lease_s)
                except Exception as exc:  # the rows come due again: a redelivery is answered from the claim
                    log.warning("renewing %d delivery lease(s) failed: %s", len(ids), type(exc).__name__)

    def _deliver(self, row: outbox.OutboxRow, url: str) -> None:
        with telemetry.span("dispatch.deliver", parent=telemetry.context_of(row.trace_parent), kind=SpanKind.PRODUCER,
                            attributes={"specialists.job_id": row.job_id, "specialists.specialist": row.specialist_id,
                                        "specialists.attempt": row.attempts}) as span:
            self._deliver_traced(row, url, span)

    def _deliver_traced(self, row: outbox.OutboxRow, url: str, span: Span) -> None:
        try:
            job = jobs.build_job(row, self.signer, self.settings, url)
            result = deliver_over_http(job, client=self.connections, timeout_s=self.settings.dispatch.deadline_s)
            telemetry.annotate(span, **{"specialists.verdict": result.verdict, "http.response.status_code": result.status})
            with self._lock:
                self._unanswered[url] = 0 if result.status is not None else self._unanswered[url] + 1
            self._note_reachability()
            crash_here("after_enqueue", self.settings)
            with self._renewing:  # no renewal can now overwrite what _record writes
                self._leave(row)
            self._record(row, url, result)
        except Exception:
            log.exception("delivering job %s failed; it comes due again after its delivery lease", row.job_id)
        finally:
            self._leave(row)
            if self._left_due:
                self.wake.set()

    def _leave(self, row: outbox.OutboxRow) -> None:
        with self._lock:
            self._in_flight.pop(row.dispatch_id, None)

    def _record(self, row: outbox.OutboxRow, url: str, result: DeliveryResult) -> None:
        if result.verdict == "done":
            if not result.row_closed:  # the worker's finish closed it in its transaction: nothing to write
                self._write(lambda conn: outbox.mark_delivered(conn, row))
            return
        error = f"{result.code} (HTTP {result.status})" if result.status else result.code
        if result.code == WORKER_FULL:
            # The row goes back as it was before the take (``outbox.hand_back``): due at once, in its place in the
            # fair order, its customer's turn not spent; it is the worker that waits its Retry-After: no delivery goes
            # to it meanwhile. Had the row waited instead, the rows due while it did (another customer's backlog)
            # would have taken the slot ahead of it.
            delay_s = result.retry_after_s or self.settings.dispatch.retry_base_s
            self._full_until[url] = time.monotonic() + delay_s
            log.info("job %s: the worker is full (%s); delivering to it again in %g s", row.job_id, error, delay_s,
                     extra={"event": "dispatch_retry", "job_id": row.job_id, "code": result.code})
            self._write(lambda conn: outbox.hand_back(conn, row, error=error))
            return
        if (result.status is None or result.code == WORKER_STOPPING) and self._elsewhere(url):
            # The worker is gone (no answer: killed, restarting) or going (its stop signal came): no delivery goes to
            # it for a while, longer each time in a row, and the job goes back as it was before the take, to another
            # worker at once, not after a backoff (issue 44 §4). With no other worker, the backoff below holds.
            # A job that had run there is answered from its claim wherever it goes.
            with self._lock:
                in_a_row = max(1, self._unanswered[url])
            closed_s = min(self.settings.dispatch.retry_max_s, self.settings.dispatch.retry_base_s * 2 ** (in_a_row - 1))
            self._full_until[url] = time.monotonic() + closed_s
            log.info("job %s: the worker did not take it (%s); delivering it to another worker now, to that one again "
                     "in %g s", row.job_id, error, closed_s,
                     extra={"event": "dispatch_retry", "job_id": row.job_id, "code": result.code})
            self._write(lambda conn: outbox.hand_back(conn, row, error=error))
            self._left_due = True  # due now: the delivery's end wakes the next round
            return
        if result.code == NOT_SERVED:
            self.served.stale()
        if row.attempts >= self.settings.dispatch.max_attempts and give_up(self.engine, self.tasks, row, error=error, limits=self.settings.ledger):
            return
        if result.verdict == "refused":
            log.warning(
                "job %s: the worker refused the delivery (%s); check SPECIALISTS_WORKER_JOB_SECRETS, "
                "SPECIALISTS_WORKER_AUDIENCE and the specialists the workers serve. Retrying in %g s",
                row.job_id, error, self.settings.dispatch.retry_max_s,
            )
            delay_s = self.settings.dispatch.retry_max_s
        else:
            delay_s = retry_delay_s(
                row.attempts - 1,
                result.retry_after_s,
                base_s=self.settings.dispatch.retry_base_s,
                max_s=self.settings.dispatch.retry_max_s,
            )
            log.info("job %s: delivery attempt %d answered %s; delivering again in %.1f s", row.job_id,
                     row.attempts, error, delay_s,
                     extra={"event": "dispatch_retry", "job_id": row.job_id, "code": result.code})
        self._write(lambda conn: outbox.reschedule(conn, row, delay_s=delay_s, error=error))

    def _elsewhere(self, url: str) -> bool:
        """Another worker URL answered its last delivery (full or not: the job waits for its slot in the outbox)."""
        with self._lock:
            return any(other != url and self._unanswered[other] == 0 for other in self.urls)

    def _write(self, statement: Callable[[Connection], None]) -> None:
        """One statement of the row's outcome, in autocommit (each is safe to repeat)."""

        def run() -> None:
            with self._autocommit.connect() as conn:
                statement(conn)

        db.retrying_once(run)

    def close(self) -> None:
        self.connections.close()
        with self._lock:
            abandoned = len(self._in_flight)
        if abandoned:
            log.info("stopping with %d delivery(ies) in flight; they come due again after their lease", abandoned)
