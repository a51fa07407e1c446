"""A model endpoint on 127.0.0.1 that speaks the OpenAI chat-completions wire format, for tests.

A paid model cannot run here, so this stands in for one: it answers root turns
(requests that offer the ``python`` tool) with the next scripted tool call, and
sub-calls with a fixed text, and reports usage like a real endpoint. It keeps
every request (headers and body) so a test can check what left the worker.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeOpenAI:
    def __init__(self, root_codes: list[str], subcall_answer: str = "fine") -> None:
        self.root_codes = list(root_codes)
        self.subcall_answer = subcall_answer
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with fake._lock:
                    fake.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                answer = fake._answer(json.loads(body))
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.subcall_answer}
        if request.get("tools"):
            with self._lock:
                code = self.root_codes.pop(0) if self.root_codes else "final_answer('out of script')"
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"call_{len(self.requests)}", "type": "function",
                                "function": {"name": "python", "arguments": json.dumps({"code": code})}}],
            }
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": request.get("model", "fake-model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }
