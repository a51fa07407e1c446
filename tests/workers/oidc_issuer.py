"""A local stand-in for Google's token signer and certificates endpoint (the real wire formats).

Tokens are RS256 JWTs signed by a local key pair with the claims Cloud Tasks puts
in its OIDC tokens; the certificates are served as Google's v1 endpoint serves
them, ``{key id: PEM X.509 certificate}``, over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt


class LocalKey:
    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        self.private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, key_id)])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.private_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(self.private_key, hashes.SHA256())
        )
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self.signer = crypt.RSASigner.from_string(pem, key_id=key_id)

    def token(self, **claims: object) -> str:
        return jwt.encode(self.signer, claims, key_id=self.key_id).decode()


def cloud_tasks_claims(audience: str, account: str, *, lifetime_s: int = 3600, **overrides: object) -> dict:
    now = int(time.time())
    claims = {
        "iss": "https://accounts.google.com",
        "aud": audience,
        "azp": "1234567890",
        "sub": "1234567890",
        "email": account,
        "email_verified": True,
        "iat": now,
        "exp": now + lifetime_s,
    }
    claims.update(overrides)
    return claims


class CertsEndpoint:
    """Serves ``{kid: cert}`` for the given keys; counts fetches; can be switched to failing."""

    def __init__(self, keys: list[LocalKey]) -> None:
        self.keys = keys
        self.fetches = 0
        self.failing = False
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                endpoint.fetches += 1
                if endpoint.failing:
                    self.send_response(500)
                    self.end_headers()
                    return
                body = json.dumps({key.key_id: key.cert_pem for key in endpoint.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/oauth2/v1/certs"

    def __enter__(self) -> "CertsEndpoint":
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
