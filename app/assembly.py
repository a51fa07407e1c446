"""Assembles the edge: specs, database, SDK routes per specialist, middleware, operations routes.

``create_app`` is the only place the pieces meet. The edge runs no specialist:
admitted work leaves through the dispatch outbox to workers (docs/WORKERS.md). Per specialist, under
``/specialists/<id>``: the Agent Card, the JSON-RPC endpoint at ``/jsonrpc``
(A2A 1.0 methods, plus the 0.3 names), and the HTTP+JSON routes; with
SPECIALISTS_GRPC_PORT set, one gRPC server for all of them, and one per SPECIALISTS_GRPC_SPECIALIST_PORTS entry (app/grpc_binding.py),
started and stopped with the app's lifespan. The SDK's
REST builder also mounts a catch-all ``/{tenant}`` route at the root; the edge
serves no tenants by path (the key names the customer), so it is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from a2a.extensions.common import HTTP_EXTENSION_HEADER, get_requested_extensions
from a2a.server.cluster import VersionedDatabaseTaskStore
from a2a.server.context import ServerCallContext
from a2a.server.routes import ServerCallContextBuilder, create_jsonrpc_routes, create_rest_routes
from a2a.types.a2a_pb2 import AgentCard
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from app import integers, ledger_port
from app.admission import AdmissionService
from app.boundary import ErrorBoundary
from app.cards import build_card, discovery_routes, jwks_routes
from app.push import PushConfigs
from app.errors import TaskNotFound, error_response, register_with_sdk
from app.events import NotifiedEventStream
from app.grpc_binding import GRACEFUL_STOP_S, GrpcBinding, build_servers
from app.handler import EdgeRequestHandler, identity_of
from app.identity import EdgeUser
from app.listing import TaskListing
from app.middleware import CREDENTIAL_HEADERS, IDENTITY_SCOPE_KEY, SPECIALIST_SCOPE_KEY, A2AGuard, RequestLog
from taskstate.notify import TASK_EVENTS, Listener, Notifier
from app.observability import Metrics
from app.ratelimit import RateLimiter
from app.slashes import TrailingSlash
from app.streams import StreamGate, StreamRefusalStatus
from core import db, telemetry
from core.errors import ServiceError
from core.settings import Settings
from core.specs import LoadedSpec, load_specs
from ledger.keys import AsyncKeyVerifier, KeySigner

log = logging.getLogger(__name__)

READY_CHECK_TIMEOUT_S = 2.0


class EdgeCallContextBuilder(ServerCallContextBuilder):
    """The SDK call context: the caller as its user (owner scope), headers without credentials."""

    def build(self, request: Request) -> ServerCallContext:
        identity = request.scope[IDENTITY_SCOPE_KEY]
        specialist_id = request.scope[SPECIALIST_SCOPE_KEY]
        headers = {k: v for k, v in request.headers.items() if k not in CREDENTIAL_HEADERS}
        return ServerCallContext(
            user=EdgeUser(identity, specialist_id),
            state={"headers": headers},
            requested_extensions=get_requested_extensions(request.headers.getlist(HTTP_EXTENSION_HEADER)),
        )


@dataclass
class Edge:
    """The running parts of one edge process (tests and the benchmark reach in here)."""

    settings: Settings
    specs: dict[str, LoadedSpec]
    engine: AsyncEngine
    autocommit_engine: AsyncEngine  # single statements in autocommit (``edge_engine``)
    store: VersionedDatabaseTaskStore
    events: NotifiedEventStream
    listener: Listener
    admission: AdmissionService
    limiter: RateLimiter
    metrics: Metrics
    handlers: dict[str, EdgeRequestHandler]
    schema_head: str


def _extended_card(engine: AsyncEngine):
    async def modify(card: AgentCard, context: ServerCallContext) -> AgentCard:
        identity = identity_of(context)
        if identity.anonymous:
            return card
        async with engine.connect() as conn:
            available = await conn.run_sync(ledger_port.available_credits, identity.customer_id)
        extended = AgentCard()
        extended.CopyFrom(card)
        extended.capabilities.extensions[0].params.update({"availableCredits": available or 0})
        return extended

    return modify


def _a2a_routes(specialist_id: str, handler: EdgeRequestHandler, builder: ServerCallContextBuilder) -> list[BaseRoute]:
    prefix = f"/specialists/{specialist_id}"
    routes: list[BaseRoute] = list(
        create_jsonrpc_routes(handler, f"{prefix}/jsonrpc", context_builder=builder, enable_v0_3_compat=True)
    )
    rest = create_rest_routes(handler, context_builder=builder, path_prefix=prefix)
    routes.extend(route for route in rest if not isinstance(route, Mount))  # drop the /{tenant} catch-all
    routes.append(_no_such_task_route(prefix))
    return routes


def _no_such_task_route(prefix: str) -> Route:
    """A task id with a slash in it (``/tasks/a%2Fb``: the path is matched decoded) matches none of the SDK's
    routes; it names no task, and is answered as any such id is (``TaskNotFound``, 404), not as a bare route
    miss. Registered after the SDK's routes, so it only sees what they did not take."""

    async def no_such_task(request: Request) -> Response:
        return error_response(TaskNotFound("Task not found"), "rest")

    return Route(f"{prefix}/tasks/{{head}}/{{tail:path}}", no_such_task, methods=["GET", "POST", "DELETE"])


