"""Load and fault suite: customers send drill tasks through two API instances while workers are killed; then an audit.

    .venv/bin/python -m bench.load [--customers 16] [--seconds 30] [--cancel 0.1] [--duplicate 0.1]
                                   [--kill-every 8] [--dispatcher embedded|cloud-tasks] [--no-baseline] [--json]
                                   [--keep-logs]

Builds the service as a deployment on 127.0.0.1 (``ops.drill.topology.LocalTopology``: a
fresh database on DATABASE_URL's server or on the embedded PostgreSQL, two API instances, two
workers with 4 job slots each, the dispatcher; leases of 2 s, worker beats every 0.15 s, so a dead worker is
found after 5 missed beats, 0.75 s: production's ratios, a 30 s lease and a 2 s beat, scaled down), then runs the
same load twice on it, each run with customers of its own:

  baseline  ``--customers`` customers, each with its own key, credits and the `drill` skill, for
            ``--seconds``. Each sends a drill task (a random script: a progress step, 0-1 s of sleep
            in one or two steps, sometimes an artifact, then complete, or fail one time in ten) with
            returnImmediately through one API instance, polls GetTask through the other (after 0.2 s,
            then doubling up to 1 s) until the task is terminal, and sends the next. Real HTTP, one
            thread per customer.
  faults    the same load, and: a fraction of the tasks is sent twice, the same body through the
            other instance, half of them after the first answer and half racing it (both answers
            must carry the same task); a fraction is canceled after a random delay within its
            script; every ``--kill-every`` seconds a worker that holds a running job is killed with
            SIGKILL and started again at once. A killed worker's jobs end *unknown* once its beat
            stops (or their lease passes; held, listed for an operator): that is the service's
            promise, not an error. Their customers stop waiting after the bound below and send the
            next task.

A customer stops waiting for its task when GetTask says its outcome is under reconciliation (the
status message's ``outcomeUnderReconciliation``: its worker died), as an agent reading the status
would, counted as ``told_unknown``; and waits at most the script's time + the cancel bound + the
lease and sweep (the time a dead worker's job takes to become unknown) + 5 s, as ``gave_up``. After each run: no
more sends; wait until every task is terminal or listed unknown (given up when no task settles
for the longest script + the cancel bound + the lease and sweep + 30 s, for a restarting worker
and redeliveries, or after 10 minutes in all); then ``ops.drill.audit.audit`` (every task
terminal or unknown, each resolved once, nothing charged without a claim, ``ledger verify`` clean).

With ``--dispatcher cloud-tasks`` the relay hands jobs to the Cloud Tasks emulator, which calls the
first worker only (Cloud Tasks calls one service URL) and delivers one job at a time: its figures
measure the emulator, and a kill stops every delivery until that worker is back.

Figures per run, side by side: tasks admitted per second, admission latency (a first send to its
answer, refusals included) p50/p99, answers by operation and error code, duplicates and their
answers, cancels, kills, final task states, unknown reservations, credits charged, time to
quiescence. The per-key rate limit is raised to 6,000 a minute: a customer whose tasks are short
sends and polls up to ten times a second, and the default 600 would measure the rate limiter.

Unlike the other benchmarks this one checks what it measures: speed never fails it, broken
promises do. Exit status 1 when an audit is not clean, the tasks did not settle within the bounds,
a duplicate was answered with another task or another status, or the service answered 5xx.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import bindparam, text  # noqa: E402

from bench.dispatch import percentiles  # noqa: E402
from core.settings import Settings  # noqa: E402
from ledger import keys  # noqa: E402
from ledger.client import Ledger  # noqa: E402
from ops.drill.audit import TERMINAL, Audit, audit  # noqa: E402
from ops.drill.topology import DispatcherKind, LocalTopology, Progress, server_url  # noqa: E402
from taskstate.ids import task_id_of  # noqa: E402
from taskstate.updates import UNKNOWN_KEY  # noqa: E402

SPECIALIST = "drill"  # specs/drill.yaml: executor scripted, tariff 2 credits, skill `drill`
CREDITS_PER_CUSTOMER = 100_000
MAX_PARALLEL = 256  # unknown reservations stay held: a customer's cap must not be what a long run measures
POLL_FIRST_S = 0.2  # a customer polls GetTask after 0.2 s, then doubles the wait up to 1 s
POLL_MAX_S = 1.0
MAX_SLEEP_S = 1.0
FAIL_FRACTION = 0.1
REQUEST_TIMEOUT_S = 30.0
PATIENCE_MARGIN_S = 5.0
QUIESCENCE_MARGIN_S = 30.0
QUIESCENCE_MAX_S = 600.0
REFUSAL_BACKOFF_S = 0.2
PROGRESS_EVERY_S = 5.0
UNTIL_POLL_S = 0.1  # past its floor, a run with `until` looks at its counts this often
RATE_LIMIT_PER_KEY = 6000
# Production's beat and lease (2 s, 30 s) in LOCAL_BOUNDS' scale (a 2 s lease): the sweeper takes a worker for dead
# after SPECIALISTS_WORKER_DEAD_AFTER_BEATS (5) missed beats, 0.75 s.
WORKER_BEAT_S = 0.15
TRANSPORT = 0  # the status recorded for a request that got no HTTP answer


@dataclass(frozen=True)
class Kill:
    worker: str
    pid: int
    tasks: tuple[str, ...]  # the tasks whose jobs it held unfinished claims on when it died
    chosen_with: tuple[str, ...]  # those it held when it was chosen: a job may finish between that and the kill
    at_s: float  # since the run's start
    restart_s: float  # SIGKILL to the new process answering /healthz


@dataclass
class LoadResult:
    name: str
    seconds: float
    customers: list[str]
    admitted: int = 0
    admitted_by_customer: Counter = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    answers: Counter = field(default_factory=Counter)  # (operation, HTTP status) -> count
    errors: Counter = field(default_factory=Counter)  # (operation, stable code) -> count
    duplicates: int = 0
    duplicate_mismatches: list[str] = field(default_factory=list)
    cancels: int = 0
    kills: list[Kill] = field(default_factory=list)
    killed_outcomes: dict[str, str] = field(default_factory=dict)  # task -> "unknown" or its final state
    gave_up: int = 0
    told_unknown: int = 0  # waits ended because the task said its outcome is under reconciliation
    harness_errors: list[str] = field(default_factory=list)  # a customer or the killer stopped on an exception
    quiescence_s: float = 0.0
    quiet: bool = False  # every task terminal and resolved, or listed unknown, within the bound
    audit: Audit = field(default_factory=Audit)

    @property
    def server_errors(self) -> int:
        return sum(n for (_, status), n in self.answers.items() if status >= 500)

    @property
    def failures(self) -> list[str]:
        found = [f"audit: {p}" for p in self.audit.problems] + self.harness_errors
        if not self.quiet:
            found.append("tasks were still neither terminal nor unknown when the wait ended")
        found += [f"duplicate: {m}" for m in self.duplicate_mismatches]
        if self.server_errors:
            found.append(f"{self.server_errors} answers were 5xx")
        return found

    def figures(self) -> dict[str, Any]:
        p50, p99 = percentiles(self.latencies_s)
        summary = self.audit.summary()
        return {
            "tasks_per_s": self.admitted / self.seconds,
            "admitted": self.admitted,
            "admission_p50_ms": p50,
            "admission_p99_ms": p99,
            "requests": sum(self.answers.values()),
            "errors": {f"{op}:{code}": n for (op, code), n in sorted(self.errors.items())},
            "duplicates": self.duplicates,
            "duplicate_mismatches": len(self.duplicate_mismatches),
            "cancels": self.cancels,
            "kills": len(self.kills),
            "kill_log": [asdict(kill) for kill in self.kills],
            "killed_jobs": sum(len(k.tasks) for k in self.kills),
            "restart_max_s": max((k.restart_s for k in self.kills), default=0.0),
            "gave_up": self.gave_up,
            "told_unknown": self.told_unknown,
            "states": summary["states"],
            "unknown": summary["unknown"],
            "unknown_not_killed": len(set(self.audit.unknown) - {t for k in self.kills for t in k.tasks}),
            "charged": summary["charged"],
            "quiescence_s": self.quiescence_s,
            "audit_clean": self.audit.clean,
            "failures": self.failures,
        }


def random_script(rng: random.Random) -> tuple[dict[str, Any], float]:
    """A short drill script and the seconds it sleeps."""
    sleep_s = round(rng.uniform(0.0, MAX_SLEEP_S), 2)
    steps: list[dict[str, Any]] = [{"op": "progress", "text": "started"}]
    if rng.random() < 0.5:
        first = round(sleep_s * rng.random(), 2)
        steps += [{"op": "sleep", "seconds": first}, {"op": "progress", "text": "halfway"},
                  {"op": "sleep", "seconds": round(sleep_s - first, 2)}]
    else:
        steps.append({"op": "sleep", "seconds": sleep_s})
    if rng.random() < 0.3:
        steps.append({"op": "artifact", "text": "a finding"})
    steps.append({"op": "fail", "text": "scripted failure"} if rng.random() < FAIL_FRACTION
                 else {"op": "complete", "text": "done"})
    return {"steps": steps}, sleep_s


def send_body(script: dict[str, Any]) -> dict[str, Any]:
    return {
        "message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"data": {"script": script}}]},
        "configuration": {"returnImmediately": True},
    }


def error_code(answer: httpx.Response) -> str:
    """The refusal's stable code (ErrorInfo metadata ``code``, else its reason), or the bare status."""
    try:
        error = answer.json()["error"]
        detail = error["details"][0]
        return str(detail.get("metadata", {}).get("code") or detail["reason"].lower())
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return f"http_{answer.status_code}"


