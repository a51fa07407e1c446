"""Assembling a worker from settings, and serving it: what `specialists worker` calls.

``build_worker_service`` wires the signer, the OIDC check (unless turned off), the
runners (the built-in ones and every ready rlm spec, see ``workers.hosted_rlm``),
where they run (``workers.isolation``: a process per job, its runners prepared once
from a ``RunnerRecipe`` by ``JOB_RUNNERS``), the finisher, the settlement (the task's final
state and the ledger, in the finish's transaction, with the executors' usage
wired in: ``USAGE``, the rlm executor's ``workers.hosted_rlm.usage``) and the fenced task events.
``USAGE`` is also what an operator's reconcile reads (``workers.reconcile``: its callers pass it). ``run_worker`` checks the
configuration (schema at head, a job secret present), then serves the endpoint
with uvicorn until stopped; on shutdown running jobs get ``worker_drain_s`` to
finish.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from sqlalchemy import Engine

from core import db, telemetry
from core.errors import ServiceError
from core.settings import Settings
from core.specs import LoadedSpec, load_specs
from rlmfamily.kernels.monty import runtime_identity
from ledger.limits import SCHEMA_MAX_ID_CHARS
from workers.auth import CertsFetcher, JobSigner, OidcVerifier, VerifiedJob
from workers.conformance import ConformanceExecutor
from workers.executor_runner import ExecutorRunner
from workers.finish import ClaimFinisher, Settlement
from workers.instance import host_name
from workers.isolation import BuiltRunner, JobHost, ProcessJobs, RunnerBuild, ThreadJobs
from workers.runs import EventSink, Runner, ScriptedRunner, ScriptStep
from workers.server import WorkerLimits, WorkerService, create_worker_app
from workers.settlement import TaskSettlement, UsageSource
from workers.hosted_rlm.runner import RlmRunner, warm
from workers.hosted_rlm.serving import specialist_runners
from workers.hosted_rlm.usage import RLM_USAGE
from taskstate.ids import TaskRef
from taskstate.updates import TaskEvents

log = logging.getLogger(__name__)

# The executors' record of what a job used: the one place it is chosen, for the finish's settlement and the
# operator's reconcile (workers.reconcile) alike. Only the rlm executor keeps one; every other job is charged
# at its fixed price.
USAGE: UsageSource = RLM_USAGE

StepObserver = Callable[[str, int, ScriptStep], None]


class WorkerNotConfigured(ServiceError):
    code = "worker_not_configured"


def new_worker_id() -> str:
    return f"{host_name()}:{os.getpid()}:{secrets.token_hex(3)}"


def script_in_message(tasks: TaskEvents) -> Callable[[VerifiedJob], Any]:
    """The scripted specialist's script, from the ``script`` key of the A2A message's first data part."""

    def script_of(job: VerifiedJob) -> Any:
        if TaskRef.of_payload(job.payload) is None:
            return None
        for part in tasks.message(job).parts:
            if part.WhichOneof("content") == "data":
                data = MessageToDict(part.data)
                if isinstance(data, dict) and "script" in data:
                    return data["script"]
        return None

    return script_of


def default_runners(
    settings: Settings, tasks: TaskEvents, on_step: StepObserver | None = None,
    specs: Mapping[str, LoadedSpec] | None = None,
) -> dict[str, Runner]:
    """The built-in specialists every worker serves, by specialist id (the rlm specs are added by
    ``build_worker_service`` from ``workers.hosted_rlm.serving``). ``specs``: as loaded, or the specs folder's."""
    scripted = ScriptedRunner(on_step=on_step, script_of=script_in_message(tasks))
    runners: dict[str, Runner] = {
        "scripted": scripted,
        "conformance": ExecutorRunner(ConformanceExecutor(settings.edge.conformance_hold_working_s), tasks),
    }
    # Every spec of executor "scripted" (the drill specialist) runs the scripted runner under its own id.
    for specialist_id, loaded in (load_specs(settings.hosted.specs_dir) if specs is None else specs).items():
        if loaded.spec.executor == "scripted":
            runners.setdefault(specialist_id, scripted)
    return runners


def with_specialists(
    settings: Settings, engine: Engine, tasks: TaskEvents, runners: Mapping[str, Runner],
    specs: Mapping[str, LoadedSpec] | None = None,
) -> tuple[dict[str, Runner], list[dict[str, Any]]]:
    """``runners`` plus a ``RlmRunner`` for every ready rlm spec not served by them, and the readiness
    problems of the others (what ``/readyz`` reports; logged here, once, by the worker)."""
    combined, problems = _served(settings, engine, tasks, runners, specs)
    for problem in problems:
        log.warning("specialist %s is not served: %s", problem["specialist"], problem["message"])
    return combined, problems


