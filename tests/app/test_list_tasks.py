"""ListTasks through the a2a-sdk client over real HTTP (and gRPC) on 127.0.0.1: the edge's own listing (issue 18).

A customer's tasks are written in the store's format by their owner module (``rows.insert_new``), with the
timestamps a test needs: ties, and tasks without a status timestamp (the SDK's conformance executor writes
those). Nothing runs them (``edge_alone`` has no worker), so their order does not move while a test pages.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import grpc
import grpc.aio
import httpx
import pytest
from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types.a2a_pb2 import (
    Artifact,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import InvalidParamsError
from a2a.utils.task import ListTasksCursor, encode_list_tasks_cursor
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import Engine

from taskstate import rows
from tests.app.conftest import Customer

pytestmark = [pytest.mark.timeout(120, func_only=True), pytest.mark.anyio]
CONFORMANCE = "conformance"
BINDINGS = ["JSONRPC", "HTTP+JSON", "GRPC"]
START = datetime(2025, 3, 1, 12, 0, 0)


@dataclass(frozen=True)
class Seeded:
    id: str
    context_id: str
    state: int
    last_updated: datetime | None

    def key(self) -> tuple[bool, datetime, str]:
        """The listing's order, descending: timestamped first, newest first, then id."""
        return (self.last_updated is not None, self.last_updated or datetime.min, self.id)