def edge_engine(url: str, settings: Settings, *, autocommit: bool = False) -> AsyncEngine:
    """One of the edge's two pools: ``core.db.make_async_engine``, without pre-ping (a round trip on every checkout,
    and the hot path checks out twice a request: rate limit, admission) and without statement telemetry. A
    connection the server ended while it sat in the pool is found on checkout by its socket, at no round trip, and
    replaced. ``autocommit``: the pool of single statements, each its own transaction (the rate-limit count, a new
    task's admission, the event reads), whose connections are in autocommit from their start, so a checkout neither
    switches one in and out of it nor rolls it back (issue 44: 0.1-0.2 ms of the edge's CPU an admission); the
    other pool runs transactions. Each is sized by SPECIALISTS_DB_POOL_SIZE and SPECIALISTS_DB_MAX_OVERFLOW."""
    return db.make_async_engine(url, settings, instrumented=False, autocommit=autocommit)


async def schema_problem(engine: AsyncEngine, head: str) -> tuple[str | None, str | None]:
    """The schema's revision, and why this code must not serve on it (None: it may; see ``db.schema_problem``)."""
    async with engine.connect() as conn:
        current = (await conn.execute(text(db.REVISION_SQL))).scalar_one_or_none()
        chain = {}
        if current is not None and (await conn.execute(text(db.COMPATIBILITY_EXISTS_SQL))).scalar():
            chain = db.compatibility_chain((await conn.execute(text(db.COMPATIBILITY_SQL))).all())
    return current, db.schema_problem(current, head, chain)


class EdgeNotConfigured(ServiceError):
    code = "edge_not_configured"


def check_edge_settings(settings: Settings) -> None:
    """Start-up's refusals of the edge: live keys with ``/metrics`` open to anyone, unless opened on purpose."""
    edge = settings.edge
    if settings.keys.environment == "live" and edge.metrics_token is None and not edge.metrics_open:
        raise EdgeNotConfigured(
            "with SPECIALISTS_KEY_ENVIRONMENT=live, /metrics needs a scraper's token: set SPECIALISTS_METRICS_TOKEN "
            "(or SPECIALISTS_METRICS_OPEN=true to open it to anyone who reaches the edge, on purpose)"
        )


