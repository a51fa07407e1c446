"""The A2A request handler of one specialist: the a2a-sdk's default handler with admission in front.

GetTask and SubscribeToTask are the SDK's own, on the shared PostgreSQL store and
event stream, scoped by owner. ListTasks is the edge's own (``app.listing``: keyset
pages served by an index, tokens it signs, a total it does not count per page),
after the SDK's checks, with the SDK's response. Sends and cancels differ:
  - SendMessage / SendStreamingMessage run admission (one transaction: task,
    reservation, outbox row; or the replay of the send they repeat, with the
    direct Message it was answered with, if it was) instead of executing in
    this process; a blocking send then waits for a terminal or interrupted state
    (at most ``blocking_wait_max_s``) on the task's notifications, watched from
    before its admission commits, reading the task only when woken and only if
    it stopped (a specialist that may answer with a direct Message waits on the
    task's event stream instead, which tells which answer it is), a stream
    relays the events (the task first, except that a specialist that may answer
    with a direct Message holds the task back until the first event: a Message
    then streams alone);
  - the push-notification config methods (Create, Get, List, Delete) are the edge's own (``app.push``),
    scoped by owner, on its tables (``taskstate.push``); a send's own configuration is stored by admission;
  - CancelTask is one transaction on any instance: the task's jobs are cancelled
    through their claims (a running one is stopped by its worker within a
    heartbeat), the task is CANCELED, and the reservation resolved as
    docs/A2A_EDGE.md states.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.agent_execution.active_task import INTERRUPTED_TASK_STATES, TERMINAL_TASK_STATES
from a2a.server.cluster import TaskVersion, VersionedDatabaseTaskStore
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event, EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.request_handler import validate
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.task import apply_history_length

from app.admission import Admitted, AdmissionService, check_list_request
from app.errors import (
    EdgeError,
    InternalFault,
    KeyRequiredForListing,
    PushNotificationNotSupported,
    converting_foreign_errors,
)
from app.events import NotifiedEventStream
from app.identity import EdgeUser, Identity
from app.listing import TaskListing
from app.observability import Metrics, note_refusal, note_task
from app.push import PushConfigs
from app.required import validate_request_params
from app.streams import StreamGate, caller_of
from core import telemetry
from core.settings import Settings
from core.specs import LoadedSpec

STOP_STATES = TERMINAL_TASK_STATES | INTERRUPTED_TASK_STATES
STOP_STATE_NAMES = sorted(TaskState.Name(state) for state in STOP_STATES)  # as the task rows store them
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
# The executors that may answer a send with a direct Message instead of a task (the conformance specialist's
# ``message`` scenario); every other specialist's answer is always its task.
DIRECT_REPLY_EXECUTORS = frozenset({"conformance"})


class _EdgeRunsNothing(AgentExecutor):
    """The edge never executes a specialist itself; reaching this is a bug, said loudly."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise InternalFault("the edge does not run specialists in the request path")

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise InternalFault("the edge does not run specialists in the request path")


def identity_of(context: ServerCallContext) -> Identity:
    user = context.user
    if not isinstance(user, EdgeUser):
        raise InternalFault("request reached the handler without an identity")
    return user.identity


def idempotency_key_of(context: ServerCallContext) -> str | None:
    """The ``Idempotency-Key`` the call carried: an HTTP header (JSON-RPC, HTTP+JSON) or gRPC metadata, which
    the bindings' call context builders both put in ``state["headers"]`` under lower-case names."""
    headers = context.state.get("headers") or {}
    return headers.get(IDEMPOTENCY_KEY_HEADER)


def _wants_history(params: SendMessageRequest) -> bool:
    """Whether the send's answer carries any of its task's history: not when it asked for none (historyLength 0)."""
    configuration = params.configuration
    return not configuration.HasField("history_length") or configuration.history_length != 0


def _stops(event: Event) -> bool:
    if isinstance(event, Message):
        return True
    return isinstance(event, TaskStatusUpdateEvent | Task) and event.status.state in STOP_STATES


