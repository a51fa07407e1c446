"""The webhook rule (core.webhooks) and the push signing keys (core.push_signing), without a network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from pydantic import SecretStr, ValidationError

from core.push_signing import PushSigner, verify
from core.settings import PROJECT_ROOT, Settings
from core.webhooks import WebhookRefused, check_url, resolve_checked

REFUSED = [
    ("https://10.0.0.1/h", "private"), ("https://172.16.5.4/h", "private"), ("https://192.168.1.1/h", "private"),
    ("https://[fd12::1]/h", "private"), ("https://100.64.0.1/h", "private"), ("https://127.0.0.1/h", "loopback"),
    ("https://[::1]/h", "loopback"), ("https://169.254.169.254/h", "metadata"), ("https://[fd00:ec2::254]/h", "metadata"),
    ("https://169.254.10.10/h", "link-local"), ("https://[fe80::1]/h", "link-local"), ("https://0.0.0.0/h", "unspecified"),
    ("https://224.0.0.1/h", "multicast"), ("https://[::ffff:127.0.0.1]/h", "loopback"),
    ("https://metadata.google.internal/h", "metadata"),
]


@pytest.mark.parametrize("url, kind", REFUSED)
def test_registration_refuses_every_address_that_is_not_public_unicast(url, kind):
    with pytest.raises(WebhookRefused) as refused:
        check_url(url, allow_loopback=False, max_chars=2048)
    assert refused.value.code == "webhook_address_refused" and kind in refused.value.message


# Every IPv6 form that embeds an IPv4 address, each wrapping a refused one (issue 42: 6to4 of the metadata address
# was taken at registration), and the same forms wrapping a public address where that form is itself routable.
EMBEDDED = [
    ("6to4", "2002:a9fe:a9fe::", "169.254.169.254 is a cloud metadata address"),
    ("6to4", "2002:a9fe:a9fe:1::7", "169.254.169.254 is a cloud metadata address"),
    ("6to4", "2002:7f00:1::", "127.0.0.1 is a loopback address"),
    ("6to4", "2002:0a00:0001::", "10.0.0.1 is a private address"),
    ("6to4", "2002:6440:0001::", "100.64.0.1 is a private address"),
    ("NAT64 well-known", "64:ff9b::a9fe:a9fe", "169.254.169.254 is a cloud metadata address"),
    ("NAT64 well-known", "64:ff9b::c0a8:101", "192.168.1.1 is a private address"),
    ("NAT64 local-use", "64:ff9b:1::7f00:1", "127.0.0.1 is a loopback address"),
    ("Teredo client", "2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1 is a private address"),
    ("Teredo server", "2001:0:a9fe:a9fe:8000:63bf:a7f7:f7f7", "169.254.169.254 is a cloud metadata address"),
    ("IPv4-compatible", "::a9fe:a9fe", "169.254.169.254 is a cloud metadata address"),
    ("IPv4-compatible", "::7f00:1", "127.0.0.1 is a loopback address"),
    ("IPv4-mapped", "::ffff:a9fe:a9fe", "169.254.169.254 is a cloud metadata address"),
]


@pytest.mark.parametrize("form, address, reason", EMBEDDED)
def test_every_ipv6_form_that_embeds_a_refused_ipv4_address_is_refused(form, address, reason):
    for allow_loopback in (False, True):
        with pytest.raises(WebhookRefused) as refused:
            check_url(f"https://[{address}]/h", allow_loopback=allow_loopback, max_chars=2048)
        assert refused.value.code == "webhook_address_refused" and reason in refused.value.message, form
        target = check_url("https://hook.example/h", allow_loopback=False, max_chars=2048)
        with pytest.raises(WebhookRefused, match=reason):  # and at delivery, from what the name resolves to
            resolve_checked(target, allow_loopback=allow_loopback, timeout_s=1, resolver=lambda h, p: [address])


def test_6to4_of_a_public_ipv4_address_is_still_taken():
    assert check_url("https://[2002:5db8:d822::1]/h", allow_loopback=False, max_chars=2048).host == "2002:5db8:d822::1"


SIX_TO_FOUR_VERDICTS = """
from core.webhooks import WebhookRefused, check_url
for host in ("2002:5db8:d822::1", "2002:a9fe:a9fe::", "2002:0a00:0001::"):
    try:
        print(host, check_url(f"https://[{host}]/h", allow_loopback=False, max_chars=2048).host == host)
    except WebhookRefused as refused:
        print(host, refused.code)
