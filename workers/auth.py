"""Worker authentication: the signed job body, and the Cloud Tasks OIDC token.

Two independent checks, so that a worker reachable by mistake still refuses
forged work:

* **Signed body** (always). The dispatcher signs the job with a shared secret
  (itsdangerous, HMAC-SHA256, timestamped, with a salt used for nothing else).
  The body reads ``v1.<secret id>.<token>``; several secrets may be configured,
  newest first: the newest signs, all verify, so secrets rotate without losing
  jobs in flight. No secret configured: every job is refused (fail closed).
  The job id, specialist and deadline come from the verified body only, never
  from a header. The body is bound to this worker's audience and expires after
  ``worker_job_max_age_s``.
* **OIDC** (production). Cloud Tasks attaches a Google-signed ID token for the
  configured service account and audience; the worker checks its signature
  against the certificates at ``worker_oidc_certs_url`` (cached), its issuer,
  audience, account and expiry. ``worker_oidc_verify=false`` turns this off on
  one machine only (settings refuse it with real Cloud Tasks).

A valid body delivered again is not an attack on its own (Cloud Tasks delivers
at least once): the claim row makes it run at most once. See docs/WORKERS.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from itsdangerous import BadPayload, BadSignature, SignatureExpired, TimestampSigner, URLSafeTimedSerializer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import ServiceError
from core.settings import Settings

_SALT = "specialists.worker-job.v1"
BODY_VERSION = "v1"
MAX_PAYLOAD_KEYS = 64
SECRET_ID_CHARS = 8  # hex characters of a secret's digest that name it in a signed body
SHOWN_VERSION_CHARS = 16  # of an unknown body version, quoted in the refusal


class WorkerAuthRefused(ServiceError):
    """A delivery is not accepted. ``code`` says why; ``http_status`` is the worker's answer."""

    code = "worker_auth_refused"

    def __init__(self, message: str, *, code: str, http_status: int = 401) -> None:
        super().__init__(message, code=code)
        self.http_status = http_status


# Stable reasons a job body is refused.
NOT_CONFIGURED = "worker_auth_not_configured"
BODY_MALFORMED = "job_body_malformed"
BODY_UNKNOWN_SECRET = "job_body_unknown_secret"
BODY_TAMPERED = "job_body_tampered"
BODY_EXPIRED = "job_body_expired"
BODY_WRONG_AUDIENCE = "job_body_wrong_audience"
BODY_TOO_LARGE = "job_body_too_large"

# Stable reasons an OIDC token is refused.
OIDC_MISSING = "oidc_token_missing"
OIDC_MALFORMED = "oidc_token_malformed"
OIDC_BAD_SIGNATURE = "oidc_signature_invalid"
OIDC_EXPIRED = "oidc_token_expired"
OIDC_NOT_YET_VALID = "oidc_token_not_yet_valid"
OIDC_WRONG_ISSUER = "oidc_wrong_issuer"
OIDC_WRONG_AUDIENCE = "oidc_wrong_audience"
OIDC_WRONG_ACCOUNT = "oidc_wrong_service_account"
OIDC_CERTS_UNAVAILABLE = "oidc_certs_unavailable"

GOOGLE_ISSUERS = ("https://accounts.google.com", "accounts.google.com")


