"""The Cloud Tasks relay: outbox rows committed with their task become Cloud Tasks tasks, then ``sent``.

Each round locks due rows (``FOR UPDATE SKIP LOCKED``: several relays share the
outbox), enqueues each through ``CloudTasksDispatcher`` and marks it ``sent`` in
the same transaction, then commits. A relay that dies between the enqueue and
the commit leaves the rows ``pending``: the next round enqueues them again under
the same deterministic task name, which Cloud Tasks answers ALREADY_EXISTS
(success); the worker's claim makes even a second delivery harmless. Rows whose
enqueue failed are rescheduled with backoff, and given up (failed, voided) after
``dispatch_max_attempts``. A job refused as not dispatchable (its body too
large, the dispatch deadline too short for it) is given up at once.

Once ``sent``, delivery and its retries belong to Cloud Tasks; the worker's
settlement marks the row ``done``.

The Cloud Tasks queue is first in, first out, so the relay is where the fair order of worker slots is kept
(issue 41): it locks rows in the outbox's fair order (``taskstate.outbox.lock_due``, the embedded take's order)
and keeps at most ``SPECIALISTS_DISPATCH_RELAY_MAX_IN_FLIGHT`` rows ``sent``: the rest wait in the outbox, where a
customer's backlog cannot stand in front of another's next job. docs/OPERATIONS.md says what that guarantees.
"""

from __future__ import annotations

import logging

from opentelemetry.trace import SpanKind
from sqlalchemy import Engine

from core import telemetry
from core.settings import Settings
from workers.auth import JobSigner
from taskstate import outbox
from workers.dispatch import jobs
from workers.dispatch.base import DispatchError, DispatchRefused, Dispatcher
from workers.dispatch.delivery import retry_delay_s
from workers.dispatch.embedded import crash_here, fair_order
from workers.dispatch.sweeper import give_up
from taskstate.updates import TaskEvents

log = logging.getLogger(__name__)


class CloudTasksRelay:
    def __init__(
        self, engine: Engine, settings: Settings, signer: JobSigner, tasks: TaskEvents, dispatcher: Dispatcher
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.signer = signer
        self.tasks = tasks
        self.dispatcher = dispatcher
        self.worker_url = settings.dispatch.worker_urls[0]

    @property
    def in_flight(self) -> int:
        return 0

    def round(self) -> float:
        limit = self.settings.dispatch.batch_size
        to_give_up: list[tuple[outbox.OutboxRow, str]] = []
        with self.engine.begin() as conn:
            rows = outbox.lock_due(conn, limit=limit, max_in_flight=self.settings.dispatch.relay_max_in_flight,
                                   order=fair_order(self.settings))
            if rows:
                crash_here("before_enqueue", self.settings)
            for row in rows:
                try:
                    with telemetry.span("dispatch.enqueue", parent=telemetry.context_of(row.trace_parent),
                                        kind=SpanKind.PRODUCER,
                                        attributes={"specialists.job_id": row.job_id,
                                                    "specialists.specialist": row.specialist_id,
                                                    "specialists.attempt": row.attempts}):
                        result = self.dispatcher.enqueue(jobs.build_job(row, self.signer, self.settings,
                                                                        self.worker_url))
                except DispatchRefused as refused:
                    to_give_up.append((row, f"{refused.code}: {refused.message}"))
                    continue
                except DispatchError as failed:
                    if row.attempts >= self.settings.dispatch.max_attempts:
                        to_give_up.append((row, failed.message))
                        continue
                    delay_s = retry_delay_s(
                        row.attempts - 1, None, base_s=self.settings.dispatch.retry_base_s,
                        max_s=self.settings.dispatch.retry_max_s,
                    )
                    log.warning("enqueueing job %s failed (%s); retrying in %.1f s", row.job_id, failed.message, delay_s)
                    outbox.reschedule(conn, row, delay_s=delay_s, error=failed.message, attempts=row.attempts)
                    continue
                log.info("job %s enqueued as %s%s", row.job_id, result.task_name, "" if result.created else " (again)")
                outbox.mark_sent(conn, row)
            if rows:
                crash_here("after_enqueue", self.settings)
        for row, error in to_give_up:
            if not give_up(self.engine, self.tasks, row, error=error, limits=self.settings.ledger):
                with self.engine.begin() as conn:  # the job has a claim after all (a cancel got there): it decides
                    outbox.mark_delivered(conn, row)
        return 0.0 if len(rows) == limit else self.settings.dispatch.poll_interval_s

    def close(self) -> None:
        return None
