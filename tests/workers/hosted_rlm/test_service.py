"""The reviewer as customers reach it: HTTP -> admission -> dispatch -> a worker process -> Monty with the scripted
route -> settlement; and a worker killed with SIGKILL in the middle of a semantic call, whose job the next delivery
resumes and settles once. Separate processes on 127.0.0.1 (tests/workers/system.py), a database of their own."""

from __future__ import annotations

import base64
import os
import signal
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from a2a.types.a2a_pb2 import StreamResponse
from sqlalchemy import text

from ledger import keys
from ledger.client import Ledger
from tests import http_calls
from tests.conftest import TEST_SECRET
from tests.workers.hosted_rlm import support
from tests.workers.hosted_rlm.test_resume import FILES as FOUR_DEFECTS
from tests.workers.hosted_rlm.test_runner import FILES, RULE, pasted_files
from tests.workers.system import System, system_on_its_own_database
from taskstate.ids import job_id_sql

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture(scope="module")
def system(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    def reviewers_on_scripted_routes(running: System) -> None:
        support.write_spec(running.specs_dir, "reviewer")
        support.write_spec(running.specs_dir, "reviewer-slow", model_route="slow")
        routes = running.folder / "routes.toml"
        held, _ = support.held_script(running.folder / "held")
        routes.write_text(
            f'[routes.test]\nkind = "scripted"\nscript = "{support.SCRIPTS / "review_sql.toml"}"\n'
            f'[routes.slow]\nkind = "scripted"\nscript = "{held}"\n'
        )
        running.settings.update(
            model_routes_file=str(routes),
            model_routes_allow_scripted="true",
            specialist_checkpoint_key=support.CHECKPOINT_KEY.decode(),
        )

    with system_on_its_own_database(server_url, tmp_path_factory.mktemp("specialists"), workers=2, edges=("api",),
                                    prepare=reviewers_on_scripted_routes) as running:
        yield running


@pytest.fixture
def customer(system: System) -> dict[str, str]:
    customer_id = f"c-{uuid.uuid4().hex[:12]}"
    issued = keys.issue_key(system.engine, keys.KeySigner([TEST_SECRET], "test"), customer_id=customer_id,
                            ttl=timedelta(days=1))
    Ledger(system.engine).grant(customer_id, 100, operator="tests", skills=["reviewer", "reviewer-slow"],
                                reason="specialist tests")
    return {"Authorization": f"Bearer {issued.token}", "A2A-Version": "1.0"}


def send(system: System, headers: dict[str, str], specialist: str, files: dict[str, str], *,
         pasted: bool = False) -> str:
    """The rule and ``files``: as inline file parts, or (``pasted``) pasted in the one text part."""
    parts = [{"text": pasted_files(RULE, files)}] if pasted else [{"text": RULE}] + [
        {"raw": base64.b64encode(content.encode()).decode(), "filename": name, "mediaType": "text/x-python"}
        for name, content in files.items()
    ]
    body = {"message": {"messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER", "parts": parts},
            "configuration": {"returnImmediately": True}}
    answer = http_calls.post(f"{system.edges[0].specialist(specialist)}/message:send", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["task"]["id"]


def task_of(system: System, headers: dict[str, str], specialist: str, task_id: str) -> dict:
    return http_calls.get(f"{system.edges[0].specialist(specialist)}/tasks/{task_id}", headers=headers).json()


def finished(system: System, headers: dict[str, str], specialist: str, task_id: str) -> dict | None:
    task = task_of(system, headers, specialist, task_id)
    return task if task["status"]["state"] in ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED") else None


def settlements(system: System, task_id: str) -> list[tuple[str, int]]:
    with system.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(
            text("SELECT kind::text, charged FROM ledger_settlements WHERE job_id = :j"), {"j": task_id})]


def artifacts(task: dict) -> dict[str, dict]:
    return {artifact["name"]: artifact["parts"][0] for artifact in task.get("artifacts", [])}


def test_a_review_runs_end_to_end_with_findings_one_settlement_and_usage_recorded(system, customer):
    task_id = send(system, customer, "reviewer", FILES)
    task = system.wait_for("the review to finish", lambda: finished(system, customer, "reviewer", task_id), 60)

    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    found = artifacts(task)
    assert [(f["path"], f["line"]) for f in found["findings"]["data"]] == [("app/db.py", 4), ("app/orders.py", 3)]
    assert "app/db.py:4 [high]" in found["report"]["text"]
    meta = task["metadata"]["specialist"]
    assert (meta["semanticCallsUsed"], meta["creditsCharged"], meta["stopReason"]) == (2, 6, "answered")
    assert meta["findingsDropped"] == {"path_not_in_bundle": 2}
    assert settlements(system, task_id) == [("settle", 6)]  # metered: 4 + 2 x 1, of the 20 reserved
    # The artifacts are written by the finish, in its transaction, just before the final state: the last three
    # events of the task, committed together.
    with system.engine.connect() as conn:
        last = conn.execute(text(
            "SELECT CAST(xmin AS text) AS tx, event_data FROM task_events WHERE task_id = :t "
            "ORDER BY task_version DESC LIMIT 3"), {"t": task_id}).all()
    assert len({row.tx for row in last}) == 1, last
    kinds = [StreamResponse.FromString(bytes(row.event_data)).WhichOneof("payload") for row in reversed(last)]
    assert kinds == ["artifact_update", "artifact_update", "status_update"], kinds
    job = system.job_of(task_id)
    with system.engine.connect() as conn:
        calls = conn.execute(text("SELECT purpose, state, prompt_tokens FROM specialist_calls WHERE job_id = :j"),
                             {"j": job}).all()
    assert sorted(c.purpose for c in calls) == ["root", "root", "root", "subcall", "subcall"]
    assert all(c.state == "completed" and c.prompt_tokens > 0 for c in calls)


def test_code_a_foreign_agent_pastes_in_text_is_reviewed_with_findings_at_its_path_and_line(system, customer):
    task_id = send(system, customer, "reviewer", FILES, pasted=True)
    task = system.wait_for("the review to finish", lambda: finished(system, customer, "reviewer", task_id), 60)

    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    found = artifacts(task)
    assert [(f["path"], f["line"]) for f in found["findings"]["data"]] == [("app/db.py", 4), ("app/orders.py", 3)]
    assert "app/db.py:4 [high]" in found["report"]["text"]
    assert settlements(system, task_id) == [("settle", 6)]


def test_a_worker_killed_mid_subcall_is_resumed_by_the_next_delivery_and_settled_once(system, customer):
    task_id = send(system, customer, "reviewer-slow", FOUR_DEFECTS)
    job = system.wait_for("the job to be dispatched", lambda: _job(system, task_id), 30)

    wait_for_two_held_subcalls(system, job)
    kill_the_claiming_worker(system, job)

    task = system.wait_for("the resumed review to finish", lambda: finished(system, customer, "reviewer-slow", task_id), 60)
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    assert [f["path"] for f in artifacts(task)["findings"]["data"]] == list(FOUR_DEFECTS)  # the order of the bundle
    with system.engine.connect() as conn:
        claim = conn.execute(text("SELECT state, fencing_token, outcome FROM job_claims WHERE job_id = :j"),
                             {"j": job}).one()
        rows = conn.execute(text("SELECT state, superseded_by, request_sha256 FROM specialist_calls "
                                 "WHERE job_id = :j AND purpose = 'subcall'"), {"j": job}).all()
    assert (claim.state, claim.fencing_token, claim.outcome) == ("finished", 2, "completed")  # resumed once
    answered = [r for r in rows if r.state == "completed"]
    assert len(answered) == 4 and len({bytes(r.request_sha256) for r in answered}) == 4  # none asked twice
    assert all(r.superseded_by is not None for r in rows if r.state == "unknown")
    meta = task["metadata"]["specialist"]
    assert (meta["semanticCallsUsed"], meta["creditsCharged"], meta["resumes"]) == (4, 8, 1)
    assert settlements(system, task_id) == [("settle", 8)]  # once, for the four calls answered once each


def wait_for_two_held_subcalls(system: System, job: str) -> None:
    """The route's script holds every semantic call after the first two until its release file appears."""
    def in_flight() -> bool:
        with system.engine.connect() as conn:
            states = dict(conn.execute(text(
                "SELECT state, count(*) FROM specialist_calls WHERE job_id = :j AND purpose = 'subcall' GROUP BY 1"),
                {"j": job}).all())
        return states.get("completed", 0) >= 2 and states.get("started", 0) >= 2

    system.wait_for("two answered semantic calls and two held in flight", in_flight, 60, interval_s=0.02)


def kill_the_claiming_worker(system: System, job: str) -> None:
    """SIGKILL the worker whose claim holds ``job``, then release the held calls for the run that resumes it."""
    with system.engine.connect() as conn:
        worker_id = conn.execute(text("SELECT worker_id FROM job_claims WHERE job_id = :j"), {"j": job}).scalar_one()
    victim = [w for w in system.workers if str(w.process.pid) == worker_id.split(":")[1]]
    assert victim, worker_id
    os.kill(victim[0].process.pid, signal.SIGKILL)
    victim[0].process.wait(10)
    (system.folder / "held" / "release").touch()  # the resumed run's calls go through


def _job(system: System, task_id: str) -> str | None:
    with system.engine.connect() as conn:
        return conn.execute(text(
            f"SELECT c.job_id FROM dispatch_outbox o JOIN job_claims c ON c.job_id = {job_id_sql('o')} "
            "WHERE o.task_id = :t"), {"t": task_id}).scalar()
