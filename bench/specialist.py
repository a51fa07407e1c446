"""Specialist benchmark: the worker's overhead per reviewer task, and memory per concurrent task.

    .venv/bin/python bench/specialist.py [--tasks 20] [--concurrent 4] [--files 200] [--model-delay-s 0.1]
    .venv/bin/python bench/specialist.py --profile 10 [--files 200]

Starts its own database: a fresh database on the server named by DATABASE_URL when it
is set (dropped afterwards), otherwise an embedded PostgreSQL in a temporary folder.

The whole product on one machine, as `specialists serve` runs it: the edge, an embedded
dispatcher and a worker (child processes), on 127.0.0.1. The reviewer (the shipped spec,
metered) reviews a generated bundle of ``--files`` Python files (2-3 KB each, one in
25 building SQL from an f-string) sent inline; its model is a scripted route whose
every call takes ``--model-delay-s`` (the "model time"): three root turns, then one
batch of a semantic call per hit, two at a time. The customer is the a2a-sdk client
over HTTP, streaming.

  hosted    admission (the customer sends) to completion (the final status event
            reaches the customer), one task at a time: the whole path - key check,
            admission and reservation, dispatch, claim, Monty, the journal and the
            signed checkpoints in PostgreSQL, task events, finish and settlement.
  baseline  the same script on the same bundle through ``rlm.Session`` in this
            process: the bare library (Monty, file checkpoints off), no service.
            Each hosted task is followed by one bare run, in turn, so that both sample the
            same state of the machine.

The overhead per task is each one's time minus the model time it waited for (the
scripted delays along its critical path), p50/p99; the ratio compares the hosted
overhead with the bare library's. Then where a hosted task's time went, stage by stage, from
the customer's send to its final event: the stages between on the database clock (the
admission's transaction start, the claim, the run's start and end, the finish), the first
and last against the customer's wall clock (the same machine's). Then ``--concurrent`` tasks at once: the worker's
resident memory (its process and its Monty worker processes) over its idle memory,
per concurrent task.

Memory is read from /proc/<pid>/smaps_rollup of the worker and every process under it, three ways: RSS summed
(pages shared by forked processes counted once per process, so an upper bound), PSS (each process's share of
shared pages: the tree's real footprint) and USS (private pages only).

``--profile RUNS`` runs only the worker's runner in this process, RUNS reviews with model time 0, and prints
where a run's time goes: the exclusive wall time inside each part (the journal and the checkpoint store in
PostgreSQL, Monty's steps and dumps, the session's budget and history stores, the library's files, the rest),
summed over the run's threads, and the database commits per run.

A benchmark is not a test: it prints figures and never fails on speed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import database, free_port  # noqa: E402
from bench.one_machine import CHECKPOINT_KEY, KEY_SECRET, serve_env  # noqa: E402
from ops.topology import Ready, Role, ops_cli  # noqa: E402
from taskstate.ids import job_id_sql  # noqa: E402

RULE = "Find every SQL statement built from caller input."
DEFECT_EVERY = 25
SCRIPT = '''
model = "scripted-bench"
default_answer = "OK"

[[root]]
code = \'\'\'
hits = context.search(r"\\.execute\\(\\s*f[\\"']", limit=16)
print(context.stats()["files"], "files,", len(hits), "hit(s)")
\'\'\'
delay_s = {delay}

[[root]]
code = \'\'\'
answers = llm_query_batched(
    ["Does %s line %d build SQL from input? Answer DEFECT: <why>, or OK." % (h["path"], h["line"]) for h in hits],
    [h["snippet"] for h in hits],
)
findings = [{{"path": h["path"], "line": h["line"], "severity": "high", "message": a.text[7:].strip()}}
            for h, a in zip(hits, answers) if a.ok and a.text.startswith("DEFECT")]
print(len(findings), "finding(s)")
\'\'\'
delay_s = {delay}

[[root]]
code = \'\'\'final_answer({{"summary": "%d place(s) build SQL from input." % len(findings), "findings": findings}})\'\'\'
delay_s = {delay}

[[subcall]]
pattern = \'\'\'execute\\(\\s*f["'][^\\n]*\\{{\'\'\'
answer = "DEFECT: the query is an f-string of caller input; use parameters."
delay_s = {delay}
'''


def bundle(files: int) -> dict[str, str]:
    """``files`` Python modules of 2-3 KB; every DEFECT_EVERY-th builds SQL from an f-string."""
    out: dict[str, str] = {}
    for index in range(files):
        lines = [f'"""Module {index}: accounts, orders and reports."""', "", "import sqlite3", ""]
        for fn in range(8):
            lines += [f"def handler_{fn}(conn, value):", f"    # step {fn} of module {index}",
                      f"    total = sum(range({fn + index % 7}))", "    if value is None:", "        return total",
                      '    return conn.execute("SELECT id FROM t WHERE v = ?", (value,)).fetchone()', ""]
        if index % DEFECT_EVERY == 0:
            lines += ["def lookup(conn, name):", "    return conn.execute(f\"SELECT * FROM users WHERE name = '{name}'\")", ""]
        out[f"pkg/module_{index:03d}.py"] = "\n".join(lines)
    return out


def model_time_s(files: int, delay_s: float, concurrency: int = 2) -> float:
    """The scripted delays on a task's critical path: three root turns, then the batch two at a time."""
    hits = min(16, math.ceil(files / DEFECT_EVERY))
    return 3 * delay_s + math.ceil(hits / concurrency) * delay_s


