"""The console's identity in production: IAP's signed header, verified against keys served over real HTTP on
127.0.0.1 in IAP's format (PEM by key id), by the console app itself (its ASGI app, no browser needed here).

IAP cannot run on this machine; what the console sees of it is one header carrying an ES256 JWT, signed here
with keys published as IAP publishes its own (tests/deploy/iap.py, which the deploy tests use too)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from core.settings import PROJECT_ROOT, ConsoleSettings, Settings
from ops.console.app import create_console
from ops.console.auth import IAP_HEADER, SESSION_COOKIE, ConsoleNotConfigured, check_console_settings
from tests.deploy.iap import FakeIap, start_fake_iap, unpublished_iap

AUDIENCE = "/projects/123456/locations/europe-west1/services/specialists-console"
SESSION_SECRET = "console-iap-tests-session-secret-" + "s" * 40


@pytest.fixture(scope="module")
def keys() -> Iterator[FakeIap]:
    iap = start_fake_iap()
    yield iap
    iap.stop()


def _iap_console(keys: FakeIap, engine, settings: Settings) -> TestClient:
    iap = settings.model_copy(update={
        "console": ConsoleSettings(auth="iap", iap_audience=AUDIENCE, iap_certs_url=keys.certs_url,
                                   operators=["Alice@example.com", "bob@example.com"],
                                   session_secrets=[SESSION_SECRET], allowed_origins=["https://console.example"]),
        "hosted": settings.hosted.model_copy(update={"specs_dir": PROJECT_ROOT / "specs"}),
    })
    return TestClient(create_console(iap, engine), base_url="https://console.example")  # the ASGI app, as uvicorn serves it


@pytest.fixture(scope="module")
def console(keys: FakeIap, engine, settings: Settings) -> Iterator[TestClient]:
    with _iap_console(keys, engine, settings) as client:
        yield client


@pytest.fixture
def fresh_keys() -> Iterator[FakeIap]:
    """Keys of their own, for a test that rotates them."""
    iap = start_fake_iap()
    yield iap
    iap.stop()


@pytest.fixture
def fresh_console(fresh_keys: FakeIap, engine, settings: Settings) -> Iterator[TestClient]:
    """A console that has not fetched IAP's keys yet (no earlier miss bounds its next fetch)."""
    with _iap_console(fresh_keys, engine, settings) as client:
        yield client


def _get(client: TestClient, token: str | None, path: str = "/customers") -> httpx.Response:
    client.cookies.clear()
    return client.get(path, headers={IAP_HEADER: token} if token else {})


def test_a_listed_google_account_is_the_operator_and_its_session_cookie_is_secure(console, keys):
    answer = _get(console, keys.assertion("alice@example.com", AUDIENCE))
    assert answer.status_code == 200
    assert '<span data-testid="operator">alice@example.com</span>' in answer.text
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and "Secure" in cookie and "HttpOnly" in cookie
    assert "samesite=strict" in cookie.lower()
    assert "Log out" not in answer.text  # IAP signs people out, not the console


@pytest.mark.parametrize("case", ["missing", "not_listed", "audience", "issuer", "expired", "tampered", "unknown_key"])
def test_anything_but_a_valid_assertion_for_a_listed_account_is_refused(console, keys, case):
    alice = "alice@example.com"
    token = {
        "missing": lambda: None,
        "not_listed": lambda: keys.assertion("mallory@example.com", AUDIENCE),
        "audience": lambda: keys.assertion(alice, "/projects/999/global/backendServices/1"),
        "issuer": lambda: keys.assertion(alice, AUDIENCE, issuer="https://evil.example"),
        "expired": lambda: keys.assertion(alice, AUDIENCE, lifetime_s=-120),
        "tampered": lambda: keys.assertion(alice, AUDIENCE)[:-6] + "AAAAAA",
        "unknown_key": lambda: unpublished_iap().assertion(alice, AUDIENCE),
    }[case]()
    answer = _get(console, token)
    expected = {"missing": (401, "iap_missing"), "not_listed": (403, "not_an_operator")}.get(case, (401, "iap_invalid"))
    assert (answer.status_code, expected[1] in answer.text) == (expected[0], True), answer.text
    assert "data-testid=\"customers\"" not in answer.text and "set-cookie" not in answer.headers


def test_a_key_iap_rotated_in_is_fetched_once_it_signs(fresh_console, fresh_keys):
    keys = fresh_keys
    _get(fresh_console, keys.assertion("bob@example.com", AUDIENCE))
    before = keys.fetches
    keys.rotate("k2")
    assert _get(fresh_console, keys.assertion("bob@example.com", AUDIENCE)).status_code == 200
    assert keys.fetches == before + 1  # fetched again because the key id was new, not on every request
    assert _get(fresh_console, keys.assertion("bob@example.com", AUDIENCE)).status_code == 200
    assert keys.fetches == before + 1


def test_assertions_naming_an_unknown_key_id_cause_one_fetch_not_one_per_request(fresh_console, fresh_keys):
    """Issue 42: 100 requests with a key id IAP never published fetched the keys 100 times. The miss is cached for
    SPECIALISTS_CONSOLE_IAP_CERTS_REFETCH_S (30 s): one fetch, then refusals without one, forged ids or not."""
    keys = fresh_keys
    assert _get(fresh_console, keys.assertion("bob@example.com", AUDIENCE)).status_code == 200
    before = keys.fetches
    forged = []
    for i in range(5):  # five key ids nobody publishes
        attacker = FakeIap({}, {})
        attacker.rotate(f"forged-{i}")
        forged.append(attacker.assertion("bob@example.com", AUDIENCE))
    answers = [_get(fresh_console, forged[i % 5]) for i in range(100)]
    assert all(a.status_code == 401 and "iap_invalid" in a.text for a in answers)
    assert keys.fetches - before == 1
    assert _get(fresh_console, keys.assertion("bob@example.com", AUDIENCE)).status_code == 200  # known keys still work
    assert keys.fetches - before == 1


def test_a_session_of_one_account_does_not_carry_another_accounts_assertion(console, keys):
    """The cookie is bound to the assertion's account: bob's request with alice's cookie acts as bob."""
    first = _get(console, keys.assertion("alice@example.com", AUDIENCE))
    console.cookies.set(SESSION_COOKIE, first.cookies[SESSION_COOKIE])
    second = console.get("/customers", headers={IAP_HEADER: keys.assertion("bob@example.com", AUDIENCE)})
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
    assert "SPECIALISTS_CONSOLE_ALLOWED_ORIGINS" in iap.value.message
    with pytest.raises(ValueError, match="SPECIALISTS_CONSOLE_ALLOWED_ORIGINS"):
        ConsoleSettings(allowed_origins=["https://console.example/page"])
    with pytest.raises(ValueError, match="shorter than SPECIALISTS_CONSOLE_MIN_SECRET_CHARS"):
        ConsoleSettings(session_secrets=["short"])