def seed(engine: Engine, customer: Customer, count: int, *, without_timestamp: int = 0,
         contexts: list[str] | None = None, states: list[int] | None = None) -> list[Seeded]:
    """``count`` tasks of the customer on the conformance specialist; every third shares its timestamp with the
    previous one (the id decides between them), and the last ``without_timestamp`` have none."""
    contexts = contexts or [str(uuid.uuid4())]
    states = states or [TaskState.TASK_STATE_COMPLETED]
    owner = f"{customer.customer_id}:{CONFORMANCE}"
    seeded = []
    with engine.begin() as conn:
        for n in range(count):
            moment = None if n >= count - without_timestamp else START + timedelta(seconds=n - n % 3 // 2)
            status = TaskStatus(state=states[n % len(states)])
            if moment is not None:
                status.timestamp.FromDatetime(moment.replace(tzinfo=timezone.utc))
            task = Task(id=str(uuid.uuid4()), context_id=contexts[n % len(contexts)], status=status)
            task.history.append(Message(message_id=f"m-{n}-a", role=Role.ROLE_USER, parts=[Part(text="first")]))
            task.history.append(Message(message_id=f"m-{n}-b", role=Role.ROLE_AGENT, parts=[Part(text="second")]))
            task.artifacts.append(Artifact(artifact_id=f"a-{n}", parts=[Part(text="result")]))
            rows.insert_new(conn, task, owner)
            seeded.append(Seeded(task.id, task.context_id, task.status.state, moment))
    return sorted(seeded, key=Seeded.key, reverse=True)


class Lister:
    """The a2a-sdk client of one customer on one binding, as a customer builds it from the card."""

    def __init__(self, edge, customer: Customer, binding: str) -> None:
        self.edge, self.customer, self.binding = edge, customer, binding

    async def __aenter__(self) -> Lister:
        self.http = httpx.AsyncClient(headers={"Authorization": f"Bearer {self.customer.key}"}, timeout=30)
        card = await A2ACardResolver(self.http, self.edge.specialist(CONFORMANCE)).get_agent_card()
        config = ClientConfig(httpx_client=self.http, supported_protocol_bindings=[self.binding],
                              grpc_channel_factory=grpc.aio.insecure_channel)
        self.client = ClientFactory(config).create(card)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.http.aclose()

    async def list(self, **fields: object) -> ListTasksResponse:
        context = ClientCallContext(service_parameters={"authorization": f"Bearer {self.customer.key}"}, timeout=30)
        return await self.client.list_tasks(ListTasksRequest(**fields), context=context)

    async def every_page(self, **fields: object) -> list[ListTasksResponse]:
        pages = [await self.list(**fields)]
        while pages[-1].next_page_token:
            assert len(pages) < 1000, "the listing never ended"
            pages.append(await self.list(**fields, page_token=pages[-1].next_page_token))
        return pages


def ids_of(pages: list[ListTasksResponse]) -> list[str]:
    return [task.id for page in pages for task in page.tasks]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_paging_yields_each_of_the_customers_tasks_once_newest_first_and_those_without_a_timestamp_last(
    edge_alone, engine, make_customer, binding
):
    customer, stranger = make_customer(), make_customer()
    expected = seed(engine, customer, 61, without_timestamp=9)
    seed(engine, stranger, 12, without_timestamp=2)
    async with Lister(edge_alone, customer, binding) as lister:
        pages = await lister.every_page(page_size=7)
    assert ids_of(pages) == [task.id for task in expected]
    assert [len(page.tasks) for page in pages] == [7] * 8 + [5]
    assert {page.total_size for page in pages} == {61} and {page.page_size for page in pages} == {7}
    assert expected[-1].last_updated is None and expected[52].last_updated is None  # the last section spans pages


async def test_a_listing_answers_what_the_sdk_answered_history_trimmed_and_artifacts_only_when_asked(
    edge_alone, engine, make_customer
):
    customer = make_customer()
    seed(engine, customer, 3)
    async with Lister(edge_alone, customer, "JSONRPC") as lister:
        default = await lister.list()
        trimmed = await lister.list(history_length=1, include_artifacts=True)
        none = await lister.list(history_length=0)
    assert default.page_size == 50 and default.next_page_token == "" and default.total_size == 3
    assert all(len(task.history) == 2 and not task.artifacts for task in default.tasks)
    assert all([m.message_id[-1] for m in task.history] == ["b"] for task in trimmed.tasks)
    assert all(task.artifacts[0].parts[0].text == "result" for task in trimmed.tasks)
    assert all(not task.history for task in none.tasks)
    assert default.tasks[0].status.state == TaskState.TASK_STATE_COMPLETED


@pytest.mark.parametrize("binding", ["JSONRPC", "GRPC"])
async def test_each_filter_narrows_every_page_and_the_total_counts_what_it_matches(
    edge_alone, engine, make_customer, binding
):
    customer = make_customer()
    contexts = [str(uuid.uuid4()) for _ in range(3)]
    states = [TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_COMPLETED,
              TaskState.TASK_STATE_WORKING]
    expected = seed(engine, customer, 40, without_timestamp=4, contexts=contexts, states=states)
    after = START + timedelta(seconds=20)
    cases = {
        "context": ({"context_id": contexts[1]}, lambda t: t.context_id == contexts[1]),
        "status": ({"status": TaskState.TASK_STATE_FAILED}, lambda t: t.state == TaskState.TASK_STATE_FAILED),
        "both": ({"context_id": contexts[0], "status": TaskState.TASK_STATE_COMPLETED},
                 lambda t: t.context_id == contexts[0] and t.state == TaskState.TASK_STATE_COMPLETED),
        "updated after": ({"status_timestamp_after": Timestamp(seconds=int(after.replace(tzinfo=timezone.utc)
                                                                           .timestamp()))},
                          lambda t: t.last_updated is not None and t.last_updated >= after),
    }
    async with Lister(edge_alone, customer, binding) as lister:
        for name, (fields, matches) in cases.items():
            pages = await lister.every_page(page_size=3, **fields)
            wanted = [task.id for task in expected if matches(task)]
            assert ids_of(pages) == wanted, name
            assert {page.total_size for page in pages} == {len(wanted)}, name


async def jsonrpc_refusal(lister: Lister, **fields: object) -> InvalidParamsError:
    with pytest.raises(InvalidParamsError) as refused:
        await lister.list(**fields)
    return refused.value


async def test_a_forged_garbled_or_altered_page_token_is_refused_as_page_token_invalid(
    edge_alone, engine, make_customer
):
    customer = make_customer()
    seed(engine, customer, 5)
    async with Lister(edge_alone, customer, "JSONRPC") as lister:
        token = (await lister.list(page_size=2)).next_page_token
        version, payload, mac = token.split(".")
        content = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        moved = base64.urlsafe_b64encode(json.dumps({**content, "id": "0"}).encode()).decode().rstrip("=")
        for forged in (f"{version}.{moved}.{mac}", f"{version}.{payload}.{'A' * len(mac)}", token[:-3],
                       f"v9.{payload}.{mac}", "AAAA", token + "x" * 200):
            refused = await jsonrpc_refusal(lister, page_size=2, page_token=forged)
            assert refused.data == {"code": "page_token_invalid"}, forged
            assert "omit pageToken for the first page" in refused.message
        assert len((await lister.list(page_size=2, page_token=token)).tasks) == 2


async def test_a_page_token_sent_with_other_filters_is_refused_saying_so(edge_alone, engine, make_customer):
    customer = make_customer()
    seed(engine, customer, 5, states=[TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED])
    async with Lister(edge_alone, customer, "JSONRPC") as lister:
        token = (await lister.list(page_size=1, status=TaskState.TASK_STATE_FAILED)).next_page_token
        refused = await jsonrpc_refusal(lister, page_size=1, page_token=token)
        assert refused.data == {"code": "page_token_invalid"} and "other filters" in refused.message
        refused = await jsonrpc_refusal(lister, page_size=1, page_token=token, status=TaskState.TASK_STATE_COMPLETED)
        assert "other filters" in refused.message
        # Page size, history and artifacts are not filters: a later page may change them.
        page = await lister.list(page_size=5, page_token=token, status=TaskState.TASK_STATE_FAILED, history_length=0)
        assert [task.status.state for task in page.tasks] == [TaskState.TASK_STATE_FAILED]


async def test_a_page_token_works_only_for_the_customer_it_was_issued_to(edge_alone, engine, make_customer):
    customer, stranger = make_customer(), make_customer()
    seed(engine, customer, 4)
    seed(engine, stranger, 4)
    async with Lister(edge_alone, customer, "JSONRPC") as owner:
        token = (await owner.list(page_size=2)).next_page_token
    async with Lister(edge_alone, stranger, "JSONRPC") as other:
        refused = await jsonrpc_refusal(other, page_size=2, page_token=token)
    assert refused.data == {"code": "page_token_invalid"} and "to this key" in refused.message


async def test_a_page_token_of_the_sdk_store_from_the_release_before_keeps_paging(edge_alone, engine, make_customer):
    customer = make_customer()
    expected = seed(engine, customer, 9, without_timestamp=3)
    # What the a2a-sdk store issued for the last task of a page: its stored timestamp in ns, and its id.
    def cursor(task: Seeded) -> str:
        ns = None if task.last_updated is None else int(task.last_updated.replace(tzinfo=timezone.utc)
                                                        .timestamp()) * 10**9
        return encode_list_tasks_cursor(ListTasksCursor(timestamp_ns=ns, task_id=task.id))
    async with Lister(edge_alone, customer, "HTTP+JSON") as lister:
        after_timestamped = await lister.list(page_size=3, page_token=cursor(expected[2]))
        after_untimed = await lister.list(page_size=3, page_token=cursor(expected[6]))
    assert [task.id for task in after_timestamped.tasks] == [task.id for task in expected[3:6]]
    assert [task.id for task in after_untimed.tasks] == [task.id for task in expected[7:]]
    assert after_untimed.next_page_token == ""


async def test_the_total_counts_tasks_written_after_the_first_page_and_a_filtered_total_is_kept_from_it(
    edge_alone, engine, make_customer
):
    customer = make_customer()
    seed(engine, customer, 4, states=[TaskState.TASK_STATE_WORKING])
    async with Lister(edge_alone, customer, "JSONRPC") as lister:
        first = await lister.list(page_size=2)
        working = await lister.list(page_size=2, status=TaskState.TASK_STATE_WORKING)
        seed(engine, customer, 2, states=[TaskState.TASK_STATE_WORKING])
        second = await lister.list(page_size=2, page_token=first.next_page_token)
        later = await lister.list(page_size=2, status=TaskState.TASK_STATE_WORKING,
                                  page_token=working.next_page_token)
        again = await lister.list(page_size=2, status=TaskState.TASK_STATE_WORKING)
    assert (first.total_size, second.total_size) == (4, 6)  # the owner's count, read on every page
    assert (working.total_size, later.total_size, again.total_size) == (4, 4, 6)  # counted on a first page


async def test_another_customers_tasks_never_appear_whatever_the_filters(edge_alone, engine, make_customer):
    customer, stranger = make_customer(), make_customer()
    shared_looking = str(uuid.uuid4())
    seed(engine, stranger, 6, contexts=[shared_looking], states=[TaskState.TASK_STATE_FAILED])
    async with Lister(edge_alone, customer, "HTTP+JSON") as lister:
        for fields in ({}, {"context_id": shared_looking}, {"status": TaskState.TASK_STATE_FAILED},
                       {"context_id": shared_looking, "status": TaskState.TASK_STATE_FAILED}):
            page = await lister.list(**fields)
            assert (list(page.tasks), page.total_size, page.next_page_token) == ([], 0, ""), fields
