"""The dispatcher process (`specialists dispatcher`): outbox -> workers, and the lease sweeper.

One loop for both backends (``dispatch_backend``): ``embedded`` delivers outbox
rows to the worker endpoint itself (``EmbeddedDispatcher``); ``cloud_tasks``
relays them to Cloud Tasks (``CloudTasksRelay``). The loop runs a round when the
edge's ``edge_dispatch`` notification arrives (admission sends it after its
commit), when a delivery ends, or every ``dispatch_poll_interval_s`` at the
latest (a missed notification, a rescheduled row coming due). A thread of its
own runs the lease sweeper every ``dispatch_sweep_interval_s`` and the pruner
(the retention of ended tasks' events, finished jobs' outbox rows and claims,
expired Idempotency-Keys; bounded statements, see ``pruner``) every
``task_events_prune_interval_s``, so that neither, waiting on a lock, can hold
up a delivery. With push signing secrets set, a third thread delivers push notifications
(``workers.dispatch.push``), woken by every task event's notification: a webhook never holds up a job. Any
number of dispatcher processes may run against one database.

SIGTERM or SIGINT stops it at once: rows in flight stay leased and come due
again for another dispatcher; nothing is lost and nothing runs twice.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg
from sqlalchemy import Engine

from taskstate import reads
from taskstate.notify import DISPATCH, PUSH, libpq_url
from core import db, telemetry
from core.errors import ServiceError
from core.specs import SpecInvalid, load_specs
from core.settings import Settings
from workers.auth import JobSigner
from workers.dispatch.embedded import EmbeddedDispatcher
from workers.dispatch.pruner import Pruner
from workers.dispatch.sweeper import LeaseSweeper
from workers.instance import host_name
from workers.settlement import TaskSettlement
from taskstate.updates import TaskEvents

if TYPE_CHECKING:
    from workers.dispatch.relay import CloudTasksRelay

log = logging.getLogger(__name__)

LISTEN_RECONNECT_MAX_S = 5.0


class DispatcherNotConfigured(ServiceError):
    code = "dispatcher_not_configured"


def check_dispatcher_settings(settings: Settings) -> None:
    if not settings.worker.job_secrets:
        raise DispatcherNotConfigured(
            "no worker job secret is configured, so the dispatcher cannot sign jobs and every worker would refuse "
            "them; set SPECIALISTS_WORKER_JOB_SECRETS (the same value as the workers')"
        )


class OutboxListener:
    """LISTEN on the edge's dispatch channel in a thread; every notification sets ``wake``."""

    def __init__(self, sqlalchemy_url: str, wake: threading.Event, connect_timeout_s: int,
                 channel: str = DISPATCH) -> None:
        self.conninfo = libpq_url(sqlalchemy_url)
        self.channel = channel
        self.wake = wake
        self.connect_timeout_s = connect_timeout_s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="outbox-listener", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        backoff_s = 0.1
        while not self.stopping.is_set():
            try:
                with psycopg.connect(
                    self.conninfo,
                    autocommit=True,
                    connect_timeout=self.connect_timeout_s,
                    application_name="specialists-dispatcher-listener",
                ) as conn:
                    conn.execute(f"LISTEN {self.channel}")
                    backoff_s = 0.1
                    self.wake.set()  # anything committed while we were not listening
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=0.5):
                            self.wake.set()
            except Exception as exc:  # the database went away: the loop polls meanwhile
                log.warning("dispatch listener lost its connection (%s); retrying", type(exc).__name__)
                self.stopping.wait(backoff_s)
                backoff_s = min(backoff_s * 2, LISTEN_RECONNECT_MAX_S)


def build_backend(
    settings: Settings, engine: Engine, tasks: TaskEvents, *, name: str, wake: threading.Event
) -> "EmbeddedDispatcher | CloudTasksRelay":
    signer = JobSigner.from_settings(settings)
    if settings.dispatch.backend == "cloud_tasks":
        from workers.dispatch.cloud_tasks import CloudTasksDispatcher
        from workers.dispatch.relay import CloudTasksRelay

        return CloudTasksRelay(engine, settings, signer, tasks, CloudTasksDispatcher.from_settings(settings))
    return EmbeddedDispatcher(engine, settings, signer, tasks, name=name, wake=wake)


def _maintain(settings: Settings, engine: Engine, sweeper: LeaseSweeper, stop: threading.Event) -> None:
    """The sweeper and the pruner, in a thread of their own: a slow sweep or prune never holds up a delivery."""
    pruner = Pruner(engine, settings)  # keeps its walk over ended tasks between rounds
    next_prune = time.monotonic()
    while not stop.is_set():
        try:
            sweeper.sweep()
            sweeper.give_up_abandoned()
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + settings.dispatch.task_events_prune_interval_s
                pruner.round()
        except Exception as exc:  # the database restarting, a network fault: the next interval tries again
            log.warning("dispatch maintenance failed (%s: %s); retrying", type(exc).__name__, exc)
        stop.wait(settings.dispatch.sweep_interval_s)


