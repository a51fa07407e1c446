"""One trace per task, across the processes of `specialists serve` (edge, dispatcher, worker, the job's process),
exported by OTLP to a receiver on 127.0.0.1 (tests/otlp.py); the trace in every process's log lines; and nothing
secret in any of it: not the key, not the message, not the prompt, not the model's output."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import create_engine

from core.settings import PROJECT_ROOT
from core.specs import load_specs
from core.telemetry import LOG_SPAN_FIELD, LOG_TRACE_FIELD
from ledger import keys
from ledger.client import Ledger
from ops.cli_specialists import DEMO_SPECIALIST, _delegate, _demo_files
from tests.conftest import TEST_SECRET
from tests.otlp import Receiver, otlp_receiver, telemetry_env
from tests.serve import running_service

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

# Each process role's spans of one task, by name: what an operator follows from the request to the settlement.
EXPECTED = {
    "api": {"admission"},
    "dispatcher": {"dispatch.deliver"},
    "worker": {"job.deliver", "job.claim", "job.run", "job.finish"},
    "job": {"specialist.run", "specialist.step", "model.call"},
}
# What the demo route's scripted model is asked and answers (specs/demo/reviewer.toml): a sub-call's prompt, the
# code a root turn returns, a sub-call's answer.
MODEL_TEXT = ("Does this line build SQL from caller input", "candidate line(s)",
              "pass the values as query parameters instead")


def _customer(database_url: str, skill: str) -> str:
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        customer_id = f"traced-{uuid.uuid4().hex[:8]}"
        issued = keys.issue_key(engine, keys.KeySigner([TEST_SECRET], "test"), customer_id=customer_id,
                                ttl=timedelta(hours=1))
        Ledger(engine).grant(customer_id, 50, operator="tests", skills=[skill], reason="the traced task")
        return issued.token
    finally:
        engine.dispose()


def _spans_of_task(receiver: Receiver, task_id: str) -> str | None:
    """The trace id of the task's admission span, once its settlement's span has arrived in the same trace."""
    admissions = [s for s in receiver.spans if s.name == "admission" and s.attributes.get("specialists.task_id") == task_id]
    if not admissions:
        return None
    trace_id = admissions[0].trace_id
    finished = [s for s in receiver.trace(trace_id) if s.name == "job.finish"]
    job_spans_done = [s for s in receiver.trace(trace_id) if s.name == "specialist.run"]
    return trace_id if finished and job_spans_done else None


def test_a_task_is_one_trace_across_every_process_with_the_trace_in_each_process_logs_and_nothing_secret(
        server_url, engine, tmp_path):
    engine.dispose()
    canary = f"canary-{uuid.uuid4().hex}"
    files = {**_demo_files(), "shop/NOTES.txt": f"private customer note {canary}\n"}
    with otlp_receiver() as receiver:
        with running_service(server_url, tmp_path, extra_env=telemetry_env(receiver)) as service:
            token = _customer(service.env["DATABASE_URL"], DEMO_SPECIALIST)
            seen = asyncio.run(_delegate(service.base_url, token, files, timeout_s=90))
            assert seen["state"] == "TASK_STATE_COMPLETED", seen
            task_id = seen["task_id"]
            trace_id = receiver.wait_for("the task's whole trace", lambda: _spans_of_task(receiver, task_id), 60)
        log_text = service.log_path.read_text()

    spans = receiver.trace(trace_id)
    by_role: dict[str, set[str]] = {}
    for span in spans:
        by_role.setdefault(span.resource["specialists.role"], set()).add(span.name)
    for role, names in EXPECTED.items():
        assert names <= by_role.get(role, set()), (role, by_role)
    instances = {span.resource["service.instance.id"] for span in spans}
    assert len(instances) >= 4  # edge, dispatcher, worker and the job's process: one trace across all of them

    # The customer's request is the root: every other span descends from it.
    ids = {span.span_id for span in spans}
    roots = [span for span in spans if span.parent_span_id not in ids]
    assert len(roots) == 1 and roots[0].kind == 2 and roots[0].resource["specialists.role"] == "api", roots  # SERVER
    calls = [span for span in spans if span.name == "model.call"]
    assert all(call.attributes["gen_ai.usage.input_tokens"] > 0 for call in calls)
    assert {call.attributes["specialists.purpose"] for call in calls} >= {"root", "subcall"}
    finish = next(span for span in spans if span.name == "job.finish")
    assert finish.attributes["specialists.outcome"] == "completed" and finish.attributes["specialists.accepted"]

    # Each process exported its last counts as it stopped: the task's admission, its claim, its run, its model's
    # tokens and the credits it settled, as the ledger charged them.
    charged = seen["metadata"]["specialist"]["creditsCharged"]
    assert charged > 0
    assert receiver.total("specialists.admissions", specialist=DEMO_SPECIALIST, outcome="admitted") == 1
    assert receiver.total("specialists.credits.reserved", specialist=DEMO_SPECIALIST) > 0
    assert receiver.total("specialists.credits.settled", specialist=DEMO_SPECIALIST, outcome="completed") == charged
    assert receiver.total("specialists.job.claim_latency.count", specialist=DEMO_SPECIALIST, claim="claimed") == 1
    assert receiver.total("specialists.job.duration.count", specialist=DEMO_SPECIALIST, outcome="completed") == 1
    assert receiver.total("specialists.model.tokens", specialist=DEMO_SPECIALIST, kind="input") > 0
    assert receiver.total("specialists.jobs.unknown") == 0

    # Every process that worked on the task logged with its trace, in the fields Cloud Logging correlates.
    lines = [json.loads(line) for line in log_text.splitlines() if line.startswith("{")]
    traced = [line for line in lines if line.get(LOG_TRACE_FIELD) == trace_id]
    span_ids_logged = {line[LOG_SPAN_FIELD] for line in traced}
    assert span_ids_logged <= ids and traced
    logged_by = {span.resource["specialists.role"] for span in spans if span.span_id in span_ids_logged}
    assert {"api", "worker", "job"} <= logged_by, logged_by

    # Nothing secret in any export or in the task's log lines: ids and counts only.
    exported = b"".join(receiver.bodies)
    task_lines = "\n".join(json.dumps(line) for line in traced)
    for secret in (token, token.split(".")[-1], canary, "private customer note", _spec_prompt(), *MODEL_TEXT):
        assert secret.encode() not in exported, secret
        assert secret not in task_lines, secret


def _spec_prompt() -> str:
    """The longest sentence of the reviewer's prompt (what its model is told), as shipped in specs/."""
    prompt = load_specs(PROJECT_ROOT / "specs")[DEMO_SPECIALIST].spec.prompt or ""
    sentence = max(prompt.split("."), key=len).strip()
    assert len(sentence) > 20
    return sentence
