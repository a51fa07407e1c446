"""The call context the gRPC binding gives the SDK: built from a real gRPC call's metadata, as HTTP's from headers.

A real ``grpc.aio`` server on 127.0.0.1 whose one method answers what
``EdgeGrpcContextBuilder`` made of the call: the metadata less credentials, keys
in lower case (what admission reads ``idempotency-key`` from), and the caller.
"""

from __future__ import annotations

import json

import grpc
import grpc.aio
import pytest

from app import grpc_binding
from app.grpc_binding import EdgeGrpcContextBuilder
from app.identity import Identity

pytestmark = pytest.mark.anyio

METHOD = "/test.Context/Build"


async def _build(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    grpc_binding._caller.set(grpc_binding._Caller(Identity("c-1", "k-1", "standard", "127.0.0.1"), "conformance"))
    built = EdgeGrpcContextBuilder().build(context)
    return json.dumps({"headers": built.state["headers"], "user": built.user.user_name,
                       "extensions": sorted(built.requested_extensions)}).encode()


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
