"""The gRPC binding as a stock client meets it: the card's URL alone reaches the specialist, an unsupported
``a2a-version`` is refused, and a stream the client cancels half-way ends without an error in the edge's log.

A raw ``grpc.aio`` stub, as the conformance kit uses one: it dials the card's first GRPC interface and sends no
``tenant``. The edges are tests/app/conftest.py's, each with the shared gRPC port (tenant routing) and the
conformance specialist's own listener (SPECIALISTS_GRPC_SPECIALIST_PORTS).
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import httpx
import pytest
from a2a.types import a2a_pb2_grpc
from a2a.types.a2a_pb2 import GetTaskRequest, SendMessageRequest
from a2a.utils.grpc_status import status_from_call
from google.protobuf.json_format import ParseDict
from google.rpc import error_details_pb2

from tests.app.conftest import PAID, message
from tests.rlm.holds import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120, func_only=True)]
CONFORMANCE = "conformance"
WAIT_S = 30.0


def grpc_interfaces(edge, specialist: str) -> list[dict]:
    card = httpx.get(f"{edge.specialist(specialist)}/.well-known/agent-card.json", timeout=30).json()
    return [i for i in card["supportedInterfaces"] if i["protocolBinding"] == "GRPC"]


def send_request(tenant: str = "", **configuration: object) -> SendMessageRequest:
    request = ParseDict(message(**configuration), SendMessageRequest())
    request.tenant = tenant
    return request


def metadata(customer, version: str = "1.0") -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {customer.key}"), ("a2a-version", version))


def refusal(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, str]:
    """The status, the ErrorInfo reason and its code of a refused call."""
    status = status_from_call(error)
    info = error_details_pb2.ErrorInfo()
    assert status is not None and status.details[0].Unpack(info), error
    return error.code(), info.reason, info.metadata.get("code", "")


async def test_a_client_that_follows_only_the_cards_grpc_url_reaches_the_specialist_without_a_tenant(
    edge_alone, make_customer
):
    customer = make_customer()
    own, shared = grpc_interfaces(edge_alone, CONFORMANCE)
    assert own == {"url": edge_alone.conformance_grpc_address, "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    assert (shared["url"], shared["tenant"]) == (edge_alone.grpc_address, CONFORMANCE)  # tenant routing stays
    async with grpc.aio.insecure_channel(own["url"]) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        sent = await stub.SendMessage(send_request(returnImmediately=True), metadata=metadata(customer), timeout=WAIT_S)
        again = await stub.GetTask(GetTaskRequest(id=sent.task.id), metadata=metadata(customer), timeout=WAIT_S)
        assert again.id == sent.task.id
        # The tenant a client copies from the shared interface names the same specialist: served too.
        named = await stub.GetTask(GetTaskRequest(id=sent.task.id, tenant=CONFORMANCE), metadata=metadata(customer),
                                   timeout=WAIT_S)
        assert named.id == sent.task.id
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # another specialist's tenant is not served here
            await stub.GetTask(GetTaskRequest(id=sent.task.id, tenant=PAID), metadata=metadata(customer),
                               timeout=WAIT_S)
        assert refusal(refused.value)[0] == grpc.StatusCode.NOT_FOUND
        assert CONFORMANCE in refused.value.details() and PAID in refused.value.details()
    async with grpc.aio.insecure_channel(shared["url"]) as channel:
        task = await a2a_pb2_grpc.A2AServiceStub(channel).GetTask(
            GetTaskRequest(id=sent.task.id, tenant=shared["tenant"]), metadata=metadata(customer), timeout=WAIT_S)
        assert task.id == sent.task.id
    # A specialist without a listener of its own keeps the one shared interface, with its tenant.
    assert [(i["url"], i.get("tenant")) for i in grpc_interfaces(edge_alone, PAID)] == [(edge_alone.grpc_address, PAID)]


async def test_an_unsupported_a2a_version_is_refused_over_grpc_with_unimplemented(edge_alone, make_customer):
    """Section 5.4 of the spec the kit bundles: VersionNotSupportedError is UNIMPLEMENTED over gRPC."""
    customer = make_customer()
    async with grpc.aio.insecure_channel(edge_alone.conformance_grpc_address) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        for version in ("99.0", "0.3", "one"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SendMessage(send_request(returnImmediately=True), metadata=metadata(customer, version),
                                       timeout=WAIT_S)
            assert refusal(refused.value)[:2] == (grpc.StatusCode.UNIMPLEMENTED, "VERSION_NOT_SUPPORTED"), version
        for version in ("1.0", "1.0.2"):  # the patch is not negotiated
            sent = await stub.SendMessage(send_request(returnImmediately=True), metadata=metadata(customer, version),
                                          timeout=WAIT_S)
            assert sent.task.id


async def test_a_stream_the_client_cancels_half_way_ends_without_an_error_in_the_log(edge_alone, make_customer):
    """A stream closed by its client is finished by grpc.aio outside the call's own context: the binding's
    per-call log must not trip over that (it logged 'Task exception was never retrieved ... ContextVar')."""
    customer = make_customer(credits=50)
    before = len(edge_alone.log_text())
    async with grpc.aio.insecure_channel(edge_alone.grpc_address) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        call = stub.SendStreamingMessage(send_request(tenant=PAID), metadata=metadata(customer), timeout=WAIT_S)
        first = await call.read()  # the task; the edge alone runs nothing, so the stream then waits
        assert first.task.id

        async def cancel() -> None:
            call.cancel()

        await asyncio.create_task(cancel())
        with pytest.raises(asyncio.CancelledError):
            await call.read()
    # The edge is a process of its own: nothing here needs this loop while its log is read.
    wait_until(lambda: '"status": "CANCELLED"' in edge_alone.log_text()[before:],
               "the edge's access line of the cancelled stream (status CANCELLED)", limit_s=WAIT_S)
    log = edge_alone.log_text()[before:]
    assert "was created in a different Context" not in log and "never retrieved" not in log, log
