"""Discovery: one Agent Card per specialist, the specialist list, and HTTP caching (ETag, Last-Modified, 304, HEAD).

The published card is the A2A 1.0 card and nothing else: ``tests/app/a2a_schema.py`` checks
it strictly against the schema of the SDK's compiled ``a2a.proto``. 0.3 clients have
their own document, ``agent-card-0.3.json``.
"""

from __future__ import annotations

from email.utils import format_datetime, parsedate_to_datetime

import pytest
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import AgentCard
from google.protobuf.json_format import ParseDict

from app.cards import build_card, card_document
from core.settings import Settings
from core.specs import load_specs
from tests import http_calls
from tests.app.a2a_schema import problems
from tests.app.conftest import PAID, PAID_TARIFF, rpc

pytestmark = pytest.mark.timeout(30, func_only=True)
CARD = "/.well-known/agent-card.json"
CARD_V03 = "/.well-known/agent-card-0.3.json"
# What the a2a-sdk's agent_card_to_dict merged into the 1.0 card from a 0.3 one (the TCK's CARD-STRUCT-001 failure).
V03_TOP_LEVEL = {"url", "preferredTransport", "protocolVersion", "security", "supportsAuthenticatedExtendedCard"}


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


# --- the A2A 1.0 schema ---------------------------------------------------------------------


def test_every_served_card_is_a_valid_a2a_1_0_card(edge_a):
    listed = http_calls.get(f"{edge_a.url}/specialists").json()["specialists"]
    for entry in listed:
        card = http_calls.get(entry["card_url"]).json()
        assert problems(card, AgentCard) == [], entry["id"]
        assert not V03_TOP_LEVEL & set(card), entry["id"]


def test_every_shipped_specs_card_is_a_valid_a2a_1_0_card():
    settings = Settings()
    specs = load_specs(settings.hosted.specs_dir)
    assert specs
    for specialist_id, loaded in specs.items():
        assert problems(card_document(build_card(loaded, settings)), AgentCard) == [], specialist_id


def test_the_extended_card_is_a_valid_a2a_1_0_card_on_both_bindings(edge_a, make_customer):
    customer = make_customer(credits=7)
    rest = http_calls.get(f"{edge_a.specialist(PAID)}/extendedAgentCard", headers=customer.headers).json()
    over_rpc = http_calls.post(f"{edge_a.specialist(PAID)}/jsonrpc", json=rpc("GetExtendedAgentCard", {}),
                               headers=customer.headers).json()["result"]
    for card in (rest, over_rpc):
        assert problems(card, AgentCard) == []
        assert card["capabilities"]["extensions"][0]["params"]["availableCredits"] == 7


def test_the_checker_refuses_the_card_the_sdk_merged_with_0_3_fields(edge_a):
    # The form served before: agent_card_to_dict adds the 0.3 card's fields because the card lists a 0.3 interface.
    served = http_calls.get(f"{edge_a.specialist(PAID)}{CARD}").json()
    merged = agent_card_to_dict(build_card_from(served))
    found = problems(merged, AgentCard)
    for name in V03_TOP_LEVEL:
        assert any(f"'{name}' is not a field of lf.a2a.v1.AgentCard" in problem for problem in found), (name, found)
    assert any(problem.startswith("$.securitySchemes.bearer:") for problem in found), found


def test_the_checker_refuses_missing_required_fields_wrong_types_and_unknown_enum_names(edge_a):
    card = http_calls.get(f"{edge_a.specialist(PAID)}{CARD}").json()
    broken = dict(card, capabilities={"streaming": "yes"}, skills=[{"id": "x", "name": "x", "description": "x"}])
    del broken["version"]
    broken["supportedInterfaces"] = [{"url": "u", "protocolBinding": "JSONRPC"}]
    broken["securitySchemes"] = {"k": {"apiKeySecurityScheme": {"name": "n"}, "mtlsSecurityScheme": {}}}
    found = "\n".join(problems(broken, AgentCard))
    assert "required field 'version' of lf.a2a.v1.AgentCard is missing" in found
    assert "$.capabilities.streaming: expected a boolean" in found
    assert "required field 'tags' of lf.a2a.v1.AgentSkill is missing" in found
    assert "required field 'protocolVersion' of lf.a2a.v1.AgentInterface is missing" in found
    assert "$.securitySchemes.k: only one of" in found


def build_card_from(document: dict) -> AgentCard:
    return ParseDict(document, AgentCard())


# --- 0.3 clients ------------------------------------------------------------------------------


def test_0_3_clients_find_the_json_rpc_endpoint_in_the_0_3_card(edge_a):
    listed = {s["id"]: s for s in http_calls.get(f"{edge_a.url}/specialists").json()["specialists"]}
    assert listed[PAID]["card_v03_url"] == f"{edge_a.specialist(PAID)}{CARD_V03}"
    card = http_calls.get(listed[PAID]["card_v03_url"]).json()
    assert card["url"] == f"{edge_a.specialist(PAID)}/jsonrpc"
    assert (card["preferredTransport"], card["protocolVersion"]) == ("JSONRPC", "0.3")
    assert card["supportsAuthenticatedExtendedCard"] is True
    assert card["security"] == [{"bearer": []}]
    assert card["securitySchemes"]["bearer"]["scheme"] == "Bearer"
    assert card["capabilities"]["extensions"][0]["params"]["tariffCredits"] == PAID_TARIFF
    assert "supportedInterfaces" not in card


def test_a_0_3_client_is_served_on_the_endpoint_its_card_names(edge_a, make_customer):
    customer = make_customer()
    card = http_calls.get(f"{edge_a.specialist('conformance')}{CARD_V03}").json()
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "kind": "message", "messageId": "tck-complete-task-v03-card", "role": "user",
        "parts": [{"kind": "text", "text": "hello"}]}}}
    # No A2A-Version header: a 0.3 request (A2A 1.0 section 3.6.2).
    answer = http_calls.post(card["url"], json=body, headers={"Authorization": customer.headers["Authorization"]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["kind"] == "task"