def make_customers(topology: LocalTopology, prefix: str, count: int) -> list[tuple[str, str]]:
    """``count`` customers entitled to the drill, with credits: (customer id, key)."""
    assert topology.engine is not None
    signer, ledger = topology.signer(), Ledger(topology.engine)
    made = []
    for index in range(count):
        customer = f"{prefix}-{index:03d}"
        token = keys.issue_key(topology.engine, signer, customer_id=customer, ttl=timedelta(days=1)).token
        ledger.grant(customer, CREDITS_PER_CUSTOMER, operator="load", skills=[SPECIALIST],
                     max_parallel=MAX_PARALLEL, reason="load")
        made.append((customer, token))
    return made


_OPEN = text(
    """
    SELECT count(*) FROM edge_tasks e
      JOIN tasks t ON t.id = e.task_id
      LEFT JOIN ledger_reservations r ON r.job_id = e.reservation_id
     WHERE e.customer_id IN :customers AND r.state::text IS DISTINCT FROM 'unknown'
       AND (NOT (t.status ->> 'state') IN :terminal OR r.state::text = 'open')
    """
).bindparams(bindparam("customers", expanding=True), bindparam("terminal", expanding=True))

_OUTCOMES = text(
    """
    SELECT e.task_id, t.status ->> 'state' AS state, r.state::text AS reservation_state
      FROM edge_tasks e JOIN tasks t ON t.id = e.task_id
      LEFT JOIN ledger_reservations r ON r.job_id = e.reservation_id
     WHERE e.task_id IN :tasks
    """
).bindparams(bindparam("tasks", expanding=True))