def create_app(settings: Settings, *, database_url: str | None = None) -> FastAPI:
    """The edge as an ASGI app. Raises SpecInvalid for a bad spec before anything starts."""
    specs = load_specs(settings.hosted.specs_dir)
    for setting, named in (("SPECIALISTS_GRPC_SPECIALIST_PORTS", settings.edge.grpc_specialist_ports),
                           ("SPECIALISTS_GRPC_SPECIALIST_URLS", settings.edge.grpc_specialist_urls)):
        if unknown := sorted(set(named) - set(specs)):
            raise EdgeNotConfigured(
                f"{setting} names {', '.join(unknown)}, which no spec in {settings.hosted.specs_dir} defines: "
                "name served specialists only"
            )
    register_with_sdk()  # the edge's refusals get their wire forms before any route can raise one
    integers.install()  # whole numbers print as integers in every JSON answer (raises if protobuf moved the hook)
    url = database_url or db.database_url(settings)
    engine = edge_engine(url, settings)
    autocommit = edge_engine(url, settings, autocommit=True)
    metrics = Metrics()
    # Its tasks' events only: nothing in the edge waits for the dispatchers' wake-ups, which every admission sends
    # (one more notification a job for this connection, its backend and the edge's loop to read; issue 44).
    listener = Listener(url, settings.database.connect_timeout_s, channels=(TASK_EVENTS,))
    notifier = Notifier(autocommit)  # its wake-ups are single statements: on the autocommit pool, on the driver
    store = VersionedDatabaseTaskStore(engine, create_table=False)
    events = NotifiedEventStream(engine, autocommit, listener, notifier, settings.edge.event_poll_interval_s)
    admission = AdmissionService(engine, autocommit, settings, notifier)
    listing = TaskListing(engine, settings)
    limiter = RateLimiter(autocommit, settings)
    signer = KeySigner([s.get_secret_value() for s in settings.keys.signing_secrets], settings.keys.environment)
    verifier = AsyncKeyVerifier(signer, engine, settings.keys.revocation_cache_s)
    streams = StreamGate(settings.edge, metrics)
    builder = EdgeCallContextBuilder()
    cards = {specialist_id: build_card(loaded, settings) for specialist_id, loaded in specs.items()}
    push_configs = PushConfigs(engine, settings) if settings.push.enabled else None
    handlers = {
        specialist_id: EdgeRequestHandler(
            loaded=loaded,
            card=cards[specialist_id],
            store=store,
            events=events,
            admission=admission,
            listing=listing,
            streams=streams,
            settings=settings,
            metrics=metrics,
            push_configs=push_configs,
            extended_card_modifier=_extended_card(engine),
        )
        for specialist_id, loaded in specs.items()
    }
    edge = Edge(
        settings=settings,
        specs=specs,
        engine=engine,
        autocommit_engine=autocommit,
        store=store,
        events=events,
        listener=listener,
        admission=admission,
        limiter=limiter,
        metrics=metrics,
        handlers=handlers,
        schema_head=db.head_revision(),
    )
    binding = None
    if settings.edge.grpc_port or settings.edge.grpc_specialist_ports:
        binding = GrpcBinding(
            specs=specs, handlers=handlers, verifier=verifier, limiter=limiter, settings=settings, metrics=metrics
        )
    # A keep-alive comment more often than the a2a-sdk client's default 5 s read timeout.
    EventSourceResponse.DEFAULT_PING_INTERVAL = settings.edge.sse_ping_interval_s

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        _, problem = await schema_problem(engine, edge.schema_head)
        if problem:
            raise db.SchemaNotAtHead(problem)
        listener.start()
        pruner = asyncio.create_task(limiter.prune_forever(), name="rate-window-pruner")
        grpc_servers = build_servers(binding, settings) if binding is not None else []
        for grpc_server in grpc_servers:  # in this event loop, on the same handlers as the HTTP bindings
            await grpc_server.start()
        if grpc_servers:
            ports = {"shared": settings.edge.grpc_port, **settings.edge.grpc_specialist_ports}
            log.info("gRPC binding on %s: %s", settings.edge.host, ports, extra={"event": "grpc_ready"})
        # Everything built so far (SDK, protobuf, SQLAlchemy) lives as long as the process:
        # keep it out of the collector's full passes, which otherwise scanned it every
        # second or two under load for ~90 ms each (the tail of the latency).
        gc.collect()
        gc.freeze()
        log.info("edge ready: %d specialist(s) at %s", len(specs), settings.edge.url, extra={"event": "ready"})
        try:
            yield
        finally:
            await asyncio.gather(*(grpc_server.stop(GRACEFUL_STOP_S) for grpc_server in grpc_servers))
            pruner.cancel()
            for handler in handlers.values():
                await handler.aclose()
            await notifier.close()
            await listener.stop()
            await engine.dispose()
            await autocommit.dispose()

    # No redirects: one trailing slash is served as the route itself (TrailingSlash, app/slashes.py).
    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False,
                  telemetry=telemetry.FASTAPI_TELEMETRY)  # the request's span is RequestLog's
    app.state.edge = edge
    routes: list[BaseRoute] = [
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/readyz", _readyz(edge), methods=["GET"]),
        Route("/metrics", _metrics(metrics, settings, _service_reader(engine, settings, sorted(specs))),
              methods=["GET"]),
        *discovery_routes(specs, cards, settings),
        *jwks_routes(settings),
    ]
    for specialist_id, handler in handlers.items():
        routes.extend(_a2a_routes(specialist_id, handler, builder))
    app.router.routes.extend(routes)
    app.add_middleware(StreamRefusalStatus)  # innermost: around the SDK's routes, where a stream is refused
    app.add_middleware(A2AGuard, specs=specs, verifier=verifier, limiter=limiter, settings=settings, metrics=metrics)
    # Around the guard and the SDK: nothing unexpected leaves with its own text (app/boundary.py).
    app.add_middleware(ErrorBoundary, metrics=metrics, retry_after_s=settings.edge.db_retry_after_s)
    app.add_middleware(RequestLog, metrics=metrics)
    app.add_middleware(TrailingSlash)  # added last: outermost, so every layer sees the one form routes have
    return app


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "alive"})


