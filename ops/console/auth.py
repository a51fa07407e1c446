"""Who is at the console, and whether this request is theirs: sessions, CSRF, the local secret and IAP.

- **The operator's identity** comes from the authentication, never from a form field. On one machine
  (``auth=local``) a person proves they hold SPECIALISTS_CONSOLE_OPERATOR_SECRET and acts as
  SPECIALISTS_CONSOLE_LOCAL_OPERATOR (default: the OS user of the console's process). In production
  (``auth=iap``) every request carries the JWT Identity-Aware Proxy signed (``x-goog-iap-jwt-assertion``,
  ES256): it is verified against Google's published keys, its audience and issuer checked, and its email must
  be one of SPECIALISTS_CONSOLE_OPERATORS.
- **Sessions** are kept on the server (``session_store``: live until logged out or SPECIALISTS_CONSOLE_SESSION_TTL_S
  after login) and named by a cookie signed with SPECIALISTS_CONSOLE_SESSION_SECRETS (itsdangerous, newest secret
  signs, all verify). HttpOnly, SameSite=Strict, Secure whenever the console is reached over https (always behind
  IAP). Logging out ends the session for every copy of its cookie.
- **CSRF**: every state-changing request carries the session's token in the form (``csrf``), compared in
  constant time, and its ``Origin`` (or, without one, ``Referer``) must be one of the allowed origins
  (SPECIALISTS_CONSOLE_ALLOWED_ORIGINS; never the request's own Host header, which its sender chooses). A request
  with neither is refused: a browser always sends one on a form POST.
- **Wrong logins** are throttled per client address and globally (``LoginThrottle``).
"""

from __future__ import annotations

import getpass
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from starlette.requests import Request

from sqlalchemy import Engine

from core.errors import ServiceError
from core.settings import ConsoleSettings
from ops.console import session_store

SESSION_COOKIE = "console_session"
IAP_HEADER = "x-goog-iap-jwt-assertion"
IAP_ISSUER = "https://cloud.google.com/iap"
CSRF_FIELD = "csrf"


class ConsoleNotConfigured(ServiceError):
    code = "console_not_configured"


class Refused(ServiceError):
    """A request the console does not serve: ``status`` 401 (who are you), 403 (not this), 400."""

    code = "console_refused"

    def __init__(self, message: str, *, code: str, status: int, retry_after_s: int | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Session:
    operator: str
    csrf: str
    via: str  # local | iap
    session_id: str = ""


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
        if not console.allowed_origins:
            problems.append("SPECIALISTS_CONSOLE_ALLOWED_ORIGINS is not set (with IAP, the console's https URL: "
                            "the only page its forms may be posted from)")
    if problems:
        raise ConsoleNotConfigured("; ".join(problems))


def local_operator(console: ConsoleSettings) -> str:
    return console.local_operator or getpass.getuser()


LOOPBACK_NAMES = ("127.0.0.1", "localhost")


def allowed_origins(console: ConsoleSettings) -> frozenset[str]:
    """The origins whose pages may post to the console: the setting, or on one machine the console's own address."""
    if console.allowed_origins:
        return frozenset(origin.rstrip("/").lower() for origin in console.allowed_origins)
    hosts = LOOPBACK_NAMES if console.host in (*LOOPBACK_NAMES, "0.0.0.0") else (console.host,)
    return frozenset(f"http://{host}:{console.port}" for host in hosts)


class Sessions:
    """Opens, reads and ends sessions: a row of ``session_store`` named by a signed cookie."""

    def __init__(self, console: ConsoleSettings, engine: Engine) -> None:
        self.engine = engine
        # itsdangerous signs with the last key and verifies with all: the settings list the newest first.
        keys = [secret.get_secret_value() for secret in reversed(console.session_secrets)]
        self._serializer = URLSafeTimedSerializer(keys, salt="specialists-console-session")
        self._sealer = URLSafeTimedSerializer(keys, salt="specialists-console-once")
        self.ttl_s = console.session_ttl_s

    def issue(self, operator: str, via: str) -> tuple[Session, str]:
        session = Session(operator=operator, csrf=secrets.token_urlsafe(32), via=via,
                          session_id=secrets.token_urlsafe(24))
        session_store.open_session(self.engine, session.session_id, operator=operator, via=via, ttl_s=self.ttl_s)
        return session, self._serializer.dumps({"op": operator, "csrf": session.csrf, "via": via,
                                                "sid": session.session_id})

    def end(self, session: Session) -> None:
        """Log out: the session ends on the server, so a copy of its cookie opens nothing any more."""
        session_store.end_session(self.engine, session.session_id)

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
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("op", "csrf", "via", "sid")):
            return None
        if not session_store.is_live(self.engine, data["sid"]):
            return None  # logged out (or expired): the cookie alone is not a session
        return Session(operator=data["op"], csrf=data["csrf"], via=data["via"], session_id=data["sid"])