_RUNNING = text("SELECT job_id FROM job_claims WHERE state = 'running' AND lease_expires_at > clock_timestamp()")
_UNFINISHED = text("SELECT job_id, worker_id FROM job_claims WHERE state IN ('running', 'unknown')")


class LoadRun:
    """One run of the load (see the module doc): customer threads, the worker killer, then quiescence and audit."""

    def __init__(self, topology: LocalTopology, *, name: str, customers: int, seconds: float,
                 cancel_fraction: float, duplicate_fraction: float, kill_every_s: float | None,
                 seed: int, progress: Progress, until: Callable[[LoadResult], bool] | None = None,
                 max_seconds: float | None = None) -> None:
        assert topology.engine is not None
        self.topology = topology
        self.engine = topology.engine
        self.seconds = seconds
        self.until = until
        self.max_seconds = seconds if max_seconds is None else max_seconds
        self.cancel_fraction = cancel_fraction
        self.duplicate_fraction = duplicate_fraction
        self.kill_every_s = kill_every_s
        self.seed = seed
        self.progress = progress
        bounds = topology.bounds
        self.patience_s = bounds.cancel_s + bounds.unknown_s + PATIENCE_MARGIN_S
        self.quiescence_timeout_s = MAX_SLEEP_S + bounds.cancel_s + bounds.unknown_s + QUIESCENCE_MARGIN_S
        self.keys = make_customers(topology, f"load-{name}-{uuid.uuid4().hex[:6]}", customers)
        self.result = LoadResult(name=name, seconds=seconds, customers=[c for c, _ in self.keys])
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.started = 0.0

    # --- what the customers see ----------------------------------------------------------

    def call(self, operation: str, request: Callable[[], httpx.Response]) -> httpx.Response | None:
        try:
            answer = request()
        except httpx.HTTPError as exc:
            with self.lock:
                self.result.answers[(operation, TRANSPORT)] += 1
                self.result.errors[(operation, f"transport_{type(exc).__name__}")] += 1
            return None
        with self.lock:
            self.result.answers[(operation, answer.status_code)] += 1
            if answer.status_code != 200:
                self.result.errors[(operation, error_code(answer))] += 1
        return answer

    def guarded(self, target: Callable[..., None], *args: Any) -> None:
        """Run a customer or the killer; an exception stops it and fails the run instead of vanishing."""
        try:
            target(*args)
        except Exception as exc:  # noqa: BLE001 - reported as a failure of the run
            with self.lock:
                self.result.harness_errors.append(f"{threading.current_thread().name} stopped: {exc!r}")

    def customer(self, index: int, customer_id: str, key: str) -> None:
        rng = random.Random(f"{self.seed}-{index}")
        apis = [f"{url}/specialists/{SPECIALIST}" for url in self.topology.api_urls]
        headers = {"Authorization": f"Bearer {key}", "A2A-Version": "1.0"}
        with httpx.Client(headers=headers, timeout=REQUEST_TIMEOUT_S) as http, \
                httpx.Client(headers=headers, timeout=REQUEST_TIMEOUT_S) as racer, \
                ThreadPoolExecutor(1) as racing:
            while not self.stop.is_set():
                via = rng.randrange(len(apis))
                other = apis[(via + 1) % len(apis)]
                script, sleep_s = random_script(rng)
                body = send_body(script)
                duplicate = rng.random() < self.duplicate_fraction
                race = duplicate and rng.random() < 0.5
                racing_again = None
                if race:  # a client that retried before the first answer arrived
                    racing_again = racing.submit(self.call, "duplicate",
                                                 lambda: racer.post(f"{other}/message:send", json=body))
                sent_at = time.perf_counter()
                answer = self.call("send", lambda: http.post(f"{apis[via]}/message:send", json=body))
                if answer is not None:
                    with self.lock:
                        self.result.latencies_s.append(time.perf_counter() - sent_at)
                again = None
                if duplicate:
                    again = racing_again.result() if racing_again is not None else \
                        self.call("duplicate", lambda: http.post(f"{other}/message:send", json=body))
                    self.check_duplicate(answer, again, race)
                task_id = self.task_of(answer) or self.task_of(again)
                if task_id is None:
                    self.stop.wait(REFUSAL_BACKOFF_S)
                    continue
                with self.lock:
                    self.result.admitted += 1
                    self.result.admitted_by_customer[customer_id] += 1
                cancel_at = time.monotonic() + rng.uniform(0.0, sleep_s) \
                    if rng.random() < self.cancel_fraction else None
                self.wait_for(http, other, task_id, cancel_at, time.monotonic() + sleep_s + self.patience_s)

    @staticmethod
    def task_of(answer: httpx.Response | None) -> str | None:
        if answer is None or answer.status_code != 200:
            return None
        return answer.json()["task"]["id"]

    def check_duplicate(self, first: httpx.Response | None, again: httpx.Response | None, race: bool) -> None:
        how = "racing the first send" if race else "after the first answer"
        first_status = first.status_code if first is not None else TRANSPORT
        again_status = again.status_code if again is not None else TRANSPORT
        problem = None
        if first_status != again_status:
            problem = f"a duplicate {how} was answered {again_status}, the first send {first_status}"
        elif first_status == 200 and self.task_of(first) != self.task_of(again):
            problem = f"a duplicate {how} got task {self.task_of(again)}, the first send {self.task_of(first)}"
        with self.lock:
            self.result.duplicates += 1
            if problem:
                self.result.duplicate_mismatches.append(problem)

    def wait_for(self, http: httpx.Client, api: str, task_id: str, cancel_at: float | None, give_up_at: float) -> None:
        """Poll GetTask until the task is terminal; cancel it on the way when ``cancel_at`` comes."""
        poll_s = POLL_FIRST_S
        poll_at = time.monotonic() + poll_s
        while True:
            wake_at = poll_at if cancel_at is None else min(poll_at, cancel_at)
            if self.stop.wait(max(0.0, wake_at - time.monotonic())):
                return
            if cancel_at is not None and time.monotonic() >= cancel_at:
                cancel_at = None
                with self.lock:
                    self.result.cancels += 1
                self.call("cancel", lambda: http.post(f"{api}/tasks/{task_id}:cancel", json={}))
            if time.monotonic() < poll_at:
                continue
            answer = self.call("get", lambda: http.get(f"{api}/tasks/{task_id}"))
            if answer is not None and answer.status_code == 200:
                status = answer.json()["status"]
                if status["state"] in TERMINAL:
                    return
                if status.get("message", {}).get("metadata", {}).get(UNKNOWN_KEY):
                    # The service says this task's outcome is under reconciliation (its worker died): a customer's
                    # agent that reads the status moves on, as this one does; the audit still checks the task.
                    with self.lock:
                        self.result.told_unknown += 1
                    return
            if time.monotonic() >= give_up_at:
                with self.lock:
                    self.result.gave_up += 1
                return
            poll_s = min(2 * poll_s, POLL_MAX_S)
            poll_at = time.monotonic() + poll_s

    # --- the faults ---------------------------------------------------------------------

    def killer(self) -> None:
        assert self.kill_every_s is not None
        rng = random.Random(f"{self.seed}-killer")
        next_at = self.started + self.kill_every_s
        while not self.stop.wait(max(0.0, next_at - time.monotonic())):
            process = self.victim(rng)
            if process is None:  # nothing running this instant: look again shortly
                next_at = time.monotonic() + 0.1
                continue
            pid = process.pid or 0
            chosen_with = self.claimed_by(pid)
            if not chosen_with:  # its job ended since it was chosen: choose again
                next_at = time.monotonic() + 0.1
                continue
            killed_at = time.monotonic()
            process.kill()
            process.start()
            tasks = self.claimed_by(pid)
            self.progress(f"[{self.result.name}] {killed_at - self.started:4.0f} s: SIGKILL to {process.name} (pid "
                          f"{pid}) holding {len(tasks)} running jobs; starting it again")
            process.wait_ready()
            kill = Kill(process.name, pid, tasks, chosen_with, killed_at - self.started,
                        time.monotonic() - killed_at)
            with self.lock:
                self.result.kills.append(kill)
            self.progress(f"[{self.result.name}] {process.name} answers again, {kill.restart_s:.1f} s after the kill")
            next_at = killed_at + self.kill_every_s

    def claimed_by(self, pid: int) -> tuple[str, ...]:
        """The tasks whose jobs the process ``pid`` held unfinished claims on (a claim's worker id carries the pid)."""
        with self.engine.connect() as conn:
            rows = conn.execute(_UNFINISHED).all()
        return tuple(sorted(task_id_of(job_id) for job_id, worker_id in rows
                            if worker_id and worker_id.split(":")[-2] == str(pid)))

    def victim(self, rng: random.Random) -> Any | None:
        """A live worker process holding a running claim, chosen at random."""
        with self.engine.connect() as conn:
            jobs = conn.execute(_RUNNING).scalars().all()
        holders = {}
        for job_id in jobs:
            process = self.topology.worker_running(job_id)
            if process is not None and process.alive:
                holders[process.name] = process
        return holders[rng.choice(sorted(holders))] if holders else None

    # --- the run ------------------------------------------------------------------------

    def run(self) -> LoadResult:
        result = self.result
        self.started = time.monotonic()
        threads = [threading.Thread(target=self.guarded, args=(self.customer, i, c, k), daemon=True,
                                    name=f"customer-{i}") for i, (c, k) in enumerate(self.keys)]
        if self.kill_every_s:
            threads.append(threading.Thread(target=self.guarded, args=(self.killer,), daemon=True, name="killer"))
        for thread in threads:
            thread.start()
        end_at = self.started + self.seconds
        give_up_at = self.started + self.max_seconds
        report_at = self.started + PROGRESS_EVERY_S
        while True:
            now = time.monotonic()
            with self.lock:
                done = now >= give_up_at or (now >= end_at and (self.until is None or self.until(result)))
                if not done and now >= report_at:
                    report_at += PROGRESS_EVERY_S
                    elapsed = now - self.started
                    errors = sum(result.errors.values())
                    self.progress(f"[{result.name}] {elapsed:4.0f} s: {result.admitted} tasks admitted "
                                  f"({result.admitted / elapsed:.1f}/s), {errors} answers not 200, "
                                  f"{result.duplicates} duplicates, {result.cancels} cancels, "
                                  f"{len(result.kills)} workers killed")
            if done:
                break
            next_at = min(report_at, give_up_at, end_at if now < end_at else now + UNTIL_POLL_S)
            time.sleep(max(0.0, next_at - time.monotonic()))
        self.stop.set()
        stopped_at = time.monotonic()
        for thread in threads:  # a customer ends its request (bounded by its timeout); the killer its restart
            thread.join()
        self.progress(f"[{result.name}] sending stopped; waiting for every task to be terminal or unknown "
                      f"(at most {self.quiescence_timeout_s:.0f} s without progress)")
        result.quiet = self.quiesce()
        result.quiescence_s = time.monotonic() - stopped_at  # from the last send: a restart in progress counts
        killed = sorted({task for kill in result.kills for task in kill.tasks})
        if killed:
            with self.engine.connect() as conn:
                for row in conn.execute(_OUTCOMES, {"tasks": killed}):
                    result.killed_outcomes[row.task_id] = (
                        "unknown" if row.reservation_state == "unknown" else row.state)
        result.audit = audit(self.engine, result.customers)
        self.progress(f"[{result.name}] quiet after {result.quiescence_s:.1f} s; audit "
                      f"{'clean' if result.audit.clean else 'NOT clean'}: {result.audit.summary()}")
        return result

    def quiesce(self) -> bool:
        """Wait until every task is terminal with its reservation resolved, or listed unknown (a task canceled
        while its worker was killed is terminal at once, but its credits are held until the lease passes and
        the sweeper records it unknown). A backlog may take long to drain (the Cloud
        Tasks emulator delivers one job at a time), so the bound is on a stall: no task settling for
        ``quiescence_timeout_s``; and on the whole wait, ``QUIESCENCE_MAX_S``."""
        gave_up_at = time.monotonic() + QUIESCENCE_MAX_S
        stalled_at = time.monotonic() + self.quiescence_timeout_s
        least_open = None
        while True:
            with self.engine.connect() as conn:
                still_open = conn.execute(_OPEN, {"customers": self.result.customers,
                                                  "terminal": sorted(TERMINAL)}).scalar_one()
            if still_open == 0:
                return True
            if least_open is None or still_open < least_open:
                least_open, stalled_at = still_open, time.monotonic() + self.quiescence_timeout_s
            if time.monotonic() >= min(stalled_at, gave_up_at):
                self.progress(f"[{self.result.name}] {still_open} tasks still neither terminal nor unknown")
                return False
            time.sleep(0.2)


