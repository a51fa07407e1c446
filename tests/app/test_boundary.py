"""The edge's outermost boundary, over real HTTP: a database outage in the guard is a 503 the client can retry.

Before, the guard's key lookup and rate-limit counters (PostgreSQL, before the SDK) failed into Starlette's
plain-text ``500 Internal Server Error``. The edge here reaches PostgreSQL through a TCP relay the test
cuts, so the database is really unreachable for that process and for nothing else.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import pytest

from tests.app.conftest import PAID, EdgeProcess, message, rpc, start_edge, stop_edge
from tests.pg_wire import pump

pytestmark = pytest.mark.timeout(120, func_only=True)


class Relay:
    """127.0.0.1:<port> -> the database, until ``cut()``: then every connection, open or new, is closed.

    ``target`` is a TCP address, or the path of PostgreSQL's Unix socket (the embedded server listens there)."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            if isinstance(self.target, str):
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(self.target)
            else:
                upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        pump(source, sink)

    def cut(self) -> None:
        self.open = False
        with self.lock:
            for end in self.sockets:
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()
            self.sockets.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def relayed_edge(database_url: str, edge_specs_dir: Path, edge_logs: Path) -> Iterator[tuple[EdgeProcess, Relay]]:
    parts = urlsplit(database_url)
    query = parse_qs(parts.query)
    socket_dir = query.pop("host", [None])[0]  # libpq's host parameter wins over the URL's host
    if socket_dir is not None and socket_dir.startswith("/"):
        relay = Relay(f"{socket_dir}/.s.PGSQL.{parts.port or 5432}")
    else:
        relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    netloc = parts.netloc.rsplit("@", 1)
    via_relay = urlunsplit(parts._replace(netloc=f"{netloc[0]}@127.0.0.1:{relay.port}" if len(netloc) == 2
                                          else f"127.0.0.1:{relay.port}", query=urlencode(query, doseq=True)))
    edge = start_edge(via_relay, edge_specs_dir, edge_logs, "relayed", db_connect_timeout_s="2")
    yield edge, relay
    stop_edge(edge)
    relay.close()


def test_a_database_outage_answers_503_with_retry_after_in_the_catalogues_form(relayed_edge, make_customer):
    edge, relay = relayed_edge
    customer = make_customer(credits=50)
    assert httpx.get(f"{edge.specialist(PAID)}/tasks", headers=customer.headers, timeout=30).status_code == 200
    relay.cut()
    rest = httpx.post(f"{edge.specialist(PAID)}/message:send", json=message(returnImmediately=True),
                      headers=customer.headers, timeout=30)
    jsonrpc = httpx.post(f"{edge.specialist(PAID)}/jsonrpc", json=rpc("GetTask", {"id": "t-1"}),
                         headers=customer.headers, timeout=30)
    for answer in (rest, jsonrpc):
        assert answer.status_code == 503, answer.text[:300]
        assert int(answer.headers["retry-after"]) >= 1
        assert "database" in answer.text and "Traceback" not in answer.text and "psycopg" not in answer.text
    assert rest.json()["error"]["details"][0]["metadata"]["code"] == "database_unavailable"
    assert jsonrpc.json()["error"]["code"] == -50302
