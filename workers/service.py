"""Assembling a worker from settings, and serving it: what `specialists worker` calls.

``build_worker_service`` wires the signer, the OIDC check (unless turned off), the
runners, the finisher and the settlement seam. ``run_worker`` checks the
configuration (schema at head, a job secret present), then serves the endpoint
with uvicorn until stopped.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Mapping

from sqlalchemy import Engine

from core import db
from core.errors import ServiceError
from core.settings import Settings
from workers.auth import CertsFetcher, JobSigner, OidcVerifier
from workers.finish import ClaimFinisher, NoSettlement, Settlement
from workers.runner import EventSink, LoggingEventSink, Runner, ScriptedRunner
from workers.server import WorkerLimits, WorkerService, create_worker_app

log = logging.getLogger(__name__)


class WorkerNotConfigured(ServiceError):
    code = "worker_not_configured"


def new_worker_id() -> str:
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(3)}"


def default_runners() -> dict[str, Runner]:
    """Specialists every worker serves until the spec-driven ones land (issue 7)."""
    return {"scripted": ScriptedRunner()}


def check_worker_settings(settings: Settings) -> None:
    """Refuse to start a worker that would refuse every job, or check no token while it should."""
    if not settings.worker_job_secrets:
        raise WorkerNotConfigured(
            "no worker job secret is configured, so this worker would refuse every job; set "
            "SPECIALISTS_WORKER_JOB_SECRETS (the same value as the dispatcher's)"
        )
    if settings.worker_oidc_verify and not settings.dispatch_service_account:
        raise WorkerNotConfigured(
            "the worker checks OIDC tokens but no account is accepted; set SPECIALISTS_DISPATCH_SERVICE_ACCOUNT, "
            "or on one machine only SPECIALISTS_WORKER_OIDC_VERIFY=false"
        )
    if not settings.worker_oidc_verify:
        log.warning("OIDC tokens are NOT checked (SPECIALISTS_WORKER_OIDC_VERIFY=false): one-machine mode")


def build_worker_service(
    settings: Settings,
    engine: Engine,
    *,
    runners: Mapping[str, Runner] | None = None,
    settlement: Settlement | None = None,
    events: EventSink | None = None,
    fetch_certs: CertsFetcher | None = None,
    worker_id: str | None = None,
) -> WorkerService:
    check_worker_settings(settings)
    worker_id = worker_id or new_worker_id()
    settlement = settlement or NoSettlement()
    return WorkerService(
        engine=engine,
        limits=WorkerLimits.from_settings(settings),
        worker_id=worker_id,
        signer=JobSigner.from_settings(settings),
        oidc=OidcVerifier.from_settings(settings, fetch_certs) if settings.worker_oidc_verify else None,
        runners=runners if runners is not None else default_runners(),
        finisher=ClaimFinisher(
            engine, worker_id=worker_id, settlement=settlement, attempts=settings.worker_finish_attempts
        ),
        settlement=settlement,
        events=events or LoggingEventSink(),
    )


def run_worker(settings: Settings, *, host: str, port: int, runners: Mapping[str, Runner] | None = None) -> None:
    """Serve the worker endpoint until stopped (blocking)."""
    import uvicorn

    check_worker_settings(settings)
    engine = db.make_engine(db.database_url(settings), settings)
    db.require_schema_at_head(engine)
    app = create_worker_app(build_worker_service(settings, engine, runners=runners))
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