def _served(
    settings: Settings, engine: Engine, tasks: TaskEvents, runners: Mapping[str, Runner],
    specs: Mapping[str, LoadedSpec] | None,
) -> tuple[dict[str, Runner], list[dict[str, Any]]]:
    served = specialist_runners(settings, engine, tasks.message, specs=specs)
    combined = dict(runners)
    for specialist_id, runner in served.runners.items():
        combined.setdefault(specialist_id, runner)
    return combined, [problem.to_dict() for problem in served.problems if problem.specialist_id not in runners]


def check_worker_settings(settings: Settings) -> None:
    """Refuse to start a worker that would refuse every job, or check no token while it should."""
    if not settings.worker.job_secrets:
        raise WorkerNotConfigured(
            "no worker job secret is configured, so this worker would refuse every job; set "
            "SPECIALISTS_WORKER_JOB_SECRETS (the same value as the dispatcher's)"
        )
    if settings.worker.oidc_verify and not settings.dispatch.service_account:
        raise WorkerNotConfigured(
            "the worker checks OIDC tokens but no account is accepted; set SPECIALISTS_DISPATCH_SERVICE_ACCOUNT, "
            "or on one machine only SPECIALISTS_WORKER_OIDC_VERIFY=false"
        )
    if not settings.worker.oidc_verify:
        log.warning("OIDC tokens are NOT checked (SPECIALISTS_WORKER_OIDC_VERIFY=false): one-machine mode")


@dataclass(frozen=True)
class RunnerRecipe:
    """What a job's process needs to build its runner: picklable (it crosses to the forkserver's child).

    ``on_step`` observes the scripted specialist's steps in the job's process, so it must pickle too (a
    module-level class; tests use one that appends to a file)."""

    settings: Settings
    database_url: str
    specs: Mapping[str, LoadedSpec]  # as the worker loaded them at start-up: parsing YAML costs a job ~50 ms
    on_step: StepObserver | None = None


@dataclass(frozen=True)
class PreparedRunners:
    """A worker's runners as a job's process takes them: built once in the forkserver (``workers.job_template``),
    on an engine that no job's process shares a connection of (it has none when they are forked)."""

    settings: Settings
    engine: Engine
    tasks: TaskEvents
    runners: Mapping[str, Runner]


def prepare_job_runners(recipe: RunnerRecipe) -> PreparedRunners:
    """Every runner of the worker, as it serves them, on an engine of their own: no job in it, no thread started,
    no connection opened (the forkserver forks every job's process from it). The digest of Monty's binary is taken
    here too (``runtime_identity``, cached for the process): a run's checkpoints name it, and hashing the binary
    cost each job's process 27 ms."""
    settings = recipe.settings
    engine = db.make_engine(recipe.database_url, settings)
    tasks = TaskEvents(engine)
    runners, _ = _served(settings, engine, tasks, default_runners(settings, tasks, recipe.on_step, recipe.specs),
                         recipe.specs)
    if any(isinstance(runner, RlmRunner) for runner in runners.values()):
        try:
            runtime_identity()
        except (OSError, RuntimeError):  # no binary to hash: the run that needs one says so, not every job
            pass
    return PreparedRunners(settings, engine, tasks, runners)


def start_job_runner(prepared: PreparedRunners, specialist_id: str) -> BuiltRunner:
    """In a job's process, its job come: the runner of ``specialist_id``. Its own exporters (a forked process has
    none running), and its engine's statements in its spans; they continue the worker's run span, and the last of
    them are exported when it lets go, after its outcome was sent."""
    if telemetry.setup(prepared.settings.telemetry, role="job") is not None:
        telemetry.instrument_engine(prepared.engine)

    def close() -> None:
        if prepared.engine.pool.checkedin():  # a run that connected: its connections end with a word to the server
            prepared.engine.dispose()  # (none made, nothing to end: disposing rebuilt the pool, 0.7 ms of a no-op job)
        telemetry.shutdown()

    return BuiltRunner(runner=prepared.runners[specialist_id], events=prepared.tasks, close=close)


