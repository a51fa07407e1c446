"""The embedded dispatcher learns what its workers serve from their /readyz (issue 41), over real HTTP on 127.0.0.1.

A worker stand-in answers /readyz as workers/server.py does (ready or not, with the specialists it serves); the
dispatcher's ``ServedSpecialists`` is what its takes filter by (``taskstate.outbox.FairOrder.served``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from workers.dispatch.served import ServedSpecialists, readyz_url


class _Worker:
    """Answers GET /readyz with ``specialists``, counting the questions."""

    def __init__(self) -> None:
        self.specialists: list[str] = ["reviewer"]
        self.asked = 0
        worker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                worker.asked += 1
                body = json.dumps({"status": "not_ready", "specialists": worker.specialists,
                                   "problems": ["analyst: no key"]}).encode()
                self.send_response(200 if self.path == "/readyz" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jobs"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def worker() -> Iterator[_Worker]:
    running = _Worker()
    yield running
    running.server.shutdown()
    running.server.server_close()


def _closed_port_url() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return f"http://127.0.0.1:{port}/jobs"


def test_the_readyz_url_sits_beside_the_job_endpoint() -> None:
    assert readyz_url("http://10.0.0.7:8081/jobs") == "http://10.0.0.7:8081/readyz"
    assert readyz_url("https://worker.run.app/jobs?x=1") == "https://worker.run.app/readyz"


def test_a_dispatcher_takes_what_its_workers_serve_and_asks_again_after_a_refusal(worker: _Worker) -> None:
    with httpx.Client() as client:
        served = ServedSpecialists([worker.url, _closed_port_url()], client, refresh_s=3600)
        assert served.current() == ("reviewer",)  # a worker not ready still names what it serves
        assert served.serves(worker.url, "reviewer") and not served.serves(worker.url, "analyst")
        assert served.current() == ("reviewer",) and worker.asked == 1  # not asked again before refresh_s
        worker.specialists = ["analyst", "reviewer"]
        served.stale()  # a worker answered specialist_not_served
        assert served.current() == ("analyst", "reviewer") and worker.asked == 2


def test_while_no_worker_has_answered_every_job_may_be_taken() -> None:
    # A dispatcher started before its workers must still deliver, find them unreachable and say so.
    url = _closed_port_url()
    with httpx.Client() as client:
        served = ServedSpecialists([url], client, refresh_s=3600)
        assert served.current() is None and served.serves(url, "anything")
