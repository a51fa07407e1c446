"""A real webhook on 127.0.0.1 for push notification tests: records every request, answers by path.

Paths: ``/ok/...`` answers 200; ``/fail/...`` 500; ``/redirect/...`` 302 to another host; ``/hang/...`` holds
the request open until ``release()`` (or the client gives up). Tests wait on what arrived (``wait_for``),
never on time.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


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


@dataclass(frozen=True)
class PrivateCA:
    """A certificate authority of the test's own and a server certificate it signed for 127.0.0.1."""

    ca_pem: Path
    cert_pem: Path
    key_pem: Path


def private_ca(folder: Path) -> PrivateCA:
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specialists test private CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    found = PrivateCA(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    found.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    found.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    found.key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return found


class Webhook:
    def __init__(self, tls: PrivateCA | None = None) -> None:
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
        self.scheme = "http"
        if tls is not None:  # the handshake happens in the request's own thread, at its first read
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.cert_pem, tls.key_pem)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True, do_handshake_on_connect=False)
            self.scheme = "https"

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

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
def running_webhook(tls: PrivateCA | None = None) -> Iterator[Webhook]:
    webhook = Webhook(tls)
    thread = threading.Thread(target=webhook.server.serve_forever, name="webhook", daemon=True)
    thread.start()
    try:
        yield webhook
    finally:
        webhook.release()
        webhook.server.shutdown()
        webhook.server.server_close()
