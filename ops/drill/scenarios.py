"""The drill's scenarios: each drives the deployment as customers and an operator would, and returns a verdict
with its evidence.

A scenario records what it saw (``Step.note``) and stops at the first broken
promise (``Step.check``), which fails it; an action the deployment cannot do
(``Unavailable``: no hook) is noted as skipped, and a scenario whose every part
was skipped is reported skipped. The customers a drill creates are
``drill-<run>-<role>``; each gets a key and ``SPECIALISTS_DRILL_CREDITS`` for the
``drill`` specialist (specs/drill.yaml, tariff 2), except those made to be refused.
The last scenario, settlement, audits every drill customer of the run.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import httpx
from sqlalchemy import text

from ledger import keys
from ledger.client import Ledger
from ops.drill import SCENARIO_NAMES
from ops.drill.audit import audit
from ops.drill.deployments import Deployment, Unavailable

DRILL = "drill"
REVIEWER = "reviewer"  # the resume drill's rlm specialist
OPERATOR = "specialists-drill"
RUN_ID_CHARS = 8  # random hex characters of a drill run id (in customer names and reasons)
SHOWN_BODY_CHARS = 300  # of an unexpected HTTP answer, quoted in a step's evidence
Progress = Callable[[str], None]
VerdictKind = Literal["pass", "fail", "skipped"]


class Broken(Exception):
    """A promise the deployment did not keep."""


@dataclass
class Verdict:
    scenario: str
    verdict: VerdictKind
    seconds: float
    evidence: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "verdict": self.verdict, "seconds": round(self.seconds, 2),
                "evidence": self.evidence}


@dataclass
class Customer:
    id: str
    key: str
    key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "A2A-Version": "1.0"}


@dataclass
class Step:
    """The evidence of one scenario, and its checks."""

    progress: Progress
    evidence: list[str] = field(default_factory=list)
    skipped: int = 0
    done: int = 0

    def note(self, line: str) -> None:
        self.evidence.append(line)
        self.progress(f"    {line}")

    def check(self, condition: Any, broken: str) -> None:
        if not condition:
            raise Broken(broken)

    def attempt(self, action: Callable[[], str]) -> bool:
        """Run a process-control action; note it, or note it skipped when the deployment cannot do it."""
        try:
            self.note(action())
        except Unavailable as why:
            self.note(f"skipped: {why}")
            self.skipped += 1
            return False
        self.done += 1
        return True


class Drill:
    """One run of the drill against one deployment."""

    def __init__(self, deployment: Deployment, *, slack_s: float, credits: int, progress: Progress) -> None:
        self.deployment = deployment
        self.slack_s = slack_s
        self.credits = credits
        self.progress = progress
        self.run_id = uuid.uuid4().hex[:RUN_ID_CHARS]
        self.customers: list[Customer] = []
        # No keep-alive: the drill restarts the processes it talks to, and a pooled connection an instance
        # closed as it was reused would fail a request for a reason that is not the deployment's.
        self.http = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))
        self.ledger = Ledger(deployment.engine)

    # --- customers and requests ---------------------------------------------------------

    def customer(self, role: str, *, credits: int | None = None, skills: tuple[str, ...] = (DRILL,),
                  expired: bool = False) -> Customer:
        customer_id = f"drill-{self.run_id}-{role}"
        now = datetime.now(timezone.utc) - (timedelta(hours=2) if expired else timedelta(0))
        issued = keys.issue_key(self.deployment.engine, self.deployment.signer, customer_id=customer_id,
                                ttl=timedelta(hours=1), label=f"specialists drill {self.run_id}", now=now,
                                operator=OPERATOR)
        amount = self.credits if credits is None else credits
        if amount:
            self.ledger.grant(customer_id, amount, operator=OPERATOR, skills=list(skills),
                              reason=f"specialists drill {self.run_id}")
        customer = Customer(customer_id, issued.token, issued.identity.key_id)
        self.customers.append(customer)
        return customer

    def url(self, via: int, specialist: str = DRILL) -> str:
        return f"{self.deployment.api_urls[via % len(self.deployment.api_urls)]}/specialists/{specialist}"

    def send(self, customer: Customer | None, steps: list[dict[str, Any]], *, via: int = 0,
             message_id: str | None = None, extra_parts: list[dict] | None = None,
             metadata: dict[str, Any] | None = None) -> httpx.Response:
        message: dict[str, Any] = {
            "messageId": message_id or f"drill-{uuid.uuid4()}",
            "role": "ROLE_USER",
            "parts": [{"data": {"script": {"steps": steps}}}, *(extra_parts or [])],
        }
        if metadata:
            message["metadata"] = metadata
        headers = customer.headers if customer else {"A2A-Version": "1.0"}
        return self.http.post(f"{self.url(via)}/message:send", headers=headers,
                              json={"message": message, "configuration": {"returnImmediately": True}})

    def start(self, customer: Customer, steps: list[dict[str, Any]], *, via: int = 0) -> str:
        answer = self.send(customer, steps, via=via)
        if answer.status_code != 200:
            raise Broken(f"a drill task was refused through API {via + 1}: {answer.status_code} {answer.text[:SHOWN_BODY_CHARS]}")
        return answer.json()["task"]["id"]

    def task(self, customer: Customer, task_id: str, *, via: int = 0, specialist: str = DRILL) -> dict[str, Any]:
        answer = self.http.get(f"{self.url(via, specialist)}/tasks/{task_id}", headers=customer.headers)
        if answer.status_code != 200:
            raise Broken(f"GetTask {task_id} through API {via + 1}: {answer.status_code} {answer.text[:SHOWN_BODY_CHARS]}")
        return answer.json()

    def state(self, customer: Customer, task_id: str, *, via: int = 0, specialist: str = DRILL) -> str:
        return self.task(customer, task_id, via=via, specialist=specialist)["status"]["state"]

    def cancel(self, customer: Customer, task_id: str, *, via: int = 0) -> httpx.Response:
        return self.http.post(f"{self.url(via)}/tasks/{task_id}:cancel", headers=customer.headers, json={})

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.05) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise Broken(f"{what}: not within {timeout_s:.1f} s")
            time.sleep(interval_s)

    # --- what the operator sees ---------------------------------------------------------

    def job_of(self, task_id: str) -> str | None:
        with self.deployment.engine.connect() as conn:
            dispatch_id = conn.execute(text("SELECT max(dispatch_id) FROM dispatch_outbox WHERE task_id = :t"),
                                       {"t": task_id}).scalar_one()
        return f"{task_id}.{dispatch_id}" if dispatch_id is not None else None

    def claim(self, job_id: str | None) -> dict[str, Any]:
        if job_id is None:
            return {}
        with self.deployment.engine.connect() as conn:
            row = conn.execute(text("SELECT state, outcome, claims, deliveries, worker_id FROM job_claims "
                                    "WHERE job_id = :j"), {"j": job_id}).mappings().one_or_none()
        return dict(row) if row else {}

    def running_job(self, task_id: str, timeout_s: float) -> str:
        """Wait until a worker holds the task's job; its id."""
        def running() -> str | None:
            job = self.job_of(task_id)
            return job if self.claim(job).get("state") == "running" else None
        return self.wait(f"a worker to take task {task_id}", running, timeout_s)

    def reservation(self, task_id: str) -> Any:
        return self.ledger.reservation(task_id)

    def claim_timeout_s(self) -> float:
        """Time for an admitted task to reach a worker: the dispatcher's poll, a delivery, a start."""
        return 30.0 + self.slack_s

    def close(self) -> None:
        self.http.close()


