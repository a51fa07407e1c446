"""A job whose worker is SIGKILLed mid-run and which the next delivery resumes is still one trace: both attempts'
spans, the resumption marked, exported by OTLP from every process to a receiver on 127.0.0.1 (tests/otlp.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from tests.otlp import Receiver, otlp_receiver
from tests.workers.hosted_rlm import support
from tests.workers.hosted_rlm.test_resume import FILES as FOUR_DEFECTS
from tests.workers.hosted_rlm.test_service import _job, customer, finished, send  # noqa: F401 (a fixture)
from tests.workers.system import System, system_on_its_own_database

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def system(server_url: str, tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[System]:
    def a_held_reviewer(running: System) -> None:
        support.write_spec(running.specs_dir, "reviewer-slow", model_route="slow")
        routes = running.folder / "routes.toml"
        held, _ = support.held_script(running.folder / "held")
        routes.write_text(f'[routes.slow]\nkind = "scripted"\nscript = "{held}"\n')
        running.settings.update(
            model_routes_file=str(routes), model_routes_allow_scripted="true",
            specialist_checkpoint_key=support.CHECKPOINT_KEY.decode(),
            otel_enabled="true", otel_endpoint=receiver.url, otel_export_delay_s="0.2",
        )

    with system_on_its_own_database(server_url, tmp_path_factory.mktemp("traced"), workers=2, edges=("api",),
                                    prepare=a_held_reviewer) as running:
        yield running


def test_a_job_killed_with_its_worker_and_resumed_shows_both_attempts_in_one_trace(system, customer, receiver):
    task_id = send(system, customer, "reviewer-slow", FOUR_DEFECTS)
    job = system.wait_for("the job to be dispatched", lambda: _job(system, task_id), 30)

    def in_flight() -> bool:
        with system.engine.connect() as conn:
            states = dict(conn.execute(text(
                "SELECT state, count(*) FROM specialist_calls WHERE job_id = :j AND purpose = 'subcall' GROUP BY 1"),
                {"j": job}).all())
        return states.get("completed", 0) >= 2 and states.get("started", 0) >= 2

    system.wait_for("two answered semantic calls and two held in flight", in_flight, 60, interval_s=0.02)
    admission = receiver.wait_for("the task's admission span", lambda: next(
        (s for s in receiver.spans if s.name == "admission" and s.attributes.get("specialists.task_id") == task_id),
        None), 30)
    trace_id = admission.trace_id

    def spans(name: str) -> list:
        return [s for s in receiver.trace(trace_id) if s.name == name]

    # The first attempt's claim and its answered calls are exported before the kill (the kill takes the rest).
    receiver.wait_for("the first attempt's claim and two answered calls",
                      lambda: [s for s in spans("job.claim") if s.attributes["specialists.claim"] == "claimed"] and len([s for s in spans("model.call")
                                                          if s.attributes.get("specialists.purpose") == "subcall"]) >= 2,
                      30)
    with system.engine.connect() as conn:
        worker_id = conn.execute(text("SELECT worker_id FROM job_claims WHERE job_id = :j"), {"j": job}).scalar_one()
    victim = [w for w in system.workers if str(w.process.pid) == worker_id.split(":")[1]]
    assert victim, worker_id
    os.kill(victim[0].process.pid, signal.SIGKILL)
    victim[0].process.wait(10)
    (system.folder / "held" / "release").touch()

    task = system.wait_for("the resumed review to finish", lambda: finished(system, customer, "reviewer-slow", task_id), 60)
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    receiver.wait_for("the resumed attempt's finish in the same trace", lambda: spans("job.finish"), 30)

    # Deliveries answered "busy" while the first worker held its lease are claims too; two of them ran.
    claims = sorted((s for s in spans("job.claim") if s.attributes["specialists.claim"] == "claimed"),
                    key=lambda s: s.attributes["specialists.fencing_token"])
    assert [c.attributes["specialists.fencing_token"] for c in claims] == [1, 2]
    assert "resumed" not in claims[0].events and "resumed" in claims[1].events
    assert claims[0].resource["service.instance.id"] != claims[1].resource["service.instance.id"]  # two workers
    resumed_runs = [s for s in spans("specialist.run") if s.attributes.get("specialists.resumed")]
    assert len(resumed_runs) == 1 and "resumed" in resumed_runs[0].events
    assert len(spans("job.deliver")) >= 2 and len(spans("admission")) == 1
    [finish] = spans("job.finish")
    assert finish.attributes["specialists.outcome"] == "completed" and finish.attributes["specialists.credits_settled"] == 8