def connect_ahead(prepared: PreparedRunners) -> None:
    """In a job's process waiting for its job: one connection of the runners' engine, opened now and kept in its
    pool, with a run's statements run once on it (``hosted_rlm.runner.warm``), when the worker serves an rlm
    specialist (its run opens its journal first thing: 3-5 ms of connecting, SQLAlchemy's first-connect questions
    included, and 4-8 ms of its first statements on a new server process, that its job then does not wait for). A
    worker that serves none (the scripted and conformance specialists write only task events, if anything) opens
    none: a no-op job stays without a connection. The connection waits with the process; one the server ended
    meanwhile is found at checkout (``core.db.discard_dead_on_checkout``) and the run connects anew."""
    if any(isinstance(runner, RlmRunner) for runner in prepared.runners.values()):
        warm(prepared.engine)


# What ``workers.isolation.ProcessJobs`` builds a job's runner with.
JOB_RUNNERS = RunnerBuild(prepare=prepare_job_runners, start=start_job_runner, ahead=connect_ahead)


def build_worker_service(
    settings: Settings,
    engine: Engine,
    *,
    runners: Mapping[str, Runner] | None = None,
    settlement: Settlement | None = None,
    events: EventSink | None = None,
    fetch_certs: CertsFetcher | None = None,
    worker_id: str | None = None,
    on_step: StepObserver | None = None,
) -> WorkerService:
    """A worker. ``runners`` given (objects, with their in-process callbacks) run in threads of the worker, so they
    need ``SPECIALISTS_WORKER_JOB_ISOLATION=thread``; otherwise the served runners run as the setting says."""
    check_worker_settings(settings)
    if runners is not None and settings.worker.job_isolation == "process":
        raise WorkerNotConfigured(
            "runner objects given to a worker run in its own threads; set SPECIALISTS_WORKER_JOB_ISOLATION=thread "
            "to run them"
        )
    worker_id = worker_id or new_worker_id()
    tasks = TaskEvents(engine)
    settlement = settlement or TaskSettlement(
        tasks, operator=f"worker:{worker_id}"[:SCHEMA_MAX_ID_CHARS], limits=settings.ledger, usage=USAGE
    )
    problems: list[dict[str, Any]] = []
    specs = load_specs(settings.hosted.specs_dir) if runners is None else {}
    if runners is None:
        runners, problems = with_specialists(settings, engine, tasks, default_runners(settings, tasks, on_step, specs),
                                             specs)
    events = events or tasks
    jobs: JobHost
    if settings.worker.job_isolation == "process":
        recipe = RunnerRecipe(settings, engine.url.render_as_string(hide_password=False), specs, on_step)
        jobs = ProcessJobs(JOB_RUNNERS, recipe, max_memory_bytes=settings.worker.job_max_memory_bytes)
    else:
        jobs = ThreadJobs(runners, events)
    return WorkerService(
        engine=engine,
        limits=WorkerLimits.from_settings(settings),
        worker_id=worker_id,
        signer=JobSigner.from_settings(settings),
        oidc=OidcVerifier.from_settings(settings, fetch_certs) if settings.worker.oidc_verify else None,
        runners=runners,
        jobs=jobs,
        finisher=ClaimFinisher(
            engine, worker_id=worker_id, settlement=settlement, attempts=settings.worker.finish_attempts
        ),
        settlement=settlement,
        events=events,
        readiness_problems=problems,
    )


def run_worker(
    settings: Settings,
    *,
    host: str,
    port: int,
    database_url: str | None = None,
    on_step: StepObserver | None = None,
    on_listening: Callable[[int], None] | None = None,
) -> None:
    """Serve the worker endpoint until stopped (blocking). Port 0 picks a free port (see ``on_listening``)."""
    check_worker_settings(settings)
    telemetry.setup(settings.telemetry, role="worker")  # before its engine: the statements are instrumented
    try:
        _serve_worker(settings, host, port, database_url, on_step, on_listening)
    finally:
        telemetry.shutdown()  # the last spans and counts of this worker


def _serve_worker(settings: Settings, host: str, port: int, database_url: str | None, on_step: StepObserver | None,
                  on_listening: Callable[[int], None] | None) -> None:
    import uvicorn

    engine = db.make_engine(database_url or db.database_url(settings), settings)
    db.require_schema_at_head(engine)
    app = create_worker_app(build_worker_service(settings, engine, on_step=on_step))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=max(1, int(settings.worker.drain_s)),
        )
    )
    if on_listening is not None:
        original_startup = server.startup

        async def startup(sockets=None):  # type: ignore[no-untyped-def]
            await original_startup(sockets=sockets)
            on_listening(sock.getsockname()[1])

        server.startup = startup  # type: ignore[method-assign]
    try:
        server.run(sockets=[sock])
    finally:
        engine.dispose()
