"""`specialists usage` and `specialists demo`: what the rlm specialists used, and the product in one command.

``usage`` lists one row per specialist job (outcome, semantic calls, tokens,
cost, credits to settle; unknown usage counted apart, never as zero) and, with
``--job``, every model call of that job.

``demo`` drives the running service (``specialists serve`` in another terminal,
or ``SPECIALISTS_EDGE_PUBLIC_URL``) as a customer would: it issues a demo key,
grants credits, delegates a review of the bundled example project
(``specs/demo/shop``, one known defect) to the ``reviewer`` through the a2a-sdk
client over HTTP, streams the progress, prints the findings and the ledger
movements, and exits non-zero if any step fails (including a review that misses
the known defect). It uses whatever route the reviewer has: the scripted demo
route by default, a real model once the routes file names one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from core.settings import PROJECT_ROOT
from core.specs import load_specs
from ops.output import EXIT_CONFIG, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit, emit_json, fail, say
from rlmfamily.a2a.wire import whole_numbers  # protobuf Struct numbers are floats; show 8, not 8.0

DEMO_PROJECT = PROJECT_ROOT / "specs" / "demo" / "shop"
DEMO_RULE = (
    "Review this project against one rule: no SQL statement may be built from caller input "
    "(f-strings, concatenation or % formatting); values must be passed as query parameters."
)
KNOWN_DEFECT = "shop/customers.py"
DEMO_SPECIALIST = "reviewer"
# How long the check that the service answers waits for each of its two requests (/readyz, the card).
DEMO_PREFLIGHT_TIMEOUT_S = 10.0
DEMO_CREDITS = 100
DEMO_CUSTOMER_SUFFIX_CHARS = 8  # random hex characters that make each demo (or journey) customer new
# Beyond the reviewer's own deadline: time for a worker to take the task and for the settlement.
DEMO_MARGIN_S = 60.0

_JOB_COLUMNS = ["job_id", "specialist_id", "outcome", "stop_reason", "resumes", "turns", "semantic_calls_used",
                "semantic_calls_charged", "charged_credits", "model_calls", "replayed_calls", "prompt_tokens",
                "completion_tokens", "cost_usd", "cpu_seconds", "calls_with_unknown_tokens", "calls_with_unknown_cost"]
_CALL_COLUMNS = ["call_id", "purpose", "turn", "step_index", "state", "model", "prompt_tokens", "completion_tokens",
                 "cost_usd", "replays", "superseded_by", "claim", "note"]


def cmd_usage(ctx: Any, args: argparse.Namespace) -> int:
    """The rlm jobs (newest first); with ``--job`` one job and its model calls, or a task's jobs (a job id is
    ``<task id>.<dispatch id>``, and an operator starts from the task id)."""
    from workers.hosted_rlm import journal

    if args.specialist is not None:
        specs = load_specs(ctx.settings.hosted.specs_dir)
        if args.specialist not in specs:
            return fail("specialist_unknown", f"no specialist {args.specialist!r}; the specialists are "
                        f"{', '.join(sorted(specs))} (SPECIALISTS_SPECS_DIR)", as_json=ctx.as_json, exit_code=EXIT_USAGE)
    engine = ctx.engine_at_head()
    with engine.connect() as conn:
        jobs = journal.usage_by_job(conn, specialist_id=args.specialist, job_id=args.job, since=args.since,
                                    until=args.until, limit=args.limit)
        of_task = None
        if args.job and not jobs:  # not a job's id: a task's, whose jobs are listed
            jobs = of_task = journal.usage_by_task(conn, args.job, limit=args.limit)
        one = jobs[0]["job_id"] if args.job and len(jobs) == 1 else None
        calls = journal.usage_calls(conn, one) if one else None
    if args.job and not jobs:
        return fail("job_not_found", f"no specialist run for the job or task {args.job!r}; `specialists usage` "
                    "lists the jobs, and a task's id lists all of its jobs", as_json=ctx.as_json)
    if ctx.as_json:
        emit_json({"jobs": jobs, **({"task_id": args.job} if of_task else {}),
                   **({"calls": calls} if calls is not None else {})})
        return EXIT_OK
    title = f"rlm jobs of task {args.job} (newest first)" if of_task else "specialist runs (newest first)"
    emit(jobs, as_json=False, columns=_JOB_COLUMNS, title=title)
    if calls is not None:
        emit(calls, as_json=False, columns=_CALL_COLUMNS, title=f"model calls of {one} (usage '-' is unknown)")
    elif of_task:
        say("each job's model calls: `specialists usage --job <job_id>`")
    return EXIT_OK


# --- the demo -----------------------------------------------------------------------


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _demo_files() -> dict[str, str]:
    return {p.relative_to(DEMO_PROJECT).as_posix(): p.read_text() for p in sorted(DEMO_PROJECT.rglob("*")) if p.is_file()}


def _reviewer(settings: Any) -> tuple[str, float, str]:
    """The kind of the reviewer's model route here (scripted, openai, missing), its deadline, and the skill its
    card publishes (what the demo's customer is entitled to)."""
    from workers.hosted_rlm.routes import ModelRoutes, RouteNotReady

    spec = load_specs(settings.hosted.specs_dir)[DEMO_SPECIALIST].spec
    try:
        route = ModelRoutes.load(settings.hosted.model_routes_file).get(spec.model_route or "")
    except RouteNotReady:
        return "missing", spec.limits.deadline_s, spec.skill.id
    return route.kind, spec.limits.deadline_s, spec.skill.id


async def _delegate(base_url: str, token: str, files: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Send the review through the a2a-sdk client, streaming; return what the customer saw."""
    import httpx
    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
    from google.protobuf.json_format import MessageToDict

    parts = [Part(text=DEMO_RULE)] + [
        Part(raw=content.encode(), filename=name, media_type="text/x-python" if name.endswith(".py") else "text/plain")
        for name, content in files.items()
    ]
    message = Message(message_id=f"demo-{uuid.uuid4()}", role=Role.ROLE_USER, parts=parts)
    seen: dict[str, Any] = {"task_id": None, "state": None, "status_message": "", "artifacts": {}, "metadata": {}}
    # The SDK client's default timeout is 5 s; the edge pings streams every few seconds, a run takes longer.
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s) as http:
        card = await A2ACardResolver(http, f"{base_url}/specialists/{DEMO_SPECIALIST}").get_agent_card()
        _progress(f"delegating to {card.name} ({len(files)} files) ...")
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        async for event in client.send_message(SendMessageRequest(message=message)):
            kind = event.WhichOneof("payload")
            if kind == "task":
                seen["task_id"] = event.task.id
                seen["state"] = TaskState.Name(event.task.status.state)
            elif kind == "status_update":
                status = event.status_update.status
                seen["state"] = TaskState.Name(status.state)
                text = " ".join(p.text for p in status.message.parts if p.text)
                seen["status_message"] = text or seen["status_message"]
                if event.status_update.metadata.fields:
                    seen["metadata"] = whole_numbers(MessageToDict(event.status_update.metadata))
                _progress(f"  [{seen['state'].removeprefix('TASK_STATE_').lower()}] {text}")
            elif kind == "artifact_update":
                artifact = event.artifact_update.artifact
                part = artifact.parts[0]
                seen["artifacts"][artifact.name] = whole_numbers(MessageToDict(part.data)) if part.HasField("data") else part.text
                _progress(f"  artifact: {artifact.name}")
            elif kind == "message":
                seen["status_message"] = " ".join(p.text for p in event.message.parts if p.text)
    return seen


def _service_problem(base_url: str) -> str | None:
    """Why the service at ``base_url`` cannot take the demo's task now (None: it is ready and serves the
    reviewer's card): checked before the demo adds a customer, issues a key or grants a credit."""
    import httpx

    try:
        ready = httpx.get(f"{base_url}/readyz", timeout=DEMO_PREFLIGHT_TIMEOUT_S)
        if ready.status_code != 200:
            return f"{base_url}/readyz answers {ready.status_code}: the service is not ready (its log says why)"
        card = httpx.get(f"{base_url}/specialists/{DEMO_SPECIALIST}/.well-known/agent-card.json",
                         timeout=DEMO_PREFLIGHT_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"nothing answers at {base_url} ({type(exc).__name__}); is `specialists serve` running? (--url)"
    if card.status_code != 200:
        return f"{base_url} serves no {DEMO_SPECIALIST} card (HTTP {card.status_code}): is it this service? (--url)"
    return None


def _refuse_unready(ctx: Any, base_url: str, code: str) -> int | None:
    """The exit code of a refusal when no customer can be added yet (no signing secret, or the service at
    ``base_url`` is not ready); None: go on. Shared by ``demo`` and ``journey``, before anything is granted."""
    if not ctx.settings.keys.signing_secrets:
        return fail("secret_missing", "SPECIALISTS_KEY_SIGNING_SECRETS is not set; on one machine run "
                    "`specialists serve` first (it generates it)", as_json=ctx.as_json, exit_code=EXIT_CONFIG)
    problem = _service_problem(base_url)
    if problem is not None:
        return fail(code, f"{problem}. Nothing was granted.", as_json=ctx.as_json)
    return None


def _new_customer(ctx: Any, engine: Any, purpose: str, credits: int) -> tuple[str, str, Any]:
    """A new customer of its own for ``specialists <purpose>`` with a one-day key and ``credits`` granted for
    the reviewer's skill: (customer id, the key's token, the Ledger that granted them)."""
    from ledger import keys
    from ledger.client import Ledger

    settings = ctx.settings
    reason = f"specialists {purpose}"
    customer = f"{purpose}-{uuid.uuid4().hex[:DEMO_CUSTOMER_SUFFIX_CHARS]}"
    ledger = Ledger(engine)
    ledger.open_account(customer, operator=ctx.operator, reason=reason)
    signer = keys.KeySigner([s.get_secret_value() for s in settings.keys.signing_secrets], settings.keys.environment)
    issued = keys.issue_key(engine, signer, customer_id=customer, ttl=timedelta(days=1), label=reason,
                            require_customer=True, operator=ctx.operator)
    ledger.grant(customer, credits, operator=ctx.operator, skills=[DEMO_SPECIALIST], reason=reason,
                 require_customer=True)
    return customer, issued.token, ledger


def cmd_demo(ctx: Any, args: argparse.Namespace) -> int:
    settings = ctx.settings
    base_url = (args.url or settings.edge.url).rstrip("/")
    refused = _refuse_unready(ctx, base_url, "demo_failed")
    if refused is not None:
        return refused
    route, deadline_s, skill = _reviewer(settings)
    timeout_s = args.timeout_s if args.timeout_s is not None else deadline_s + DEMO_MARGIN_S
    _progress(f"the reviewer's model route is {route}" + (" (no model: a scripted replay)" if route == "scripted" else ""))
    customer, token, ledger = _new_customer(ctx, ctx.engine_at_head(), "demo", DEMO_CREDITS)
    _progress(f"added customer {customer}, issued it a demo key and granted {DEMO_CREDITS} credits for the {skill} skill")
    files = _demo_files()
    try:
        seen = asyncio.run(asyncio.wait_for(_delegate(base_url, token, files, timeout_s), timeout_s))
    except (TimeoutError, asyncio.TimeoutError):
        return fail("demo_timed_out", f"the review did not finish within {timeout_s:g} s (--timeout-s); is a worker "
                    "serving the reviewer? `curl <worker>/readyz` lists what it cannot serve", as_json=ctx.as_json)
    except Exception as exc:  # the service is not running, refused the key, the stream broke...
        return fail("demo_failed", f"delegating to {base_url} failed ({type(exc).__name__}: {exc}); is "
                    "`specialists serve` running?", as_json=ctx.as_json)
    findings = seen["artifacts"].get("findings") or []
    movements = [asdict(line) for line in ledger.history(customer, limit=20)]
    summary = {
        "customer": customer,
        "task_id": seen["task_id"],
        "state": seen["state"],
        "message": seen["status_message"],
        "route": route,
        "findings": findings,
        "specialist": seen["metadata"].get("specialist", {}),
        "ledger": movements,
    }
    problem = _verdict(seen, findings, movements)
    if ctx.as_json:  # the verdict inside the one JSON document, nothing on stderr
        emit_json(summary | ({"error": {"code": problem[0], "message": problem[1]}} if problem else {}))
        return EXIT_REFUSED if problem else EXIT_OK
    emit(findings, as_json=False, columns=["path", "line", "severity", "message"], title="findings")
    emit({k: v for k, v in summary["specialist"].items()}, as_json=False, title="the task's final metadata")
    emit(movements, as_json=False, columns=["at", "kind", "job_id", "from_account", "to_account", "credits",
                                            "reason"], title=f"ledger movements of {customer}")
    return fail(*problem, as_json=False) if problem else EXIT_OK


def _verdict(seen: dict[str, Any], findings: list[dict[str, Any]], movements: list[dict[str, Any]]) -> tuple[str, str] | None:
    """What went wrong with the demo's review, as (code, message); None when it did what it shows."""
    if seen["state"] != "TASK_STATE_COMPLETED":
        return "demo_task_not_completed", f"the review ended {seen['state']}: {seen['status_message']}"
    if not any(f.get("path") == KNOWN_DEFECT for f in findings):
        return "demo_defect_missed", f"the review did not report the known defect in {KNOWN_DEFECT}"
    if not any(m["kind"] == "settle" for m in movements):
        return "demo_not_settled", "the task completed but no settlement is in the customer's journal"
    return None


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `usage` and `demo` to the `specialists` parser."""
    usage = groups.add_parser("usage", parents=[common], help="what rlm specialist runs used, per job")
    usage.add_argument("--job", default=None,
                       help="one job (<task id>.<n>) with every model call it made, or a task id: its jobs")
    usage.add_argument("--specialist", default=None, help="only this specialist's jobs")
    usage.add_argument("--limit", type=int, default=50, help="jobs listed, newest first (at most 1000)")
    from ops.cli_ledger import _instant

    usage.add_argument("--since", type=_instant, default=None, help="only jobs started at or after (ISO 8601, UTC)")
    usage.add_argument("--until", type=_instant, default=None, help="only jobs started before (ISO 8601, UTC)")
    usage.set_defaults(func=cmd_usage)

    demo = groups.add_parser(
        "demo", parents=[common], help="delegate a review of the bundled example project to the running service"
    )
    demo.add_argument("--url", default=None, help="the service's base URL (default: SPECIALISTS_EDGE_PUBLIC_URL)")
    demo.add_argument("--timeout-s", type=float, default=None,
                      help="give up after this long (default: the reviewer's deadline plus a minute)")
    demo.set_defaults(func=cmd_demo)

