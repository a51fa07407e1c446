"""The console's identity in production: IAP's signed header, verified against keys served over real HTTP on
127.0.0.1 in IAP's format (PEM by key id), by the console app itself (its ASGI app, no browser needed here).

IAP cannot run on this machine; what the console sees of it is one header carrying an ES256 JWT, signed here
with a key this test publishes as IAP publishes its own."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.auth import crypt, jwt
from starlette.testclient import TestClient

from core.settings import PROJECT_ROOT, ConsoleSettings, Settings
from ops.console.app import create_console
from ops.console.auth import IAP_HEADER, IAP_ISSUER, SESSION_COOKIE, ConsoleNotConfigured, check_console_settings

AUDIENCE = "/projects/123456/locations/europe-west1/services/specialists-console"
SESSION_SECRET = "console-iap-tests-session-secret-" + "s" * 40


class Keys:
    """Signing keys by id, and the PEM map a certs URL serves (what https://www.gstatic.com/iap/verify/public_key
    serves for IAP's own)."""

    def __init__(self) -> None:
        self.private: dict[str, ec.EllipticCurvePrivateKey] = {}
        self.fetches = 0

    def add(self, kid: str) -> None:
        self.private[kid] = ec.generate_private_key(ec.SECP256R1())

    def published(self) -> dict[str, str]:
        return {kid: key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()
                for kid, key in self.private.items()}

    def token(self, kid: str, *, email: str, audience: str = AUDIENCE, issuer: str = IAP_ISSUER,
              lifetime_s: int = 600) -> str:
        pem = self.private[kid].private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())
        signer = crypt.ES256Signer.from_string(pem, key_id=kid)
        now = int(time.time())
        claims = {"iss": issuer, "aud": audience, "email": email, "sub": f"accounts.google.com:{email}",
                  "iat": now - 5, "exp": now + lifetime_s}
        return jwt.encode(signer, claims).decode()


@pytest.fixture(scope="module")
def keys() -> Iterator[tuple[Keys, str]]:
    published = Keys()
    published.add("k1")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            published.fetches += 1
            body = json.dumps(published.published()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield published, f"http://127.0.0.1:{server.server_address[1]}/iap/verify/public_key"
    server.shutdown()


@pytest.fixture(scope="module")
def console(keys, engine, settings: Settings) -> Iterator[httpx.Client]:
    _, certs_url = keys
    iap = settings.model_copy(update={
        "console": ConsoleSettings(auth="iap", iap_audience=AUDIENCE, iap_certs_url=certs_url,
                                   operators=["Alice@example.com", "bob@example.com"],
                                   session_secrets=[SESSION_SECRET]),
        "hosted": settings.hosted.model_copy(update={"specs_dir": PROJECT_ROOT / "specs"}),
    })
    app = create_console(iap, engine)
    with TestClient(app, base_url="https://console.example") as client:  # the app over ASGI, as uvicorn serves it
        yield client


def _get(client: httpx.Client, token: str | None, path: str = "/customers") -> httpx.Response:
    client.cookies.clear()
    return client.get(path, headers={IAP_HEADER: token} if token else {})


def test_a_listed_google_account_is_the_operator_and_its_session_cookie_is_secure(console, keys):
    published, _ = keys
    answer = _get(console, published.token("k1", email="alice@example.com"))
    assert answer.status_code == 200
    assert '<span data-testid="operator">alice@example.com</span>' in answer.text
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and "Secure" in cookie and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "samesite=strict" in cookie.lower()
    assert "Log out" not in answer.text  # IAP signs people out, not the console


@pytest.mark.parametrize("case", ["missing", "not_listed", "audience", "issuer", "expired", "tampered", "unknown_key"])
def test_anything_but_a_valid_assertion_for_a_listed_account_is_refused(console, keys, case):
    published, _ = keys
    token = {
        "missing": None,
        "not_listed": published.token("k1", email="mallory@example.com"),
        "audience": published.token("k1", email="alice@example.com", audience="/projects/999/global/backendServices/1"),
        "issuer": published.token("k1", email="alice@example.com", issuer="https://evil.example"),
        "expired": published.token("k1", email="alice@example.com", lifetime_s=-120),
        "tampered": published.token("k1", email="alice@example.com")[:-6] + "AAAAAA",
        "unknown_key": None,
    }[case]
    if case == "unknown_key":
        stranger = Keys()
        stranger.add("k-stranger")
        token = stranger.token("k-stranger", email="alice@example.com")
    answer = _get(console, token)
    expected = {"missing": (401, "iap_missing"), "not_listed": (403, "not_an_operator")}.get(case, (401, "iap_invalid"))
    assert (answer.status_code, expected[1] in answer.text) == (expected[0], True), answer.text
    assert "data-testid=\"customers\"" not in answer.text and "set-cookie" not in answer.headers


def test_a_key_iap_rotated_in_is_fetched_once_it_signs(console, keys):
    published, _ = keys
    _get(console, published.token("k1", email="bob@example.com"))
    before = published.fetches
    published.add("k2")
    assert _get(console, published.token("k2", email="bob@example.com")).status_code == 200
    assert published.fetches == before + 1  # fetched again because the key id was new, not on every request
    assert _get(console, published.token("k2", email="bob@example.com")).status_code == 200
    assert published.fetches == before + 1


def test_a_session_of_one_account_does_not_carry_another_accounts_assertion(console, keys):
    """The cookie is bound to the assertion's account: bob's request with alice's cookie acts as bob."""
    published, _ = keys
    first = _get(console, published.token("k1", email="alice@example.com"))
    console.cookies.set(SESSION_COOKIE, first.cookies[SESSION_COOKIE])
    second = console.get("/customers", headers={IAP_HEADER: published.token("k1", email="bob@example.com")})
    assert '<span data-testid="operator">bob@example.com</span>' in second.text


def test_start_up_names_every_setting_the_chosen_authentication_lacks():
    with pytest.raises(ConsoleNotConfigured) as iap:
        check_console_settings(ConsoleSettings(auth="iap"))
    assert all(name in iap.value.message for name in ("SPECIALISTS_CONSOLE_SESSION_SECRETS",
                                                      "SPECIALISTS_CONSOLE_IAP_AUDIENCE",
                                                      "SPECIALISTS_CONSOLE_OPERATORS"))
    with pytest.raises(ConsoleNotConfigured) as local:
        check_console_settings(ConsoleSettings(session_secrets=[SESSION_SECRET]))
    assert "SPECIALISTS_CONSOLE_OPERATOR_SECRET" in local.value.message
    with pytest.raises(ValueError, match="shorter than SPECIALISTS_CONSOLE_MIN_SECRET_CHARS"):
        ConsoleSettings(session_secrets=["short"])
