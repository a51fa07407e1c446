"""Hosted conditions: the task goes to a running service (``specialists serve``) as a customer sends it.

One A2A message through the a2a-sdk client (the extra ``rlmfamily[a2a]``), streaming: the instruction as
a text part, the task's input files as inline file parts. The answer is the specialist's artifact
(``findings`` for a reviewer, ``report`` for an analyst); the same graders judge it. Beside it the
record keeps what the ledger charged (the task's final ``specialist`` metadata: ``creditsCharged`` is
what the finish's settlement posted) and the model's usage, read from the operator's own usage record
by ``usage_command`` (``specialists usage --json --job {task_id}``: model calls, tokens, USD; unknown
stays null). The library imports nothing of the service: it speaks A2A to it and runs its command.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmfamily.a2a.wire import whole_numbers  # protobuf Struct numbers are floats: 5, not 5.0
from rlmfamily.eval.conditions import Condition
from rlmfamily.eval.errors import EvalError
from rlmfamily.eval.pack import Task

HOSTED_KINDS = ("review", "analysis")  # what a hosted specialist answers; coding tasks need a workspace
FINAL_STATES = ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED")
MAX_HOSTED_FILES = 64  # files of one message (the reviewer's max_parts is below it)
USAGE_COMMAND_TIMEOUT_S = 60
MAX_NOTE_CHARS = 500  # of what a failed usage command said, kept in the record


class HostedUnavailable(EvalError):
    code = "eval_hosted_unavailable"


@dataclass(frozen=True)
class HostedOutcome:
    answer: str | None
    hosted: dict[str, Any]  # the task id, its final state and what the ledger charged
    usage: dict[str, Any]  # the model's usage, from the service's record


def check_hosted(tasks: tuple[Task, ...], condition: Condition) -> None:
    wrong = [t.id for t in tasks if t.spec.kind not in HOSTED_KINDS]
    if wrong:
        raise EvalError(f"condition {condition.name} is hosted: it runs {' and '.join(HOSTED_KINDS)} tasks only, not "
                        f"{', '.join(wrong)}; choose tasks with --tag reviewer --tag analyst", setting="conditions")
    try:
        import a2a.client  # noqa: F401
    except ImportError:
        raise HostedUnavailable("hosted conditions send A2A messages with the a2a-sdk: "
                                "pip install 'rlmfamily[a2a]'") from None


def run_hosted(task: Task, condition: Condition, workspace: Path, *, token: str, question: str,
               message_id: str) -> HostedOutcome:
    """``message_id`` is the same for every try of one attempt of one experiment: a try that runs again after
    a kill sends the same message, which the service answers with the first task (charged once), not a new one."""
    files = sorted(p for p in workspace.rglob("*") if p.is_file())[:MAX_HOSTED_FILES]
    parts = {p.relative_to(workspace).as_posix(): p.read_bytes() for p in files}
    seen = asyncio.run(asyncio.wait_for(_send(condition, token, question, parts, message_id), condition.deadline_s))
    artifacts = seen["artifacts"]
    if task.spec.kind == "review":
        findings = artifacts.get("findings")
        answer = None if findings is None else json.dumps(findings)
    else:
        answer = artifacts.get("report")
    meta = seen["metadata"].get("specialist", {})
    hosted = {"task_id": seen["task_id"], "message_id": message_id, "state": seen["state"], "status_message": seen["status_message"],
              "credits_charged": meta.get("creditsCharged"), "semantic_calls_used": meta.get("semanticCallsUsed"),
              "semantic_calls_charged": meta.get("semanticCallsCharged"), "pricing": meta.get("pricing"),
              "stop_reason": meta.get("stopReason"), "turns": meta.get("turns")}
    return HostedOutcome(answer, hosted, service_usage(condition, seen["task_id"]))


async def _send(condition: Condition, token: str, question: str, files: dict[str, bytes],
                message_id: str) -> dict[str, Any]:
    import httpx
    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.types.a2a_pb2 import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState
    from google.protobuf.json_format import MessageToDict

    parts = [Part(text=question)] + [Part(raw=data, filename=name, media_type="text/plain")
                                     for name, data in files.items()]
    message = Message(message_id=message_id, role=Role.ROLE_USER, parts=parts)
    seen: dict[str, Any] = {"task_id": None, "state": None, "status_message": "", "artifacts": {}, "metadata": {}}
    base = f"{(condition.url or '').rstrip('/')}/specialists/{condition.specialist}"
    # The SDK client's default timeout is 5 s; a review streams for longer.
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=condition.deadline_s,
                                 follow_redirects=False) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        async for event in client.send_message(SendMessageRequest(message=message)):
            kind = event.WhichOneof("payload")
            if kind == "task":  # the first event; or the only one, when this message was sent before
                _read_task(event.task, seen)
            elif kind == "status_update":
                status = event.status_update.status
                seen["state"] = TaskState.Name(status.state)
                seen["status_message"] = " ".join(p.text for p in status.message.parts if p.text) or seen["status_message"]
                if event.status_update.metadata.fields:
                    seen["metadata"] = whole_numbers(MessageToDict(event.status_update.metadata))
            elif kind == "artifact_update":
                artifact = event.artifact_update.artifact
                part = artifact.parts[0]
                seen["artifacts"][artifact.name] = whole_numbers(MessageToDict(part.data)) if part.HasField("data") else part.text
        if seen["task_id"] and not seen["artifacts"] and seen["state"] in FINAL_STATES:
            # A resend (the same message id) is answered with the first task, without its events: read it whole.
            _read_task(await client.get_task(GetTaskRequest(id=seen["task_id"])), seen)
    return seen


def _read_task(task: Any, seen: dict[str, Any]) -> None:
    from a2a.types.a2a_pb2 import TaskState
    from google.protobuf.json_format import MessageToDict

    seen["task_id"], seen["state"] = task.id, TaskState.Name(task.status.state)
    seen["status_message"] = " ".join(p.text for p in task.status.message.parts if p.text) or seen["status_message"]
    for artifact in task.artifacts:
        part = artifact.parts[0]
        seen["artifacts"][artifact.name] = whole_numbers(MessageToDict(part.data)) if part.HasField("data") else part.text
    if task.metadata.fields:
        seen["metadata"] = whole_numbers(MessageToDict(task.metadata))
    if task.status.HasField("message") and task.status.message.metadata.fields and not seen["metadata"]:
        seen["metadata"] = whole_numbers(MessageToDict(task.status.message.metadata))


def service_usage(condition: Condition, task_id: str | None) -> dict[str, Any]:
    """The model's usage of the task's jobs, from the operator's usage command; unknown stays null."""
    unknown = {"calls": None, "root_calls": None, "subcalls": None, "unknown_usage_calls": None,
               "unknown_cost_calls": None, "input_tokens": None, "cached_input_tokens": None, "output_tokens": None,
               "reasoning_tokens": None, "cost_usd": None, "known_lower_bound": None}
    if task_id is None or not condition.usage_command:
        return unknown | {"source": "none: no task id or no usage_command"}
    command = [part.replace("{task_id}", task_id) for part in condition.usage_command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=USAGE_COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return unknown | {"source": f"usage_command failed: {type(exc).__name__}: {exc}"[:MAX_NOTE_CHARS]}
    try:
        jobs = list(json.loads(done.stdout)["jobs"])
    except (ValueError, KeyError, TypeError):
        said = (done.stdout.strip() + " " + done.stderr.strip()).strip()
        return unknown | {"source": f"usage_command exited {done.returncode} without jobs: {said}"[:MAX_NOTE_CHARS]}
    unknown_tokens = sum(int(j.get("calls_with_unknown_tokens") or 0) for j in jobs)
    unknown_cost = sum(int(j.get("calls_with_unknown_cost") or 0) for j in jobs)
    prompt = sum(int(j.get("prompt_tokens") or 0) for j in jobs)
    completion = sum(int(j.get("completion_tokens") or 0) for j in jobs)
    usd = sum(float(j.get("cost_usd") or 0) for j in jobs)
    return {"calls": sum(int(j.get("model_calls") or 0) for j in jobs), "root_calls": None, "subcalls": None,
            "unknown_usage_calls": unknown_tokens, "unknown_cost_calls": unknown_cost,
            "input_tokens": None if unknown_tokens else prompt, "cached_input_tokens": None,
            "output_tokens": None if unknown_tokens else completion, "reasoning_tokens": None,
            "cost_usd": None if unknown_cost else round(usd, 10),
            "known_lower_bound": {"input_tokens": prompt, "output_tokens": completion, "cost_usd": round(usd, 10)},
            "jobs": [j.get("job_id") for j in jobs], "source": "the service's usage record (usage_command)"}
