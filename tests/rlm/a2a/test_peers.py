"""The peers file: peers are configured explicitly; secrets, credentials in URLs and unsafe URLs are refused at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmfamily.a2a.errors import PeersFileInvalid, PeerNotFound
from rlmfamily.a2a.peers import load_peers, origin_of

pytestmark = pytest.mark.timeout(30)

GOOD = """
[[peers]]
alias = "review"
url = "https://specialists.example.com/specialists/review/"
description = "Reviews a diff"
skill = "code-review"
credential_env = "REVIEW_API_KEY"
tariff_credits = 5
max_tasks = 3
max_concurrent = 2
max_payload_bytes = 100000
max_result_bytes = 200000
deadline_s = 600

[[peers]]
alias = "local-echo"
url = "http://127.0.0.1:8123"
"""


def write(tmp_path: Path, text: str, name: str = "peers.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_peers_file_in_toml_or_json_gives_every_field_and_limit(tmp_path: Path) -> None:
    peers = load_peers(write(tmp_path, GOOD))
    review = peers.get("review")
    assert review.url == "https://specialists.example.com/specialists/review"
    assert review.card_url == "https://specialists.example.com/specialists/review/.well-known/agent-card.json"
    assert (review.skill, review.credential_env, review.tariff_credits, review.paid) == (
        "code-review", "REVIEW_API_KEY", 5, True)
    assert (review.max_tasks, review.max_concurrent, review.max_payload_bytes, review.max_result_bytes,
            review.deadline_s) == (3, 2, 100_000, 200_000, 600)
    free = peers.get("local-echo")
    assert not free.paid and free.credential_env is None
    as_json = write(tmp_path, json.dumps({"peers": [{"alias": "a", "url": "https://a.example"}]}), "peers.json")
    assert load_peers(as_json).get("a").origin == "https://a.example:443"
    assert peers.credential_names() == {"REVIEW_API_KEY"}


def test_a_peer_may_name_one_of_the_two_http_bindings_and_nothing_else(tmp_path: Path) -> None:
    base = '[[peers]]\nalias = "x"\nurl = "https://x.example"\n'
    assert load_peers(write(tmp_path, base)).get("x").binding is None  # the card decides, JSON-RPC first
    for binding in ("JSONRPC", "HTTP+JSON"):
        assert load_peers(write(tmp_path, base + f'binding = "{binding}"\n')).get("x").binding == binding
    with pytest.raises(PeersFileInvalid) as caught:
        load_peers(write(tmp_path, base + 'binding = "GRPC"\n'))
    assert "binding" in caught.value.message and "'JSONRPC' or 'HTTP+JSON'" in caught.value.message


def test_the_model_sees_peers_without_urls_or_key_variable_names(tmp_path: Path) -> None:
    public = load_peers(write(tmp_path, GOOD)).get("review").public()
    assert "url" not in public and "credential_env" not in public
    assert "REVIEW_API_KEY" not in json.dumps(public) and "example.com" not in json.dumps(public)


@pytest.mark.parametrize("field", ["api_key", "token", "secret", "password", "authorization", "key"])
def test_an_inline_secret_is_refused_with_advice_to_name_a_variable(tmp_path: Path, field: str) -> None:
    path = write(tmp_path, f'[[peers]]\nalias = "x"\nurl = "https://x.example"\n{field} = "sk_live_abc.def"\n')
    with pytest.raises(PeersFileInvalid) as caught:
        load_peers(path)
    assert caught.value.code == "peers_file_invalid" and caught.value.setting == "a2a_peers_file"
    assert "inline secret" in caught.value.message and "credential_env" in caught.value.message
    assert "sk_live_abc" not in caught.value.message


@pytest.mark.parametrize(("url", "why"), [
    ("https://user:pw@x.example/agent", "credentials"),
    ("https://x.example/agent?api_key=sk_live_1", "query string"),
    ("https://x.example/agent?", "query string"),
    ("https://x.example/agent#frag", "fragment"),
    ("http://x.example/agent", "loopback"),
    ("ftp://x.example/agent", "http(s)"),
    ("x.example/agent", "http(s)"),
])
def test_a_url_with_credentials_a_query_or_plain_http_off_loopback_is_refused(tmp_path: Path, url: str,
                                                                               why: str) -> None:
    with pytest.raises(PeersFileInvalid) as caught:
        load_peers(write(tmp_path, f'[[peers]]\nalias = "x"\nurl = "{url}"\n'))
    assert why in caught.value.message
    assert "sk_live_1" not in caught.value.message and "pw" not in caught.value.message


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:8000/a\\tb", "'\\t' at position 23"),
    ("http://127.0.\\n0.1:8000/", "'\\n' at position 13"),
    ("http://127.0.0.1:8000/a b", "' ' at position 23"),
    ("http://127.0.0.1:8000/\\u0000", "'\\x00' at position 22"),
])
def test_a_url_with_a_tab_or_another_character_httpx_refuses_is_refused_naming_the_peer(tmp_path: Path, url: str,
                                                                                       why: str) -> None:
    # Issue 15: urlsplit drops tabs and newlines, so such a URL passed, and every call failed in httpx later.
    with pytest.raises(PeersFileInvalid) as caught:
        load_peers(write(tmp_path, f'[[peers]]\nalias = "tabbed"\nurl = "{url}"\n'))
    assert "'tabbed'" in caught.value.message and why in caught.value.message
    assert caught.value.setting == "a2a_peers_file"


@pytest.mark.parametrize(("extra", "why"), [
    ('credential_env = "sk_live_abc123"', "NAME of an environment variable"),
    ('tariff_credits = 3\ncredential_env = "K"', "needs a skill and a credential_env"),
    ('tariff_credits = 3\nskill = "s"', "needs a skill and a credential_env"),
    ('max_payload_bytes = 10', "max_payload_bytes"),
    ('surprise = 1', "surprise"),
    ('alias2 = "y"', "alias2"),
])
def test_a_key_pasted_as_a_variable_name_a_paid_peer_without_skill_or_key_and_unknown_fields_are_refused(
        tmp_path: Path, extra: str, why: str) -> None:
    with pytest.raises(PeersFileInvalid) as caught:
        load_peers(write(tmp_path, f'[[peers]]\nalias = "x"\nurl = "https://x.example"\n{extra}\n'))
    assert why in caught.value.message


def test_duplicate_aliases_and_unknown_peers_are_named(tmp_path: Path) -> None:
    twice = '[[peers]]\nalias = "x"\nurl = "https://x.example"\n' * 2
    with pytest.raises(PeersFileInvalid, match="alias used twice: x"):
        load_peers(write(tmp_path, twice))
    with pytest.raises(PeerNotFound, match="configured peers: review, local-echo"):
        load_peers(write(tmp_path, GOOD)).get("nobody")


def test_origins_make_default_ports_explicit() -> None:
    assert origin_of("https://A.example/x") == origin_of("https://a.example:443/y") == "https://a.example:443"
    assert origin_of("http://127.0.0.1:8000/x") != origin_of("http://127.0.0.1:8001/x")
    assert origin_of("http://[::1]:80/") == "http://[::1]:80"
