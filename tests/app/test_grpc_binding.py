"""The gRPC binding's parts that need no database: the call context it gives the SDK, its settings, the cards.

The call context is built from a real gRPC call's metadata, as HTTP's from headers:
a real ``grpc.aio`` server on 127.0.0.1 whose one method answers what
``EdgeGrpcContextBuilder`` made of the call (the metadata less credentials, keys in
lower case: what admission reads ``idempotency-key`` from; and the caller). The
binding through the whole pipeline is tests/workers/test_grpc.py.
"""

from __future__ import annotations

import contextvars
import json

import grpc
import grpc.aio
import pytest
from pydantic import ValidationError

from app import grpc_binding
from app.assembly import EdgeNotConfigured, create_app
from app.cards import build_card
from app.grpc_binding import EdgeGrpcContextBuilder
from app.identity import Identity
from app.observability import Metrics
from core.settings import PROJECT_ROOT, EdgeSettings, Settings
from core.specs import load_specs

METHOD = "/test.Context/Build"


async def _build(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    grpc_binding._caller.set(grpc_binding._Caller(Identity("c-1", "k-1", "standard", "127.0.0.1"), "conformance"))
    built = EdgeGrpcContextBuilder().build(context)
    return json.dumps({"headers": built.state["headers"], "user": built.user.user_name,
                       "extensions": sorted(built.requested_extensions)}).encode()


@pytest.mark.anyio
async def test_the_metadata_less_credentials_is_the_contexts_headers_in_lower_case():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Context", {"Build": grpc.unary_unary_rpc_method_handler(_build)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(METHOD)
            answer = json.loads(await call(b"", timeout=10, metadata=(
                ("authorization", "Bearer sk_test_secret"),
                ("idempotency-key", "order-42"),
                ("a2a-version", "1.0"),
                ("a2a-extensions", "urn:x:one, urn:x:two"),
                ("trace-bin", b"\x00\x01"),
            )))
    finally:
        await server.stop(None)
    headers = answer["headers"]
    assert headers["idempotency-key"] == "order-42" and headers["a2a-version"] == "1.0"
    assert "authorization" not in headers and "sk_test_secret" not in json.dumps(answer)
    assert "trace-bin" not in headers  # binary metadata is not text
    assert all(key == key.lower() for key in headers)
    assert answer["user"] == "c-1:conformance"
    assert answer["extensions"] == ["urn:x:one", "urn:x:two"]


async def _close_elsewhere(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """What asyncio does to a stream whose client went away: its generator is finalised in another task, so the
    call's log is closed in another context than the one it opened in."""
    metrics = Metrics()
    call = grpc_binding._CallLog(metrics, "SendStreamingMessage", context)
    call.__enter__()
    contextvars.copy_context().run(call.__exit__, GeneratorExit, GeneratorExit(), None)
    counted = metrics.requests.labels(operation="grpc_SendStreamingMessage", status="CANCELLED")._value.get()
    return json.dumps({"cancelled_counted": counted}).encode()


@pytest.mark.anyio
async def test_a_call_log_closed_in_another_context_counts_the_call_cancelled_and_raises_nothing():
    """It raised 'ValueError: <Token ...> was created in a different Context', which asyncio then logged as
    'Task exception was never retrieved' (issue 43)."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Log", {"Close": grpc.unary_unary_rpc_method_handler(_close_elsewhere)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = json.loads(await channel.unary_unary("/test.Log/Close")(b"", timeout=10))
    finally:
        await server.stop(None)
    assert answer == {"cancelled_counted": 1.0}


# --- the setting and the cards --------------------------------------------------------------------------


def edge_settings(**fields: object) -> EdgeSettings:
    return EdgeSettings(**{"port": 8080, "public_url": None, "grpc_port": 0, "grpc_public_url": None, **fields})


def grpc_interfaces(settings: EdgeSettings) -> list[tuple[str, str, str]]:
    loaded = load_specs(PROJECT_ROOT / "specs")["conformance"]
    card = build_card(loaded, Settings(edge=settings.model_dump()))
    return [(i.url, i.tenant, i.protocol_version) for i in card.supported_interfaces if i.protocol_binding == "GRPC"]


def test_grpc_is_off_by_default_and_the_cards_then_list_no_grpc_interface():
    settings = edge_settings()
    assert settings.grpc_url is None and grpc_interfaces(settings) == []


def test_a_grpc_port_puts_the_local_address_with_the_specialist_as_tenant_on_the_card():
    assert grpc_interfaces(edge_settings(grpc_port=50051)) == [("127.0.0.1:50051", "conformance", "1.0")]


def test_a_public_grpc_url_is_named_even_by_an_edge_that_does_not_serve_grpc():
    settings = edge_settings(grpc_public_url="specialists-grpc-1.europe-west1.run.app:443")
    assert grpc_interfaces(settings) == [("specialists-grpc-1.europe-west1.run.app:443", "conformance", "1.0")]


def test_the_grpc_port_must_be_its_own_and_the_public_url_a_host_and_port():
    with pytest.raises(ValidationError, match="SPECIALISTS_GRPC_PORT .*SPECIALISTS_EDGE_PORT"):
        edge_settings(grpc_port=8080)
    with pytest.raises(ValidationError, match="(?i)grpc_public_url"):
        edge_settings(grpc_public_url="https://grpc.example.com")


def test_a_specialist_with_a_grpc_port_of_its_own_is_named_first_on_its_card_without_a_tenant():
    settings = edge_settings(grpc_port=50051, grpc_specialist_ports={"conformance": 50052})
    assert grpc_interfaces(settings) == [("127.0.0.1:50052", "", "1.0"), ("127.0.0.1:50051", "conformance", "1.0")]
    public = edge_settings(grpc_specialist_urls={"conformance": "conformance-grpc.example.com:443"})
    assert grpc_interfaces(public) == [("conformance-grpc.example.com:443", "", "1.0")]


def test_a_specialists_grpc_port_must_be_its_own_and_its_url_a_host_and_port():
    with pytest.raises(ValidationError, match="SPECIALISTS_GRPC_SPECIALIST_PORTS .*SPECIALISTS_GRPC_PORT"):
        edge_settings(grpc_port=50051, grpc_specialist_ports={"conformance": 50051})
    with pytest.raises(ValidationError, match=r"gives 'b' port 50052, which SPECIALISTS_GRPC_SPECIALIST_PORTS \('a'\) has"):
        edge_settings(grpc_specialist_ports={"a": 50052, "b": 50052})
    with pytest.raises(ValidationError, match="SPECIALISTS_GRPC_SPECIALIST_URLS .*host:port"):
        edge_settings(grpc_specialist_urls={"conformance": "https://grpc.example.com"})


def test_the_edge_refuses_to_start_with_a_grpc_port_or_url_for_a_specialist_it_does_not_serve():
    for field in ({"grpc_specialist_ports": {"nobody": 50052}}, {"grpc_specialist_urls": {"nobody": "h:443"}}):
        settings = Settings(edge=edge_settings(**field).model_dump())
        with pytest.raises(EdgeNotConfigured, match="SPECIALISTS_GRPC_SPECIALIST_.* names nobody"):
            create_app(settings, database_url="postgresql://nobody@127.0.0.1:1/none")  # refused before connecting
