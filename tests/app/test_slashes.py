"""Every route answers with and without a trailing slash, the same, and nothing redirects.

The A2A TCK posts JSON-RPC to ``…/jsonrpc/``; Starlette answered ``307`` with an empty
body, which a client that does not follow redirects (httpx by default) reads as a
failure. The routes are not listed by hand: they are read from the app ``create_app``
builds for the edges' specs, and each one is called on the running edge both ways.
A route without a sample request below fails the test, so a new route cannot be
left out.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from app.assembly import create_app
from app.slashes import without_trailing_slash
from core.settings import Settings
from tests import http_calls
from tests.app.conftest import Customer, message, rpc
from tests.conftest import TEST_SECRET

pytestmark = pytest.mark.timeout(120, func_only=True)

SPECIALIST = "{specialist}"
# Parts of an answer that differ between two calls made for the same thing (new ids, clocks, request ids).
VOLATILE_KEYS = frozenset({"id", "taskId", "contextId", "messageId", "timestamp", "request_id"})


@dataclass
class Sample:
    """One request to a route: its path after the route's prefix is filled in, and how its answer is compared."""

    path: str
    body: dict | None = None
    headers: dict[str, str] = field(default_factory=dict)
    compare_body: bool = True  # False: only the status and the media type (a body that changes by itself)


@dataclass
class Fixtures:
    caller: Customer  # owns ``task_id`` (finished) and nothing that still changes
    sender: Customer  # sends the new messages, so the caller's listing stays still
    task_id: str


# Every (route, method) the edge mounts, with a request for it. ``{specialist}`` stands for each specialist's id.
SAMPLES: dict[tuple[str, str], Callable[[str, Fixtures], Sample]] = {
    ("/healthz", "GET"): lambda s, f: Sample("/healthz"),
    ("/readyz", "GET"): lambda s, f: Sample("/readyz"),
    ("/metrics", "GET"): lambda s, f: Sample("/metrics", compare_body=False),  # counters move with every call
    ("/specialists", "GET"): lambda s, f: Sample("/specialists"),
    ("/specialists/{specialist}/.well-known/agent-card.json", "GET"): lambda s, f: Sample(
        f"/specialists/{s}/.well-known/agent-card.json"),
    ("/specialists/{specialist}/.well-known/agent-card-0.3.json", "GET"): lambda s, f: Sample(
        f"/specialists/{s}/.well-known/agent-card-0.3.json"),
    ("/specialists/{specialist}/jsonrpc", "POST"): lambda s, f: Sample(
        f"/specialists/{s}/jsonrpc", rpc("GetTask", {"id": f.task_id}), f.caller.headers),
    ("/specialists/{specialist}/message:send", "POST"): lambda s, f: Sample(
        f"/specialists/{s}/message:send", message(returnImmediately=True), f.sender.headers),
    ("/specialists/{specialist}/message:stream", "POST"): lambda s, f: Sample(  # a finished task: answered at once
        f"/specialists/{s}/message:stream", message(taskId=f.task_id), f.caller.headers),
    ("/specialists/{specialist}/tasks", "GET"): lambda s, f: Sample(f"/specialists/{s}/tasks", None, f.caller.headers),
    ("/specialists/{specialist}/tasks/{id}", "GET"): lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}", None, f.caller.headers),
    ("/specialists/{specialist}/tasks/{id}:cancel", "POST"): lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}:cancel", {}, f.caller.headers),
    ("/specialists/{specialist}/tasks/{id}:subscribe", "GET"): lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}:subscribe", None, f.caller.headers),
    ("/specialists/{specialist}/tasks/{id}:subscribe", "POST"): lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}:subscribe", {}, f.caller.headers),
    ("/specialists/{specialist}/tasks/{id}/pushNotificationConfigs", "GET"): lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}/pushNotificationConfigs", None, f.caller.headers),
    ("/specialists/{specialist}/tasks/{id}/pushNotificationConfigs", "POST"): lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}/pushNotificationConfigs", {"url": "https://example.com/hook"},
        f.caller.headers),
    ("/specialists/{specialist}/tasks/{id}/pushNotificationConfigs/{push_id}", "GET"): lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}/pushNotificationConfigs/p-1", None, f.caller.headers),
    ("/specialists/{specialist}/tasks/{id}/pushNotificationConfigs/{push_id}", "DELETE"): lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}/pushNotificationConfigs/p-1", None, f.caller.headers),
    # A task id with a slash in it names no task: TaskNotFound, whatever the method (app/assembly.py).
    **{("/specialists/{specialist}/tasks/{head}/{tail:path}", method): (lambda s, f: Sample(
        f"/specialists/{s}/tasks/{f.task_id}/x", None, f.caller.headers)) for method in ("GET", "POST", "DELETE")},
    ("/specialists/{specialist}/extendedAgentCard", "GET"): lambda s, f: Sample(
        f"/specialists/{s}/extendedAgentCard", None, f.caller.headers),
}


