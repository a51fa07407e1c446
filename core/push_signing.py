"""The keys that sign push notifications (ES256 JWTs) and their published form (a JWKS).

Each secret of ``SPECIALISTS_PUSH_SIGNING_SECRETS`` (newest first) is stretched into one P-256 private key
(HKDF-SHA256, fixed info), so the keys rotate exactly as the other secrets do: an operator puts a new secret
in front, and drops the oldest once every JWT it signed has expired. The newest key signs; every key is in the
JWKS (``kid``: its RFC 7638 thumbprint), so a receiver verifies with the key the header names. The edge
publishes the JWKS (``/.well-known/jwks.json``); the dispatcher signs. JWS by hand: ES256 is ECDSA over
SHA-256 with the signature as ``r || s`` (RFC 7518 3.4), which ``cryptography`` gives in DER.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

_CURVE_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_INFO = b"specialists push notification signing key v1"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class SigningKey:
    kid: str
    private: ec.EllipticCurvePrivateKey

    @property
    def jwk(self) -> dict[str, str]:
        numbers = self.private.public_key().public_numbers()
        return {"kty": "EC", "crv": "P-256", "x": b64url(numbers.x.to_bytes(32, "big")),
                "y": b64url(numbers.y.to_bytes(32, "big")), "use": "sig", "alg": "ES256", "kid": self.kid}


def derive_key(secret: str) -> SigningKey:
    material = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=_INFO).derive(secret.encode())
    private = ec.derive_private_key(int.from_bytes(material, "big") % (_CURVE_ORDER - 1) + 1, ec.SECP256R1())
    numbers = private.public_key().public_numbers()
    canonical = json.dumps({"crv": "P-256", "kty": "EC", "x": b64url(numbers.x.to_bytes(32, "big")),
                            "y": b64url(numbers.y.to_bytes(32, "big"))}, separators=(",", ":"), sort_keys=True)
    return SigningKey(kid=b64url(hashlib.sha256(canonical.encode()).digest()), private=private)


class PushSigner:
    """Signs notification JWTs with the newest key; publishes all of them."""

    def __init__(self, secrets: Sequence[SecretStr], *, issuer: str, lifetime_s: int) -> None:
        if not secrets:
            raise ValueError("push signing needs at least one secret (SPECIALISTS_PUSH_SIGNING_SECRETS)")
        self.keys = [derive_key(secret.get_secret_value()) for secret in secrets]
        self.issuer = issuer
        self.lifetime_s = lifetime_s

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.jwk for key in self.keys]}

    def sign(self, *, audience: str, task_id: str, event_id: str, body: bytes, now_s: float | None = None) -> str:
        """A JWT binding this notification: who sent it (``iss``), to which webhook (``aud``), about which task
        and event, over which body (``body_sha256``), valid ``lifetime_s``; ``jti`` is unique per attempt."""
        issued = int(now_s if now_s is not None else time.time())
        claims = {"iss": self.issuer, "aud": audience, "iat": issued, "exp": issued + self.lifetime_s,
                  "jti": str(uuid.uuid4()), "task_id": task_id, "event_id": event_id,
                  "body_sha256": hashlib.sha256(body).hexdigest()}
        key = self.keys[0]
        header = {"alg": "ES256", "typ": "JWT", "kid": key.kid}
        signing_input = (b64url(json.dumps(header, separators=(",", ":")).encode()) + "."
                         + b64url(json.dumps(claims, separators=(",", ":")).encode()))
        r, s = decode_dss_signature(key.private.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return signing_input + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


def verify(token: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """The claims of a JWT signed by one of ``jwks``' keys (signature and expiry checked), or ValueError.
    What a receiver does; the service's tests use it against the JWKS the edge publishes."""
    try:
        header_b64, claims_b64, signature_b64 = token.split(".")
        header = json.loads(b64url_decode(header_b64))
        claims = json.loads(b64url_decode(claims_b64))
    except ValueError as exc:
        raise ValueError(f"not a JWT: {exc}") from None
    if header.get("alg") != "ES256":
        raise ValueError("unexpected alg")
    matching = [key for key in jwks.get("keys", []) if key.get("kid") == header.get("kid")]
    if not matching:
        raise ValueError("no published key has this kid")
    jwk = matching[0]
    public = ec.EllipticCurvePublicNumbers(int.from_bytes(b64url_decode(jwk["x"]), "big"),
                                           int.from_bytes(b64url_decode(jwk["y"]), "big"),
                                           ec.SECP256R1()).public_key()
    raw = b64url_decode(signature_b64)
    signature = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    public.verify(signature, f"{header_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))  # raises InvalidSignature
    if claims.get("exp", 0) < time.time():
        raise ValueError("expired")
    return claims