def _readyz(edge: Edge):
    async def readyz(request: Request) -> Response:
        try:
            current, problem = await asyncio.wait_for(schema_problem(edge.engine, edge.schema_head),
                                                      READY_CHECK_TIMEOUT_S)
        except Exception as exc:
            return JSONResponse(
                {"status": "not_ready", "reason": "database_unreachable", "detail": type(exc).__name__}, status_code=503
            )
        if problem:
            return JSONResponse(
                {"status": "not_ready", "reason": "schema_not_at_head", "schema": current, "head": edge.schema_head},
                status_code=503,
            )
        return JSONResponse({"status": "ready", "schema": current})

    return readyz


def _service_reader(engine: AsyncEngine, settings: Settings, specialists: list[str]):
    """The service's state for ``/metrics``: the read `specialists health` makes (``taskstate.reads.service_facts``),
    at most once per ``telemetry.SERVICE_READ_REUSE_S`` however often it is scraped (an open ``/metrics`` must not
    be a way to load the database); None when the database does not answer (the edge's own metrics are still
    served)."""
    from taskstate.reads import service_facts

    lock = asyncio.Lock()
    latest: dict[str, Any] = {"at": None, "points": None}

    async def read() -> telemetry.ServicePoints | None:
        async with lock:
            now = time.monotonic()
            if latest["at"] is not None and now - latest["at"] <= telemetry.SERVICE_READ_REUSE_S:
                return latest["points"]
            try:
                async with engine.connect() as conn:
                    facts = await conn.run_sync(lambda sync: service_facts(
                        sync, specialists=specialists, live_s=settings.health.worker_live_s,
                        failures_window_s=settings.health.failures_window_s))
                latest["points"] = facts.points()
            except Exception as exc:  # a scrape must still show the edge's own counts
                log.warning("the service's state could not be read for /metrics: %s", type(exc).__name__)
                latest["points"] = None
            latest["at"] = time.monotonic()
            return latest["points"]

    return read


def _metrics(metrics: Metrics, settings: Settings,
             read_service: Callable[[], Awaitable[telemetry.ServicePoints | None]] | None = None):
    token = settings.edge.metrics_token.get_secret_value().encode() if settings.edge.metrics_token else None

    async def endpoint(request: Request) -> Response:
        if token is not None:
            offered = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(offered, b"Bearer " + token):
                return JSONResponse(
                    {"code": "metrics_token_required", "message": "/metrics needs the scraper's bearer token "
                     "(SPECIALISTS_METRICS_TOKEN)"},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
                )
        if read_service is not None:
            metrics.show_service(await read_service())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return endpoint