class JobBodyModel(BaseModel):
    """The signed claims of one job (the wire form; short keys keep the task small)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    job_id: str = Field(alias="job", pattern=r"^[A-Za-z0-9_.:-]{1,200}$")
    specialist_id: str = Field(alias="sp", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    audience: str = Field(alias="aud", min_length=1, max_length=500)
    deadline_s: float = Field(alias="dl", gt=0, le=3600)
    payload: dict[str, Any] = Field(alias="p", default_factory=dict, max_length=MAX_PAYLOAD_KEYS)


@dataclass(frozen=True)
class VerifiedJob:
    """A job whose body this worker verified: the only source of its identity."""

    job_id: str
    specialist_id: str
    deadline_s: float
    payload: dict[str, Any]
    signed_at: datetime
    secret_id: str
    # Not signed: the job's message as the worker's claim read it from its outbox row (``claims.claim``), handed
    # to the job's process with the job so that the run does not read it again. None: read it when needed.
    message: bytes | None = field(default=None, compare=False, repr=False)
    # Not signed either: the credits the job's task reserved at admission, as the claim read them
    # (``claims.ClaimResult.reserved_credits``); what ``RunContext.reserved_credits`` hands the runner.
    reserved_credits: int | None = field(default=None, compare=False)
    # Not signed either: the worker's run span as a W3C traceparent (core/telemetry.py), which the job's process
    # continues. None: telemetry is off.
    trace_parent: str | None = field(default=None, compare=False, repr=False)


def _secret_id(secret: str) -> str:
    return hashlib.sha256(("specialists-worker-secret-id:" + secret).encode()).hexdigest()[:SECRET_ID_CHARS]


class _KeyKeptSigner(TimestampSigner):
    """itsdangerous's timed signer, keeping the key it derives from each of its secrets (an HMAC of the secret and
    the salt), which it derived again at every signature and verification. Same keys, same tokens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._derived: dict[str | bytes | None, bytes] = {}  # one entry a secret this signer holds: bounded

    def derive_key(self, secret_key: str | bytes | None = None) -> bytes:
        derived = self._derived.get(secret_key)
        if derived is None:
            derived = self._derived[secret_key] = super().derive_key(secret_key)
        return derived


class JobSigner:
    """Signs job bodies (dispatch side) and verifies them (worker side) with the configured secrets.

    Each secret's serializer and signer are made once, here: ``URLSafeTimedSerializer.loads`` and ``dumps`` made a
    signer at every call, which derived its key again (issue 44: 19-22 against 14-16 us a verification measured
    alone, about 0.05 ms of a loaded worker's 4 a job). The signer's ``unsign`` and the serializer's
    ``load_payload`` are what ``loads`` runs for a serializer without fallback signers, with the same errors."""

    def __init__(self, secrets_newest_first: list[str], *, audience: str, max_age_s: int) -> None:
        self.audience = audience
        self.max_age_s = max_age_s
        self._serializers = {
            _secret_id(secret): URLSafeTimedSerializer(
                secret, salt=_SALT, signer=_KeyKeptSigner,
                signer_kwargs={"digest_method": hashlib.sha256, "key_derivation": "hmac"},
            )
            for secret in secrets_newest_first
        }
        self._signers = {secret_id: serializer.make_signer() for secret_id, serializer in self._serializers.items()}
        self._newest = _secret_id(secrets_newest_first[0]) if secrets_newest_first else None

    @classmethod
    def from_settings(cls, settings: Settings) -> "JobSigner":
        return cls(
            [secret.get_secret_value() for secret in settings.worker.job_secrets],
            audience=settings.worker.audience,
            max_age_s=settings.worker.job_max_age_s,
        )

    def sign(
        self, *, job_id: str, specialist_id: str, deadline_s: float, payload: dict[str, Any] | None = None
    ) -> bytes:
        if self._newest is None:
            raise _refuse_not_configured()
        model = JobBodyModel(
            job=job_id, sp=specialist_id, aud=self.audience, dl=deadline_s, p=payload or {}
        )
        payload = self._serializers[self._newest].dump_payload(model.model_dump(by_alias=True))
        signed = self._signers[self._newest].sign(payload)
        token = signed.decode("ascii")
        return f"{BODY_VERSION}.{self._newest}.{token}".encode("ascii")

    def verify(self, body: bytes) -> VerifiedJob:
        if not self._serializers:
            raise _refuse_not_configured()
        try:
            text = body.decode("ascii")
            version, secret_id, token = text.split(".", 2)
        except (UnicodeDecodeError, ValueError):
            raise WorkerAuthRefused(
                "the job body is not of the form v1.<secret id>.<token>", code=BODY_MALFORMED
            ) from None
        if version != BODY_VERSION:
            raise WorkerAuthRefused(f"job body version {version[:SHOWN_VERSION_CHARS]!r} is not {BODY_VERSION}", code=BODY_MALFORMED)
        serializer, signer = self._serializers.get(secret_id), self._signers.get(secret_id)
        if serializer is None or signer is None:
            raise WorkerAuthRefused(
                "the job body was signed with a secret this worker does not hold (forged, retired, or from "
                "another deployment); check SPECIALISTS_WORKER_JOB_SECRETS on the dispatcher and the worker",
                code=BODY_UNKNOWN_SECRET,
            )
        try:
            signed, signed_at = signer.unsign(token, max_age=self.max_age_s, return_timestamp=True)
            claims = serializer.load_payload(signed)
        except SignatureExpired as exc:
            raise WorkerAuthRefused(
                f"the job body was signed at {exc.date_signed} and is older than SPECIALISTS_WORKER_JOB_MAX_AGE_S "
                f"({self.max_age_s} s) or dated in the future",
                code=BODY_EXPIRED,
            ) from None
        except BadPayload:
            raise WorkerAuthRefused("the job body's signed payload is not valid JSON", code=BODY_MALFORMED) from None
        except BadSignature:
            raise WorkerAuthRefused(
                "the job body's signature does not match its contents; it was altered or forged", code=BODY_TAMPERED
            ) from None
        try:
            model = JobBodyModel.model_validate(claims)
        except ValidationError as exc:
            raise WorkerAuthRefused(
                f"the job body's claims are not valid: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}",
                code=BODY_MALFORMED,
            ) from None
        if model.audience != self.audience:
            raise WorkerAuthRefused(
                f"the job body is addressed to worker audience {model.audience!r}, this worker is "
                f"{self.audience!r} (SPECIALISTS_WORKER_AUDIENCE)",
                code=BODY_WRONG_AUDIENCE,
                http_status=403,
            )
        return VerifiedJob(
            job_id=model.job_id,
            specialist_id=model.specialist_id,
            deadline_s=model.deadline_s,
            payload=model.payload,
            signed_at=signed_at,
            secret_id=secret_id,
        )


