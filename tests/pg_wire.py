"""A TCP proxy in front of PostgreSQL that counts what its clients send: every statement, every round trip.

Point a process's ``DATABASE_URL`` at ``StatementCounter.url`` and every
connection it (and the processes it starts) opens goes through here. The client
side of the PostgreSQL wire protocol is read as it passes, never changed:

* a simple ``Query`` (``Q``) is one statement and one round trip: psycopg sends
  ``BEGIN``, ``COMMIT`` and ``ROLLBACK`` this way, and statements without
  parameters (SQLAlchemy's pre-ping, a dialect's start-up questions);
* an extended-protocol ``Execute`` (``E``) is one statement, its text taken from
  the ``Parse`` (``P``) of the statement it binds (named or unnamed), and a
  ``Sync`` (``S``) closes one round trip.

What a statement is comes from its first word (``BEGIN``, ``SELECT``, ...), so a
test can say which kind grew. No timing: counts only. The connection must not
be encrypted (the proxy reads plaintext): ``sslmode=disable`` and
``gssencmode=disable`` are put in ``url``.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_MAX_CONNECTIONS = 200  # a test's processes open a few dozen; more means a leak worth seeing


def _first_word(sql: str) -> str:
    words = sql.strip().split(None, 1)
    return words[0].upper().rstrip(";") if words else ""


class _ClientStream:
    """The client's half of one connection, parsed message by message as bytes arrive."""

    def __init__(self, counter: "StatementCounter") -> None:
        self.counter = counter
        self.buffer = b""
        self.started = False  # past the untyped start-up messages
        self.statements: dict[bytes, str] = {}  # prepared statement name -> its text
        self.bound = b""  # the statement the last Bind named

    def feed(self, data: bytes) -> None:
        with self.counter.lock:  # a chunk's messages counted at once: a statement and its Sync are seen together
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if not self.started:
                if len(self.buffer) < 8:
                    return
                length, code = struct.unpack("!ii", self.buffer[:8])
                if len(self.buffer) < length:
                    return
                self.buffer = self.buffer[length:]
                if code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                    self.started = code != _CANCEL_REQUEST
                    self.counter.note_connection()
                continue
            if len(self.buffer) < 5:
                return
            kind = self.buffer[:1]
            (length,) = struct.unpack("!i", self.buffer[1:5])
            if len(self.buffer) < 1 + length:
                return
            body, self.buffer = self.buffer[5 : 1 + length], self.buffer[1 + length :]
            self._message(kind, body)

    def _message(self, kind: bytes, body: bytes) -> None:
        if kind == b"Q":
            self.counter.note_statement(body.rstrip(b"\0").decode(errors="replace"), round_trip=True)
        elif kind == b"P":
            name, rest = body.split(b"\0", 1)
            self.statements[name] = rest.split(b"\0", 1)[0].decode(errors="replace")
            if name:  # a named statement: psycopg prepares one at its fifth use on a connection, once
                self.counter.note_prepare()
        elif kind == b"B":
            _portal, rest = body.split(b"\0", 1)
            self.bound = rest.split(b"\0", 1)[0]
        elif kind == b"E":
            self.counter.note_statement(self.statements.get(self.bound, "?"), round_trip=False)
        elif kind == b"S":
            self.counter.note_round_trip()


def pump(source: socket.socket, sink: socket.socket, on_data: Callable[[bytes], None] | None = None) -> None:
    """Copy one direction of a proxied TCP connection until either end closes, then shut both down (a relay's
    half of a connection; ``on_data`` sees each chunk first)."""
    try:
        while data := source.recv(65536):
            if on_data is not None:
                on_data(data)
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class StatementCounter:
    """The proxy: ``url`` to hand to processes, ``statements``/``round_trips``/``connections`` to read."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        # The server's address: a host and port, or (libpq's ``host=/dir`` in the query, as the embedded
        # PostgreSQL is reached) the Unix socket in that folder.
        query = [(key, value) for key, value in parse_qsl(parts.query) if key != "host"]
        socket_dir = dict(parse_qsl(parts.query)).get("host", "")
        port = parts.port or 5432
        self.upstream: tuple[str, int] | str = (
            f"{socket_dir}/.s.PGSQL.{port}" if socket_dir.startswith("/") else (parts.hostname or "127.0.0.1", port)
        )
        self.lock = threading.RLock()
        self.statements = 0
        self.prepares = 0
        self.round_trips = 0
        self.connections = 0
        self.kinds: Counter[str] = Counter()
        self.texts: Counter[str] = Counter()
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        query = urlencode([*query, ("sslmode", "disable"), ("gssencmode", "disable")])
        self.url = urlunsplit((parts.scheme, f"{netloc[0]}@{host}" if len(netloc) == 2 else host, parts.path, query, ""))
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="pg-counter-accept", daemon=True).start()

    # --- what the streams report -----------------------------------------------------------

    def note_connection(self) -> None:
        with self.lock:
            self.connections += 1

    def note_statement(self, sql: str, *, round_trip: bool) -> None:
        with self.lock:
            self.statements += 1
            self.round_trips += round_trip
            self.kinds[_first_word(sql)] += 1
            self.texts[" ".join(sql.split())[:120]] += 1

    def note_prepare(self) -> None:
        with self.lock:
            self.prepares += 1

    def note_round_trip(self) -> None:
        with self.lock:
            self.round_trips += 1

    def snapshot(self) -> tuple[int, int, Counter[str], Counter[str]]:
        """(statements, round trips, statements by first word, statements by text) so far."""
        with self.lock:
            return self.statements, self.round_trips, Counter(self.kinds), Counter(self.texts)

    # --- the proxy ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if len(self._sockets) >= 2 * _MAX_CONNECTIONS:
                client.close()
                continue
            server = self._connect_upstream()
            self._sockets += [client, server]
            stream = _ClientStream(self)
            threading.Thread(target=self._pump, args=(client, server, stream), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None), daemon=True).start()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.upstream)
            return server
        return socket.create_connection(self.upstream)

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket, stream: _ClientStream | None) -> None:
        pump(source, target, None if stream is None else stream.feed)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()