def run_load(topology: LocalTopology, *, name: str = "faults", customers: int = 16, seconds: float = 30.0,
             cancel_fraction: float = 0.1, duplicate_fraction: float = 0.1, kill_every_s: float | None = 8.0,
             seed: int = 1, progress: Progress | None = None, until: Callable[[LoadResult], bool] | None = None,
             max_seconds: float | None = None) -> LoadResult:
    """Run the load on a started topology (see the module doc) and audit what it left.

    Sending lasts ``seconds``; with ``until``, it goes on past that until ``until(result)`` holds (checked under
    the run's lock), but not past ``max_seconds``. A test that needs a cancel or a kill to have happened says so
    there, so a slow machine sends longer instead of failing for having sent too little."""
    return LoadRun(topology, name=name, customers=customers, seconds=seconds, cancel_fraction=cancel_fraction,
                   duplicate_fraction=duplicate_fraction, kill_every_s=kill_every_s, seed=seed,
                   progress=progress or (lambda line: None), until=until,
                   max_seconds=seconds if max_seconds is None else max(seconds, max_seconds)).run()


# --- the report -----------------------------------------------------------------------------


def table(results: list[LoadResult]) -> str:
    figures = [r.figures() for r in results]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, values: list[str]) -> None:
        rows.append((label, values))

    row("tasks admitted/s", [f"{f['tasks_per_s']:.1f}" for f in figures])
    row("tasks admitted", [str(f["admitted"]) for f in figures])
    row("admission p50 ms", [f"{f['admission_p50_ms']:.1f}" for f in figures])
    row("admission p99 ms", [f"{f['admission_p99_ms']:.1f}" for f in figures])
    row("requests (send, duplicate, get, cancel)", [str(f["requests"]) for f in figures])
    for code in sorted({code for f in figures for code in f["errors"]}):
        row(f"not 200: {code}", [str(f["errors"].get(code, 0)) for f in figures])
    row("5xx answers", [str(r.server_errors) for r in results])
    row("duplicates (another task or status)", [f"{f['duplicates']} ({f['duplicate_mismatches']})" for f in figures])
    row("cancels sent", [str(f["cancels"]) for f in figures])
    row("worker kills (running jobs killed)", [f"{f['kills']} ({f['killed_jobs']})" for f in figures])
    row("worker restart, slowest s", [f"{f['restart_max_s']:.1f}" for f in figures])
    row("customer waits given up", [str(f["gave_up"]) for f in figures])
    row("  ended by an unknown status", [str(f["told_unknown"]) for f in figures])
    for state in sorted({s for f in figures for s in f["states"]}):
        row(f"final state {state}", [str(f["states"].get(state, 0)) for f in figures])
    row("reservations unknown", [str(f["unknown"]) for f in figures])
    row("  of which not on a killed worker", [str(f["unknown_not_killed"]) for f in figures])
    row("credits charged", [str(f["charged"]) for f in figures])
    row("quiet after s (from the last send)", [f"{f['quiescence_s']:.1f}" for f in figures])
    row("audit", ["clean" if f["audit_clean"] else "NOT CLEAN" for f in figures])
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{'':<{width}}" + "".join(f"{r.name:>12}" for r in results)]
    lines += [f"{label:<{width}}" + "".join(f"{v:>12}" for v in values) for label, values in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--customers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cancel", type=float, default=0.1, help="fraction of tasks canceled (faults run)")
    parser.add_argument("--duplicate", type=float, default=0.1, help="fraction of sends sent twice (faults run)")
    parser.add_argument("--kill-every", type=float, default=8.0,
                        help="seconds between worker kills (faults run); 0: no kills")
    parser.add_argument("--dispatcher", choices=["embedded", "cloud-tasks"], default="embedded")
    parser.add_argument("--no-baseline", action="store_true", help="only the run with faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (always kept on a failure)")
    args = parser.parse_args()

    began = time.monotonic()

    def progress(line: str) -> None:
        print(f"{time.monotonic() - began:6.1f} s  {line}", file=sys.stderr, flush=True)

    dispatcher: DispatcherKind = args.dispatcher
    load_before = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="bench-load-"))
    topology = LocalTopology(folder, server_url(Settings()), dispatcher_kind=dispatcher, progress=progress,
                             extra_settings={"rate_limit_per_key": str(RATE_LIMIT_PER_KEY),
                                             "worker_beat_s": str(WORKER_BEAT_S)})
    common = {"customers": args.customers, "seconds": args.seconds, "seed": args.seed, "progress": progress}
    results: list[LoadResult] = []
    with topology:
        if not args.no_baseline:
            results.append(run_load(topology, name="baseline", cancel_fraction=0.0, duplicate_fraction=0.0,
                                    kill_every_s=None, **common))
        results.append(run_load(topology, name="faults", cancel_fraction=args.cancel,
                                duplicate_fraction=args.duplicate, kill_every_s=args.kill_every or None, **common))
    failures = [f"{r.name}: {failure}" for r in results for failure in r.failures]
    if failures or args.keep_logs:
        progress(f"the processes' logs are kept in {folder / 'logs'}")
    else:
        shutil.rmtree(folder, ignore_errors=True)

    setup = {"customers": args.customers, "seconds": args.seconds, "cancel": args.cancel,
             "duplicate": args.duplicate, "kill_every_s": args.kill_every, "dispatcher": args.dispatcher,
             "cpus": os.cpu_count(), "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}
    if args.json:
        print(json.dumps({"setup": setup, "runs": {r.name: r.figures() for r in results}}, indent=2))
    else:
        print(f"\nLoad and faults: {args.customers} customers, {args.seconds:g} s per run, drill tasks, "
              f"{len(topology.api)} API instances, {len(topology.worker)} workers, dispatcher {args.dispatcher}; "
              f"faults: cancel {args.cancel:.0%}, duplicate {args.duplicate:.0%}, a worker killed every "
              f"{args.kill_every:g} s; {os.cpu_count()} CPUs, load average {load_before:.1f} before and "
              f"{os.getloadavg()[0]:.1f} after\n")
        print(table(results))
        if len(results) == 2:
            base, faults = (r.figures() for r in results)
            print(f"\nwith faults: {faults['tasks_per_s'] / max(base['tasks_per_s'], 1e-9):.0%} of the baseline's "
                  f"tasks/s, admission p99 {faults['admission_p99_ms'] / max(base['admission_p99_ms'], 1e-9):.2f}x")
        for failure in failures:
            print(f"FAILED {failure}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