def secure_request(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"


def check_same_origin(request: Request, allowed: frozenset[str]) -> None:
    """The request came from a page of the console itself (``Origin``, else ``Referer``): one of ``allowed``."""
    sent = request.headers.get("origin") or request.headers.get("referer")
    if not sent or sent == "null":
        raise Refused("this request does not say which page sent it (no Origin or Referer); "
                      "use the console's own forms", code="origin_missing", status=403)
    parts = urlsplit(sent)
    if f"{parts.scheme}://{parts.netloc}".lower() not in allowed:
        raise Refused("this request was sent from a page that is not the console's (SPECIALISTS_CONSOLE_ALLOWED_ORIGINS); "
                      "use the console's own forms", code="origin_refused", status=403)


def check_csrf(session: Session, sent: str | None) -> None:
    if not sent or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise Refused("the form's CSRF token is missing or is not this session's; reload the page and submit again",
                      code="csrf_refused", status=403)


def check_operator_secret(console: ConsoleSettings, typed: str) -> bool:
    expected = console.operator_secret
    return expected is not None and hmac.compare_digest(typed.encode(), expected.get_secret_value().encode())


class LoginThrottle:
    """Wrong operator secrets, counted in a sliding window (SPECIALISTS_CONSOLE_LOGIN_WINDOW_S) per client address
    and for all addresses together. Past either limit, every login (the right secret too) is refused with 429 and
    the seconds until the oldest counted failure leaves the window: a guesser learns nothing more until then.

    Kept in this process (auth=local runs one console on one machine; behind IAP nobody logs in here); at most
    ``MAX_ADDRESSES`` addresses are tracked, the longest quiet forgotten first."""

    MAX_ADDRESSES = 10_000

    def __init__(self, console: ConsoleSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_address = console.login_failures_per_address
        self.global_limit = console.login_failures_global
        self.window_s = console.login_window_s
        self._clock = clock
        self._by_address: OrderedDict[str, deque[float]] = OrderedDict()
        self._all: deque[float] = deque(maxlen=self.global_limit)
        self._lock = threading.Lock()

    def _wait_s(self, failures: deque[float], limit: int, now: float) -> float:
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures[0] + self.window_s - now if len(failures) >= limit else 0.0

    def check(self, address: str) -> None:
        """Refuse (429, ``login_throttled``) while this address or everyone is over its limit."""
        with self._lock:
            now = self._clock()
            mine = self._by_address.get(address, deque())
            wait_mine = self._wait_s(mine, self.per_address, now)
            wait_all = self._wait_s(self._all, self.global_limit, now)
        if wait_mine > 0:
            raise Refused(f"too many wrong operator secrets from this address: try again in {math.ceil(wait_mine)} s "
                          f"(SPECIALISTS_CONSOLE_LOGIN_FAILURES_PER_ADDRESS in SPECIALISTS_CONSOLE_LOGIN_WINDOW_S)",
                          code="login_throttled", status=429, retry_after_s=math.ceil(wait_mine))
        if wait_all > 0:
            raise Refused(f"too many wrong operator secrets from everyone: logins resume in {math.ceil(wait_all)} s "
                          f"(SPECIALISTS_CONSOLE_LOGIN_FAILURES_GLOBAL in SPECIALISTS_CONSOLE_LOGIN_WINDOW_S)",
                          code="login_throttled", status=429, retry_after_s=math.ceil(wait_all))

    def failed(self, address: str) -> None:
        with self._lock:
            now = self._clock()
            mine = self._by_address.pop(address, None) or deque(maxlen=self.per_address)
            mine.append(now)
            self._by_address[address] = mine  # the most recent last: the first is the longest quiet
            while len(self._by_address) > self.MAX_ADDRESSES:
                self._by_address.popitem(last=False)
            self._all.append(now)


class IapVerifier:
    """Verifies IAP's signed header: ES256 with Google's keys (fetched from ``iap_certs_url``, cached), audience,
    issuer, expiry; the operator is its email, which must be listed in SPECIALISTS_CONSOLE_OPERATORS."""

    def __init__(self, console: ConsoleSettings, *, client: httpx.Client | None = None) -> None:
        self.audience = console.iap_audience
        self.certs_url = console.iap_certs_url
        self.cache_s = console.iap_certs_cache_s
        self.refetch_s = console.iap_certs_refetch_s
        self.operators = {email.lower() for email in console.operators}
        self._client = client or httpx.Client(timeout=10.0, trust_env=False, follow_redirects=False)
        self._certs: dict[str, str] = {}
        self._fetched_at = 0.0
        self._refetched_at = -math.inf  # the last fetch an unknown key id caused
        self._lock = threading.Lock()

    def _keys(self, *, unknown_kid: bool = False) -> dict[str, str]:
        with self._lock:
            refresh = False
            if unknown_kid:  # a key IAP rotated in since we fetched, or a forged id: at most one fetch a refetch_s
                refresh = time.monotonic() - self._refetched_at >= self.refetch_s
                if refresh:
                    self._refetched_at = time.monotonic()
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
            certs = self._keys(unknown_kid=True)  # the miss is cached for refetch_s: no fetch per request
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
