"""A real webhook on 127.0.0.1 for push notification tests: records every request, answers by path.

Paths: ``/ok/...`` answers 200; ``/fail/...`` 500; ``/redirect/...`` 302 to another host; ``/hang/...`` holds
the request open until ``release()`` (or the client gives up). Tests wait on what arrived (``wait_for``),
never on time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def event(self) -> dict:
        return json.loads(self.body)

    @property
    def event_id(self) -> str:
        return self.headers["x-a2a-notification-event-id"]


class Webhook:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.changed = threading.Condition()
        self.released = threading.Event()
        self.hanging = 0  # requests held open right now
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with webhook.changed:
                    webhook.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    webhook.changed.notify_all()
                if self.path.startswith("/hang/"):
                    with webhook.changed:
                        webhook.hanging += 1
                        webhook.changed.notify_all()
                    webhook.released.wait(60)
                    with webhook.changed:
                        webhook.hanging -= 1
                        webhook.changed.notify_all()
                status = 500 if self.path.startswith("/fail/") else 302 if self.path.startswith("/redirect/") else 200
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("Content-Length", "2")
                self.end_headers()
                try:
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the client gave up on a held request

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def release(self) -> None:
        self.released.set()

    def wait_for(self, condition: Callable[[list[Received]], bool], timeout_s: float = 60) -> list[Received]:
        """Until ``condition(received)`` holds (a bound only "never" breaks); the requests so far."""
        with self.changed:
            if not self.changed.wait_for(lambda: condition(self.received), timeout=timeout_s):
                raise AssertionError(f"the webhook never saw what was expected; it saw {self.paths()}")
            return list(self.received)

    def paths(self) -> list[str]:
        return [r.path for r in self.received]

    def at(self, prefix: str) -> list[Received]:
        with self.changed:
            return [r for r in self.received if r.path.startswith(prefix)]


@contextmanager
def running_webhook() -> Iterator[Webhook]:
    webhook = Webhook()
    thread = threading.Thread(target=webhook.server.serve_forever, name="webhook", daemon=True)
    thread.start()
    try:
        yield webhook
    finally:
        webhook.release()
        webhook.server.shutdown()
        webhook.server.server_close()
