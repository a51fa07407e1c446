"""Who is at the console, and whether this request is theirs: sessions, CSRF, the local secret and IAP.

- **The operator's identity** comes from the authentication, never from a form field. On one machine
  (``auth=local``) a person proves they hold SPECIALISTS_CONSOLE_OPERATOR_SECRET and acts as
  SPECIALISTS_CONSOLE_LOCAL_OPERATOR (default: the OS user of the console's process). In production
  (``auth=iap``) every request carries the JWT Identity-Aware Proxy signed (``x-goog-iap-jwt-assertion``,
  ES256): it is verified against Google's published keys, its audience and issuer checked, and its email must
  be one of SPECIALISTS_CONSOLE_OPERATORS.
- **Sessions** are a cookie signed with SPECIALISTS_CONSOLE_SESSION_SECRETS (itsdangerous, newest secret signs,
  all verify) that expires SPECIALISTS_CONSOLE_SESSION_TTL_S after login. HttpOnly, SameSite=Strict, Secure
  whenever the console is reached over https (always behind IAP).
- **CSRF**: every state-changing request carries the session's token in the form (``csrf``), compared in
  constant time, and its ``Origin`` (or, without one, ``Referer``) must be the console's own. A request with
  neither is refused: a browser always sends one on a form POST.
"""

from __future__ import annotations

import getpass
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from starlette.requests import Request

from core.errors import ServiceError
from core.settings import ConsoleSettings

SESSION_COOKIE = "console_session"
IAP_HEADER = "x-goog-iap-jwt-assertion"
IAP_ISSUER = "https://cloud.google.com/iap"
CSRF_FIELD = "csrf"


class ConsoleNotConfigured(ServiceError):
    code = "console_not_configured"


class Refused(ServiceError):
    """A request the console does not serve: ``status`` 401 (who are you), 403 (not this), 400."""

    code = "console_refused"

    def __init__(self, message: str, *, code: str, status: int) -> None:
        super().__init__(message, code=code)
        self.status = status


@dataclass(frozen=True)
class Session:
    operator: str
    csrf: str
    via: str  # local | iap


def check_console_settings(console: ConsoleSettings) -> None:
    """Stop start-up when the chosen authentication cannot work, naming the setting (every problem at once)."""
    problems = []
    if not console.session_secrets:
        problems.append("SPECIALISTS_CONSOLE_SESSION_SECRETS is not set (it signs the console's sessions)")
    if console.auth == "local" and console.operator_secret is None:
        problems.append("SPECIALISTS_CONSOLE_OPERATOR_SECRET is not set (with SPECIALISTS_CONSOLE_AUTH=local, "
                        "operators log in with it; `specialists serve` generates one on one machine)")
    if console.auth == "iap":
        if not console.iap_audience:
            problems.append("SPECIALISTS_CONSOLE_IAP_AUDIENCE is not set (the audience of IAP's JWT)")
        if not console.operators:
            problems.append("SPECIALISTS_CONSOLE_OPERATORS is empty (with IAP, nobody could log in)")
    if problems:
        raise ConsoleNotConfigured("; ".join(problems))


def local_operator(console: ConsoleSettings) -> str:
    return console.local_operator or getpass.getuser()


class Sessions:
    """Signs and reads the session cookie."""

    def __init__(self, console: ConsoleSettings) -> None:
        # itsdangerous signs with the last key and verifies with all: the settings list the newest first.
        keys = [secret.get_secret_value() for secret in reversed(console.session_secrets)]
        self._serializer = URLSafeTimedSerializer(keys, salt="specialists-console-session")
        self._sealer = URLSafeTimedSerializer(keys, salt="specialists-console-once")
        self.ttl_s = console.session_ttl_s

    def issue(self, operator: str, via: str) -> tuple[Session, str]:
        session = Session(operator=operator, csrf=secrets.token_urlsafe(32), via=via)
        return session, self._serializer.dumps({"op": operator, "csrf": session.csrf, "via": via})

    def seal(self, data: dict) -> str:
        """Something for the next request only (a key just issued), signed like the session."""
        return self._sealer.dumps(data)

    def unseal(self, value: str, *, max_age_s: int) -> dict | None:
        try:
            data = self._sealer.loads(value, max_age=max_age_s)
        except (SignatureExpired, BadSignature):
            return None
        return data if isinstance(data, dict) else None

    def read(self, request: Request) -> Session | None:
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie or len(cookie) > 4096:
            return None
        try:
            data = self._serializer.loads(cookie, max_age=self.ttl_s)
        except (SignatureExpired, BadSignature):
            return None
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("op", "csrf", "via")):
            return None
        return Session(operator=data["op"], csrf=data["csrf"], via=data["via"])


