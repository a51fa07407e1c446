"""Health knows when nothing can run (issue 42, section 1): the only worker is killed, and `specialists health`, the
edge's ``/metrics`` and the dispatcher's log say so; the edge's own readiness stays about the edge.

Seen before: with the only worker killed, `specialists health` said ready and exited 0 for as long as it was
watched, the queue said "nothing queued", and the dispatcher logged ``worker_unreachable`` at INFO only. Real
processes (an edge, a worker, a dispatcher) on a database of their own; the worker is killed with SIGKILL, and the
test waits for each fact to turn, never for a fixed time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from core.settings import Settings
from ledger import keys
from ledger.client import Ledger
from ops.health import health
from tests import commands, http_calls
from tests.conftest import TEST_SECRET
from tests.workers.system import System, script_message, system_on_its_own_database

pytestmark = pytest.mark.timeout(240)

BEAT_S = 0.2
LIVE_S = 3.0  # a worker whose beat is older is dead; the test waits well past it, never for it
SERVED = ["conformance", "scripted"]  # the system's specs, both served by its worker


@pytest.fixture(scope="module")
def system(server_url: str, engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    engine.dispose()  # the session's idle connections go back before four processes start
    with system_on_its_own_database(server_url, tmp_path_factory.mktemp("health-kill"), workers=1, edges=("api",),
                                    settings={"worker_beat_s": str(BEAT_S),
                                              "health_worker_live_s": str(LIVE_S)}) as running:
        yield running


def settings_of(system: System) -> Settings:
    return Settings(database={"url": system.database_url}, hosted={"specs_dir": system.specs_dir},
                    worker={"beat_s": BEAT_S}, health={"worker_live_s": LIVE_S})


def cli_health(system: System) -> subprocess.CompletedProcess:
    return commands.specialists(["health", "--json"], system.env())  # in this process (tests/commands.py)


def send_scripted(system: System) -> str:
    customer_id = f"c-{uuid.uuid4().hex[:12]}"
    issued = keys.issue_key(system.engine, keys.KeySigner([TEST_SECRET], "test"), customer_id=customer_id,
                            ttl=timedelta(days=1))
    Ledger(system.engine).grant(customer_id, 30, operator="tests", skills=["scripted"], reason="health tests")
    answer = http_calls.post(f"{system.edges[0].specialist('scripted')}/message:send",
                             json=script_message([{"op": "complete", "text": "hi"}], returnImmediately=True),
                             headers={"Authorization": f"Bearer {issued.token}", "A2A-Version": "1.0"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["task"]["id"]


def warnings_unreachable(system: System) -> list[dict]:
    lines = [json.loads(line) for line in system.dispatchers[0].log_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "workers_unreachable"]


def test_a_killed_worker_turns_health_metrics_and_the_dispatchers_log_while_the_edge_stays_ready(system):
    settings = settings_of(system)
    alive = system.wait_for("the worker's first beats", lambda: not health(settings, system.engine).without_live_worker,
                            timeout_s=60)
    assert alive
    before = cli_health(system)
    assert json.loads(before.stdout)["without_live_worker"] == [], before.stdout + before.stderr

    worker = system.workers[0]
    os.kill(worker.process.pid, signal.SIGKILL)
    worker.process.wait(10)
    killed_at = time.monotonic()
    turned = system.wait_for("health to say no worker is live", lambda: (
        found if (found := health(settings, system.engine)).without_live_worker == SERVED else None),
        timeout_s=LIVE_S + 60)
    assert {p.code for p in turned.problems} >= {"no_live_worker"}
    assert [w.live for w in turned.facts.workers] == [False]  # its row stays, dead: health names what died
    print(f"health turned {time.monotonic() - killed_at:.1f} s after the kill (bound {LIVE_S:g} s + a read)")

    # A task sent now waits: the dispatcher finds no worker, says so at WARNING with a count, and health and the
    # edge's /metrics count the job as waiting for redelivery.
    task_id = send_scripted(system)
    warned = system.wait_for("the dispatcher's workers_unreachable warning", lambda: warnings_unreachable(system),
                             timeout_s=60)
    assert warned[0]["level"] == "WARNING" and warned[0]["count"] >= 1, warned
    waiting = system.wait_for("health to count the job for redelivery", lambda: (
        found if (found := health(settings, system.engine)).redelivery >= 1 else None), timeout_s=60)
    assert [q.specialist_id for q in waiting.queue] == ["scripted"] and waiting.oldest_queued_age_s >= 0
    assert task_id

    after = cli_health(system)
    assert after.returncode == 1, after.stdout + after.stderr
    report = json.loads(after.stdout)
    assert report["without_live_worker"] == SERVED and report["queue"]["redelivery"] >= 1
    assert {p["specialist_id"] for p in report["problems"] if p["code"] == "no_live_worker"} == set(SERVED)
    table = commands.specialists(["health"], system.env())
    assert table.returncode == 1, table.stdout
    assert "NOT READY no_live_worker: no worker serving scripted" in table.stdout, table.stdout

    edge = system.edges[0]
    assert http_calls.get(f"{edge.url}/readyz").status_code == 200  # the edge's readiness is about the edge
    scraped = http_calls.get(f"{edge.url}/metrics").text
    assert 'specialists_workers_live{specialist="scripted"} 0.0' in scraped, scraped
    assert 'specialists_queue_redelivery{specialist="scripted"} 1.0' in scraped, scraped
    assert 'specialists_queue_age_seconds{specialist="scripted"}' in scraped

    # A worker started again makes the specialists live again; stopped cleanly (SIGTERM), it deletes its beat, so
    # health turns at once rather than after the live bound.
    replacement = system.start_worker()
    back = system.wait_for("the new worker's beat", lambda: (
        found if not (found := health(settings, system.engine)).without_live_worker else None), timeout_s=60)
    live_ids = [w.worker_id for w in back.facts.workers if w.live]
    assert len(live_ids) == 1
    replacement.stop()
    gone = health(settings, system.engine)
    assert live_ids[0] not in [w.worker_id for w in gone.facts.workers]
    assert gone.without_live_worker == SERVED
