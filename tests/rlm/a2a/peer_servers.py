"""A2A peers on 127.0.0.1 for the delegation tests.

- ``SdkPeer``: a well-behaved peer built with the a2a-sdk server (in-memory task
  store, a trivial executor whose behaviour is chosen by the task's first word),
  served by uvicorn on the bindings its card lists (JSON-RPC at ``/jsonrpc``,
  HTTP+JSON under ``/rest``). It records every call and the bearer keys it saw.
- ``HostilePeer``: an ``http.server`` peer that misbehaves on purpose (redirects,
  a card that moves the origin, gzip, oversized or endless bodies, a dropped
  connection after accepting a task), on JSON-RPC or HTTP+JSON. It counts every
  request it receives.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ..holds import POLL_S, Hold

SKILL = "code-review"
JSONRPC = "JSONRPC"
HTTP_JSON = "HTTP+JSON"
INTERFACE_PATHS = {JSONRPC: "/jsonrpc", HTTP_JSON: "/rest"}
BIG_RESULT_CHARS = 60_000
HELD_BODY_BYTES = 1_000_000  # what a hostile body sends before it holds: more than any max_result_bytes tested


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def card_dict(base: str, *, interface_url: str | None = None, skill: str = SKILL,
              tariff_credits: int | None = None, bindings: tuple[str, ...] = (JSONRPC,)) -> dict[str, Any]:
    """A card listing one interface per binding, in order (``interface_url`` replaces the first one's URL)."""
    interfaces = [AgentInterface(url=f"{base}{INTERFACE_PATHS[b]}", protocol_binding=b, protocol_version="1.0")
                  for b in bindings]
    if interface_url is not None:
        interfaces[0].url = interface_url
    card = AgentCard(
        name="reviewer", description="reviews things", version="1.0",
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=False, push_notifications=False),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id=skill, name="Review", description="Reviews a diff", tags=["review"])],
    )
    if tariff_credits is not None:
        card.capabilities.extensions.append(AgentExtension(uri="urn:test:tariff", params={"tariffCredits": tariff_credits}))
    return MessageToDict(card)


# ---------- the well-behaved peer ----------


class Recorder:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.bearers: list[str | None] = []
        self.messages: list[dict[str, Any]] = []
        self.bodies: list[dict[str, Any]] = []  # every JSON-RPC request (or HTTP+JSON body) as it arrived
        self.bindings: Counter[str] = Counter()  # calls per binding
        self.file_fetches = 0
        self.lock = threading.Lock()
        self._gates: dict[str, threading.Event] = {}
        self.closed = threading.Event()

    def gate(self, name: str) -> threading.Event:
        """What ``held <name>`` work waits for: ``release(name)``, or the peer's close."""
        with self.lock:
            return self._gates.setdefault(name, threading.Event())

    def release(self, name: str) -> None:
        self.gate(name).set()