def secure_request(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"


def check_same_origin(request: Request) -> None:
    """The request came from a page of the console itself (``Origin``, else ``Referer``)."""
    sent = request.headers.get("origin") or request.headers.get("referer")
    if not sent or sent == "null":
        raise Refused("this request does not say which page sent it (no Origin or Referer); "
                      "use the console's own forms", code="origin_missing", status=403)
    parts = urlsplit(sent)
    host = request.headers.get("host", "")
    if parts.netloc != host:
        raise Refused("this request was sent from another site's page; use the console's own forms",
                      code="origin_refused", status=403)


def check_csrf(session: Session, sent: str | None) -> None:
    if not sent or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise Refused("the form's CSRF token is missing or is not this session's; reload the page and submit again",
                      code="csrf_refused", status=403)


def check_operator_secret(console: ConsoleSettings, typed: str) -> bool:
    expected = console.operator_secret
    return expected is not None and hmac.compare_digest(typed.encode(), expected.get_secret_value().encode())


class IapVerifier:
    """Verifies IAP's signed header: ES256 with Google's keys (fetched from ``iap_certs_url``, cached), audience,
    issuer, expiry; the operator is its email, which must be listed in SPECIALISTS_CONSOLE_OPERATORS."""

    def __init__(self, console: ConsoleSettings, *, client: httpx.Client | None = None) -> None:
        self.audience = console.iap_audience
        self.certs_url = console.iap_certs_url
        self.cache_s = console.iap_certs_cache_s
        self.operators = {email.lower() for email in console.operators}
        self._client = client or httpx.Client(timeout=10.0, trust_env=False, follow_redirects=False)
        self._certs: dict[str, str] = {}
        self._fetched_at = 0.0
        self._lock = threading.Lock()

    def _keys(self, *, refresh: bool = False) -> dict[str, str]:
        with self._lock:
            if refresh or not self._certs or time.monotonic() - self._fetched_at > self.cache_s:
                try:
                    answer = self._client.get(self.certs_url)
                    answer.raise_for_status()
                    certs = answer.json()
                except (httpx.HTTPError, ValueError) as exc:
                    if self._certs:  # keep the last good keys through a blip
                        return self._certs
                    raise Refused(f"IAP's public keys could not be fetched ({type(exc).__name__}); "
                                  "try again (SPECIALISTS_CONSOLE_IAP_CERTS_URL)", code="iap_keys_unavailable",
                                  status=503) from None
                if not isinstance(certs, dict):
                    raise Refused("IAP's public keys are not a key-id map (SPECIALISTS_CONSOLE_IAP_CERTS_URL)",
                                  code="iap_keys_unavailable", status=503)
                self._certs = {str(k): str(v) for k, v in certs.items()}
                self._fetched_at = time.monotonic()
            return self._certs

    def operator(self, request: Request) -> str:
        from google.auth import exceptions, jwt

        token = request.headers.get(IAP_HEADER)
        if not token:
            raise Refused("this console is reached through Identity-Aware Proxy only", code="iap_missing", status=401)
        if len(token) > 8192:
            raise Refused("the IAP assertion is too large", code="iap_invalid", status=401)
        try:
            header = jwt.decode_header(token)
        except (ValueError, exceptions.GoogleAuthError):
            raise Refused("the IAP assertion is not a JWT", code="iap_invalid", status=401) from None
        if header.get("alg") != "ES256":
            raise Refused("the IAP assertion is not signed with ES256", code="iap_invalid", status=401)
        certs = self._keys()
        if header.get("kid") not in certs:
            certs = self._keys(refresh=True)  # a key IAP rotated in since we fetched
        try:
            claims = jwt.decode(token, certs=certs, audience=self.audience, clock_skew_in_seconds=30)
        except (ValueError, exceptions.GoogleAuthError):
            raise Refused("the IAP assertion did not verify (signature, audience or expiry)", code="iap_invalid",
                          status=401) from None
        if claims.get("iss") != IAP_ISSUER:
            raise Refused("the IAP assertion has another issuer", code="iap_invalid", status=401)
        email = str(claims.get("email", "")).lower()
        if email not in self.operators:
            raise Refused(f"{email or 'this account'} is not a console operator (SPECIALISTS_CONSOLE_OPERATORS)",
                          code="not_an_operator", status=403)
        return email
