"""A PostgreSQL wire proxy that counts round trips: what a test uses to hold the service to a statement budget.

Point a process's ``DATABASE_URL`` at ``RoundTripCounter.url`` and every byte it
exchanges with PostgreSQL passes through here, unchanged. The proxy reads the
protocol as it passes and counts, per connection, each ``ReadyForQuery`` the
server sends: exactly one ends every round trip, whatever it carried (a simple
query, an extended-protocol Sync, a BEGIN, a COMMIT, a pool's ping). The one
that ends the start-up handshake is counted as the connection, not as a round
trip. Connections are told apart by the ``application_name`` of their start-up
packet, so a count can leave out a listener or take only one role.

The proxy answers SSLRequest and GSSENCRequest with "no" itself, so what it
relays is always plain protocol; it counts, it never times.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


@dataclass
class Connection:
    application_name: str = ""
    ready: int = 0  # ReadyForQuery messages, the start-up one included
    asked: int = 0  # round trips the client began (a simple query, or a Sync)
    statements: list[str] = field(default_factory=list)  # what ran: each simple query, each Bind's statement
    prepared: dict[bytes, str] = field(default_factory=dict)  # Parse messages' texts by statement name

    @property
    def round_trips(self) -> int:
        return max(0, self.ready - 1)


class RoundTripCounter:
    """A counting proxy on 127.0.0.1 in front of the PostgreSQL of ``upstream_url``; start with ``with``."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        self.url = urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))
        self._lock = threading.RLock()  # held while a chunk is read: a Bind and its Sync are seen together
        self.connections: list[Connection] = []
        self.log: list[tuple[str, str]] = []  # (application_name, what ran), in the order the proxy saw it
        self._stopped = False

    def __enter__(self) -> RoundTripCounter:
        threading.Thread(target=self._accept, name="pgwire-accept", daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped = True
        self._listener.close()

    def round_trips(self, application_name: str | None = None) -> int:
        """Round trips so far on every connection (or those of one application_name)."""
        with self._lock:
            return sum(c.round_trips for c in self.connections
                       if application_name is None or c.application_name == application_name)

    def by_application(self) -> Counter[str]:
        with self._lock:
            counts: Counter[str] = Counter()
            for c in self.connections:
                counts[c.application_name] += c.round_trips
            return counts

    def settled(self) -> bool:
        """Whether every round trip begun so far has ended (the server answered each one)."""
        with self._lock:
            return all(c.asked <= c.round_trips for c in self.connections)

    def statements(self, application_name: str | None = None) -> list[str]:
        """What ran, in order: each simple query's text and each bound statement's."""
        with self._lock:
            return [what for name, what in self.log if application_name is None or name == application_name]

    # --- relaying -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="pgwire-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        record = Connection()
        try:
            startup = self._startup_packet(client)
            if startup is None:
                client.close()
                return
            record.application_name = _application_name(startup)
            server = socket.create_connection(self._upstream)
        except OSError:
            client.close()
            return
        with self._lock:
            self.connections.append(record)
        server.sendall(startup)
        threading.Thread(target=self._relay_client, args=(client, server, record), daemon=True).start()
        self._relay_server(server, client, record)

    @staticmethod
    def _startup_packet(client: socket.socket) -> bytes | None:
        """The client's StartupMessage, after refusing any SSL or GSS encryption request."""
        while True:
            head = _read_exactly(client, 8)
            if head is None:
                return None
            length, code = struct.unpack("!ii", head)
            if code in (_SSL_REQUEST, _GSSENC_REQUEST) and length == 8:
                client.sendall(b"N")
                continue
            rest = _read_exactly(client, length - 8)
            return None if rest is None else head + rest

    def _relay_server(self, server: socket.socket, client: socket.socket, record: Connection) -> None:
        buffer = b""
        try:
            while chunk := server.recv(65536):
                buffer += chunk
                while len(buffer) >= 5:  # counted before the client sees the answer
                    kind, length = buffer[:1], struct.unpack("!i", buffer[1:5])[0]
                    if len(buffer) < 1 + length:
                        break
                    if kind == b"Z":
                        with self._lock:
                            record.ready += 1
                    buffer = buffer[1 + length:]
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (server, client):
                _close(end)

    def _relay_client(self, client: socket.socket, server: socket.socket, record: Connection) -> None:
        buffer = b""
        try:
            while chunk := client.recv(65536):
                buffer += chunk
                with self._lock:
                    buffer = self._read_client(buffer, record)
                server.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (server, client):
                _close(end)

    def _read_client(self, buffer: bytes, record: Connection) -> bytes:
        """Note the whole messages at the head of ``buffer``; return the incomplete rest."""
        while len(buffer) >= 5:
            kind, length = buffer[:1], struct.unpack("!i", buffer[1:5])[0]
            if len(buffer) < 1 + length:
                break
            body = buffer[5:1 + length]
            if kind in (b"Q", b"S"):
                record.asked += 1
            if kind == b"Q":
                self._note(record, body[:-1].decode("utf-8", "replace"))
            elif kind == b"P":  # Parse: statement name, then the query text
                name_end = body.index(b"\x00")
                query = body[name_end + 1:body.index(b"\x00", name_end + 1)]
                record.prepared[body[:name_end]] = query.decode("utf-8", "replace")
                if name_end:  # a named statement: prepared once, then only bound
                    self._note(record, f"PREPARE {body[:name_end].decode()}", ran=False)
            elif kind == b"B":  # Bind: portal name, then the statement's name
                portal_end = body.index(b"\x00")
                name = body[portal_end + 1:body.index(b"\x00", portal_end + 1)]
                self._note(record, record.prepared.get(name, "?"))
            buffer = buffer[1 + length:]
        return buffer

    def _note(self, record: Connection, query: str, *, ran: bool = True) -> None:
        text = " ".join(query.split())[:300]
        with self._lock:
            if ran:
                record.statements.append(text)
            self.log.append((record.application_name, text))


def _application_name(startup: bytes) -> str:
    fields = startup[8:].split(b"\x00")
    for key, value in zip(fields[::2], fields[1::2]):
        if key == b"application_name":
            return value.decode("utf-8", "replace")
    return ""


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