@converting_foreign_errors  # the edge's one boundary for foreign errors: see app/errors.py
class EdgeRequestHandler(DefaultRequestHandler):
    def __init__(
        self,
        *,
        loaded: LoadedSpec,
        card: AgentCard,
        store: VersionedDatabaseTaskStore,
        events: NotifiedEventStream,
        admission: AdmissionService,
        listing: TaskListing,
        streams: StreamGate,
        settings: Settings,
        metrics: Metrics,
        push_configs: PushConfigs | None = None,
        extended_card_modifier: Callable[[AgentCard, ServerCallContext], Awaitable[AgentCard]] | None = None,
    ) -> None:
        super().__init__(
            agent_executor=_EdgeRunsNothing(),
            task_store=store,
            agent_card=card,
            event_stream=events,
            extended_agent_card=card,
            extended_card_modifier=extended_card_modifier,
        )
        self.loaded = loaded
        self.events = events
        self.admission = admission
        self.listing = listing
        self.streams = streams
        self.settings = settings
        self.metrics = metrics
        self.push_configs = push_configs
        self.direct_replies = loaded.spec.executor in DIRECT_REPLY_EXECUTORS

    async def _admit(self, params: SendMessageRequest, context: ServerCallContext,
                     new_task_id: str | None = None) -> Admitted:
        spec = self.loaded.spec
        # The request's span (RequestLog's, or the gRPC binding's) is the admission's: one span per SendMessage,
        # renamed and annotated here, rather than a child of its own (half of telemetry's cost at the edge).
        span = telemetry.admission_span(spec.id, spec.tariff_credits)
        try:
            admitted = await self.admission.admit(
                self.loaded, identity_of(context), params, idempotency_key_of(context), new_task_id
            )
        except EdgeError as refused:
            self.metrics.count_admission(spec.id, refused.code)
            self.metrics.count_refusal(refused.code)
            note_refusal(refused.code)
            telemetry.annotate(span, **{"specialists.outcome": "refused", "specialists.code": refused.code})
            raise
        except Exception as refused:
            self.metrics.count_admission(spec.id, type(refused).__name__)
            raise
        outcome = "replay" if admitted.replay else "admitted"
        note_task(admitted.task.id)
        self.metrics.count_admission(spec.id, outcome, credits_reserved=admitted.reserved_credits)
        telemetry.annotate(span, **{"specialists.outcome": outcome, "specialists.task_id": admitted.task.id,
                                    "specialists.credits_reserved": admitted.reserved_credits})
        return admitted

    async def _tail(self, task_id: str, version: int) -> AsyncGenerator[Event, None]:
        """Events after ``version`` until the task stops (terminal, waiting for input, or a direct reply)."""
        async with contextlib.aclosing(self.events.subscribe(task_id, after=TaskVersion(version))) as subscription:
            async for versioned in subscription:
                yield versioned.event
                if _stops(versioned.event):
                    return

    @validate_request_params
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        if params.configuration.return_immediately or self.direct_replies:
            return await self._send_and_tail(params, context)
        # Blocking: the task's notifications are watched from before its admission commits, so none is lost and
        # nothing needs reading until one comes (a new task's id is chosen here; a follow-up names its task).
        new_task_id = str(uuid.uuid4())
        watched = params.message.task_id or new_task_id
        with self.events.watching(watched) as woken:
            admitted = await self._admit(params, context, new_task_id)
            if admitted.reply is not None:  # a resend of a send answered with a direct Message: that Message again
                return admitted.reply
            task = admitted.task
            if task.status.state in STOP_STATES:
                return apply_history_length(task, params.configuration)
            if task.id == watched:
                return await self._wait(task.id, params, context, woken, read_first=False)
        # A resend of a new task: the task was admitted before this send's watch began, so it reads before it waits.
        with self.events.watching(task.id) as woken:
            return await self._wait(task.id, params, context, woken, read_first=True)

    async def _wait(self, task_id: str, params: SendMessageRequest, context: ServerCallContext,
                    woken: asyncio.Event, *, read_first: bool) -> Task:
        """The task once it finished or asks for input, or as it is at ``blocking_wait_max_s``."""
        owner = context.user.user_name
        try:
            async with asyncio.timeout(self.settings.edge.blocking_wait_max_s):
                stopped, _ = await self.events.until_in(task_id, owner, STOP_STATE_NAMES, woken,
                                                        read_first=read_first, with_history=_wants_history(params))
                return apply_history_length(stopped, params.configuration)
        except TimeoutError:
            return await self._as_it_is(task_id, params, context)  # the client polls or subscribes

    async def _send_and_tail(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        """A send that answers at once, or a blocking one of a specialist that may answer with a direct Message
        (the task's events tell which answer it is)."""
        admitted = await self._admit(params, context)
        if admitted.reply is not None:  # a resend of a send answered with a direct Message: that Message again
            return admitted.reply
        task = admitted.task
        if params.configuration.return_immediately or task.status.state in STOP_STATES:
            return apply_history_length(task, params.configuration)
        try:
            async with asyncio.timeout(self.settings.edge.blocking_wait_max_s):
                async for event in self._tail(task.id, admitted.version):
                    if isinstance(event, Message):
                        return event
        except TimeoutError:
            pass  # answer with the task as it is now; the client polls or subscribes
        return await self._as_it_is(task.id, params, context)

    async def _as_it_is(self, task_id: str, params: SendMessageRequest, context: ServerCallContext) -> Task:
        """The owner's task as it is now: a blocking send's answer at ``blocking_wait_max_s``."""
        stored = await self._versioned_store.get(task_id, context)
        if stored is None:
            raise InternalFault(f"task {task_id} vanished after admission")
        return apply_history_length(stored.task, params.configuration)

    @validate_request_params
    @validate(lambda self: self._agent_card.capabilities.streaming, "Streaming is not supported by the agent")
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        async with self.streams.slot(caller_of(identity_of(context))):
            admitted = await self._admit(params, context)
            if admitted.reply is not None:  # a resend of a send answered with a direct Message: that Message again
                yield admitted.reply
                return
            task = apply_history_length(admitted.task, params.configuration)
            if admitted.task.status.state in STOP_STATES:
                yield task
                return
            # A specialist that may answer with a direct Message: the task is held back until the first event
            # says which answer this is, so that a Message streams alone (spec 3.1.2: exactly one Message, then
            # the stream closes), and a task streams as it always has, the task first.
            held: Task | None = task if self.direct_replies else None
            if held is None:
                yield task
            async for event in self._tail(admitted.task.id, admitted.version):
                if held is not None and not isinstance(event, Message):
                    yield held
                held = None
                yield event

    @validate_request_params
    @validate(lambda self: self._agent_card.capabilities.streaming, "Streaming is not supported by the agent")
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        note_task(params.id)
        async with self.streams.slot(caller_of(identity_of(context))):
            async with contextlib.aclosing(super().on_subscribe_to_task(params, context)) as events:
                async for event in events:
                    yield event

    @validate_request_params
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        note_task(params.id)
        return await self.admission.cancel(params.id, context.user.user_name)

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        note_task(params.id)
        return await super().on_get_task(params, context)

    @validate_request_params
    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        if identity_of(context).anonymous:
            raise KeyRequiredForListing(
                "listing tasks needs a key: without one, tasks are reachable only by their id"
            )
        check_list_request(params)
        return await self.listing.list(params, context.user.user_name)

    # --- push notification configurations (app/push.py) ------------------------------------------------

    def _push(self) -> PushConfigs:
        if self.push_configs is None or not self._agent_card.capabilities.push_notifications:
            raise PushNotificationNotSupported("this service does not send push notifications")
        return self.push_configs

    @validate_request_params
    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        return await self._push().create(params, identity_of(context), context.user.user_name)

    @validate_request_params
    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        return await self._push().get(params.task_id, params.id, context.user.user_name)

    @validate_request_params
    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        configs = await self._push().list(params.task_id, context.user.user_name)
        return ListTaskPushNotificationConfigsResponse(configs=configs)

    @validate_request_params
    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await self._push().delete(params.task_id, params.id, context.user.user_name)