def _start_push(settings: Settings, engine: Engine, url: str, name: str,
                stop: threading.Event) -> tuple[threading.Thread, OutboxListener] | None:
    """The push notifications' delivery loop, on a thread of its own, woken when an event of a task with push
    configurations was written (``notify.PUSH``; it also polls every SPECIALISTS_PUSH_POLL_INTERVAL_S); nothing
    when push is off (no SPECIALISTS_PUSH_SIGNING_SECRETS)."""
    if not settings.push.enabled:
        return None
    from workers.dispatch.push import PushDeliverer

    wake = threading.Event()
    deliverer = PushDeliverer(engine, settings, name=name, wake=wake)
    listener = OutboxListener(url, wake, settings.database.connect_timeout_s, channel=PUSH)
    listener.start()
    thread = threading.Thread(target=deliverer.run, args=(stop,), name="push-deliveries", daemon=True)
    thread.start()
    return thread, listener


def served_specialists(settings: Settings) -> list[str]:
    """The specialists of the specs folder, read once as the dispatcher starts (not at each export); none when it
    does not load, said once: the gauges of the rest still come."""
    try:
        return sorted(load_specs(settings.hosted.specs_dir))
    except SpecInvalid as exc:
        log.warning("the specs did not load, so no specialists.workers.live gauge is exported: %s", exc)
        return []


def service_points(settings: Settings, engine: Engine, specialists: list[str]) -> "telemetry.ServicePoints":
    """The service's state for the gauges (``core.telemetry.observe_service``): the read `specialists health` makes,
    for ``specialists`` (``served_specialists``)."""
    with engine.connect() as conn:
        facts = reads.service_facts(conn, specialists=specialists, live_s=settings.health.worker_live_s,
                                    failures_window_s=settings.health.failures_window_s)
    return facts.points()


def run_dispatcher(
    settings: Settings,
    *,
    database_url: str | None = None,
    stop: threading.Event | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run until ``stop`` is set, or SIGTERM/SIGINT arrives (when called on the main thread)."""
    check_dispatcher_settings(settings)
    telemetry.setup(settings.telemetry, role="dispatcher")  # before its engine: the statements are instrumented
    try:
        _run(settings, database_url, stop, on_ready)
    finally:
        telemetry.shutdown()  # the last spans and counts of this dispatcher


def _run(settings: Settings, database_url: str | None, stop: threading.Event | None,
         on_ready: Callable[[], None] | None) -> None:
    url = database_url or db.database_url(settings)
    engine = db.make_engine(url, settings)
    db.require_schema_at_head(engine)
    stop = stop or threading.Event()
    wake = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: (stop.set(), wake.set()))
    name = f"dispatcher:{host_name()}:{os.getpid()}"
    tasks = TaskEvents(engine)
    backend = build_backend(settings, engine, tasks, name=name, wake=wake)
    sweeper = LeaseSweeper(
        engine,
        TaskSettlement(tasks, operator=name, limits=settings.ledger),
        max_resumes=settings.hosted.max_resumes,
        resume_window_s=settings.hosted.resume_window_s,
        abandoned_after_s=settings.worker.job_max_age_s + settings.dispatch.deadline_s
        if settings.dispatch.backend == "cloud_tasks"
        else None,
        dead_after_s=settings.worker.dead_after_s,
    )
    specialists = served_specialists(settings)
    telemetry.observe_service(lambda: service_points(settings, engine, specialists))
    listener = OutboxListener(url, wake, settings.database.connect_timeout_s)
    listener.start()
    log.info(
        "dispatcher %s ready: %s to %s", name, settings.dispatch.backend, ", ".join(settings.dispatch.worker_urls)
    )
    if on_ready is not None:
        on_ready()
    maintenance = threading.Thread(
        target=_maintain, args=(settings, engine, sweeper, stop), name="dispatcher-maintenance", daemon=True
    )
    maintenance.start()
    push_stop = threading.Event()
    pushing = _start_push(settings, engine, url, name, push_stop)
    try:
        while not stop.is_set():
            wake.clear()
            try:
                delay_s = backend.round()
            except Exception as exc:  # the database restarting, a network fault: try again shortly
                log.warning("dispatch round failed (%s: %s); retrying", type(exc).__name__, exc)
                delay_s = min(1.0, settings.dispatch.poll_interval_s)
            if delay_s > 0:
                wake.wait(delay_s)
    finally:
        push_stop.set()
        if pushing is not None:
            pushing[1].stop()
            pushing[0].join(timeout=settings.database.connect_timeout_s)
        listener.stop()
        maintenance.join(timeout=settings.database.connect_timeout_s)
        backend.close()
        engine.dispose()
        log.info("dispatcher %s stopped", name)
