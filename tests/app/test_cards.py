"""Discovery: one Agent Card per specialist, the specialist list, and HTTP caching (ETag, Last-Modified, 304, HEAD)."""

from __future__ import annotations

from email.utils import format_datetime, parsedate_to_datetime

import pytest

from tests import http_calls
from tests.app.conftest import PAID, PAID_TARIFF

pytestmark = pytest.mark.timeout(30, func_only=True)
CARD = "/.well-known/agent-card.json"


def test_the_specialist_list_links_every_card(edge_a):
    answer = http_calls.get(f"{edge_a.url}/specialists")
    assert answer.status_code == 200
    listed = {s["id"]: s for s in answer.json()["specialists"]}
    assert set(listed) == {"conformance", PAID}
    assert listed[PAID]["card_url"] == f"{edge_a.specialist(PAID)}{CARD}"
    assert listed[PAID]["tariff_credits"] == PAID_TARIFF
    assert http_calls.get(listed["conformance"]["card_url"]).status_code == 200


def test_a_card_lists_skill_modes_tariff_limits_security_and_both_bindings(edge_a):
    card = http_calls.get(f"{edge_a.specialist(PAID)}{CARD}").json()
    assert [s["id"] for s in card["skills"]] == ["echo"]
    assert card["defaultInputModes"] == ["text/plain"]
    interfaces = {(i["protocolBinding"], i["protocolVersion"]): i["url"] for i in card["supportedInterfaces"]}
    assert interfaces[("JSONRPC", "1.0")] == f"{edge_a.specialist(PAID)}/jsonrpc"
    assert interfaces[("HTTP+JSON", "1.0")] == edge_a.specialist(PAID)
    assert ("JSONRPC", "0.3") in interfaces
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert card["securityRequirements"] == [{"schemes": {"bearer": {}}}]
    params = card["capabilities"]["extensions"][0]["params"]
    assert params["tariffCredits"] == PAID_TARIFF
    assert params["maxInputBytes"] == 1024
    assert params["creditCeilingMetadataKey"] == "credit_ceiling"
    assert card["capabilities"]["streaming"] is True
    assert card["capabilities"]["extendedAgentCard"] is True


def test_a_card_carries_validators_and_a_cache_lifetime(edge_a):
    answer = http_calls.get(f"{edge_a.specialist(PAID)}{CARD}")
    assert answer.headers["etag"].startswith('"')
    assert answer.headers["cache-control"] == "public, max-age=300"
    assert parsedate_to_datetime(answer.headers["last-modified"]).tzinfo is not None


def test_if_none_match_answers_304_without_a_body(edge_a):
    url = f"{edge_a.specialist(PAID)}{CARD}"
    etag = http_calls.get(url).headers["etag"]
    for presented in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        answer = http_calls.get(url, headers={"If-None-Match": presented})
        assert answer.status_code == 304, presented
        assert answer.content == b""
        assert answer.headers["etag"] == etag
    assert http_calls.get(url, headers={"If-None-Match": '"stale"'}).status_code == 200


def test_if_modified_since_answers_304_for_an_unchanged_card(edge_a):
    url = f"{edge_a.specialist(PAID)}{CARD}"
    last_modified = parsedate_to_datetime(http_calls.get(url).headers["last-modified"])
    assert http_calls.get(url, headers={"If-Modified-Since": format_datetime(last_modified, usegmt=True)}).status_code == 304
    earlier = last_modified.replace(year=last_modified.year - 1)
    assert http_calls.get(url, headers={"If-Modified-Since": format_datetime(earlier, usegmt=True)}).status_code == 200


def test_head_answers_the_headers_of_get_without_the_body(edge_a):
    url = f"{edge_a.specialist(PAID)}{CARD}"
    got = http_calls.get(url)
    head = http_calls.head(url)
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["etag"] == got.headers["etag"]
    assert int(head.headers["content-length"]) == len(got.content)
    assert http_calls.head(f"{edge_a.url}/specialists").status_code == 200


def test_two_instances_serve_the_same_card_with_the_same_validators(edge_a, edge_b):
    a = http_calls.get(f"{edge_a.specialist(PAID)}{CARD}")
    b = http_calls.get(f"{edge_b.specialist(PAID)}{CARD}")
    assert a.headers["last-modified"] == b.headers["last-modified"]
    # The card names its own instance's URL, so the bodies differ only there.
    assert a.json()["name"] == b.json()["name"]


def test_the_authenticated_extended_card_shows_the_callers_available_credits(edge_a, make_customer):
    customer = make_customer(credits=42)
    answer = http_calls.get(f"{edge_a.specialist(PAID)}/extendedAgentCard", headers=customer.headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["capabilities"]["extensions"][0]["params"]["availableCredits"] == 42


def test_the_extended_card_needs_a_key(edge_a):
    answer = http_calls.get(f"{edge_a.specialist(PAID)}/extendedAgentCard", headers={"A2A-Version": "1.0"})
    assert answer.status_code == 401
