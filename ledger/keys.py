"""Customer API keys: signed tokens that carry who the caller is, and their revocation.

A key reads ``sk_<environment>_<secret id>_<payload>.<signature>``. The payload (key id,
customer, tier, issue and expiry times, and the environment) is signed with itsdangerous
(HMAC-SHA256), so a ``sk_live_`` key rewritten to ``sk_test_`` does not verify wherever
the secrets are shared.

Keys issued before migration 0110 did not sign their environment (form
``env_unsigned``; ``env_signed`` since). Their payload has no ``env``, and a payload
cannot be changed without the secret, so a new key can never pass for an old one.
They keep working until they expire, vouched for by their record instead: it must
say ``env_unsigned`` and name the prefix's environment. `specialists keys list`
shows each key's form.
The key itself is shown once and never stored: the database keeps its id and
metadata, and revocation is a row update.

Several signing secrets may be configured, newest first: the newest signs, all
verify, so secrets rotate without invalidating keys. The short secret id in the
key says which secret signed it, so a key signed by a secret this service does
not hold is told apart from a key whose payload was altered. With no secret
configured every key is refused (fail closed).

Revocation reaches every instance within ``revocation_cache_s`` seconds: a
verifier caches a key's database status for at most that long.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from itsdangerous import BadSignature, Signer
from itsdangerous.encoding import base64_decode, base64_encode
from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from core.errors import ServiceError
from ledger.errors import CustomerNotFound
from ledger.limits import LedgerSettings, default_limits, env_name

KEY_PREFIX = "sk"
_SALT = "specialists.api-key.v1"
SECRET_ID_CHARS = 8  # hex characters of a secret's digest that name it in the key
_KEY_RE = re.compile(
    rf"^sk_(live|test)_([0-9a-f]{{{SECRET_ID_CHARS}}})_([A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+)$"
)
MAX_KEY_CHARS = 1024
MAX_LABEL_CHARS = 200  # the CHECK on api_keys.label (migration 0001)
MAX_OPERATOR_CHARS = 200  # the CHECK on api_keys.issued_by (migration 0230)
MAX_CACHED_KEYS = 100_000  # key statuses one verifier keeps; past it the cache starts again
# Keys whose signature an edge verifier checked and keeps (the key as sent, its identity); past it the cache starts
# again. Only keys that passed the check are kept, so only issued keys fill it.
MAX_CHECKED_KEYS = 10_000
CUSTOMER_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
TIER_RE = re.compile(r"^[a-z0-9_-]{1,32}$")


class KeyRefused(ServiceError):
    """A presented key is not accepted. ``code`` is one of the reasons below (the edge answers 401)."""

    code = "key_invalid"


# Stable reasons a presented key is refused.
NO_SECRET = "no_signing_secret_configured"
MALFORMED = "key_malformed"
WRONG_ENVIRONMENT = "key_wrong_environment"
WRONG_SECRET = "key_unknown_signing_secret"
TAMPERED = "key_tampered"
EXPIRED = "key_expired"
REVOKED = "key_revoked"
UNKNOWN = "key_unknown"

# What a key's signature covers (api_keys.key_form, migration 0110).
FORM_ENV_UNSIGNED = "env_unsigned"  # issued before 0110: the environment is only in the prefix
FORM_ENV_SIGNED = "env_signed"

_REASON_TEXT = {
    NO_SECRET: "this service has no key-signing secret configured, so it accepts no key; "
    "the operator must set SPECIALISTS_KEY_SIGNING_SECRETS",
    MALFORMED: "the key is not of the form sk_<live|test>_<secret id>_<payload>.<signature>; copy it again exactly as issued",
    WRONG_ENVIRONMENT: "the key was issued for another environment ({detail}); use a key issued for this one",
    WRONG_SECRET: "the key was signed with a secret this service does not hold (retired or from another "
    "deployment); ask the operator for a new key",
    TAMPERED: "the key's signature does not match its contents; it was altered or truncated",
    EXPIRED: "the key expired at {detail}; ask the operator for a new key",
    REVOKED: "the key was revoked at {detail}; ask the operator for a new key",
    UNKNOWN: "the key is validly signed but this service has no record of it; ask the operator for a new key",
}


def refuse(reason: str, detail: str = "") -> KeyRefused:
    return KeyRefused(_REASON_TEXT[reason].format(detail=detail), code=reason)


@dataclass(frozen=True)
class KeyIdentity:
    """Who a verified key speaks for."""

    key_id: str
    customer_id: str
    tier: str
    environment: str
    issued_at: datetime
    expires_at: datetime
    environment_signed: bool = True  # False: a key from before migration 0110, see the module's docstring

    @property
    def form(self) -> str:
        return FORM_ENV_SIGNED if self.environment_signed else FORM_ENV_UNSIGNED


@dataclass(frozen=True)
class IssuedKey:
    identity: KeyIdentity
    token: str  # shown once, never stored


def _secret_id(secret: str) -> str:
    return hashlib.sha256(("specialists-key-secret-id:" + secret).encode()).hexdigest()[:SECRET_ID_CHARS]


class KeySigner:
    """Signs and checks key tokens with the configured secrets (newest first)."""

    def __init__(self, secrets_newest_first: list[str], environment: str) -> None:
        self.environment = environment
        self._signers = {
            _secret_id(secret): Signer(secret, salt=_SALT, digest_method=hashlib.sha256, key_derivation="hmac")
            for secret in secrets_newest_first
        }
        self._newest = _secret_id(secrets_newest_first[0]) if secrets_newest_first else None

    def sign(self, identity: KeyIdentity) -> str:
        if self._newest is None:
            raise refuse(NO_SECRET)
        payload = {
            "kid": identity.key_id,
            "cus": identity.customer_id,
            "tier": identity.tier,
            "iat": int(identity.issued_at.timestamp()),
            "exp": int(identity.expires_at.timestamp()),
            "env": identity.environment,
        }
        body = base64_encode(json.dumps(payload, separators=(",", ":"), sort_keys=True))
        token = self._signers[self._newest].sign(body).decode()
        return f"{KEY_PREFIX}_{identity.environment}_{self._newest}_{token}"

    def check(self, key: str, *, now: datetime | None = None) -> KeyIdentity:
        """Verify signature, environment and expiry. Revocation needs the database: see KeyVerifier."""
        if not self._signers:
            raise refuse(NO_SECRET)
        if len(key) > MAX_KEY_CHARS:
            raise refuse(MALFORMED)
        match = _KEY_RE.match(key.strip())
        if not match:
            raise refuse(MALFORMED)
        environment, secret_id, token = match.groups()
        if environment != self.environment:
            raise refuse(WRONG_ENVIRONMENT, f"{environment}, this service is {self.environment}")
        signer = self._signers.get(secret_id)
        if signer is None:
            raise refuse(WRONG_SECRET)
        try:
            body = signer.unsign(token)
        except BadSignature:
            raise refuse(TAMPERED) from None
        try:
            payload = json.loads(base64_decode(body))
            signed_environment = payload.get("env")
            identity = KeyIdentity(
                key_id=str(payload["kid"]),
                customer_id=str(payload["cus"]),
                tier=str(payload["tier"]),
                environment=environment,
                issued_at=datetime.fromtimestamp(int(payload["iat"]), timezone.utc),
                expires_at=datetime.fromtimestamp(int(payload["exp"]), timezone.utc),
                environment_signed=signed_environment is not None,
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            raise refuse(MALFORMED) from None
        if signed_environment is not None and signed_environment != environment:
            raise refuse(TAMPERED)  # the prefix was rewritten: the signature says another environment
        return unexpired(identity, now)


def unexpired(identity: KeyIdentity, now: datetime | None = None) -> KeyIdentity:
    """The identity of a checked key, or its refusal once it expired."""
    if (now or datetime.now(timezone.utc)) >= identity.expires_at:
        raise refuse(EXPIRED, identity.expires_at.isoformat())
    return identity


class KeyNotFound(ServiceError):
    """No key by this id (``details["key_id"]``: what a "did you mean" starts from, ledger/near.py)."""

    code = "key_not_found"


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)


def _check_customer_id(customer_id: str) -> None:
    if not CUSTOMER_RE.match(customer_id):
        raise ServiceError(
            f"customer id {customer_id!r} is not valid: use 1-63 lowercase letters, digits, '_', '.', '-', "
            "starting with a letter or digit",
            code="customer_id_invalid",
        )


def ensure_customer(conn: Connection, customer_id: str) -> None:
    _check_customer_id(customer_id)
    conn.execute(
        text("INSERT INTO customers (customer_id) VALUES (:c) ON CONFLICT DO NOTHING"), {"c": customer_id}
    )


def issue_key(
    engine: Engine,
    signer: KeySigner,
    *,
    customer_id: str,
    tier: str = "standard",
    ttl: timedelta,
    label: str = "",
    now: datetime | None = None,
    require_customer: bool = False,
    operator: str | None = None,
) -> IssuedKey:
    """Create a key row and return the signed token. The token is not stored anywhere.

    A customer the service does not know is added, unless ``require_customer`` (the operator's command): then
    it is refused (``CustomerNotFound``) and nothing is written. ``operator`` is who issued it, kept as the
    key's ``issued_by`` (`keys list`)."""
    if operator is not None and not 0 < len(operator) <= MAX_OPERATOR_CHARS:
        raise ServiceError(f"an operator is 1-{MAX_OPERATOR_CHARS} characters naming who acts (--operator)",
                           code="operator_invalid")
    if not TIER_RE.match(tier):
        raise ServiceError(f"tier {tier!r} is not valid: use 1-32 of a-z, 0-9, '_', '-'", code="tier_invalid")
    if len(label) > MAX_LABEL_CHARS:
        raise ServiceError(f"a key label has at most {MAX_LABEL_CHARS} characters", code="label_too_long")
    issued_at = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    identity = KeyIdentity(
        key_id=new_key_id(),
        customer_id=customer_id,
        tier=tier,
        environment=signer.environment,
        issued_at=issued_at,
        expires_at=issued_at + ttl,
    )
    token = signer.sign(identity)  # refuses before anything is written when no secret is configured
    with engine.begin() as conn:
        if require_customer:
            _check_customer_id(customer_id)
            known = conn.execute(text("SELECT EXISTS (SELECT 1 FROM customers WHERE customer_id = :c)"),
                                 {"c": customer_id}).scalar_one()
            if not known:
                raise CustomerNotFound.of(customer_id)
        else:
            ensure_customer(conn, customer_id)
        conn.execute(
            text(
                "INSERT INTO api_keys (key_id, customer_id, environment, tier, label, issued_at, expires_at, "
                "key_form, issued_by) VALUES (:k, :c, :e, :t, :l, :i, :x, :f, :o)"
            ),
            {
                "k": identity.key_id,
                "c": customer_id,
                "e": identity.environment,
                "t": tier,
                "l": label,
                "i": identity.issued_at,
                "x": identity.expires_at,
                "f": identity.form,
                "o": operator,
            },
        )
    return IssuedKey(identity=identity, token=token)


def revoke_key(
    engine: Engine, key_id: str, *, reason: str, operator: str, limits: LedgerSettings | None = None
) -> bool:
    """Revoke a key. Returns False when it was already revoked; raises when there is no such key.

    The reason is refused over ``max_reason_chars`` (SPECIALISTS_LEDGER_MAX_REASON_CHARS), like every
    reason the ledger keeps.
    """
    reason = reason.strip()
    if not reason:
        raise ServiceError("a revocation needs a reason (--reason)", code="reason_required")
    max_chars = (limits or default_limits()).max_reason_chars
    if len(reason) > max_chars:
        raise ServiceError(
            f"the reason has {len(reason)} characters; at most {max_chars} are accepted "
            f"({env_name('max_reason_chars')})",
            code="reason_too_long",
        )
    with engine.begin() as conn:
        row = conn.execute(
            text(
                "UPDATE api_keys SET revoked_at = now(), revoked_reason = :r, revoked_by = :o "
                "WHERE key_id = :k AND revoked_at IS NULL RETURNING key_id"
            ),
            {"k": key_id, "r": reason, "o": operator},
        ).first()
        if row:
            return True
        exists = conn.execute(text("SELECT 1 FROM api_keys WHERE key_id = :k"), {"k": key_id}).first()
    if not exists:
        raise KeyNotFound(f"no key with id {key_id!r}; `specialists keys list` shows them", key_id=key_id)
    return False


def list_keys(engine: Engine, customer_id: str | None = None) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT key_id, customer_id, environment, key_form, tier, label, issued_at, issued_by, expires_at, "
                "revoked_at, revoked_reason, revoked_by FROM api_keys WHERE (CAST(:c AS text) IS NULL OR customer_id = :c) "
                "ORDER BY issued_at, key_id"
            ),
            {"c": customer_id},
        ).mappings()
        return [dict(row) for row in rows]


