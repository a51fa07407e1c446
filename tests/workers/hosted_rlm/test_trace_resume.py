"""A job whose worker is SIGKILLed mid-run and which the next delivery resumes is still one trace: both attempts'
spans, the resumption marked, exported by OTLP from every process to a receiver on 127.0.0.1 (tests/otlp.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.otlp import Receiver, otlp_receiver
from tests.workers.hosted_rlm import support
from tests.workers.hosted_rlm.test_resume import FILES as FOUR_DEFECTS
from tests.workers.hosted_rlm.test_service import (  # noqa: F401 (customer: a fixture)
    _job,
    customer,
    finished,
    kill_the_claiming_worker,
    send,
    wait_for_two_held_subcalls,
)
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
            otel_enabled="true", otel_endpoint=receiver.url, otel_export_delay_s="0.2", otel_sampling_ratio="1",
        )

    with system_on_its_own_database(server_url, tmp_path_factory.mktemp("traced"), workers=2, edges=("api",),
                                    prepare=a_held_reviewer) as running:
        yield running


def test_a_job_killed_with_its_worker_and_resumed_shows_both_attempts_in_one_trace(system, customer, receiver):
    task_id = send(system, customer, "reviewer-slow", FOUR_DEFECTS)
    job = system.wait_for("the job to be dispatched", lambda: _job(system, task_id), 30)

    wait_for_two_held_subcalls(system, job)
    admission = receiver.wait_for("the task's admission span", lambda: next(
        (s for s in receiver.spans if s.name == "admission" and s.attributes.get("specialists.task_id") == task_id),
        None), 30)
    trace_id = admission.trace_id

    def spans(name: str) -> list:
        return [s for s in receiver.trace(trace_id) if s.name == name]

    def ran(claims: list) -> list:  # deliveries answered "busy" while the first worker held its lease claim too
        return [s for s in claims if s.attributes["specialists.claim"] == "claimed"]

    def subcalls() -> list:
        return [s for s in spans("model.call") if s.attributes.get("specialists.purpose") == "subcall"]

    # The first attempt's claim and its answered calls are exported before the kill (the kill takes the rest).
    receiver.wait_for("the first attempt's claim and two answered calls",
                      lambda: ran(spans("job.claim")) and len(subcalls()) >= 2, 30)
    kill_the_claiming_worker(system, job)

    task = system.wait_for("the resumed review to finish", lambda: finished(system, customer, "reviewer-slow", task_id), 60)
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    receiver.wait_for("the resumed attempt's finish in the same trace", lambda: spans("job.finish"), 30)

    claims = sorted(ran(spans("job.claim")), key=lambda s: s.attributes["specialists.fencing_token"])
    assert [c.attributes["specialists.fencing_token"] for c in claims] == [1, 2]
    assert "resumed" not in claims[0].events and "resumed" in claims[1].events
    assert claims[0].resource["service.instance.id"] != claims[1].resource["service.instance.id"]  # two workers
    resumed_runs = [s for s in spans("specialist.run") if s.attributes.get("specialists.resumed")]
    assert len(resumed_runs) == 1 and "resumed" in resumed_runs[0].events
    assert len(spans("job.deliver")) >= 2 and len(spans("admission")) == 1
    [finish] = spans("job.finish")
    assert finish.attributes["specialists.outcome"] == "completed" and finish.attributes["specialists.credits_settled"] == 8