def refusal_code(answer: httpx.Response) -> str:
    """The stable refusal code of an HTTP+JSON error answer (``ErrorInfo.metadata.code``)."""
    try:
        error = answer.json().get("error", {})
    except ValueError:
        return f"http_{answer.status_code}"
    for detail in error.get("details") or []:
        code = (detail.get("metadata") or {}).get("code")
        if code:
            return str(code)
    return str(error.get("status") or f"http_{answer.status_code}")


SLEEP = {"op": "sleep", "seconds": 60}


# --- the scenarios ------------------------------------------------------------------------------


def refusal(drill: Drill, step: Step) -> None:
    """Unauthenticated, unentitled, expired, revoked, over-ceiling, over-size and unpaid requests are refused
    with their code, and leave no task and no reservation behind."""
    script = [{"op": "complete", "text": "must never run"}]
    unentitled = drill.customer("unentitled", credits=20, skills=("conformance",))
    expired = drill.customer("expired", expired=True)
    revoked = drill.customer("revoked")
    payer = drill.customer("refused")
    poor = drill.customer("poor", credits=1)
    before = drill.ledger.account(payer.id)

    # A key the service has seen (so any instance may have cached it as valid), then revoked.
    listed = drill.http.get(f"{drill.url(0)}/tasks", headers=revoked.headers)
    step.check(listed.status_code == 200, f"the revoked customer's key was refused before revocation: {listed.text[:SHOWN_BODY_CHARS]}")
    keys.revoke_key(drill.deployment.engine, revoked.key_id, reason=f"specialists drill {drill.run_id}",
                    operator=OPERATOR)
    revoked_at = time.monotonic()
    bound = drill.deployment.bounds.revocation_cache_s + drill.slack_s

    def refused_everywhere() -> bool:
        return all(drill.http.get(f"{drill.url(i)}/tasks", headers=revoked.headers).status_code == 401
                   for i in range(len(drill.deployment.api_urls)))

    drill.wait("the revoked key to be refused on every instance", refused_everywhere, bound, interval_s=0.1)
    step.note(f"revoked key refused on every instance {time.monotonic() - revoked_at:.1f} s after revocation "
              f"(bound {drill.deployment.bounds.revocation_cache_s:g} s)")

    cases: list[tuple[str, Customer | None, dict[str, Any], int, str]] = [
        ("no key", None, {}, 401, "key_required"),
        ("unentitled key", unentitled, {}, 403, "not_entitled"),
        ("expired key", expired, {}, 401, "key_expired"),
        ("revoked key", revoked, {}, 401, "key_revoked"),
        ("over the credit ceiling", payer, {"metadata": {"credit_ceiling": 1}}, 400, "over_credit_ceiling"),
        ("over the size limit", payer, {"extra_parts": [{"text": "x" * 9000}]}, 413, "payload_too_large"),
        ("too few credits", poor, {}, 402, "insufficient_credits"),
    ]
    for index, (name, customer, extra, status, code) in enumerate(cases):
        answer = drill.send(customer, script, via=index, **extra)
        got = refusal_code(answer)
        step.check((answer.status_code, got) == (status, code),
                   f"{name}: expected {status} {code}, got {answer.status_code} {got}: {answer.text[:SHOWN_BODY_CHARS]}")
        step.note(f"{name}: {answer.status_code} {code} through API {index % len(drill.deployment.api_urls) + 1}")

    refused = [unentitled.id, expired.id, revoked.id, payer.id, poor.id]
    with drill.deployment.engine.connect() as conn:
        tasks = conn.execute(text("SELECT count(*) FROM edge_tasks WHERE customer_id = ANY(:c)"),
                             {"c": refused}).scalar_one()
        held = conn.execute(text("SELECT count(*) FROM ledger_reservations WHERE customer_id = ANY(:c)"),
                            {"c": refused}).scalar_one()
    step.check(tasks == 0 and held == 0, f"refused requests left {tasks} tasks and {held} reservations")
    after = drill.ledger.account(payer.id)
    step.check(before is not None and after is not None and after.available == before.available
               and after.held == before.held, "a refused request moved credits")
    step.note(f"no task and no reservation for the {len(refused)} refused customers; balances unchanged")