@dataclass
class _Status:
    revoked_at: datetime | None
    exists: bool
    checked_at: float
    environment: str | None = None
    form: str | None = None


_STATUS = text("SELECT revoked_at, environment, key_form FROM api_keys WHERE key_id = :k")


def _status_of(row: Any, checked_at: float) -> _Status:
    if row is None:
        return _Status(revoked_at=None, exists=False, checked_at=checked_at)
    return _Status(revoked_at=row.revoked_at, exists=True, checked_at=checked_at, environment=row.environment,
                   form=row.key_form)


def _accept(identity: KeyIdentity, status: _Status) -> KeyIdentity:
    """The database's word on a signed key: it exists, is not revoked, and vouches for an old key's prefix."""
    if not status.exists:
        raise refuse(UNKNOWN)
    if status.revoked_at is not None:
        raise refuse(REVOKED, status.revoked_at.isoformat())
    if not identity.environment_signed and (status.form != FORM_ENV_UNSIGNED
                                            or status.environment != identity.environment):
        raise refuse(TAMPERED)  # an old key's prefix rewritten, or a new key's record with an unsigned payload
    return identity


class KeyVerifier:
    """Full verification: signature, environment, expiry, then revocation from the database.

    A key's database status is cached for ``revocation_cache_s`` seconds per instance,
    which is the bound on how long a revoked key can still be accepted.
    """

    def __init__(self, signer: KeySigner, engine: Engine, revocation_cache_s: float) -> None:
        self.signer = signer
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")  # one read: no BEGIN, no ROLLBACK
        self.revocation_cache_s = revocation_cache_s
        self._cache: dict[str, _Status] = {}
        self._lock = threading.Lock()
        self._max_cache_entries = MAX_CACHED_KEYS

    def verify(self, key: str, *, now: datetime | None = None) -> KeyIdentity:
        identity = self.signer.check(key, now=now)
        return _accept(identity, self._status(identity.key_id))

    def _status(self, key_id: str) -> _Status:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(key_id)
        if cached and now - cached.checked_at < self.revocation_cache_s:
            return cached
        with self.engine.connect() as conn:
            row = conn.execute(_STATUS, {"k": key_id}).first()
        status = _status_of(row, now)
        with self._lock:
            if len(self._cache) >= self._max_cache_entries:
                self._cache.clear()
            self._cache[key_id] = status
        return status


