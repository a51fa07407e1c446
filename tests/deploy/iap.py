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


@dataclass
class FakeIap:
    key_id: str
    private_pem: bytes
    server: ThreadingHTTPServer

    @property
    def certs_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/iap/verify/public_key"

    def assertion(self, email: str, audience: str, *, issuer: str = IAP_ISSUER) -> str:
        """The header IAP would send for ``email`` reaching the resource of ``audience``."""
        now = int(time.time())
        signer = es256.ES256Signer.from_string(self.private_pem, self.key_id)
        payload = {"iss": issuer, "aud": audience, "email": email, "sub": "accounts.google.com:" + str(int(hashlib.sha256(email.encode()).hexdigest()[:15], 16)),
                   "iat": now, "exp": now + ASSERTION_LIFETIME_S}
        return jwt.encode(signer, payload).decode()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_fake_iap() -> FakeIap:
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    key_id = "fake-iap-key-1"
    body = json.dumps({key_id: public_pem}).encode()

    class Keys(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/iap/verify/public_key":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keys)
    threading.Thread(target=server.serve_forever, name="fake-iap-keys", daemon=True).start()
    return FakeIap(key_id=key_id, private_pem=private_pem, server=server)
