"""The private worker endpoint: authenticate a delivery, claim its job, run it under a lease, finish it.

``POST /jobs`` with the signed job body (see workers.auth). The answer depends on
the claim, and is what Cloud Tasks (or the embedded dispatcher) acts on:

=========================  ======  ===================================================
situation                  status  body ``code``
=========================  ======  ===================================================
refused (auth, size)       4xx     the refusal's code; nothing is claimed
specialist not served      404     ``specialist_not_served``; nothing is claimed
worker full                503     ``worker_at_capacity`` + Retry-After; nothing claimed
live lease elsewhere       503     ``job_busy`` + Retry-After (the lease's time left)
worker stopping            503     ``worker_stopping``: nothing claimed (or the claim
                                   given back before the run started); deliver elsewhere
already finished           200     ``job_already_finished`` + the stored outcome
lease expired (unknown)    200     ``job_outcome_unknown``: never run again
records pruned             200     ``job_gone``: no outbox row (finished, past retention)
ran and finished           200     ``job_finished`` + the outcome (+ ``row_closed``)
our result was stale       200     ``job_result_stale``: recorded for operators
outcome not recorded       503     ``finish_failed``: the lease expires, then unknown
=========================  ======  ===================================================

Answers carry the outcome state only, never the job's input or results: whoever
holds a valid body learns no more than whether the job ran. ``row_closed: true``
says that the finish closed the job's outbox row in its transaction (the service's
settlement does, for a task's job): the embedded dispatcher then has nothing to
write for it (issue 44: a statement per job).

While a job runs the worker renews its lease every ``worker_heartbeat_s``; the
renewal also carries cancel requests, so a cancel from any API instance reaches
the runner within one heartbeat. The job's deadline and a lost lease stop the
runner the same way; a runner that does not stop within ``worker_cancel_grace_s``
is killed (in thread mode: abandoned) and the job finishes without it.

The runner runs in a process of its own (``workers.isolation``): this process
keeps the HTTP server, the heartbeats and the finish, so no job's code can stall
them (issue 15).

A clean stop (SIGTERM, SIGINT; issue 44 §4): from the signal on, a delivery is
answered ``worker_stopping`` and claims nothing, and a job claimed as the signal
came is given back (``claims.release``) before its run starts, so the dispatcher
delivers it to another worker at once, without a lease to wait out. Running jobs
get ``worker_drain_s``; those still running when the worker stops had started, so
they are recorded unknown then (``abandon_running``), not a lease later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import logging
import math
import signal
import threading
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from starlette.types import Receive, Scope, Send

from core import db, telemetry
from core.settings import Settings
from taskstate import claims, ids
from workers.beat import WorkerBeat
from workers.auth import BODY_TOO_LARGE, JobSigner, OidcVerifier, VerifiedJob, WorkerAuthRefused
from workers.dispatch.jobs import TRACE_PAYLOAD_KEY
from workers.finish import Finisher, Settlement
from workers.isolation import JobHost, RunningJob
from workers.runs import EventSink, Runner, RunOutcome

log = logging.getLogger(__name__)

JOBS_PATH = "/jobs"

T = TypeVar("T")
SLOT_THREADS_PER_SLOT = 2  # a delivery's blocking call, and the next delivery's claim once the runner's process exited


@dataclass(frozen=True)
class WorkerLimits:
    lease_s: float
    heartbeat_s: float
    cancel_grace_s: float
    max_concurrent_jobs: int
    max_body_bytes: int
    beat_s: float = 15.0  # SPECIALISTS_WORKER_BEAT_S: how often it writes that it is alive (workers.beat)

    @classmethod
    def from_settings(cls, settings: Settings) -> "WorkerLimits":
        return cls(
            lease_s=settings.worker.lease_s,
            heartbeat_s=settings.worker.heartbeat_s,
            cancel_grace_s=settings.worker.cancel_grace_s,
            max_concurrent_jobs=settings.worker.max_concurrent_jobs,
            max_body_bytes=settings.dispatch.max_body_bytes,
            beat_s=settings.worker.beat_s,
        )


class _Answer(JSONResponse):
    """A delivery's answer, its content kept beside its body for the delivery's log line (not parsed back)."""

    def __init__(self, content: dict[str, Any], status_code: int, headers: dict[str, str] | None) -> None:
        super().__init__(content, status_code=status_code, headers=headers)
        self.answer = content


def _answer(status: int, code: str, message: str, retry_after_s: float | None = None, **extra: Any) -> _Answer:
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))} if retry_after_s is not None else None
    return _Answer({"code": code, "message": message, **extra}, status, headers)


class WorkerService:
    def __init__(
        self,
        *,
        engine: Engine,
        limits: WorkerLimits,
        worker_id: str,
        signer: JobSigner,
        oidc: OidcVerifier | None,
        runners: Mapping[str, Runner],
        jobs: JobHost,
        finisher: Finisher,
        settlement: Settlement,
        events: EventSink,
        readiness_problems: list[dict[str, Any]] | None = None,
    ) -> None:
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")  # one-statement work: no BEGIN/COMMIT
        self.limits = limits
        self.worker_id = worker_id
        self.signer = signer
        self.oidc = oidc
        # What this worker serves, and how each specialist claims (``max_resumes``); ``jobs`` runs them.
        self.runners = dict(runners)
        self.jobs = jobs
        self.finisher = finisher
        self.settlement = settlement
        self.events = events
        # Specialists this worker could not serve (route, key, spec): /readyz reports them.
        self.readiness_problems = list(readiness_problems or [])
        # Counts running runners, not requests: a runner holds its slot until its process (or thread) has ended.
        self._slots = threading.BoundedSemaphore(limits.max_concurrent_jobs)
        self.stopping = threading.Event()  # set by a stop signal: no new claim, unstarted claims go back
        self._running: dict[str, tuple[VerifiedJob, int]] = {}  # job id -> (job, fencing token), while it runs
        self._running_lock = threading.Lock()
        # The blocking work of a delivery that holds a slot (its claim, its job's start, a renewal, a finish the loop
        # decides, a release), on threads of the worker's own: one call at a time a delivery, and a slot freed when its
        # runner's process exits, before its delivery's finish, so at most two a slot (SLOT_THREADS_PER_SLOT).
        # Not anyio's ``to_thread``: its sniffio lookup, capacity limiter and cancel scope cost 15-20 us of CPU a hop
        # more than the loop's executor (issue 44: two hops a job; 5,000 no-op hops each way on uvloop).
        self._slot_threads = concurrent.futures.ThreadPoolExecutor(
            SLOT_THREADS_PER_SLOT * limits.max_concurrent_jobs, thread_name_prefix="worker-slot")
        # Its idle threads end with the service (a test's), never before: a run's finish may come after the stop.
        weakref.finalize(self, self._slot_threads.shutdown, wait=False)

    async def _in_slot_thread(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on a slot's thread, in a copy of the caller's context (its span, as anyio's ``to_thread``
        copied it). As with ``to_thread``, the work is never abandoned: a cancellation that comes while it runs is
        raised once it has returned, so that what it did (a claim, a started job) is known to the caller's cleanup."""
        call = functools.partial(contextvars.copy_context().run, work, *args)
        future = asyncio.get_running_loop().run_in_executor(self._slot_threads, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            while not future.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([future])
            raise

    def begin_stop(self) -> None:
        """The worker is stopping: deliveries from now on are handed back (``worker_stopping``), nothing claimed."""
        if not self.stopping.is_set():
            self.stopping.set()
            log.info("worker %s is stopping: new deliveries are handed back", self.worker_id,
                     extra={"event": "worker_stopping", "worker_id": self.worker_id})

    def abandon_running(self) -> list[str]:
        """As the worker stops: record the jobs still running unknown now (they started; their processes end with
        this worker), in one transaction each with the ledger's and the task's unknown mark. A job that finished
        meanwhile is left as it is. Returns the job ids recorded."""
        with self._running_lock:
            running = list(self._running.values())
        recorded = []
        why = "its worker stopped before it ended (SPECIALISTS_WORKER_DRAIN_S)"
        for job, token in running:
            try:
                # A pooled connection idle since the database restarted is found dead here (no ping on checkout):
                # again at once on a new one, or the job would wait out its lease (its beat row goes with the stop).
                newly = db.retrying_once(lambda job=job, token=token: self._record_abandoned(job, token, why))
            except DBAPIError as exc:  # its lease passes instead, and the sweeper records it
                log.warning("job %s: could not be recorded unknown as the worker stopped (%s)", job.job_id,
                            type(exc).__name__)
                continue
            if newly:
                self.settlement.committed(job)
                recorded.append(job.job_id)
                log.warning("job %s: still running as its worker stopped; recorded unknown for an operator",
                            job.job_id, extra={"event": "job_unknown", "job_id": job.job_id, "code": "worker_stopped"})
        return recorded

    def _record_abandoned(self, job: VerifiedJob, token: int, why: str) -> bool:
        with self.engine.begin() as conn:
            newly = claims.record_unknown(conn, job.job_id, fencing_token=token, why=why)
            if newly:
                self.settlement.mark_unknown(conn, job, token, why)
        return newly

    def _stopping_answer(self, job: VerifiedJob) -> _Answer:
        return _answer(503, "worker_stopping", "this worker is stopping; the job was not started here, deliver it to "
                       "another worker", job_id=job.job_id)

    # --- the request ------------------------------------------------------------------

    async def deliver(self, request: Request) -> _Answer:
        """Answer one delivery, and log the answer as one ``job_delivery`` line (what the drills' evidence and
        a log-based metric count: ``code`` says whether it ran, was refused, or was answered without running).
        A verified job's answer is given, and logged, in the job's trace: the one its dispatcher signed."""
        started = time.monotonic()
        try:
            body = await self._read_body(request)
            if self.oidc is not None:
                await anyio.to_thread.run_sync(self.oidc.verify, request.headers.get("authorization"))
            job = self.signer.verify(body)
        except WorkerAuthRefused as refused:
            log.warning("delivery refused: %s", refused.code)
            return self._answered(_answer(refused.http_status, refused.code, refused.message), started)
        parent = telemetry.context_of(job.payload.get(TRACE_PAYLOAD_KEY))
        with telemetry.span("job.deliver", parent=parent, kind=SpanKind.CONSUMER,
                            attributes={"specialists.job_id": job.job_id, "specialists.specialist": job.specialist_id,
                                        "specialists.worker_id": self.worker_id}) as span:
            response = await self._deliver_verified(job)
            telemetry.annotate(span, **{"http.response.status_code": response.status_code})
            return self._answered(response, started)

    def _answered(self, response: _Answer, started: float) -> _Answer:
        if not log.isEnabledFor(logging.INFO):
            return response
        answer = response.answer
        job_id = answer.get("job_id")
        log.info(
            "delivery answered %s %s%s", response.status_code, answer.get("code", "-"), f" for {job_id}" if job_id else "",
            extra={"event": "job_delivery", "status": response.status_code, "code": answer.get("code"),
                   "job_id": job_id, "task_id": ids.task_id_of(job_id) if job_id else None,
                   "outcome": answer.get("outcome"), "worker_id": self.worker_id,
                   "duration_ms": round((time.monotonic() - started) * 1000, 1)},
        )
        return response

    async def _deliver_verified(self, job: VerifiedJob) -> _Answer:
        runner = self.runners.get(job.specialist_id)
        if runner is None:
            return _answer(
                404, "specialist_not_served", f"this worker does not run specialist {job.specialist_id!r}"
            )
        if self.stopping.is_set():
            return self._stopping_answer(job)
        if not self._slots.acquire(blocking=False):
            return _answer(
                503,
                "worker_at_capacity",
                f"this worker already runs {self.limits.max_concurrent_jobs} jobs "
                "(SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS); retry later",
                retry_after_s=self.limits.heartbeat_s,
            )
        started = False
        try:
            with telemetry.span("job.claim") as span:
                try:
                    claim = await self._in_slot_thread(db.retrying_once, lambda: self._claim(job, runner))
                except DBAPIError as exc:
                    log.warning("claiming job %s failed: %s", job.job_id, type(exc).__name__)
                    return _answer(503, "claim_failed", "the claim could not be recorded; retry later",
                                   retry_after_s=1)
                telemetry.annotate(span, **{"specialists.claim": claim.outcome,
                                            "specialists.fencing_token": claim.fencing_token})
                waited_s = (datetime.now(timezone.utc) - job.signed_at).total_seconds()
                telemetry.meters.claim_latency.record(max(0.0, waited_s), {"specialist": job.specialist_id,
                                                                           "claim": claim.outcome})
            if claim.outcome == "finished":
                return _answer(
                    200,
                    "job_already_finished",
                    "this job already finished; it is not run again",
                    job_id=job.job_id,
                    outcome=claim.job_outcome,
                )
            if claim.outcome == "lease_expired_unknown":
                return _answer(
                    200,
                    "job_outcome_unknown",
                    "a worker's lease on this job expired while it ran; it is not run again and waits for an "
                    "operator to reconcile it",
                    job_id=job.job_id,
                )
            if claim.outcome == "gone":
                return _answer(
                    200,
                    "job_gone",
                    "this job has no outbox row (it finished and its records were pruned past their retention); "
                    "it is not run",
                    job_id=job.job_id,
                )
            if claim.outcome == "busy":
                return _answer(
                    503, "job_busy", "another worker holds a live lease on this job", retry_after_s=claim.retry_after_s
                )
            if self.stopping.is_set():  # the stop came during the claim: give it back before anything ran
                await self._in_slot_thread(db.retrying_once, lambda: self._release(job, claim.fencing_token))
                return self._stopping_answer(job)
            started = True
            if claim.message is not None:
                job = dataclasses.replace(job, message=claim.message, reserved_credits=claim.reserved_credits)
            # Shielded: a dispatcher that hangs up does not stop the job or its finish.
            return await asyncio.shield(asyncio.ensure_future(self._execute(job, claim.fencing_token)))
        finally:
            if not started:
                self._slots.release()

    async def _read_body(self, request: Request) -> bytes:
        limit = self.limits.max_body_bytes
        too_large = WorkerAuthRefused(
            f"the job body exceeds {limit} bytes (SPECIALISTS_DISPATCH_MAX_BODY_BYTES)", code=BODY_TOO_LARGE, http_status=413
        )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large
        if request.headers.get("content-encoding", "identity") != "identity":
            raise WorkerAuthRefused("compressed job bodies are not accepted", code="job_body_encoded", http_status=415)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    def _claim(self, job: VerifiedJob, runner: Runner) -> claims.ClaimResult:
        max_resumes = getattr(runner, "max_resumes", None)
        ref = ids.TaskRef.of_payload(job.payload)
        # A job's first delivery (nearly every one): its claim alone, one statement. Any other, in a transaction
        # that decides it: a redelivery, a resume, a lease found expired (the job unknown, with its money).
        with self._autocommit.connect() as conn:
            first = claims.claim_first(conn, job.job_id, worker_id=self.worker_id, lease_s=self.limits.lease_s, ref=ref)
        if first is not None:
            return first
        with self.engine.begin() as conn:
            if max_resumes is None:
                result = claims.claim(conn, job.job_id, worker_id=self.worker_id, lease_s=self.limits.lease_s, ref=ref)
            else:
                # A runner that checkpoints (rlm specialists): an expired lease with a checkpoint is resumed.
                found = claims.claim_resumable(
                    conn, job.job_id, worker_id=self.worker_id, lease_s=self.limits.lease_s, max_resumes=max_resumes,
                    ref=ref,
                )
                result = found.claim
                if found.resumed:
                    telemetry.annotate(trace.get_current_span(), **{"specialists.resumed": True})
                    trace.get_current_span().add_event("resumed", {"specialists.fencing_token": result.fencing_token})
                    log.warning("job %s: its worker's lease expired; resuming it from its checkpoint (claim %s)",
                                job.job_id, result.fencing_token)
            if result.newly_unknown:
                self.settlement.mark_unknown(
                    conn, job, result.fencing_token, "its lease expired while it ran; found by a later delivery"
                )
        if result.newly_unknown:
            self.settlement.committed(job)
        return result

    def _release(self, job: VerifiedJob, token: int) -> None:
        with self.engine.begin() as conn:
            claims.release(conn, job.job_id, fencing_token=token)

    def _renew(self, job: VerifiedJob, token: int) -> claims.RenewResult:
        return db.retrying_once(lambda: self._renew_once(job, token))

    def _renew_once(self, job: VerifiedJob, token: int) -> claims.RenewResult:
        with self.engine.begin() as conn:
            result = claims.renew(conn, job.job_id, fencing_token=token, lease_s=self.limits.lease_s)
            if result.outcome == "expired":
                self.settlement.mark_unknown(conn, job, token, "its lease expired before this worker renewed it")
        if result.outcome == "expired":
            self.settlement.committed(job)
        return result

    # --- running under the lease -----------------------------------------------------

    async def _execute(self, job: VerifiedJob, token: int) -> _Answer:
        started_at = time.monotonic()
        with self._running_lock:
            self._running[job.job_id] = (job, token)
        try:
            with telemetry.span("job.run", attributes={"specialists.fencing_token": token}) as span:
                # The job's process continues the trace from this span: its specialist's steps and model calls.
                job = dataclasses.replace(job, trace_parent=telemetry.traceparent())
                response, state = await self._execute_traced(job, token)
                telemetry.annotate(span, **{"specialists.outcome": state})
        finally:
            with self._running_lock:
                self._running.pop(job.job_id, None)
        telemetry.meters.job_duration.record(time.monotonic() - started_at,
                                             {"specialist": job.specialist_id, "outcome": state or "none"})
        return response

    async def _execute_traced(self, job: VerifiedJob, token: int) -> tuple[_Answer, str | None]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[RunOutcome] = loop.create_future()  # an outcome a stop came before: finished below
        finished: asyncio.Future[tuple[RunOutcome, claims.FinishResult | Exception]] = loop.create_future()
        deadline_at = time.monotonic() + job.deadline_s
        decision = _Decision()
        parent = telemetry.current_context()  # the job's run span: the finish's span continues it from any thread

        exited = asyncio.Event()  # the runner has ended (its process has exited) and its slot is free

        def settle(future: asyncio.Future[Any], value: Any) -> None:
            if not future.done():
                future.set_result(value)

        def reported(outcome: RunOutcome) -> None:  # from the job's watcher thread, as soon as the outcome is known
            if decision.outcome_first():
                # No stop came before it: the outcome is the job's as it is, finished here and now (issue 44: through
                # the event loop and back to a thread, 0.5-2.4 ms of run ends -> finished).
                value: tuple[RunOutcome, claims.FinishResult | Exception] = (outcome, self._finish(job, token, outcome,
                                                                                                   parent))
                target: asyncio.Future[Any] = finished
            else:
                value, target = outcome, done
            try:
                loop.call_soon_threadsafe(settle, target, value)
            except RuntimeError:  # the server stopped while a runner was still going
                log.info("job %s: runner ended after the worker stopped; its outcome is dropped", job.job_id)

        def ended() -> None:  # from the job's watcher thread, once its runner has ended
            self._slots.release()
            try:
                loop.call_soon_threadsafe(exited.set)
            except RuntimeError:  # the server stopped meanwhile: nobody waits for it
                pass

        try:
            running: RunningJob = await self._in_slot_thread(self.jobs.start, job, token, deadline_at, reported,
                                                                 ended)
        except Exception as exc:  # no process could be started (fork failed, out of memory): a failed run
            log.exception("job %s: its runner could not be started", job.job_id)
            # Finished below, off the event loop (``reported`` would finish it here, on the loop's thread).
            settle(done, RunOutcome("failed", "the worker could not start the specialist",
                                    detail={"error": type(exc).__name__}))
            ended()
            running = _NotStarted()

        gave_up = False
        give_up_at = math.inf
        next_renewal = time.monotonic() + self.limits.heartbeat_s

        def stop(reason: str) -> None:
            nonlocal give_up_at
            if decision.stop(reason):
                give_up_at = time.monotonic() + self.limits.cancel_grace_s
                running.stop()

        while not (done.done() or finished.done()):
            if decision.outcome_came:  # the outcome is on its way, or being finished by its thread: nothing to decide
                await asyncio.wait([done, finished], return_when=asyncio.FIRST_COMPLETED)
                continue
            wake_at = min(next_renewal, give_up_at, deadline_at if decision.stop_reason is None else math.inf)
            await asyncio.wait([done, finished], timeout=max(0.0, wake_at - time.monotonic()),
                               return_when=asyncio.FIRST_COMPLETED)
            if done.done() or finished.done() or decision.outcome_came:
                continue
            now = time.monotonic()
            if now >= next_renewal:
                next_renewal = now + self.limits.heartbeat_s
                try:
                    renewal = await self._in_slot_thread(self._renew, job, token)
                except DBAPIError as exc:  # keep running: the lease covers a few missed heartbeats
                    log.warning("renewing job %s failed: %s", job.job_id, type(exc).__name__)
                else:
                    if renewal.outcome != "renewed":
                        stop("lease_lost")
                    elif renewal.cancel_requested:
                        stop("canceled")
            if decision.stop_reason is None and now >= deadline_at:
                stop("deadline")
            if now >= give_up_at:
                running.kill()  # frees its slot once its process is gone (a thread is only abandoned)
                gave_up = True
                break

        # The finish runs while the runner's process lets go of what it held and exits (the job host kills one that
        # does not within its wait); the answer waits for both, so a delivery answered is a slot free again. A runner
        # given up on past the grace is not waited for: it was killed (a process) or abandoned (a thread), and holds
        # its slot until it ends.
        try:
            if finished.done():
                outcome, result = finished.result()
            else:
                outcome = self._final_outcome(job, done.result() if done.done() else None, decision.stop_reason)
                result = await self._in_slot_thread(self._finish, job, token, outcome, parent)
        finally:
            if not gave_up:
                await exited.wait()
        if isinstance(result, Exception):
            return _answer(503, "finish_failed", str(result), retry_after_s=self.limits.lease_s), None
        if result.accepted:
            closed = self.settlement.closes_outbox_row and ids.TaskRef.of_payload(job.payload) is not None
            return _answer(
                200, "job_finished", "the job ran and its outcome is recorded", job_id=job.job_id, outcome=outcome.state,
                **({"row_closed": True} if closed else {}),
            ), outcome.state
        return _answer(
            200,
            "job_result_stale",
            f"this worker's claim on the job was no longer current (the job is {result.state}); "
            "its result is recorded for operators and moves no money",
            job_id=job.job_id,
        ), "stale"

    def _finish(self, job: VerifiedJob, token: int, outcome: RunOutcome,
                parent: Any) -> claims.FinishResult | Exception:
        """The job's finish (claim, task, money: ``Finisher``) in its own span under the job's run span; a finish
        that could not be recorded is returned as its exception (the answer is ``finish_failed``)."""
        with telemetry.span("job.finish", parent=parent, attributes={"specialists.outcome": outcome.state}) as span:
            try:
                result = self.finisher.finish(job, token, outcome)
            except Exception as exc:
                log.error("job %s: %s", job.job_id, exc)
                return exc
            telemetry.annotate(span, **{"specialists.accepted": result.accepted, "specialists.state": result.state})
            return result

    def _final_outcome(self, job: VerifiedJob, outcome: RunOutcome | None, stop_reason: str | None) -> RunOutcome:
        grace = f"within worker_cancel_grace_s ({self.limits.cancel_grace_s:g} s)"
        # What the runner recorded (e.g. a specialist's usage and the credits it computed) stays with the outcome.
        kept = dict(outcome.detail) if outcome else {}
        if stop_reason == "deadline":
            detail = {**kept, "stopped": "deadline", "runner_outcome": outcome.state if outcome else None}
            return RunOutcome(
                "failed",
                f"the specialist's deadline of {job.deadline_s:g} s passed"
                + ("" if outcome else f"; it did not stop {grace}"),
                outcome.artifacts if outcome else (),
                detail,
            )
        if stop_reason == "canceled" and (outcome is None or outcome.state != "completed"):
            return RunOutcome(
                "canceled",
                "cancelled on request" + ("" if outcome else f"; the specialist did not stop {grace}"),
                outcome.artifacts if outcome else (),
                {**kept, "stopped": "canceled"},
            )
        if outcome is None:  # lease lost and the runner did not stop: report what we know, it will be refused
            return RunOutcome("failed", f"the worker lost its lease and the specialist did not stop {grace}",
                              detail={"stopped": stop_reason})
        return outcome


class _Decision:
    """What decides how a run's outcome is finished: whichever of the two comes first, under one lock. An outcome
    that comes while no stop was asked for is the job's as the runner gave it, finished by the thread that reported
    it (``outcome_first``), and a stop asked for after it changes nothing; a stop asked for first (a cancel, the
    deadline, a lost lease: ``stop``) applies to the outcome that comes later (``WorkerService._final_outcome``),
    which the request's task finishes. As before, where the event loop saw the outcome before its next decision."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stop_reason: str | None = None
        self.outcome_came = False

    def outcome_first(self) -> bool:
        """The outcome came: True when no stop came before it (its reporter finishes it)."""
        with self._lock:
            self.outcome_came = True
            return self.stop_reason is None

    def stop(self, reason: str) -> bool:
        """A stop: True when it is the first and no outcome came before it (the runner is to be asked to stop)."""
        with self._lock:
            if self.stop_reason is not None or self.outcome_came:
                return False
            self.stop_reason = reason
            return True


class _NotStarted:
    def stop(self) -> None:
        return None

    def kill(self) -> None:
        return None


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _hand_back_on_stop_signals(service: WorkerService) -> None:
    """Chain the server's own stop signal handlers (uvicorn's, which start its graceful shutdown) with
    ``service.begin_stop``, so deliveries stop being claimed the moment the signal comes, not once the server has
    drained. Only the main thread may set handlers; elsewhere (a test's server thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        previous = signal.getsignal(signum)

        def handler(sig: int, frame: Any, previous: Any = previous) -> None:
            service.begin_stop()
            if callable(previous):
                previous(sig, frame)
            elif previous == signal.SIG_DFL:  # no server of ours handles it: what the signal did before
                signal.signal(sig, previous)
                signal.raise_signal(sig)

        signal.signal(signum, handler)


class WorkerApp:
    """The worker's ASGI application: ``POST /jobs`` is answered here, straight from the server, and everything else
    (``/healthz``, ``/readyz``, the lifespan, a wrong method or path) by the FastAPI app behind it. A delivery is
    the worker's one hot request: FastAPI's middleware, routing and endpoint around it were 0.039 ms of CPU a
    request measured alone, against 0.004 for this call (issue 44). Its answers are ``WorkerService.deliver``'s, as
    before; an exception that escapes it is answered 500 by the server, as FastAPI's error middleware answered it."""

    def __init__(self, service: WorkerService, app: FastAPI) -> None:
        self.service = service
        self.app = app
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == JOBS_PATH and scope["method"] == "POST":
            response = await self.service.deliver(Request(scope, receive))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_worker_app(service: WorkerService) -> WorkerApp:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        beat = WorkerBeat(service.engine, worker_id=service.worker_id, specialists=sorted(service.runners),
                          beat_s=service.limits.beat_s)
        beat.start()
        _hand_back_on_stop_signals(service)
        try:
            yield
        finally:
            service.begin_stop()
            # Past the drain: what still runs had started and ends with this process; say so now, not a lease later.
            await anyio.to_thread.run_sync(service.abandon_running)
            await anyio.to_thread.run_sync(beat.stop, service.limits.beat_s)
            service.jobs.close()  # the process forked ahead of the next job goes, unused

    app = FastAPI(title="specialists worker", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan,
                  telemetry=telemetry.FASTAPI_TELEMETRY)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "worker_id": service.worker_id}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Ready when every specialist it was configured for is served (routes, keys, specs)."""
        problems = service.readiness_problems
        return JSONResponse(
            {"status": "ready" if not problems else "not_ready", "worker_id": service.worker_id,
             "specialists": sorted(service.runners), "problems": problems},
            status_code=200 if not problems else 503,
        )

    app.state.worker = service
    return WorkerApp(service, app)