class AsyncKeyVerifier:
    """KeyVerifier for an asyncio service: the same checks, the revocation lookup on an AsyncEngine.

    Signature, environment and expiry are checked in memory (no I/O); a key's
    database status is cached for ``revocation_cache_s`` seconds per instance,
    the same revocation bound as ``KeyVerifier``. A key whose signature and
    environment passed is kept with its identity (up to ``MAX_CHECKED_KEYS``), so
    that its next request is not unsigned again (the HMAC, the payload's base64 and
    JSON: about 23 us a request, issue 44): what they decide depends on the key's
    text and this process's secrets only, which do not change while it runs. Its
    expiry is checked at every request, and its status as above.
    """

    def __init__(self, signer: KeySigner, engine: AsyncEngine, revocation_cache_s: float) -> None:
        self.signer = signer
        # One read: autocommit, so no BEGIN before it and no ROLLBACK after (one round trip, not three).
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.revocation_cache_s = revocation_cache_s
        self._cache: dict[str, _Status] = {}
        self._max_cache_entries = MAX_CACHED_KEYS
        self._checked: dict[str, KeyIdentity] = {}  # a key as sent -> its identity, signature and environment checked

    async def verify(self, key: str, *, now: datetime | None = None) -> KeyIdentity:
        identity = self._checked.get(key)  # one event loop: no lock needed
        if identity is None:
            identity = self.signer.check(key, now=now)  # raises on any refusal: only a key that passed is kept
            if len(self._checked) >= MAX_CHECKED_KEYS:
                self._checked.clear()
            self._checked[key] = identity
        else:
            unexpired(identity, now)
        return _accept(identity, await self._status(identity.key_id))

    async def _status(self, key_id: str) -> _Status:
        now = time.monotonic()
        cached = self._cache.get(key_id)  # one event loop: no lock needed
        if cached and now - cached.checked_at < self.revocation_cache_s:
            return cached
        async with self.engine.connect() as conn:
            row = (await conn.execute(_STATUS, {"k": key_id})).first()
        status = _status_of(row, now)
        if len(self._cache) >= self._max_cache_entries:
            self._cache.clear()
        self._cache[key_id] = status
        return status