def cancellation(drill: Drill, step: Step) -> None:
    """A cancel before any worker claimed the task charges nothing; a cancel of a running task stops it within
    heartbeat + grace and charges the tariff (docs/WORKERS.md)."""
    customer = drill.customer("cancel")
    bounds = drill.deployment.bounds
    tariff = _tariff(drill)

    # Before the claim: dispatch held (locally), or a race with the delivery (a deployment).
    held = step.attempt(drill.deployment.hold_dispatch)
    try:
        task_id = drill.start(customer, [SLEEP, {"op": "complete"}], via=0)
        answer = drill.cancel(customer, task_id, via=1)
    finally:
        if held:
            step.note(drill.deployment.release_dispatch())
    step.check(answer.status_code == 200 and answer.json()["status"]["state"] == "TASK_STATE_CANCELED",
               f"cancel before claim: {answer.status_code} {answer.text[:SHOWN_BODY_CHARS]}")
    time.sleep(1.0 + drill.slack_s)  # a held delivery, now released, must find the job closed
    job = drill.job_of(task_id)
    claim = drill.claim(job)
    reservation = drill.reservation(task_id)
    if not claim.get("claims"):
        step.check(reservation.state == "voided" and reservation.charged == 0,
                   f"canceled before any claim but the reservation is {reservation.state}, charged {reservation.charged}")
        step.check(drill.state(customer, task_id, via=0) == "TASK_STATE_CANCELED", "the canceled task came back")
        step.note(f"canceled before claim (task {task_id}): reservation voided, charged 0, never run"
                  + (" (dispatch was held)" if held else " (the cancel beat the delivery)"))
    else:
        drill.wait("the claimed job to stop", lambda: drill.claim(job).get("state") == "finished",
                   bounds.cancel_s + drill.slack_s)
        reservation = drill.reservation(task_id)
        step.check(reservation.charged == tariff, f"claimed, then canceled, but charged {reservation.charged}")
        step.note(f"the delivery beat the cancel (task {task_id}): run stopped, charged the tariff {tariff}; "
                  "the before-claim case was not exercised")

    # While running, canceled through the other instance.
    task_id = drill.start(customer, [{"op": "progress", "text": "running"}, SLEEP, {"op": "complete"}], via=0)
    job = drill.running_job(task_id, drill.claim_timeout_s())
    asked = time.monotonic()
    answer = drill.cancel(customer, task_id, via=1)
    step.check(answer.status_code == 200 and answer.json()["status"]["state"] == "TASK_STATE_CANCELED",
               f"cancel while running: {answer.status_code} {answer.text[:SHOWN_BODY_CHARS]}")
    bound = bounds.cancel_s
    drill.wait("the running job to stop after the cancel", lambda: drill.claim(job).get("state") == "finished",
               bound + drill.slack_s, interval_s=0.02)
    stopped = time.monotonic() - asked
    claim = drill.claim(job)
    step.check(claim["outcome"] == "canceled", f"the canceled job finished {claim['outcome']}")
    reservation = drill.reservation(task_id)
    step.check(reservation.state == "settled" and reservation.charged == tariff,
               f"canceled while running: reservation {reservation.state}, charged {reservation.charged}, "
               f"policy: the tariff {tariff}")
    step.check(drill.state(customer, task_id, via=0) == "TASK_STATE_CANCELED", "the task is not canceled on API 1")
    step.note(f"canceled while running (task {task_id}) through API 2: the worker stopped {stopped:.2f} s later "
              f"(bound heartbeat + grace = {bound:g} s), charged the tariff {tariff}")