class ScriptedExecutor(AgentExecutor):
    """Behaviour by the task's first word: hello (direct Message), ask, auth, slow, held, big, file, fail, charge;
    else a review.

    ``slow N`` works N seconds; ``held NAME`` works until the test calls ``recorder.release(NAME)``
    (or the peer closes), so a test that needs the work still running never races a sleep. ``charge JSON``
    completes with ``JSON`` as the charge in the task's metadata, where the hosted service states it
    (``{"specialist": {"creditsCharged": JSON}}``); ``held NAME JSON`` does the same once released.
    """

    def __init__(self, recorder: Recorder, base: str) -> None:
        self.recorder = recorder
        self.base = base

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None and context.task_id and context.context_id
        text = "\n".join(p.text for p in message.parts if p.WhichOneof("content") == "text")
        with self.recorder.lock:
            self.recorder.messages.append(MessageToDict(message))
        word = text.split()[0] if text.split() else ""
        if word == "hello" and context.current_task is None:
            await event_queue.enqueue_event(Message(message_id=str(uuid.uuid4()), role=Role.ROLE_AGENT,
                                                    context_id=context.context_id, parts=[Part(text="hello yourself")]))
            return
        current = context.current_task
        if current is None:
            await event_queue.enqueue_event(Task(id=context.task_id, context_id=context.context_id,
                                                 status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                                                 history=[message]))
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        say = updater.new_agent_message
        if current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.add_artifact([Part(text=f"reviewed branch {text.strip()}: no findings")])
            await updater.complete()
            return
        if word == "ask":
            await updater.requires_input(say([Part(text="Which branch should I review?")]))
        elif word == "auth":
            await updater.requires_auth(say([Part(text="Sign in at the reviewer's console first.")]))
        elif word == "slow":
            await updater.start_work()
            seconds = float(text.split()[1]) if len(text.split()) > 1 else 30.0
            await asyncio.sleep(seconds)
            await updater.add_artifact([Part(text="slow review done")])
            await updater.complete()
        elif word == "held":
            await updater.start_work()
            gate = self.recorder.gate(text.split()[1] if len(text.split()) > 1 else "")
            while not (gate.is_set() or self.recorder.closed.is_set()):
                await asyncio.sleep(POLL_S)
            await updater.add_artifact([Part(text="held review done")])
            await complete_charged(updater, text.split()[2] if len(text.split()) > 2 else None)
        elif word == "charge":
            await updater.add_artifact([Part(text="charged review done")])
            await complete_charged(updater, text.split(maxsplit=1)[1].splitlines()[0])
        elif word == "big":
            await updater.add_artifact([Part(text="".join(f"line {i:05d} ok\n" for i in range(BIG_RESULT_CHARS // 14)))])
            await updater.complete()
        elif word == "file":
            await updater.add_artifact([Part(url=f"{self.base}/files/report.txt", media_type="text/plain",
                                             filename="report.txt"), Part(text="see the attached report")])
            await updater.complete()
        elif word == "fail":
            await updater.failed(say([Part(text="could not review")]))
        else:
            await updater.add_artifact([Part(text=f"review of {len(text)} characters: looks fine")], name="review")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


async def complete_charged(updater: TaskUpdater, charge_json: str | None) -> None:
    """Complete the task, stating ``charge_json`` (parsed) as its charge in the metadata when one is given."""
    if charge_json is None:
        await updater.complete()
        return
    await updater.update_status(TaskState.TASK_STATE_COMPLETED,
                                metadata={"specialist": {"creditsCharged": json.loads(charge_json)}})


class SdkPeer:
    """The a2a-sdk server on a free loopback port (uvicorn in a thread) until ``close``."""

    def __init__(self, *, tariff_credits: int | None = None, skill: str = SKILL,
                 bindings: tuple[str, ...] = (JSONRPC,)) -> None:
        self.sock = free_socket()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.recorder = Recorder()
        card = AgentCard()
        from google.protobuf.json_format import ParseDict

        ParseDict(card_dict(self.url, skill=skill, tariff_credits=tariff_credits, bindings=bindings), card)
        handler = DefaultRequestHandler(agent_executor=ScriptedExecutor(self.recorder, self.url),
                                        task_store=InMemoryTaskStore(), agent_card=card)
        recorder = self.recorder

        async def files(request: Request) -> PlainTextResponse:
            with recorder.lock:
                recorder.file_fetches += 1
            return PlainTextResponse("never fetched")

        # The REST builder mounts a catch-all tenant route: it goes last.
        app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/jsonrpc"),
                                Route("/files/{name}", files),
                                *create_rest_routes(handler, path_prefix=INTERFACE_PATHS[HTTP_JSON])])

        class Record:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                binding = binding_of(scope["path"]) if scope["type"] == "http" else None
                if binding is None:
                    if scope["type"] == "http" and scope["path"].endswith("/agent-card.json"):
                        with recorder.lock:
                            recorder.calls["card"] += 1
                    await self.inner(scope, receive, send)
                    return
                chunks: list[bytes] = []
                while True:
                    event = await receive()
                    chunks.append(event.get("body", b""))
                    if not event.get("more_body"):
                        break
                body = b"".join(chunks)
                headers = dict((k.decode().lower(), v.decode()) for k, v in scope["headers"])
                auth = headers.get("authorization")
                parsed = json.loads(body) if body else {}
                method = parsed.get("method", "?") if binding == JSONRPC else rest_method(scope["method"],
                                                                                         scope["path"])
                with recorder.lock:
                    recorder.bodies.append(parsed)
                    recorder.calls[method] += 1
                    recorder.bindings[binding] += 1
                    recorder.bearers.append(auth.removeprefix("Bearer ") if auth else None)
                replayed = False

                async def replay() -> dict[str, Any]:
                    nonlocal replayed
                    if replayed:
                        return await receive()
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}

                await self.inner(scope, replay, send)

        self.server = uvicorn.Server(uvicorn.Config(Record(app), log_level="warning", access_log=False,
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.server.started, "uvicorn did not start"

    def close(self) -> None:
        self.recorder.closed.set()
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def binding_of(path: str) -> str | None:
    for binding, prefix in INTERFACE_PATHS.items():
        if path == prefix or path.startswith(prefix + "/"):
            return binding
    return None


def rest_method(verb: str, path: str) -> str:
    """The A2A method an HTTP+JSON request names (the routes the a2a-sdk serves)."""
    if path.endswith("/message:send"):
        return "SendMessage"
    if path.endswith(":cancel"):
        return "CancelTask"
    if verb == "GET" and "/tasks/" in path:
        return "GetTask"
    return f"{verb} {path}"


# ---------- the hostile peer ----------


class HostilePeer:
    """Misbehaves according to ``mode``; ``hits`` counts requests by (method, path) and by A2A method.

    ``binding`` is the one interface its card lists: JSON-RPC (``/jsonrpc``) or HTTP+JSON (``/rest``).
    Every misbehaviour happens the same way on both.
    """

    MODES = ("redirect_card", "redirect_rpc", "moved_card", "tab_card", "gzip", "oversized", "endless",
             "drop_after_accept", "error_rpc", "wrong_task", "ask_then_drop_reply", "plain")

    def __init__(self, mode: str, *, binding: str = JSONRPC) -> None:
        assert mode in self.MODES, mode
        self.mode = mode
        self.binding = binding
        self.hits: Counter[str] = Counter()
        self.task_id = str(uuid.uuid4())
        self.accepted_message_ids: list[str] = []
        self.task_state = "TASK_STATE_COMPLETED"  # what GetTask reports
        # What GetTask's task holds besides: its artifacts and metadata, written as JSON by json.dumps (``plain``
        # mode accepts a task and answers with them: a peer whose JSON says 8, not 8.0).
        self.task_artifacts: list[dict[str, Any]] = [{"artifactId": "a1", "parts": [{"text": "the result that was lost"}]}]
        self.task_metadata: dict[str, Any] | None = None
        self.hold = Hold()  # where an oversized or endless body stops, until close
        self.lock = threading.Lock()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                             **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _answer(self, request: dict[str, Any], result: dict[str, Any]) -> None:
                if peer.binding == JSONRPC:
                    result = {"jsonrpc": "2.0", "id": request["id"], "result": result}
                self._send(200, json.dumps(result).encode())

            def _error(self, request: dict[str, Any], code: int, reason: str, message: str, http_status: int) -> None:
                if peer.binding == JSONRPC:
                    self._send(200, json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": {
                        "code": code, "message": message}}).encode())
                    return
                self._send(http_status, json.dumps({"error": {"code": http_status, "message": message, "details": [
                    {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                     "domain": "a2a-protocol.org"}]}}).encode())

            def do_GET(self) -> None:  # noqa: N802
                with peer.lock:
                    peer.hits[f"GET {self.path}"] += 1
                if self.path.endswith("/.well-known/agent-card.json"):
                    card = card_dict(peer.url, bindings=(peer.binding,))
                    if peer.mode == "redirect_card":
                        self._send(302, b"", {"Location": "http://127.0.0.1:9/elsewhere.json"})
                    elif peer.mode == "tab_card":  # same origin, but a tab httpx refuses (issue 15)
                        self._send(200, json.dumps(card_dict(peer.url, interface_url=f"{peer.url}/json\trpc",
                                                             bindings=(peer.binding,))).encode())
                    elif peer.mode == "moved_card":
                        self._send(200, json.dumps(card_dict(peer.url, interface_url="http://127.0.0.2:8443/rpc",
                                                             bindings=(peer.binding,))).encode())
                    else:
                        self._send(200, json.dumps(card).encode())
                elif peer.binding == HTTP_JSON and self.path.startswith("/rest/tasks/"):
                    with peer.lock:
                        peer.hits["GetTask"] += 1
                    task_id = self.path.removeprefix("/rest/tasks/").split("?")[0]
                    self._get_task({"id": None, "params": {"id": task_id}})
                else:
                    self._send(404, b"{}")

            def _read_request(self) -> dict[str, Any]:
                """The request as JSON-RPC would carry it (``id``, ``method``, ``params``), on either binding."""
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if peer.binding == JSONRPC:
                    return body
                return {"id": None, "method": rest_method("POST", self.path), "params": body}

            def do_POST(self) -> None:  # noqa: N802
                request = self._read_request()
                method = request.get("method", "?")
                with peer.lock:
                    peer.hits[f"POST {self.path}"] += 1
                    peer.hits[method] += 1
                if method == "GetTask":
                    self._get_task(request)
                    return
                mode = peer.mode
                if method == "SendMessage":
                    with peer.lock:
                        peer.accepted_message_ids.append(request["params"]["message"]["messageId"])
                if mode == "redirect_rpc":
                    self._send(307, b"", {"Location": "http://127.0.0.1:9/jsonrpc"})
                elif mode == "gzip":
                    answer = peer._task_result()
                    if peer.binding == JSONRPC:
                        answer = {"jsonrpc": "2.0", "id": request["id"], "result": answer}
                    self._send(200, gzip.compress(json.dumps(answer).encode()), {"Content-Encoding": "gzip"})
                elif mode in ("oversized", "endless"):
                    # Both bodies never end: after HELD_BODY_BYTES the peer holds the connection open,
                    # so a client that read to the end would wait for its request timeout instead.
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    if mode == "oversized":
                        self.send_header("Content-Length", str(3_000_000))
                    else:  # no Content-Length: the body ends only when the connection does
                        self.send_header("Connection", "close")
                    self.end_headers()
                    try:
                        self.wfile.write(b'{"jsonrpc": "2.0", "result": "')
                        for _ in range(HELD_BODY_BYTES // 4096):
                            self.wfile.write(b"y" * 4096)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the client stopped reading: the point of the test
                    peer.hold()
                    self.close_connection = True
                elif mode == "ask_then_drop_reply" and "taskId" not in request["params"]["message"]:
                    result = peer._task_result()
                    result["task"]["status"] = {"state": "TASK_STATE_INPUT_REQUIRED", "message": {
                        "messageId": "q1", "role": "ROLE_AGENT", "parts": [{"text": "Which branch?"}]}}
                    self._answer(request, result)
                elif mode in ("drop_after_accept", "ask_then_drop_reply"):
                    # The task is accepted, then the connection drops before any answer.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif mode == "error_rpc":
                    self._error(request, -32602, "INVALID_PARAMS", "credit_ceiling below the tariff", 400)
                else:
                    self._answer(request, peer._task_result())

            def _get_task(self, request: dict[str, Any]) -> None:
                asked = request["params"]["id"]
                if asked != peer.task_id:
                    self._error(request, -32001, "TASK_NOT_FOUND", "task not found", 404)
                    return
                history = [{"messageId": mid, "role": "ROLE_USER", "parts": [{"text": "..."}]}
                           for mid in ([] if peer.mode == "wrong_task" else peer.accepted_message_ids)]
                history.append({"messageId": "someone-else", "role": "ROLE_USER", "parts": [{"text": "other"}]})
                task = {"id": peer.task_id, "contextId": "ctx-1", "status": {"state": peer.task_state},
                        "artifacts": peer.task_artifacts, "history": history}
                if peer.task_metadata is not None:
                    task["metadata"] = peer.task_metadata
                self._answer(request, task)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def _task_result(self) -> dict[str, Any]:
        """A SendMessage result: the accepted task, working."""
        return {"task": {"id": self.task_id, "contextId": "ctx-1", "status": {"state": "TASK_STATE_WORKING"}}}

    def close(self) -> None:
        self.hold.release()
        self.server.shutdown()
        self.server.server_close()


# ---------- fixtures (import them into a test module to use them) ----------


def a2a_settings(data_dir: Any, **overrides: Any) -> Any:
    from rlmfamily.settings import load_settings

    options: dict[str, Any] = dict(data_dir=data_dir, a2a_enabled=True, a2a_poll_interval_s=0.05,
                                   a2a_request_timeout_s=5.0, a2a_connect_timeout_s=2.0)
    options.update(overrides)
    return load_settings(**options)


def peers_of(*configs: dict[str, Any]) -> Any:
    from rlmfamily.a2a.peers import PeerConfig, Peers

    return Peers(None, tuple(PeerConfig(**c) for c in configs))