def percentiles(values_s: list[float]) -> tuple[float, float]:
    ordered = sorted(values_s)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return statistics.median(ordered) * 1000, p99 * 1000


MEMORY_KINDS = ("rss", "pss", "uss")


def memory_kib(pid: int) -> dict[str, int]:
    """Memory of a process and all its descendants (the worker, its job processes and their Monty processes), in
    KiB: ``rss`` sums resident memory (pages shared between forked processes counted once per process: an upper
    bound), ``pss`` gives each process its share of shared pages (the tree's real footprint), ``uss`` sums private
    pages only (what the tree frees if it exits). From /proc/<pid>/smaps_rollup."""
    total = dict.fromkeys(MEMORY_KINDS, 0)
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = {}
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines()[1:]:
                name, value, *_ = line.split()
                fields[name.rstrip(":")] = int(value)
            total["rss"] += fields.get("Rss", 0)
            total["pss"] += fields.get("Pss", 0)
            total["uss"] += fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return total


# --- where the hosted run's time goes (--profile) -----------------------------------------------------------


class Split:
    """Exclusive wall time per label, summed over threads: a wrapped call's time minus its wrapped callees'."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner = owner.__dict__.get(name, getattr(owner, name))
        self._undo.append((owner, name, owner.__dict__.get(name)))
        local, split = self._local, self

        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = local.__dict__.setdefault("stack", [])
            stack.append(0.0)
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                inside = stack.pop()
                if stack:
                    stack[-1] += elapsed
                with split._lock:
                    split.seconds[label] = split.seconds.get(label, 0.0) + elapsed - inside
                    split.calls[label] = split.calls.get(label, 0) + 1

        setattr(owner, name, staticmethod(timed) if isinstance(inner, staticmethod) else timed)

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def profile(url: str, files: dict[str, str], script: Path, tasks: int, *, show: bool = True) -> None:
    """``tasks`` reviewer runs through the worker's runner in this process (no edge, no dispatch, model time 0),
    with the time inside each part of the run and the database's commits counted."""
    from sqlalchemy import event

    from core import db
    from core.settings import Settings
    from rlmfamily.budget import Budget, BudgetLedger
    from rlmfamily.history import History
    from rlmfamily.journal import JournaledKernel
    from rlmfamily.kernels.checkpoints import Checkpoint
    from rlmfamily.kernels.monty import MontyKernel
    from rlmfamily.providers.scripted import ScriptedProvider
    from rlmfamily.trajectory import TrajectoryWriter
    from taskstate import claims
    from workers.hosted_rlm.journal import Journal
    from workers.hosted_rlm.runner import RlmRunner
    from workers.hosted_rlm.store import CheckpointPolicy, PgCheckpointStore
    from a2a.types.a2a_pb2 import Message, Part, Role
    import yaml

    from core.settings import PROJECT_ROOT
    from core.specs import load_spec
    from workers.auth import VerifiedJob
    from workers.hosted_rlm.routes import ModelRoutes, ScriptedRoute
    from workers.runs import RunContext

    settings = Settings(database={"url": url})
    engine = db.make_engine(url, settings)
    commits = {"transactions": 0, "autocommit statements": 0}

    @event.listens_for(engine, "commit")
    def _commit(conn: Any) -> None:
        commits["transactions"] += 1

    @event.listens_for(engine, "before_cursor_execute")
    def _statement(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            commits["autocommit statements"] += 1

    folder = Path(tempfile.mkdtemp(prefix="bench-specialist-profile-"))
    document = yaml.safe_load((PROJECT_ROOT / "specs" / "reviewer.yaml").read_text())
    (folder / "reviewer.yaml").write_text(yaml.safe_dump({**document, "model_route": "bench"}))
    spec = load_spec(folder / "reviewer.yaml")
    routes = ModelRoutes({"bench": ScriptedRoute(kind="scripted", script=script)})
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=RULE)] + [
        Part(raw=text.encode(), filename=name, media_type="text/x-python") for name, text in files.items()])

    class Sink:
        def emit(self, *args: Any) -> None:
            return None
    split = Split()
    for owner, names, label in (
        (Journal, ("_fenced", "open_run", "end_run", "totals", "refusals", "plan"), "journal (PostgreSQL)"),
        (PgCheckpointStore, ("put", "delete_before", "latest", "get"), "checkpoint store (PostgreSQL)"),
        (Checkpoint, ("encode",), "checkpoint encode and sign"),
        (MontyKernel, ("_record_session", "_checkpoint_pending"), "Monty dumps"),
        (MontyKernel, ("execute",), "Monty steps (own time)"),
        (MontyKernel, ("start", "recover", "close"), "Monty start and close (its worker process)"),
        (BudgetLedger, ("__init__",), "budget store (SQLite)"),
        (Budget, ("admit", "settle", "fail", "mark_unknown", "snapshot", "release", "own_usage"), "budget store (SQLite)"),
        (History, ("__init__", "add", "stats"), "history store (SQLite)"),
        (JournaledKernel, ("_write",), "library's file journal"),
        (TrajectoryWriter, ("__init__", "write", "close"), "trajectory file"),
        (ScriptedProvider, ("complete",), "scripted model"),
        (RlmRunner, ("run",), "the rest (session, bundle, answer)"),
    ):
        for name in names:
            split.wrap(owner, name, label)
    # One runner for every job, with the checkpoint policy of the settings, as a worker runs them.
    runner = RlmRunner(engine=engine, specs={spec.spec.id: spec}, routes=routes,
                       checkpoint_key=CHECKPOINT_KEY.encode(), message_of=lambda job: message, environ={},
                       checkpoint_policy=CheckpointPolicy.of(settings.hosted))
    started = time.perf_counter()
    try:
        for _ in range(tasks):
            job_id = f"bench-{uuid.uuid4().hex[:12]}"
            with engine.begin() as conn:
                token = claims.claim(conn, job_id, worker_id="bench", lease_s=600).fencing_token
            job = VerifiedJob(job_id=job_id, specialist_id=spec.spec.id, deadline_s=300, payload={}, signed_at=None,
                              secret_id="bench", reserved_credits=20)  # type: ignore[arg-type]
            outcome = runner.run(RunContext(job, token, time.monotonic() + 300, threading.Event(), Sink()))
            assert outcome.state == "completed", outcome
    finally:
        split.restore()
        engine.dispose()
    wall_s = time.perf_counter() - started
    total = sum(split.seconds.values())
    if not show:
        return
    print(f"\nwhere a hosted run's time goes: {tasks} runs in this process (the runner, no edge or dispatch; "
          f"model time 0), exclusive time per part, ms per run")
    for label, seconds in sorted(split.seconds.items(), key=lambda item: -item[1]):
        print(f"  {label:<40} {seconds / tasks * 1000:8.1f} ms  {split.calls[label] / tasks:6.1f} calls  "
              f"{seconds / total * 100:5.1f}%")
    print(f"  {'total':<40} {total / tasks * 1000:8.1f} ms (wall {wall_s / tasks * 1000:.1f} ms a run)")
    print(f"  database commits per run: {commits['transactions'] / tasks:.1f} transactions, "
          f"{commits['autocommit statements'] / tasks:.1f} autocommit statements")