def _refuse_not_configured() -> WorkerAuthRefused:
    return WorkerAuthRefused(
        "this service has no worker job secret configured, so it signs and accepts no job; the operator must "
        "set SPECIALISTS_WORKER_JOB_SECRETS (the same value on dispatchers and workers)",
        code=NOT_CONFIGURED,
        http_status=503,
    )


# --- OIDC ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OidcIdentity:
    email: str
    subject: str
    expires_at: int


CertsFetcher = Callable[[str], dict[str, str]]


def fetch_certs_with_google_auth(url: str, timeout_s: float = 5.0) -> dict[str, str]:
    """Fetch ``{key id: PEM certificate}`` through google-auth's transport (Google's v1 certs format)."""
    import google.auth.transport.requests

    request = google.auth.transport.requests.Request()
    response = request(url, method="GET", timeout=timeout_s)
    if response.status != 200:
        raise OSError(f"certificates endpoint answered HTTP {response.status}")
    certs = json.loads(response.data.decode("utf-8"))
    if not isinstance(certs, dict) or not all(isinstance(v, str) for v in certs.values()):
        raise OSError("certificates endpoint did not answer {key id: PEM certificate}")
    return certs


def _b64url(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


class OidcVerifier:
    """Checks a Cloud Tasks OIDC bearer token: signature (RS256, cached certs), issuer, audience, account, time."""

    # A token naming a key we do not have triggers a refetch (keys rotate), at most this often,
    # so a stream of invented key ids cannot turn the worker into a certificate-fetching loop.
    MIN_REFETCH_INTERVAL_S = 5.0

    def __init__(
        self,
        *,
        audience: str,
        service_account_email: str | None,
        certs_url: str,
        certs_cache_s: float,
        clock_skew_s: int,
        fetch_certs: CertsFetcher | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.audience = audience
        self.service_account_email = service_account_email
        self.certs_url = certs_url
        self.certs_cache_s = certs_cache_s
        self.clock_skew_s = clock_skew_s
        self._fetch = fetch_certs or fetch_certs_with_google_auth
        self._clock = clock  # tokens' times
        self._monotonic = monotonic  # the certificates' age and the refetch interval
        self._lock = threading.Lock()
        self._certs: dict[str, str] = {}
        self._fetched_at = float("-inf")

    @classmethod
    def from_settings(cls, settings: Settings, fetch_certs: CertsFetcher | None = None) -> "OidcVerifier":
        return cls(
            audience=settings.worker.audience,
            service_account_email=settings.dispatch.service_account,
            certs_url=settings.worker.oidc_certs_url,
            certs_cache_s=settings.worker.oidc_certs_cache_s,
            clock_skew_s=settings.worker.oidc_clock_skew_s,
            fetch_certs=fetch_certs,
        )

    def _cert_for(self, key_id: str) -> str | None:
        now = self._monotonic()
        with self._lock:
            fresh = now - self._fetched_at < self.certs_cache_s
            if fresh and key_id in self._certs:
                return self._certs[key_id]
            if fresh and now - self._fetched_at < self.MIN_REFETCH_INTERVAL_S:
                return None
            try:
                self._certs = self._fetch(self.certs_url)
            except Exception as exc:  # network, HTTP status, JSON: all mean "cannot check now"
                raise WorkerAuthRefused(
                    f"cannot fetch the OIDC certificates from {self.certs_url} ({type(exc).__name__}); "
                    "the delivery will be retried (SPECIALISTS_WORKER_OIDC_CERTS_URL)",
                    code=OIDC_CERTS_UNAVAILABLE,
                    http_status=503,
                ) from None
            self._fetched_at = now
            return self._certs.get(key_id)

    def verify(self, authorization: str | None) -> OidcIdentity:
        import google.auth.crypt
        import google.auth.jwt

        if not authorization or not authorization.startswith("Bearer "):
            raise WorkerAuthRefused("no OIDC bearer token (Authorization: Bearer ...)", code=OIDC_MISSING)
        token = authorization[len("Bearer ") :].strip()
        try:
            header = google.auth.jwt.decode_header(token)
            claims = google.auth.jwt.decode(token, verify=False)
            signed_section, signature_b64 = token.rsplit(".", 1)
            signature = _b64url(signature_b64)
        except Exception:
            raise WorkerAuthRefused("the OIDC token is not a JWT", code=OIDC_MALFORMED) from None
        if header.get("alg") != "RS256" or not isinstance(header.get("kid"), str):
            raise WorkerAuthRefused("the OIDC token is not RS256 with a key id", code=OIDC_MALFORMED)
        cert = self._cert_for(header["kid"])
        if cert is None or not google.auth.crypt.verify_signature(
            signed_section, signature, [cert], google.auth.crypt.RSAVerifier
        ):
            raise WorkerAuthRefused(
                "the OIDC token's signature does not verify against the published certificates",
                code=OIDC_BAD_SIGNATURE,
            )
        if claims.get("iss") not in GOOGLE_ISSUERS:
            raise WorkerAuthRefused(f"the OIDC token's issuer {claims.get('iss')!r} is not Google", code=OIDC_WRONG_ISSUER)
        if claims.get("aud") != self.audience:
            raise WorkerAuthRefused(
                f"the OIDC token is for audience {claims.get('aud')!r}, this worker is {self.audience!r} "
                "(SPECIALISTS_WORKER_AUDIENCE)",
                code=OIDC_WRONG_AUDIENCE,
                http_status=403,
            )
        now = self._clock()
        try:
            expires_at, issued_at = int(claims["exp"]), int(claims["iat"])
        except (KeyError, TypeError, ValueError):
            raise WorkerAuthRefused("the OIDC token lacks exp or iat", code=OIDC_MALFORMED) from None
        if now > expires_at + self.clock_skew_s:
            raise WorkerAuthRefused("the OIDC token has expired", code=OIDC_EXPIRED)
        if now < issued_at - self.clock_skew_s:
            raise WorkerAuthRefused(
                "the OIDC token is dated in the future; check the clocks (SPECIALISTS_WORKER_OIDC_CLOCK_SKEW_S)",
                code=OIDC_NOT_YET_VALID,
            )
        email = claims.get("email")
        if (
            not self.service_account_email
            or email != self.service_account_email
            or claims.get("email_verified") is not True
        ):
            raise WorkerAuthRefused(
                f"the OIDC token is for account {email!r}; this worker accepts only "
                f"{self.service_account_email!r} (SPECIALISTS_DISPATCH_SERVICE_ACCOUNT)",
                code=OIDC_WRONG_ACCOUNT,
                http_status=403,
            )
        return OidcIdentity(email=email, subject=str(claims.get("sub", "")), expires_at=expires_at)