def mounted_routes(settings: Settings) -> dict[tuple[str, str], list[str]]:
    """Each (route template, method) the edge mounts, and the specialists it is mounted for."""
    app = create_app(settings)
    specialists = sorted(app.state.edge.specs)
    mounted: dict[tuple[str, str], list[str]] = {}
    for route in app.routes:
        assert isinstance(route, Route), f"{route!r} is not a plain route: cover its paths in this test"
        template, specialist = route.path, ""
        for candidate in specialists:
            prefix = f"/specialists/{candidate}"
            if template == prefix or template.startswith(prefix + "/"):
                template, specialist = "/specialists/" + SPECIALIST + template[len(prefix):], candidate
        for method in route.methods or ():
            if method != "HEAD":  # HEAD is called below for every GET route
                mounted.setdefault((template, method), []).append(specialist)
    return mounted


def answer_of(response: httpx.Response, compare_body: bool) -> tuple[Any, ...]:
    media_type = response.headers.get("content-type", "").split(";")[0]
    if not compare_body or not response.content:
        return response.status_code, media_type
    if media_type == "text/event-stream":
        events = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
        return response.status_code, media_type, without_volatile(events)
    return response.status_code, media_type, without_volatile(response.json())


def without_volatile(document: Any) -> Any:
    if isinstance(document, dict):
        return {k: without_volatile(v) for k, v in document.items() if k not in VOLATILE_KEYS}
    if isinstance(document, list):
        return [without_volatile(v) for v in document]
    return document


def call(base: str, method: str, sample: Sample, slash: bool) -> httpx.Response:
    path = sample.path + "/" if slash else sample.path
    return http_calls.request(method, base + path, json=sample.body, headers=sample.headers, follow_redirects=False)


@pytest.fixture
def fixtures(edge_a, make_customer) -> Fixtures:
    caller, sender = make_customer(credits=100), make_customer(credits=100)
    body = message(f"tck-complete-task-{uuid.uuid4()}")
    answer = http_calls.post(f"{edge_a.specialist('conformance')}/jsonrpc", json=rpc("SendMessage", body),
                             headers=caller.headers).json()
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    return Fixtures(caller=caller, sender=sender, task_id=task["id"])


def test_every_route_answers_the_same_with_a_trailing_slash_and_never_redirects(
    edge_a, edge_specs_dir, database_url, fixtures
):
    settings = Settings(hosted={"specs_dir": edge_specs_dir}, keys={"signing_secrets": [TEST_SECRET]},
                        database={"url": database_url})
    mounted = mounted_routes(settings)
    uncovered = sorted(set(mounted) - set(SAMPLES))
    assert not uncovered, f"routes without a sample request in tests/app/test_slashes.py: {uncovered}"
    for (template, method), specialists in sorted(mounted.items()):
        for specialist in specialists:
            sample = SAMPLES[(template, method)](specialist, fixtures)
            methods = (method, "HEAD") if method == "GET" else (method,)
            for verb in methods:
                plain, slashed = call(edge_a.url, verb, sample, False), call(edge_a.url, verb, sample, True)
                where = f"{verb} {sample.path}"
                assert not plain.is_redirect and not slashed.is_redirect, (where, plain.status_code, slashed.status_code)
                assert plain.status_code != 404 or plain.headers.get("content-type", "").startswith("application/json"), (
                    f"{where} reached no route: {plain.text}")
                compare_body = sample.compare_body and verb != "HEAD"
                assert answer_of(slashed, compare_body) == answer_of(plain, compare_body), where


def test_a_path_with_more_slashes_is_unknown_not_redirected(edge_a, fixtures):
    for path in ("/specialists/conformance/jsonrpc//", "/specialists//", "/healthz//"):
        answer = http_calls.post(f"{edge_a.url}{path}", json=rpc("GetTask", {"id": fixtures.task_id}),
                                 headers=fixtures.caller.headers, follow_redirects=False)
        assert not answer.is_redirect and answer.status_code in (404, 405), (path, answer.status_code)


def test_one_trailing_slash_is_dropped_and_nothing_else():
    assert without_trailing_slash("/specialists/x/jsonrpc/") == "/specialists/x/jsonrpc"
    assert without_trailing_slash("/specialists/x/jsonrpc") == "/specialists/x/jsonrpc"
    assert without_trailing_slash("/") == "/"
    assert without_trailing_slash("/a//") == "/a/"