# --- the customer ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Review:
    """One hosted review as its customer saw it: the wall clock (``time.time``, the clock PostgreSQL's timestamps
    read on this machine) when the request was sent and when the final event arrived."""

    seconds: float  # from the send to the final event (monotonic)
    findings: int
    state: str
    task_id: str
    sent_at: float
    final_at: float


async def review(base_url: str, token: str, files: dict[str, str]) -> Review:
    """One task through the a2a-sdk client, streaming."""
    import httpx
    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState

    parts = [Part(text=RULE)] + [Part(raw=text.encode(), filename=name, media_type="text/x-python")
                                 for name, text in files.items()]
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=300) as http:
        card = await A2ACardResolver(http, f"{base_url}/specialists/reviewer").get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        findings, state, task_id = 0, "none", ""
        sent_at, started = time.time(), time.perf_counter()
        async for event in client.send_message(SendMessageRequest(message=message)):
            kind = event.WhichOneof("payload")
            if kind == "task":
                task_id = event.task.id
            elif kind == "artifact_update" and event.artifact_update.artifact.name == "findings":
                findings = len(event.artifact_update.artifact.parts[0].data.list_value.values)
            elif kind == "status_update":
                state = TaskState.Name(event.status_update.status.state)
        return Review(time.perf_counter() - started, findings, state, task_id, sent_at, time.time())


