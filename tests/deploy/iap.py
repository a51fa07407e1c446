"""A stand-in for Identity-Aware Proxy's side of a request, in its real wire format (IAP cannot run here).

IAP signs, for every request it lets through, a JWT in the ``x-goog-iap-jwt-assertion`` header: ES256, a key id
in its header, ``iss`` https://cloud.google.com/iap, ``aud`` the protected resource's audience, and the account's
``email`` and ``sub``. It publishes its public keys at https://www.gstatic.com/iap/verify/public_key as a JSON
object of key id to PEM public key. Here: a P-256 key of our own, its public key served in that form on
127.0.0.1 (the console's SPECIALISTS_CONSOLE_IAP_CERTS_URL), and assertions signed with it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.auth import jwt
from google.auth.crypt import es256

IAP_HEADER = "x-goog-iap-jwt-assertion"
IAP_ISSUER = "https://cloud.google.com/iap"
ASSERTION_LIFETIME_S = 600  # IAP's own assertions last 10 minutes


def _new_key() -> tuple[bytes, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private_pem, public_pem


@dataclass
class FakeIap:
    """Signing keys by id (the newest signs unless told), their public keys served as IAP serves its own, and how
    many times they were fetched."""

    private: dict[str, bytes]  # key id -> PEM private key
    public: dict[str, str]  # key id -> PEM public key: what the certs URL serves
    server: ThreadingHTTPServer | None = None
    fetches: int = 0

    @property
    def key_id(self) -> str:
        return next(reversed(self.private))

    @property
    def certs_url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/iap/verify/public_key"

    def rotate(self, key_id: str) -> None:
        """A new key that signs from now on, published beside the old ones (as IAP rotates)."""
        self.private[key_id], self.public[key_id] = _new_key()

    def assertion(self, email: str, audience: str, *, issuer: str = IAP_ISSUER,
                  lifetime_s: int = ASSERTION_LIFETIME_S, key_id: str | None = None) -> str:
        """The header IAP would send for ``email`` reaching the resource of ``audience``."""
        now = int(time.time())
        kid = key_id or self.key_id
        signer = es256.ES256Signer.from_string(self.private[kid], kid)
        payload = {"iss": issuer, "aud": audience, "email": email, "sub": "accounts.google.com:" + str(int(hashlib.sha256(email.encode()).hexdigest()[:15], 16)),
                   "iat": now - 5, "exp": now + lifetime_s}
        return jwt.encode(signer, payload).decode()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def unpublished_iap() -> FakeIap:
    """Keys nobody serves: what an attacker who signs his own assertions has."""
    iap = FakeIap({}, {})
    iap.rotate("unpublished-key")
    return iap


def start_fake_iap() -> FakeIap:
    iap = FakeIap({}, {})
    iap.rotate("fake-iap-key-1")

    class Keys(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/iap/verify/public_key":
                self.send_error(404)
                return
            iap.fetches += 1
            body = json.dumps(iap.public).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    iap.server = ThreadingHTTPServer(("127.0.0.1", 0), Keys)
    threading.Thread(target=iap.server.serve_forever, name="fake-iap-keys", daemon=True).start()
    return iap