def cross_instance(drill: Drill, step: Step) -> None:
    """A task created through one instance is read, streamed and canceled through the other, with the a2a-sdk
    client over JSON-RPC on one side and HTTP+JSON on the other; and one created over gRPC on the first is read
    and canceled over JSON-RPC on the second."""
    if len(drill.deployment.api_urls) < 2:
        step.note("skipped: one API URL given; pass two (--target URL,URL) to drill two instances")
        step.skipped += 1
        return
    customer = drill.customer("cross")
    asyncio.run(_cross_instance(drill, step, customer))


async def _cross_instance(drill: Drill, step: Step, customer: Customer) -> None:
    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.types.a2a_pb2 import (
        CancelTaskRequest,
        GetTaskRequest,
        Message,
        Part,
        Role,
        SendMessageRequest,
        SubscribeToTaskRequest,
        TaskState,
    )
    from google.protobuf.struct_pb2 import Value

    async def client(via: int, binding: str, http: httpx.AsyncClient, *, streaming: bool = False) -> Any:
        card = await A2ACardResolver(http, drill.url(via)).get_agent_card()
        return ClientFactory(ClientConfig(httpx_client=http, supported_protocol_bindings=[binding],
                                          streaming=streaming)).create(card)

    def message(steps: list[dict[str, Any]]) -> SendMessageRequest:
        data = Value()
        data.struct_value.update({"script": {"steps": steps}})
        request = SendMessageRequest(message=Message(message_id=f"drill-{uuid.uuid4()}", role=Role.ROLE_USER,
                                                     parts=[Part(data=data)]))
        request.configuration.return_immediately = True
        return request

    headers = {"Authorization": f"Bearer {customer.key}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http_a, \
            httpx.AsyncClient(headers=headers, timeout=60) as http_b:
        on_a = await client(0, "JSONRPC", http_a)
        on_b = await client(1, "HTTP+JSON", http_b)
        streaming_b = await client(1, "HTTP+JSON", http_b, streaming=True)
        steps = [{"op": "progress", "text": "step one"}, {"op": "sleep", "seconds": 1.0},
                 {"op": "artifact", "text": "the drill's artifact"}, {"op": "sleep", "seconds": 1.0},
                 {"op": "complete", "text": "done"}]
        sent = [event async for event in on_a.send_message(message(steps))]
        task_id = sent[0].task.id
        fetched = await on_b.get_task(GetTaskRequest(id=task_id))
        step.check(fetched.id == task_id, "GetTask through API 2 returned another task")
        step.note(f"created {task_id} on API 1 (JSON-RPC); read on API 2 (HTTP+JSON): "
                  f"{TaskState.Name(fetched.status.state)}")
        kinds: list[str] = []
        final = None
        async for event in streaming_b.subscribe(SubscribeToTaskRequest(id=task_id)):
            kind = event.WhichOneof("payload")
            kinds.append(kind)
            if kind == "status_update":
                final = event.status_update.status.state
            elif kind == "task":
                final = event.task.status.state
        step.check(final == TaskState.TASK_STATE_COMPLETED,
                   f"the stream on API 2 ended {TaskState.Name(final) if final is not None else 'without a state'}")
        step.check("artifact_update" in kinds or (await on_b.get_task(GetTaskRequest(id=task_id))).artifacts,
                   "the artifact was neither streamed nor stored")
        step.note(f"streamed on API 2 to completion: {len(kinds)} events ({', '.join(dict.fromkeys(kinds))})")
        again = await on_a.get_task(GetTaskRequest(id=task_id))
        step.check(again.status.state == TaskState.TASK_STATE_COMPLETED and len(again.artifacts) == 1,
                   "API 1 does not show the completed task with its artifact")

        running = [event async for event in on_b.send_message(message([{"op": "progress", "text": "hold"}, SLEEP]))]
        held_id = running[0].task.id
        drill.running_job(held_id, drill.claim_timeout_s())
        canceled = await on_a.cancel_task(CancelTaskRequest(id=held_id))
        step.check(canceled.status.state == TaskState.TASK_STATE_CANCELED, "cancel through API 1 did not cancel")
        seen = await on_b.get_task(GetTaskRequest(id=held_id))
        step.check(seen.status.state == TaskState.TASK_STATE_CANCELED,
                   f"API 2 shows the canceled task as {TaskState.Name(seen.status.state)}")
        step.note(f"created {held_id} on API 2 (HTTP+JSON), canceled on API 1 (JSON-RPC), canceled on both")

        jsonrpc_b = await client(1, "JSONRPC", http_b)
        await _created_over_grpc(drill, step, customer, await A2ACardResolver(http_a, drill.url(0)).get_agent_card(),
                                 jsonrpc_b, message([{"op": "progress", "text": "hold"}, SLEEP]))


async def _created_over_grpc(drill: Drill, step: Step, customer: Customer, card: Any, jsonrpc_b: Any,
                             request: Any) -> None:
    """Created over gRPC on API 1 (the interface its card names), read and canceled over JSON-RPC on API 2."""
    import grpc
    import grpc.aio
    from a2a.client import ClientCallContext, ClientConfig, ClientFactory
    from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, TaskState

    if not any(i.protocol_binding == "GRPC" for i in card.supported_interfaces):
        step.note("gRPC skipped: API 1's card lists no GRPC interface "
                  "(SPECIALISTS_GRPC_PUBLIC_URL, SPECIALISTS_GRPC_PORT)")
        step.skipped += 1
        return

    def channel(url: str) -> grpc.aio.Channel:
        # A public gRPC URL on 443 (Cloud Run's) is TLS; a local one is plain HTTP/2.
        if url.endswith(":443"):
            return grpc.aio.secure_channel(url, grpc.ssl_channel_credentials())
        return grpc.aio.insecure_channel(url)

    config = ClientConfig(streaming=False, supported_protocol_bindings=["GRPC"], grpc_channel_factory=channel)
    on_grpc = ClientFactory(config).create(card)
    calling = ClientCallContext(service_parameters={"authorization": f"Bearer {customer.key}"}, timeout=60)
    try:
        created = [event async for event in on_grpc.send_message(request, context=calling)]
        task_id = created[0].task.id
        drill.running_job(task_id, drill.claim_timeout_s())
        read = await jsonrpc_b.get_task(GetTaskRequest(id=task_id))
        step.check(read.id == task_id, "GetTask over JSON-RPC on API 2 returned another task than gRPC created")
        step.note(f"created {task_id} on API 1 (gRPC); read on API 2 (JSON-RPC): {TaskState.Name(read.status.state)}")
        canceled = await jsonrpc_b.cancel_task(CancelTaskRequest(id=task_id))
        step.check(canceled.status.state == TaskState.TASK_STATE_CANCELED, "cancel through API 2 did not cancel")
        seen = await on_grpc.get_task(GetTaskRequest(id=task_id), context=calling)
        step.check(seen.status.state == TaskState.TASK_STATE_CANCELED,
                   f"API 1 (gRPC) shows the canceled task as {TaskState.Name(seen.status.state)}")
    finally:
        await on_grpc.close()
    step.note(f"canceled {task_id} on API 2 (JSON-RPC), canceled on API 1 (gRPC) too")


def restart_and_rollout(drill: Drill, step: Step) -> None:
    """API instances killed and restarted, or rolled to a new revision, and workers restarted, all mid-task:
    every task still ends completed and is charged once."""
    customer = drill.customer("restart")
    tariff = _tariff(drill)
    work = [{"op": "progress", "text": "working"}, {"op": "sleep", "seconds": 2}, {"op": "complete", "text": "done"}]
    finished: list[str] = []
    timeout_s = drill.claim_timeout_s() + 10

    def through(action: Callable[[], str], via: int, read_via: int, what: str) -> None:
        task_id = drill.start(customer, work, via=via)
        drill.running_job(task_id, drill.claim_timeout_s())
        if step.attempt(action):
            drill.wait(f"task {task_id} to complete after {what}",
                       lambda: drill.state(customer, task_id, via=read_via) == "TASK_STATE_COMPLETED", timeout_s,
                       interval_s=0.2)
            step.note(f"task {task_id}: completed after {what}, read through API {read_via + 1}")
            finished.append(task_id)
        else:
            drill.wait(f"task {task_id} to complete", lambda: drill.state(customer, task_id) == "TASK_STATE_COMPLETED",
                       timeout_s, interval_s=0.2)
            finished.append(task_id)

    through(lambda: drill.deployment.restart_api(0), 0, 0, "its API instance was killed and restarted")
    through(lambda: drill.deployment.roll_api(1), 1, 1, "its API instance was rolled to a new revision")
    last = drill.start(customer, work, via=0)
    job = drill.running_job(last, drill.claim_timeout_s())
    if step.attempt(lambda: drill.deployment.restart_worker(job)):
        drill.wait(f"task {last} to complete", lambda: drill.state(customer, last) == "TASK_STATE_COMPLETED",
                   timeout_s, interval_s=0.2)
        step.note(f"task {last}: completed on the worker that was draining (SIGTERM), not run again "
                  f"(claims {drill.claim(job).get('claims')})")
    else:
        drill.wait(f"task {last} to complete", lambda: drill.state(customer, last) == "TASK_STATE_COMPLETED",
                   timeout_s, interval_s=0.2)
    finished.append(last)
    if step.attempt(drill.deployment.slow_review_route):
        _resumed_after_kill(drill, step)
    for task_id in finished:
        job = drill.job_of(task_id)
        claim = drill.claim(job)
        reservation = drill.reservation(task_id)
        step.check(claim.get("claims") == 1, f"task {task_id} was claimed {claim.get('claims')} times")
        step.check(reservation.state == "settled" and reservation.charged == tariff,
                   f"task {task_id}: reservation {reservation.state}, charged {reservation.charged}")
    step.note(f"{len(finished)} tasks: each claimed once, settled once at the tariff {tariff}")


def _resumed_after_kill(drill: Drill, step: Step) -> None:
    """An rlm specialist's worker killed mid semantic call: the next delivery resumes the job from its checkpoint
    (``SPECIALISTS_SPECIALIST_MAX_RESUMES``), it completes with the same findings and is charged once."""
    from ops.cli_specialists import DEMO_RULE, KNOWN_DEFECT, _demo_files

    customer = drill.customer("resume", skills=(REVIEWER,))
    parts: list[dict[str, Any]] = [{"text": DEMO_RULE}] + [
        {"raw": base64.b64encode(content.encode()).decode(), "filename": name,
         "mediaType": "text/x-python" if name.endswith(".py") else "text/plain"}
        for name, content in _demo_files().items()
    ]
    sent = drill.http.post(f"{drill.url(0, REVIEWER)}/message:send", headers=customer.headers, json={
        "message": {"messageId": f"drill-{uuid.uuid4()}", "role": "ROLE_USER", "parts": parts},
        "configuration": {"returnImmediately": True}})
    step.check(sent.status_code == 200, f"the review was refused: {sent.status_code} {sent.text[:SHOWN_BODY_CHARS]}")
    task_id = sent.json()["task"]["id"]
    job = drill.running_job(task_id, drill.claim_timeout_s())

    def in_flight() -> bool:
        with drill.deployment.engine.connect() as conn:
            return bool(conn.execute(text("SELECT count(*) FROM specialist_calls WHERE job_id = :j AND "
                                          "purpose = 'subcall' AND state = 'started'"), {"j": job}).scalar_one())

    drill.wait(f"review {task_id} to ask its semantic call", in_flight, 60, interval_s=0.05)
    step.note(drill.deployment.kill_worker(job) + " (mid semantic call)")
    step.note(drill.deployment.revive_workers())
    bounds = drill.deployment.bounds
    drill.wait(f"review {task_id} to complete after its resume",
               lambda: drill.state(customer, task_id, specialist=REVIEWER) == "TASK_STATE_COMPLETED",
               bounds.unknown_s + drill.claim_timeout_s() + 60, interval_s=0.2)
    claim = drill.claim(job)
    step.check(claim.get("claims") == 2, f"the review was claimed {claim.get('claims')} times; a resume is 2")
    seen = drill.task(customer, task_id, specialist=REVIEWER)
    findings = [p.get("data") for a in seen.get("artifacts", []) if a.get("name") == "findings" for p in a["parts"]]
    found = [f for group in findings if isinstance(group, list) for f in group]
    step.check(any(f.get("path") == KNOWN_DEFECT for f in found), f"the resumed review misses {KNOWN_DEFECT}: {found}")
    reservation = drill.reservation(task_id)
    tariff = _tariff(drill, REVIEWER)
    step.check(reservation.state == "settled" and 0 < (reservation.charged or 0) <= tariff,
               f"the resumed review: reservation {reservation.state}, charged {reservation.charged} (tariff {tariff})")
    step.note(f"review {task_id}: resumed from its checkpoint by the next delivery (claims 2), completed with "
              f"the known defect, charged {reservation.charged} once (tariff {tariff})")


def retained_unknown(drill: Drill, step: Step) -> None:
    """A job whose worker died without a word stays held and listed unknown, refuses to run again, and is
    resolved only by an operator's reconcile with a reason."""
    customer = drill.customer("unknown")
    bounds = drill.deployment.bounds
    task_id = drill.start(customer, [{"op": "progress", "text": "started"}, SLEEP, {"op": "complete"}], via=0)
    job = drill.running_job(task_id, drill.claim_timeout_s())
    killed_at = time.monotonic()
    if not step.attempt(lambda: drill.deployment.kill_worker(job)):
        drill.cancel(customer, task_id, via=0)  # nothing to drill: stop the task
        return
    try:
        drill.wait("the dead worker's job to be recorded unknown",
                   lambda: drill.claim(job).get("state") == "unknown", bounds.unknown_s + drill.slack_s + 5,
                   interval_s=0.1)
        step.note(f"job {job} unknown {time.monotonic() - killed_at:.1f} s after the kill "
                  f"(bound lease + sweep = {bounds.unknown_s:g} s)")
        reservation = drill.reservation(task_id)
        step.check(reservation.state == "unknown", f"the reservation is {reservation.state}, not unknown (held)")
        listed = [r.job_id for r in drill.ledger.reservations(customer_id=customer.id, states=("unknown",))]
        step.check(listed == [task_id], f"`reservations list --unknown` shows {listed}")
        seen = drill.task(customer, task_id, via=1)
        status_text = " ".join(p.get("text", "") for p in seen["status"].get("message", {}).get("parts", []))
        step.check(seen["status"]["state"] == "TASK_STATE_WORKING" and "reconciliation" in status_text,
                   f"the customer sees {seen['status']['state']}: {status_text!r}")
        step.note("held and listed unknown; the customer sees it working, under reconciliation")
        canceled = drill.cancel(customer, task_id, via=1)
        step.check(canceled.status_code != 200, "a cancel of the unknown task was accepted")
        step.note(f"the customer's cancel is refused ({canceled.status_code} {refusal_code(canceled)})")
        step.note(drill.deployment.revive_workers())
        if step.attempt(lambda: "a second delivery answered %s %s" % drill.deployment.redeliver(job)):
            pass
        time.sleep(1.0)
        claim = drill.claim(job)
        step.check(claim["state"] == "unknown" and claim["claims"] == 1,
                   f"after the kill the job is {claim['state']} with {claim['claims']} claims: it ran again")
        step.note(f"never run twice: {claim['claims']} claim, {claim['deliveries']} deliveries")
    finally:
        drill.deployment.revive_workers()
    from workers.assembly import USAGE
    from workers.reconcile import reconcile

    result = reconcile(drill.deployment.engine, task_id, charged=0, state="failed",
                       reason=f"specialists drill {drill.run_id}: the drill killed the worker", operator=OPERATOR,
                       usage=USAGE, limits=drill.ledger.limits).as_record()
    step.check(result["outcome"] == "reconciled", f"reconcile: {result}")
    reservation = drill.reservation(task_id)
    step.check(reservation.state == "reconciled" and reservation.charged == 0,
               f"after reconcile the reservation is {reservation.state}, charged {reservation.charged}")
    step.check(drill.state(customer, task_id, via=0) == "TASK_STATE_FAILED", "the reconciled task is not failed")
    step.check(not drill.ledger.reservations(customer_id=customer.id, states=("unknown",)),
               "still listed unknown after the reconcile")
    step.note("reconciled by the operator with a reason (charged 0, task failed); no longer listed")


def settlement(drill: Drill, step: Step) -> None:
    """One charge per task whatever the number of reads, duplicate sends and deliveries; then every drill
    customer of this run audited (each task terminal or listed unknown, resolved once) and `ledger verify`."""
    customer = drill.customer("settle")
    tariff = _tariff(drill)
    tasks: list[str] = []
    for index in range(3):
        message_id = f"drill-{uuid.uuid4()}"
        steps = [{"op": "progress", "text": f"task {index}"}, {"op": "complete", "text": "settled"}]
        first = drill.send(customer, steps, via=index, message_id=message_id)
        step.check(first.status_code == 200, f"send: {first.status_code} {first.text[:SHOWN_BODY_CHARS]}")
        again = drill.send(customer, steps, via=index + 1, message_id=message_id)
        step.check(again.status_code == 200 and again.json()["task"]["id"] == first.json()["task"]["id"],
                   f"a duplicate send was not answered with the same task: {again.status_code} {again.text[:SHOWN_BODY_CHARS]}")
        tasks.append(first.json()["task"]["id"])
    step.note(f"3 tasks, each sent twice through both instances: 3 tasks admitted")
    for task_id in tasks:
        drill.wait(f"task {task_id} to complete",
                   lambda: drill.state(customer, task_id) == "TASK_STATE_COMPLETED",
                   drill.claim_timeout_s(), interval_s=0.1)
    reads = 0
    for task_id in tasks:
        for via in range(4):
            drill.state(customer, task_id, via=via)
            reads += 1
    step.note(f"{reads} reads of the finished tasks through every instance")
    deliveries = []
    for task_id in tasks:
        job = drill.job_of(task_id)
        assert job is not None
        for _ in range(2):
            if not step.attempt(lambda: "%s delivered again: %s %s" % (job, *drill.deployment.redeliver(job))):
                break
        deliveries.append(drill.claim(job).get("deliveries"))
    for task_id in tasks:
        reservation = drill.reservation(task_id)
        step.check(reservation.state == "settled" and reservation.charged == tariff,
                   f"task {task_id}: reservation {reservation.state}, charged {reservation.charged}")
        step.check(drill.claim(drill.job_of(task_id)).get("claims") == 1, f"task {task_id} ran more than once")
    account = drill.ledger.account(customer.id)
    step.check(account is not None and account.available == drill.credits - 3 * tariff,
               f"the customer has {account.available if account else '?'} credits; expected "
               f"{drill.credits - 3 * tariff}")
    step.note(f"each charged once ({tariff}), deliveries per job {deliveries}, claims 1 each; "
              f"balance {account.available}")
    found = audit(drill.deployment.engine, [c.id for c in drill.customers])
    step.check(found.clean, "audit: " + "; ".join(found.problems))
    step.note(f"audit of the run's {len(drill.customers)} customers: {json.dumps(found.summary(), sort_keys=True)}")


class _Webhook:
    """The push drill's webhook on 127.0.0.1: records every notification it is sent."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.received: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with hook.lock:
                    hook.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def seen(self) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return list(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _state_of(event: dict[str, Any]) -> str | None:
    if "task" in event:
        return event["task"]["status"]["state"]
    if "statusUpdate" in event:
        return event["statusUpdate"]["status"]["state"]
    return None


def push(drill: Drill, step: Step) -> None:
    """A task sent with a push configuration through API 1 notifies the customer's webhook of every update, in
    order, each with the client's token and a JWT that API 2's published JWKS verifies; its configuration reads
    back through API 2, and another customer's read of it answers not found."""
    from core.push_signing import verify

    try:
        host = drill.deployment.push_webhook_host()
    except Unavailable as why:
        step.note(f"skipped: {why}")
        step.skipped += 1
        return
    customer, stranger = drill.customer("push"), drill.customer("push-stranger", credits=0)
    hook = _Webhook()
    try:
        url = f"http://{host}:{hook.server.server_address[1]}/drill/{drill.run_id}"
        token = f"drill-{drill.run_id}"
        message = {"messageId": f"drill-{uuid.uuid4()}", "role": "ROLE_USER",
                   "parts": [{"data": {"script": {"steps": [{"op": "progress", "text": "working"},
                                                            {"op": "complete", "text": "pushed"}]}}}]}
        answer = drill.http.post(f"{drill.url(0)}/message:send", headers=customer.headers, json={
            "message": message,
            "configuration": {"returnImmediately": True,
                              "taskPushNotificationConfig": {"id": "drill", "url": url, "token": token}}})
        step.check(answer.status_code == 200, f"send with a push configuration: {answer.status_code} "
                                              f"{answer.text[:SHOWN_BODY_CHARS]}")
        task_id = answer.json()["task"]["id"]
        config_path = f"/tasks/{task_id}/pushNotificationConfigs/drill"
        read = drill.http.get(f"{drill.url(1)}{config_path}", headers=customer.headers)
        step.check(read.status_code == 200 and read.json().get("url") == url,
                   f"the configuration through API 2: {read.status_code} {read.text[:SHOWN_BODY_CHARS]}")
        foreign = drill.http.get(f"{drill.url(1)}{config_path}", headers=stranger.headers)
        step.check(foreign.status_code == 404, f"another customer read the configuration: {foreign.status_code}")

        def completed() -> bool:
            return any(_state_of(json.loads(body)) == "TASK_STATE_COMPLETED" for _, body in hook.seen())

        drill.wait("the webhook to be told the task completed", completed, drill.claim_timeout_s(), interval_s=0.05)
        jwks = drill.http.get(f"{drill.deployment.api_urls[1 % len(drill.deployment.api_urls)]}/.well-known/jwks.json")
        step.check(jwks.status_code == 200, f"the JWKS of API 2: {jwks.status_code}")
        seen = hook.seen()
        ids = [int(headers["x-a2a-notification-event-id"]) for headers, _ in seen]
        unique = list(dict.fromkeys(ids))
        step.check(unique == sorted(unique), f"notifications out of order: event ids {ids}")
        for headers, body in seen:
            step.check(headers.get("x-a2a-notification-token") == token, "a notification without the client's token")
            try:
                claims = verify(headers.get("authorization", "").removeprefix("Bearer "), jwks.json())
            except Exception as exc:  # noqa: BLE001 - any failure to verify is the finding
                raise Broken(f"a notification's JWT did not verify with API 2's JWKS: {exc}") from None
            step.check(claims.get("task_id") == task_id and claims.get("aud") == url,
                       f"a JWT about another task or webhook: {claims}")
        states = [_state_of(json.loads(body)) or "artifact" for _, body in seen]
        step.note(f"task {task_id}: {len(seen)} notifications in event order ({' -> '.join(states)}), "
                  f"token echoed, each JWT verified with API 2's JWKS; the configuration read through API 2, "
                  f"not found for another customer")
        step.done += 1
    finally:
        hook.close()


def _tariff(drill: Drill, specialist: str = DRILL) -> int:
    from core.settings import Settings
    from core.specs import load_specs

    # The tariff the deployment charges is the one its admission recorded; the local spec is the fallback.
    with drill.deployment.engine.connect() as conn:
        recorded = conn.execute(text("SELECT tariff_credits FROM edge_tasks WHERE specialist_id = :s "
                                     "ORDER BY admitted_at DESC LIMIT 1"), {"s": specialist}).scalar_one_or_none()
    if recorded is not None:
        return int(recorded)
    return load_specs(Settings().hosted.specs_dir)[specialist].spec.tariff_credits


SCENARIOS: dict[str, Callable[[Drill, Step], None]] = {
    "refusal": refusal,
    "cancellation": cancellation,
    "cross-instance": cross_instance,
    "restart-and-rollout": restart_and_rollout,
    "retained-unknown": retained_unknown,
    "push": push,
    "settlement": settlement,
}


def run_scenario(drill: Drill, name: str) -> Verdict:
    step = Step(drill.progress)
    started = time.monotonic()
    try:
        SCENARIOS[name](drill, step)
    except Broken as broken:
        step.evidence.append(f"FAILED: {broken}")
        drill.progress(f"    FAILED: {broken}")
        return Verdict(name, "fail", time.monotonic() - started, step.evidence)
    except Exception as exc:  # the drill itself broke: a failure, with where
        where = traceback.format_exception(exc)[-2].strip().splitlines()[0] if exc.__traceback__ else ""
        step.evidence.append(f"FAILED: {type(exc).__name__}: {exc} ({where})")
        drill.progress(f"    FAILED: {type(exc).__name__}: {exc}")
        return Verdict(name, "fail", time.monotonic() - started, step.evidence)
    # A scenario about process control that could not control any process drilled nothing: skipped.
    skipped = name in NEEDS_CONTROL and step.skipped and not step.done
    return Verdict(name, "skipped" if skipped else "pass", time.monotonic() - started, step.evidence)


assert tuple(SCENARIOS) == SCENARIO_NAMES, "ops/drill/__init__.py lists the scenarios in this order"

NEEDS_CONTROL = frozenset({"cross-instance", "restart-and-rollout", "retained-unknown", "push"})