"""


def test_6to4_verdicts_do_not_depend_on_the_python_that_runs_them():
    # The image runs Debian's python3.11 (3.11.2), whose ipaddress counts all of 2002::/16 as private: there a
    # webhook to the 6to4 address of a public IPv4 address was refused, where the tests' Python took it.
    pythons = [sys.executable] + [p for p in ("/usr/bin/python3.11",) if Path(p).exists()]
    verdicts = {python: subprocess.run([python, "-c", SIX_TO_FOUR_VERDICTS], capture_output=True, text=True,
                                       timeout=60, cwd=PROJECT_ROOT, env={"PYTHONPATH": str(PROJECT_ROOT)})
                for python in pythons}
    for python, done in verdicts.items():
        assert done.returncode == 0, (python, done.stderr)
        assert done.stdout.split() == ["2002:5db8:d822::1", "True", "2002:a9fe:a9fe::", "webhook_address_refused",
                                       "2002:0a00:0001::", "webhook_address_refused"], (python, done.stdout)


@pytest.mark.parametrize("url, code", [
    ("http://example.com/h", "webhook_https_required"), ("http://127.0.0.1:9/h", "webhook_https_required"),
    ("https://user:pw@example.com/h", "webhook_url_invalid"), ("file:///etc/passwd", "webhook_url_invalid"),
    ("https://example.com:99999/", "webhook_url_invalid"), ("https://" + "a" * 3000, "webhook_url_invalid"),
])
def test_only_https_urls_with_a_host_are_taken(url, code):
    with pytest.raises(WebhookRefused) as refused:
        check_url(url, allow_loopback=False, max_chars=2048)
    assert refused.value.code == code


def test_loopback_over_http_is_taken_only_behind_the_setting_which_live_keys_refuse():
    target = check_url("http://127.0.0.1:8/h?x=1", allow_loopback=True, max_chars=2048)
    assert (target.port, target.path_and_query) == (8, "/h?x=1")
    with pytest.raises(ValidationError, match="SPECIALISTS_PUSH_ALLOW_LOOPBACK"):
        Settings(push={"allow_loopback": True}, keys={"environment": "live"})


def test_every_answer_of_the_resolver_must_pass_not_only_the_first():
    target = check_url("https://mixed.example/h", allow_loopback=False, max_chars=2048)
    assert str(resolve_checked(target, allow_loopback=False, timeout_s=1,
                               resolver=lambda host, port: ["93.184.216.34"])) == "93.184.216.34"
    with pytest.raises(WebhookRefused, match="10.1.1.1 is a private address"):
        resolve_checked(target, allow_loopback=False, timeout_s=1, resolver=lambda h, p: ["93.184.216.34", "10.1.1.1"])
    with pytest.raises(WebhookRefused) as unresolved:
        resolve_checked(target, allow_loopback=False, timeout_s=1, resolver=lambda h, p: (_ for _ in ()).throw(OSError()))
    assert unresolved.value.code == "webhook_unresolved"


def test_a_rotation_signs_with_the_newest_key_and_publishes_every_key():
    old, new = SecretStr("o" * 40), SecretStr("n" * 40)
    before = PushSigner([old], issuer="https://x", lifetime_s=60)
    during = PushSigner([new, old], issuer="https://x", lifetime_s=60)
    token_before = before.sign(audience="https://hook", task_id="t", event_id="1", body=b"{}")
    token_during = during.sign(audience="https://hook", task_id="t", event_id="2", body=b"{}")
    assert [k["kid"] for k in during.jwks()["keys"]] == [during.keys[0].kid, before.keys[0].kid]
    assert verify(token_before, during.jwks())["event_id"] == "1"  # a JWT signed before the rotation still verifies
    assert verify(token_during, during.jwks())["event_id"] == "2"
    with pytest.raises(ValueError, match="kid"):
        verify(token_during, before.jwks())  # the old JWKS does not know the new key
    header, claims, signature = token_during.split(".")
    forged = PushSigner([SecretStr("f" * 40)], issuer="https://x", lifetime_s=60).sign(
        audience="https://hook", task_id="other", event_id="2", body=b"{}").split(".")[1]
    with pytest.raises(InvalidSignature):
        verify(f"{header}.{forged}.{signature}", during.jwks())