def bare_run(files: dict[str, str], script: Path) -> float:
    """One run of the bare library (its own data folder, its SQLite files), from the bundle to the answer."""
    from rlmfamily import Context, ScriptedProvider, Session
    from rlmfamily.settings import load_settings

    items = [{"path": p, "start": 0, "end": len(t), "text": t} for p, t in files.items()]
    with tempfile.TemporaryDirectory() as data_dir:
        settings = load_settings(data_dir=data_dir, max_concurrency=2, max_subcalls=16, max_batch_size=16)
        started = time.perf_counter()
        context = Context.from_bundle(items, settings)
        result = Session(context=context, provider=ScriptedProvider.from_file(script), settings=settings,
                         extensions=[]).run(RULE)
        seconds = time.perf_counter() - started
    assert result.stop_reason == "answered", result
    return seconds


# --- the run -----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--model-delay-s", type=float, default=0.1)
    parser.add_argument("--cpu-share", choices=("auto", "nice", "off"), default=None,
                        help="the worker's SPECIALISTS_WORKER_JOB_CPU_SHARE (default: the setting's, auto: a cgroup "
                             "where one can be made, as on this machine as root; production's image runs nice)")
    parser.add_argument("--profile", type=int, default=0, metavar="RUNS",
                        help="only profile RUNS runs through the runner in this process (model time 0)")
    args = parser.parse_args()
    if args.profile:
        files = bundle(args.files)
        folder = Path(tempfile.mkdtemp(prefix="bench-specialist-"))
        script = folder / "reviewer.toml"
        script.write_text(SCRIPT.format(delay=0))
        url, cleanup = database(os.environ.get("DATABASE_URL"))
        try:
            profile(url, files, script, 1, show=False)  # warm-up: imports, Monty's pool
            profile(url, files, script, args.profile)
        finally:
            cleanup()
        return

    from sqlalchemy import text

    from core import db
    from core.settings import Settings
    from ledger import keys
    from ledger.client import Ledger

    files = bundle(args.files)
    size_kib = sum(len(t.encode()) for t in files.values()) / 1024
    model_s = model_time_s(args.files, args.model_delay_s)
    folder = Path(tempfile.mkdtemp(prefix="bench-specialist-"))
    script = folder / "reviewer.toml"
    script.write_text(SCRIPT.format(delay=args.model_delay_s))
    (folder / "routes.toml").write_text(f'[routes.reviewer]\nkind = "scripted"\nscript = "{script}"\n')
    url, cleanup = database(os.environ.get("DATABASE_URL"))
    port, worker_port = free_port(), free_port()
    env = serve_env(url, routes_file=folder / "routes.toml", edge_port=port, worker_port=worker_port,
                    extra={"SPECIALISTS_MAX_REQUEST_BODY_BYTES": str(4 * 1024 * 1024),
                           **({"SPECIALISTS_WORKER_JOB_CPU_SHARE": args.cpu_share} if args.cpu_share else {})})
    base = f"http://127.0.0.1:{port}"
    # Ready once serve's /readyz answers: every part it starts is up, the worker included.
    serve = Role("serve", ops_cli("serve"), env, Ready.http(f"{base}/readyz"), folder / "serve.log", cwd=ROOT,
                 stop_grace_s=20).start()
    engine = db.make_engine(url, Settings(database={"url": url}))
    try:
        serve.wait_ready()
        worker_pid = next(int(pid) for pid in Path(f"/proc/{serve.pid}/task/{serve.pid}/children").read_text().split()
                          if "worker" in Path(f"/proc/{pid}/cmdline").read_text())
        customer = f"bench-{uuid.uuid4().hex[:6]}"
        token = keys.issue_key(engine, keys.KeySigner([KEY_SECRET], "test"), customer_id=customer,
                               ttl=timedelta(days=1)).token
        Ledger(engine).grant(customer, 100_000, operator="bench", skills=["reviewer"], reason="bench")
        if args.cpu_share:
            print(f"the worker's jobs share the CPU by SPECIALISTS_WORKER_JOB_CPU_SHARE={args.cpu_share}")
        print(f"bundle: {args.files} files, {size_kib:.0f} KiB; model time per task {model_s * 1000:.0f} ms "
              f"({args.model_delay_s * 1000:.0f} ms a call); load average {os.getloadavg()[0]:.1f}")

        asyncio.run(review(base, token, files))  # warm-up: imports, Monty pool, connections
        bare_run(files, script)  # the same for the bare library, in this process
        reviews, bare = [], []
        for _ in range(args.tasks):
            # A hosted task, then a bare run, in turn: both sample the same state of the machine, so their ratio
            # holds in a run whatever else the machine is doing (the two phases one after the other did not).
            done = asyncio.run(review(base, token, files))
            assert done.state == "TASK_STATE_COMPLETED" and done.findings == math.ceil(args.files / DEFECT_EVERY), done
            reviews.append(done)
            bare.append(bare_run(files, script))
        hosted = [done.seconds for done in reviews]

        idle_kib = memory_kib(worker_pid)
        peak_kib = dict(idle_kib)
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.05):
                now = memory_kib(worker_pid)
                for kind in MEMORY_KINDS:
                    peak_kib[kind] = max(peak_kib[kind], now[kind])

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        async def burst() -> list[Review]:
            return await asyncio.gather(*(review(base, token, files) for _ in range(args.concurrent)))

        started = time.perf_counter()
        concurrent = asyncio.run(burst())
        burst_s = time.perf_counter() - started
        sampling.set()
        sampler.join()
        assert all(done.state == "TASK_STATE_COMPLETED" for done in concurrent)

        with engine.connect() as conn:
            checkpoints = conn.execute(text("SELECT count(*), coalesce(avg(length(data)), 0) FROM specialist_checkpoints")).one()
            calls = conn.execute(text("SELECT count(*) FROM specialist_calls")).scalar_one()
            # Where the time goes for the one-at-a-time tasks: the stages on the database clock, and the customer's
            # send and final event against it (the same machine's clock).
            points = {row.task_id: row._mapping for row in conn.execute(text(
                "SELECT e.task_id, extract(epoch FROM e.admitted_at) AS admitted, "
                "extract(epoch FROM c.first_claimed_at) AS claimed, extract(epoch FROM r.started_at) AS started, "
                "extract(epoch FROM r.ended_at) AS ended, extract(epoch FROM c.finished_at) AS finished "
                "FROM edge_tasks e JOIN dispatch_outbox o ON o.task_id = e.task_id "
                f"JOIN job_claims c ON c.job_id = {job_id_sql('o')} "
                "JOIN specialist_runs r ON r.job_id = c.job_id WHERE e.task_id = ANY(:ids)"),
                {"ids": [done.task_id for done in reviews]})}
            stages = []
            for done in reviews:
                at = [float(points[done.task_id][moment]) for moment in ("admitted", "claimed", "started", "ended",
                                                                         "finished")]
                stages.append([at[0] - done.sent_at, *(b - a for a, b in zip(at, at[1:])), done.final_at - at[-1]])
        hosted_over = [t - model_s for t in hosted]
        bare_over = [t - model_s for t in bare]
        h50, h99 = percentiles(hosted)
        o50, o99 = percentiles(hosted_over)
        b50, b99 = percentiles(bare)
        bo50, bo99 = percentiles(bare_over)
        print(f"\n{'run':<34} {'p50 ms':>8} {'p99 ms':>8}")
        print(f"{'hosted: admission to completion':<34} {h50:8.0f} {h99:8.0f}")
        print(f"{'hosted: worker overhead':<34} {o50:8.0f} {o99:8.0f}")
        print(f"{'baseline: bare rlm.Session':<34} {b50:8.0f} {b99:8.0f}")
        print(f"{'baseline: library overhead':<34} {bo50:8.0f} {bo99:8.0f}")
        print(f"\nhosted overhead / library overhead (p50): {o50 / max(bo50, 1e-9):.1f}x; "
              f"hosted overhead is {o50 / (h50 or 1) * 100:.0f}% of the task's time")
        for label, index in (("the customer sends -> admitted (the edge's transaction starts)", 0),
                             ("admission -> claim", 1), ("claim -> run starts (message, journal, plan)", 2),
                             ("the run (Session, Monty, journal, checkpoints, model time)", 3),
                             ("run ends -> finished and settled", 4),
                             ("finished -> the customer has the final event", 5)):
            p50, p99 = percentiles([float(row[index]) for row in stages])
            print(f"  {label:<64} p50 {p50:6.0f} ms  p99 {p99:6.0f} ms")
        print(f"{args.concurrent} tasks at once: {burst_s:.2f} s wall; the worker's process tree, idle and peak:")
        for kind in MEMORY_KINDS:
            print(f"  {kind.upper()} idle {idle_kib[kind] / 1024:.0f} MiB, peak {peak_kib[kind] / 1024:.0f} MiB: "
                  f"{(peak_kib[kind] - idle_kib[kind]) / 1024 / args.concurrent:.1f} MiB per concurrent task")
        print(f"journal: {calls} model calls; {checkpoints[0]} checkpoints kept, {checkpoints[1] / 1024:.0f} KiB each "
              f"on average; load average {os.getloadavg()[0]:.1f}")
    finally:
        engine.dispose()
        serve.stop()
        cleanup()


if __name__ == "__main__":
    main()
