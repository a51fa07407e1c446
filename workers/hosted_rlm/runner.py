"""``RlmRunner``: the worker's ``Runner`` for executor ``rlm`` specs.

One run: the job's A2A message becomes the task and the evidence bundle
(``bundle``); the model route gives a provider (``routes``); ``rlm.Session`` runs
in Monty with the hosted profile (``hosted``), journaled and checkpointed in
PostgreSQL under the job; the answer becomes a text report and, for the
reviewer, findings (``answer``); the run's record gets the amount to settle.

A job that already has checkpoints was resumed by
``taskstate.claims.claim_resumable`` after its worker died: the run replays
what the journal holds and continues from the newest checkpoint. The runner's
own figure (``RunOutcome.detail["charged_credits"]``) is the charge rule's
(``taskstate.charge``) for the spec's pricing and the answered semantic calls; a
refused task, and a job whose checkpoint cannot be used (tampered, another key
or Monty version), state 0: the failure is the service's, not the customer's.
The settlement charges from the reservation, with this figure as a cap.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from opentelemetry import trace
from sqlalchemy import Engine

from core import telemetry
from core.errors import ServiceError
from core.settings import CheckpointSync
from core.specs import LoadedSpec, PricingSpec, SpecInvalid, require_runnable
from rlmfamily.context import Context
from rlmfamily.errors import RLMError
from rlmfamily.kernels.checkpoints import Checkpoint
from rlmfamily.session import Session
from taskstate import charge
from workers.auth import VerifiedJob
from workers.runs import RunContext, RunOutcome
from workers.hosted_rlm.a2a import artifact_events
from workers.hosted_rlm.answer import Verdict, verdict_of
from workers.hosted_rlm.bundle import SpecialistTask, TaskRefused, task_from_message
from workers.hosted_rlm.hosted import HostedRun, hosted_settings, session_id_for
from workers.hosted_rlm.journal import Journal, pricing_of
from workers.hosted_rlm.progress import ProgressWriter
from workers.hosted_rlm.routes import ModelRoutes, RouteNotReady
from workers.hosted_rlm.store import CheckpointPolicy, ClaimLost, PgCheckpointStore

log = logging.getLogger(__name__)

MessageSource = Callable[[VerifiedJob], Any]  # the job's A2A Message (a2a-sdk protobuf)
MIN_RUN_S = 1.0
# The job the warm-up writes as (``warm``): no claim can hold it (a job's id is its task's id, a colon and its
# dispatch number: ``taskstate.ids``), so each fenced write finds no fence and writes nothing.
WARM_JOB_ID = "warm-up"


def warm(engine: Engine) -> None:
    """In a job's process waiting for its job (``workers.assembly.connect_ahead``): a connection of ``engine``,
    and on it each statement of a run once, as a job no claim holds (``WARM_JOB_ID``: every write of a run is
    fenced, so none writes anything, and each raises ``ClaimLost``). Ahead of the job, not on its path: this
    process's first use of each statement (its form for the driver, SQLAlchemy's compilations of the reads) and
    the new server process's first (the catalog entries of the tables each one touches, its parse and plan). The
    run's first statement took 4-8 ms where the same statement takes 0.7 once warm (issue 44).
    The connection stays in the pool for the run."""
    journal = Journal(engine, job_id=WARM_JOB_ID, fencing_token=0)
    session_id = session_id_for(WARM_JOB_ID)
    store = PgCheckpointStore(engine, job_id=WARM_JOB_ID, fencing_token=0, session_id=session_id,
                              policy=CheckpointPolicy())
    writes: tuple[Callable[[], Any], ...] = (
        lambda: journal.open_run(specialist_id="", route="", pricing=PricingSpec(), reserved_credits=0,
                                 session_id=session_id),
        lambda: journal.start_call(purpose="root", turn=0, step_index=None, after_seq=None, request_sha256=b"",
                                   request_text=None, model=None),
        lambda: journal.fail_call(0, billed=None, note=""),
        lambda: journal.start_step(0, 0, 0),
        lambda: store.put(session_id, 0, b""),
        lambda: journal.end_run(outcome="failed", stop_reason=None, turns=0, totals=journal.totals(),
                                charged_credits=0),
    )
    for write in writes:
        try:
            write()
        except ClaimLost:
            pass
    store.latest(session_id)
    journal.refusals()


class CheckpointKeyMissing(ServiceError):
    code = "checkpoint_key_missing"


class RlmRunner:
    """Runs the ``rlm`` specs of ``specs`` (by specialist id) on jobs this worker claimed."""

    def __init__(
        self,
        *,
        engine: Engine,
        specs: Mapping[str, LoadedSpec],
        routes: ModelRoutes,
        checkpoint_key: bytes | None,
        message_of: MessageSource,
        environ: Mapping[str, str],
        # No default: CheckpointPolicy() writes a record after every step, not what the settings ship
        # (CheckpointPolicy.of(settings.hosted)); a caller that forgot it would run, and measure, another policy.
        checkpoint_policy: CheckpointPolicy,
        pool: Any = None,
        scratch_dir: Path | None = None,
        max_resumes: int = 0,
        checkpoint_sync: CheckpointSync = "with_journal",
    ) -> None:
        if not checkpoint_key:
            raise CheckpointKeyMissing(
                "rlm specialists need a key to sign their checkpoints; set SPECIALISTS_SPECIALIST_CHECKPOINT_KEY "
                "(the same value on every worker)"
            )
        self.engine = engine
        self.specs = {sid: loaded for sid, loaded in specs.items() if loaded.spec.executor == "rlm"}
        for loaded in self.specs.values():
            require_runnable(loaded)
        self.routes = routes
        self.checkpoint_key = checkpoint_key
        self.message_of = message_of
        self.environ = environ
        self.pool = pool
        self.scratch_dir = scratch_dir
        # Read by the worker's claim: an expired lease of this runner's job is resumed this many times at most.
        self.max_resumes = max_resumes
        self.checkpoint_sync = checkpoint_sync
        self.checkpoint_policy = checkpoint_policy

    def run(self, ctx: RunContext) -> RunOutcome:
        job = ctx.job
        loaded = self.specs.get(job.specialist_id)
        if loaded is None:
            raise SpecInvalid(f"specialist {job.specialist_id!r} is not an rlm spec served by this worker")
        spec = loaded.spec
        try:
            task = task_from_message(self.message_of(job), spec.limits)
        except TaskRefused as refused:
            return RunOutcome("rejected", refused.message, detail={"code": refused.code, "charged_credits": 0})
        journal = Journal(self.engine, job_id=job.job_id, fencing_token=ctx.fencing_token)
        session_id = session_id_for(job.job_id)
        store = PgCheckpointStore(self.engine, job_id=job.job_id, fencing_token=ctx.fencing_token, session_id=session_id,
                                  sync=self.checkpoint_sync, policy=self.checkpoint_policy)
        assert spec.model_route is not None
        resumes = journal.open_run(
            specialist_id=spec.id, route=spec.model_route, pricing=spec.pricing,
            reserved_credits=ctx.reserved_credits, session_id=session_id,
        )
        latest = store.latest(session_id)
        plan = None
        if latest is not None:
            try:
                checkpoint = Checkpoint.decode(latest[1], key=self.checkpoint_key)
            except RLMError as refused:  # tampered, or signed with another key: never loaded, never guessed around
                return self._end(ctx, journal, loaded, Verdict(
                    "failed", f"the job could not be resumed after its worker stopped: {refused.message}",
                    code=refused.code, free=True), None, resumes)
            plan = journal.plan(checkpoint)
        # A resumed run shows where it continues from in the job's one trace (the first attempt's spans are there).
        current = trace.get_current_span()
        telemetry.annotate(current, **{"specialists.resumes": resumes, "specialists.resumed": plan is not None})
        if plan is not None:
            current.add_event("resumed", {"specialists.from_turn": plan.last_replayed_turn,
                                          "specialists.baked_subcalls": plan.baked_subcalls})
        scratch = Path(tempfile.mkdtemp(prefix="specialist-", dir=self.scratch_dir))
        # The run's progress goes to the database on a thread of its own; every report is written before the
        # run's outcome is returned, so before its artifacts and final state, which the finish writes.
        progress = ProgressWriter(lambda data: ctx.report("progress", data), name=f"progress-{job.job_id}")
        try:
            result, run = self._session(ctx, loaded, task, journal, store, plan, scratch, progress)
        except (RouteNotReady, TaskRefused) as problem:
            return self._end(ctx, journal, loaded, Verdict("failed", problem.message, code=problem.code), None, resumes)
        finally:
            progress.close()
            shutil.rmtree(scratch, ignore_errors=True)
        if ctx.cancelled():
            # The worker decides the final state (cancel, deadline, lost lease); record what was used.
            verdict = Verdict("failed", "the run was stopped before it finished", code="run_stopped")
        else:
            verdict = verdict_of(spec, task, result, journal.refusals())
        outcome = self._end(ctx, journal, loaded, verdict, result, resumes, replayed=run.replayed_calls)
        # The artifacts go with the finish, in its transaction (fenced by its claim), before the final state.
        return dataclasses.replace(outcome, events=tuple(artifact_events(outcome.artifacts)))

    def _session(self, ctx: RunContext, loaded: LoadedSpec, task: SpecialistTask, journal: Journal,
                 store: PgCheckpointStore, plan: Any, scratch: Path,
                 progress: ProgressWriter) -> tuple[Any, HostedRun]:
        spec = loaded.spec
        assert spec.model_route is not None
        provider, route = self.routes.provider(
            spec.model_route, environ=self.environ, skip_root_turns=plan.root_turns_done if plan else 0
        )
        remaining_s = min(spec.limits.deadline_s, ctx.deadline_at - time.monotonic())
        settings = hosted_settings(
            spec, route, data_dir=scratch,
            max_run_s=max(MIN_RUN_S, remaining_s - spec.limits.answer_reserve_s),
            max_subcalls=spec.limits.max_semantic_calls - (plan.baked_subcalls if plan else 0),
        )
        try:
            context = Context.from_bundle(task.items, settings)
        except RLMError as exc:
            raise TaskRefused(f"the evidence bundle cannot be read: {exc.message}", code="evidence_invalid") from None
        run = HostedRun(
            journal=journal, store=store, spec=spec, checkpoint_key=self.checkpoint_key, plan=plan,
            cancelled=ctx.cancelled, report=progress, pool=self.pool,
            trace_context=telemetry.current_context(),
        )
        session = Session(
            context=context, provider=run.provider(provider), settings=settings, kernel="monty",
            kernel_factory=run.kernel, run_id=store.session_id, on_event=run.on_event, extensions=[run.extension],
        )
        return session.run(task.question), run

    def _end(self, ctx: RunContext, journal: Journal, loaded: LoadedSpec, verdict: Verdict, result: Any,
             resumes: int, *, replayed: int = 0) -> RunOutcome:
        spec = loaded.spec
        totals = journal.totals()
        charged_credits = charge.charged_credits(
            verdict.state, reserved_credits=ctx.reserved_credits, pricing=pricing_of(spec.pricing),
            usage=charge.Usage(totals["semantic_calls_charged"], waived=verdict.free),
        )
        try:
            journal.end_run(
                outcome=verdict.state, stop_reason=result.stop_reason if result is not None else None,
                turns=result.turns if result is not None else 0, totals=totals, charged_credits=charged_credits,
            )
        except ClaimLost as lost:  # the worker learns the same at its next heartbeat; nothing to record
            log.info("job %s: %s", journal.job_id, lost.message)
        detail: dict[str, Any] = {
            "specialist": spec.id,
            "stop_reason": result.stop_reason if result is not None else None,
            "turns": result.turns if result is not None else 0,
            "semantic_calls_used": totals["semantic_calls_used"],
            "semantic_calls_charged": totals["semantic_calls_charged"],
            "charged_credits": charged_credits,  # read by the settlement (workers.hosted_rlm.usage)
            "pricing": spec.pricing.mode,
            "resumes": resumes,
            "replayed_calls": replayed,
            "usage": {k: totals[k] for k in ("prompt_tokens", "completion_tokens", "cost_usd",
                                             "calls_with_unknown_tokens", "calls_with_unknown_cost")},
        }
        if verdict.code:
            detail["code"] = verdict.code
        if verdict.findings is not None:
            detail["findings"] = len(verdict.findings)
        if verdict.dropped:
            detail["findings_dropped"] = dict(verdict.dropped)
        artifacts: list[dict[str, Any]] = []
        if verdict.state == "completed":
            artifacts.append({"name": "report", "media_type": "text/plain", "text": verdict.report})
            if verdict.findings is not None:
                artifacts.append({"name": "findings", "media_type": "application/json", "data": verdict.findings})
        return RunOutcome(verdict.state, verdict.message, tuple(artifacts), detail)  # type: ignore[arg-type]
