"""Runs the edge with uvicorn on the configured host and port (``specialists serve``)."""

from __future__ import annotations

import uvicorn

from app.observability import configure_logging
from app.assembly import create_app
from core import telemetry
from core.settings import Settings

# Streams get this long to end on their own when the server stops.
GRACEFUL_SHUTDOWN_S = 10


def serve(settings: Settings, database_url: str) -> None:
    configure_logging(settings.log.level)
    telemetry.setup(settings.telemetry, role="api")  # before the app: its engine and routes are instrumented
    try:
        _run(settings, database_url)
    finally:
        telemetry.shutdown()  # the last spans and counts of this instance


def _run(settings: Settings, database_url: str) -> None:
    app = create_app(settings, database_url=database_url)
    uvicorn.run(
        app,
        host=settings.edge.host,
        port=settings.edge.port,
        log_config=None,  # configure_logging owns the handlers: JSON, redacted
        access_log=False,  # RequestLog writes one line per request, with its request id
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
