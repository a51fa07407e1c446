"""Admission: everything checked before work is accepted, and the one transaction that accepts it.

In order, before anything is written:
  1. the message against the specialist's spec (parts, media types, sizes, ids);
  2. the caller's credit ceiling (``message.metadata["credit_ceiling"]``) against the tariff.
Then ONE transaction: the idempotency records, the context binding, the ledger
reservation, the task row (in the a2a-sdk store's format) and the dispatch
outbox row. Any refusal raises and rolls everything back, so a refused request
leaves no task and no reservation. This module owns ``edge_messages`` and
``edge_contexts``; the other rows are written through their owners' fragments
(``idempotency.CLAIM``, ``rows.NEW_TASK``, ``admitted.NEW_ROW``, ``outbox.NEW_ROW``,
composed and checked by ``core.fragments``), so a new task is one statement, ``_ADMIT``:
the only way a new task is written, run at once (autocommit, with the reservation in
it) or, when its ``fallback`` names a reason, in the send's transaction. From here on
the spec's tariff is the task's reserved credits (docs/ARCHITECTURE.md, "Glossary").

Idempotency (docs/A2A_EDGE.md): an ``Idempotency-Key`` header, scoped to the
customer and the specialist and kept ``idempotency_key_retention_s``, makes a
resend with the same content replay the first send's task (a direct Message
answer included), and one with other content ``idempotency_key_conflict``. Under
the spec's ``idempotency: message_id`` policy (paid specialists) the messageId
does the same for ever (``edge_messages``: customer, messageId, fingerprint);
under ``key_only`` (the conformance specialist) a reused messageId is a new task.

A follow-up message (``message.taskId`` set) continues a task that asks for
input: no new reservation (the task's hold covers it), the task goes back to
SUBMITTED with the message in its history, and a new outbox row is written.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass
from typing import Any

from a2a.server.agent_execution.active_task import INTERRUPTED_TASK_STATES, TERMINAL_TASK_STATES
from a2a.types.a2a_pb2 import (
    ListTasksRequest,
    Message,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.task import validate_history_length
from google.protobuf.json_format import MessageToDict
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app import ledger_port
from app.errors import (
    ContentTypeNotSupported,
    ContextUnavailable,
    EdgeError,
    IdempotencyKeyConflict,
    InvalidParams,
    InvalidValue,
    MessageIdConflict,
    OverCreditCeiling,
    PayloadTooLarge,
    PushNotificationNotSupported,
    TaskNotAwaitingInput,
    TaskNotCancelable,
    TaskNotFound,
    UnsupportedOperation,
)
from app.identity import Identity
from app.push import PushRequest, cap_refusal, check_config, check_reachable, require_key
from core import db, telemetry
from core.fragments import compose
from core.settings import Settings
from core.specs import LoadedSpec, media_type_matches
from taskstate import admitted, idempotency, outbox, push, rows
from taskstate.cancel import CancelRefused, cancel_task
from taskstate.notify import Notifier

CREDIT_CEILING_KEY = "credit_ceiling"
# A cancel that deadlocks with a job's claim or its first event (PostgreSQL picks one to abort) is
# tried again; serialization failures likewise.
CANCEL_ATTEMPTS = 3
_RETRYABLE = {"40P01", "40001"}
# The a2a-sdk task tables store ids in varchar(36). A longer contextId is refused (InvalidParams: it could
# never be stored); a longer taskId is TaskNotFound, like every id that names no task of the caller's.
MAX_ID_CHARS = 36


def invalid(message: str, code: str) -> InvalidParams:
    return InvalidParams(message, code=code)


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} bytes"


def part_media_type(part: Any) -> str:
    """The part's media type, or what its kind implies when the client stated none."""
    if part.media_type:
        return part.media_type
    kind = part.WhichOneof("content")
    return {"text": "text/plain", "data": "application/json"}.get(kind or "", "application/octet-stream")


@dataclass(frozen=True)
class Checked:
    """A message that passed every check that needs no database."""

    fingerprint: bytes
    ceiling: int | None
    idempotency_key: str | None = None  # the Idempotency-Key header, valid (None: the caller sent none)
    push: PushRequest | None = None  # the send's push configuration, checked (app.push)


# Printable ASCII, the space included (RFC 9110 field values; the draft Idempotency-Key header is a string).
_PRINTABLE_ASCII = frozenset(chr(code) for code in range(0x20, 0x7F))


def check_idempotency_key(key: str | None, settings: Settings) -> str | None:
    """The ``Idempotency-Key`` header as given, or None without one; refuse an empty, long or non-ASCII key."""
    if key is None:
        return None
    limit = settings.edge.max_idempotency_key_chars
    if not key or len(key) > limit or not set(key) <= _PRINTABLE_ASCII:
        problem = (
            "is empty" if not key
            else f"has {len(key)} characters; at most {limit} are accepted (SPECIALISTS_MAX_IDEMPOTENCY_KEY_CHARS)"
            if len(key) > limit
            else "holds a character that is not printable ASCII"
        )
        raise InvalidValue(
            f"the Idempotency-Key header {problem}; send a unique printable ASCII string such as a UUID, "
            "or omit the header",
            code="idempotency_key_invalid",
        )
    return key


def check_message(
    loaded: LoadedSpec, params: SendMessageRequest, settings: Settings, idempotency_key: str | None = None
) -> Checked:
    """Validate the request against the spec and the caller's ceiling; raise the first problem found."""
    key = check_idempotency_key(idempotency_key, settings)
    spec = loaded.spec
    where = f"specs/{loaded.path.name}"
    message = params.message
    validate_history_length(params.configuration)
    push_request = None
    if params.configuration.HasField("task_push_notification_config"):
        if not spec.push_notifications:
            raise PushNotificationNotSupported("this specialist does not send push notifications")
        push_request = check_config(params.configuration.task_push_notification_config, settings)
    if len(message.message_id) > settings.edge.max_message_id_chars:
        raise invalid(
            f"messageId has {len(message.message_id)} characters; at most {settings.edge.max_message_id_chars} are accepted",
            "message_id_too_long",
        )
    if message.role != Role.ROLE_USER:
        raise invalid("a message sent to a specialist must have role ROLE_USER", "role_invalid")
    if len(message.context_id) > MAX_ID_CHARS:
        raise invalid(
            f"contextId has {len(message.context_id)} characters; at most {MAX_ID_CHARS} are accepted", "id_too_long"
        )
    if len(message.parts) > spec.limits.max_parts:
        raise PayloadTooLarge(
            f"the message has {len(message.parts)} parts; this specialist accepts at most {spec.limits.max_parts}",
            limit="limits.max_parts",
        )
    check_fields(params, settings)
    for index, part in enumerate(message.parts):
        if part.WhichOneof("content") is None:
            raise invalid(f"part {index} has no content (text, raw, url or data)", "part_empty")
        media_type = part_media_type(part)
        if not media_type_matches(media_type, spec.input_modes):
            raise ContentTypeNotSupported(
                f"part {index} is {media_type}; this specialist accepts {', '.join(spec.input_modes)}",
                code="part_media_type_not_accepted",
            )
    # The whole message as received counts (ids, parts with their names and metadata, extensions, references),
    # except its metadata, which has a limit of its own: a 1.9 MB filename once slipped past a count of content.
    total = message_size_bytes(message)
    if total > spec.limits.max_input_bytes:
        raise PayloadTooLarge(
            f"the message is {_mib(total)} (its metadata aside); this specialist accepts at most "
            f"{_mib(spec.limits.max_input_bytes)} (limits.max_input_bytes in {where})",
            limit="limits.max_input_bytes",
        )
    metadata_bytes = message.metadata.ByteSize() + params.metadata.ByteSize()
    if metadata_bytes > spec.limits.max_metadata_bytes:
        raise PayloadTooLarge(
            f"message and request metadata are {_mib(metadata_bytes)}; this specialist accepts at most "
            f"{_mib(spec.limits.max_metadata_bytes)}",
            limit="limits.max_metadata_bytes",
        )
    accepted = list(params.configuration.accepted_output_modes)
    if accepted and not any(media_type_matches(mode, spec.output_modes) for mode in accepted):
        raise ContentTypeNotSupported(
            f"acceptedOutputModes {', '.join(accepted)} has nothing this specialist produces "
            f"({', '.join(spec.output_modes)})",
            code="output_modes_not_produced",
        )
    ceiling = _credit_ceiling(message)
    if ceiling is not None and spec.tariff_credits > ceiling:
        raise OverCreditCeiling(
            f"this specialist's tariff is {spec.tariff_credits} credits per task, above your credit_ceiling of "
            f"{ceiling}; raise the ceiling or choose another specialist. Nothing was reserved.",
            tariff_credits=spec.tariff_credits,
            credit_ceiling=ceiling,
        )
    if len(message.task_id) > MAX_ID_CHARS:
        # Longer than any task id there is (the service issues uuids, the store holds 36 characters): it names
        # no task of the caller's, and is answered as any such id is, after every other check.
        raise TaskNotFound("Task not found")
    return Checked(fingerprint=fingerprint(spec.id, message), ceiling=ceiling, idempotency_key=key, push=push_request)


def message_size_bytes(message: Message) -> int:
    """The message in protobuf's encoding (what is stored: text as UTF-8, raw as bytes) without its metadata."""
    without_metadata = message.ByteSize()
    if message.HasField("metadata"):
        without_metadata -= message.metadata.ByteSize()
    return without_metadata


def check_fields(params: SendMessageRequest, settings: Settings) -> None:
    """Every list and short string of the request against its named cap (content is bounded by the spec)."""
    edge = settings.edge
    message = params.message
    lists = (
        ("message.referenceTaskIds", message.reference_task_ids, MAX_ID_CHARS, "MAX_ID_CHARS (36, a task id)"),
        ("message.extensions", message.extensions, edge.max_uri_chars, "SPECIALISTS_MAX_URI_CHARS"),
        ("configuration.acceptedOutputModes", params.configuration.accepted_output_modes, edge.max_name_chars,
         "SPECIALISTS_MAX_NAME_CHARS"),
    )
    for name, values, max_chars, setting in lists:
        if len(values) > edge.max_list_items:
            raise PayloadTooLarge(
                f"{name} has {len(values)} entries; at most {edge.max_list_items} are accepted "
                "(SPECIALISTS_MAX_LIST_ITEMS)",
                code="list_too_long", field=name, limit="max_list_items",
            )
        for index, value in enumerate(values):
            _check_chars(f"{name}[{index}]", value, max_chars, setting)
    _check_chars("tenant", params.tenant, edge.max_name_chars, "SPECIALISTS_MAX_NAME_CHARS")
    for index, part in enumerate(message.parts):
        _check_chars(f"message.parts[{index}].filename", part.filename, edge.max_name_chars,
                     "SPECIALISTS_MAX_NAME_CHARS")
        _check_chars(f"message.parts[{index}].mediaType", part.media_type, edge.max_name_chars,
                     "SPECIALISTS_MAX_NAME_CHARS")


def _check_chars(name: str, value: str, max_chars: int, setting: str) -> None:
    if len(value) > max_chars:
        raise PayloadTooLarge(
            f"{name} has {len(value)} characters; at most {max_chars} are accepted ({setting})",
            code="field_too_long", field=name, limit=setting,
        )


def _credit_ceiling(message: Message) -> int | None:
    if CREDIT_CEILING_KEY not in message.metadata.fields:
        return None
    field = message.metadata.fields[CREDIT_CEILING_KEY]
    value = field.number_value if field.WhichOneof("kind") == "number_value" else MessageToDict(field)
    if not isinstance(value, float) or not math.isfinite(value) or value != int(value) or value < 0:
        raise invalid(
            f'metadata["{CREDIT_CEILING_KEY}"] must be a whole number of credits, 0 or more; got {value!r}',
            "credit_ceiling_invalid",
        )
    return int(value)


def check_list_request(params: ListTasksRequest) -> None:
    """Refuse a ListTasks request whose contextId could never be stored. Its page token is read, and refused
    if this service did not issue it, by ``app.listing`` (``page_token_invalid``)."""
    if len(params.context_id) > MAX_ID_CHARS:
        raise invalid(f"contextId has {len(params.context_id)} characters; at most {MAX_ID_CHARS} are accepted",
                      "id_too_long")


def fingerprint(specialist_id: str, message: Message) -> bytes:
    """What makes a resend "the same message": everything the client sent except its messageId."""
    content = Message()
    content.CopyFrom(message)
    content.message_id = ""
    digest = hashlib.sha256(specialist_id.encode() + b"\x00")
    digest.update(content.SerializeToString(deterministic=True))
    return digest.digest()


@dataclass(frozen=True)
class Admitted:
    task: Task
    version: int
    replay: bool  # an idempotent resend: nothing was written, this is the task the first send created
    # A resend of a send the specialist answered with a direct Message: that Message is the answer again.
    reply: Message | None = None
    pushed: bool = False  # the event written is a push notification (a configuration is stored for the task)
    # The credits this admission reserved (the new task's hold); 0 for a resend or a follow-up, which reserve none.
    reserved_credits: int = 0


class AdmissionService:
    """Runs the admission transaction on the async engine (the ledger's calls are sync: ``run_sync``)."""

    def __init__(self, engine: AsyncEngine, autocommit: AsyncEngine, settings: Settings, notifier: Notifier) -> None:
        assert db.in_autocommit(autocommit), "a new task's statement commits by itself: the edge's autocommit engine"
        self.engine = engine  # the send's transaction (a follow-up, a push configuration, a fallback), a cancel
        self.autocommit = autocommit  # a new task in one statement (``_admit_at_once``)
        self.settings = settings
        self.notifier = notifier

    async def admit(
        self, loaded: LoadedSpec, identity: Identity, params: SendMessageRequest, idempotency_key: str | None = None,
        new_task_id: str | None = None,
    ) -> Admitted:
        """Admit the send, or replay the one it repeats; ``idempotency_key`` is the header as received.
        ``new_task_id``: the id a new task gets (a blocking send watches it before the task exists); a new one
        when None."""
        checked = check_message(loaded, params, self.settings, idempotency_key)
        if checked.push is not None:
            require_key(identity)
            await check_reachable(checked.push, self.settings)
        send = _Send(loaded, identity, identity.owner(loaded.spec.id), params.message, checked,
                     self.settings.edge.idempotency_key_retention_s, self.settings.push.max_configs_per_customer,
                     new_task_id or str(uuid.uuid4()))
        # A send with a push configuration takes the transaction: the configuration is written before the task's
        # first event, so the trigger that writes notifications (migration 0240) sees it.
        at_once = not params.message.task_id and checked.push is None
        admitted = await self._admit_at_once(send) if at_once else None
        if admitted is None:
            async with self.engine.begin() as conn:
                admitted = await conn.run_sync(_admit, send)
        if not admitted.replay:  # committed: wake the dispatchers, and a follow-up's subscribers
            await self.notifier.dispatch(loaded.spec.executor)
            if admitted.version > 1:
                await self.notifier.task_event(admitted.task.id)
            if admitted.pushed or checked.push is not None:
                await self.notifier.push()
        return admitted

    async def _admit_at_once(self, send: _Send) -> Admitted | None:
        """A new task in one autocommit statement (``_ADMIT`` at once); None when its ``fallback`` named a reason,
        which the send's transaction answers."""
        task, params = _new_task(send, at_once=True)
        reserved_credits = params["reserved_credits"]
        if reserved_credits > 0:
            assert send.identity.customer_id is not None  # anonymous callers only reach free specialists
            # The ledger's own checks of what it is handed, before anything is sent (ledger.statements).
            ledger_port.check_reserve(customer_id=send.identity.customer_id, task_id=task.id,
                                      fingerprint_hex=params["fingerprint_hex"], specialist_id=send.specialist_id,
                                      credits=reserved_credits)
        try:
            # The hot statement, on the driver, checked out for it alone (core.db.autocommit_rows).
            [(fallback, *_)] = await db.autocommit_rows(self.autocommit, _ADMIT_SQL, _checked(params))
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == FALLBACK_SQLSTATE:
                return None
            raise
        assert fallback is None, fallback  # a reason raised SPADM: the statement stood only without one
        return Admitted(task=task, version=1, replay=False, reserved_credits=reserved_credits)

    async def cancel(self, task_id: str, owner: str) -> Task:
        """Cancel the caller's task from any instance, in one transaction with what it charges.

        The transaction is ``taskstate.cancel.cancel_task``'s. Raises TaskNotFound for a
        task that is not the caller's, TaskNotCancelable for a finished one or one whose
        outcome is under reconciliation.
        """
        for attempt in range(CANCEL_ATTEMPTS):
            try:
                async with self.engine.begin() as conn:
                    canceled, pushed = await conn.run_sync(cancel_task, task_id, owner)
                break
            except CancelRefused as refused:
                raise _cancel_error(refused) from None
            except DBAPIError as exc:  # a deadlock with a job starting at that very moment: try again
                if attempt + 1 == CANCEL_ATTEMPTS or getattr(exc.orig, "sqlstate", None) not in _RETRYABLE:
                    raise
        await self.notifier.task_event(task_id)
        if pushed:
            await self.notifier.push()
        return canceled


def _cancel_error(refused: CancelRefused) -> EdgeError:
    """The task state's refusal as the A2A error a customer gets for it."""
    if refused.code == "task_not_found":
        return TaskNotFound("Task not found")
    if refused.code == "outcome_under_reconciliation":
        return TaskNotCancelable(refused.message, code=refused.code)
    return TaskNotCancelable("Task cannot be canceled")


# --- the transactions (sync code on the async connection, via run_sync) -------------------


@dataclass(frozen=True)
class _Send:
    """One send on its way through the admission transaction."""

    loaded: LoadedSpec
    identity: Identity
    owner: str
    message: Message
    checked: Checked
    key_retention_s: float
    max_push_configs: int
    new_task_id: str  # the id of the task this send creates, if it creates one (chosen by ``admit``)

    def store_push(self, conn: Connection, task_id: str) -> None:
        """The send's push configuration for ``task_id``, before the event that should notify it."""
        if self.checked.push is None:
            return
        assert self.identity.customer_id is not None  # require_key
        try:
            push.insert_config(conn, self.checked.push.for_task(task_id), owner=self.owner,
                               customer_id=self.identity.customer_id, max_per_customer=self.max_push_configs)
        except push.TooManyConfigs as over:
            raise cap_refusal(self.max_push_configs, over.held) from None

    @property
    def specialist_id(self) -> str:
        return self.loaded.spec.id

    @property
    def by_message_id(self) -> bool:
        """Whether the messageId makes a resend idempotent (the spec's ``idempotency: message_id``)."""
        return self.loaded.spec.idempotency == "message_id"

    def key_scope(self) -> dict[str, Any]:
        assert self.checked.idempotency_key is not None
        return {"customer_key": self.identity.customer_key, "specialist_id": self.specialist_id,
                "key": self.checked.idempotency_key}


_CLAIM_MESSAGE = text(
    "INSERT INTO edge_messages (customer_key, message_id, fingerprint, specialist_id, task_id) "
    "VALUES (:customer_key, :message_id, :fingerprint, :specialist_id, :task_id) "
    "ON CONFLICT (customer_key, message_id) DO NOTHING RETURNING task_id"
)
_FIRST_SEND = text(
    "SELECT fingerprint, specialist_id, task_id FROM edge_messages WHERE customer_key = :c AND message_id = :m"
)
_CONTEXT_HOLDER = text("SELECT customer_key FROM edge_contexts WHERE context_id = :x")
# A new task in ONE statement, the only way a new task is written: the key's claim (with a key), then the
# messageId's (under the message_id policy), and only if both are new, the context binding, the task (SDK rows),
# the edge's row and the outbox row; at once, the reservation too. ``fallback`` says, in one place, why the new task
# cannot stand as written: a resend, the context (another customer's, or claimed by a transaction this
# statement's snapshot does not see), the reservation refused. Run ``at_once`` (the common case: autocommit, one
# round trip and one commit), a reason calls edge_admission_fallback (migration 0170), whose SQLSTATE SPADM turns
# the whole statement back; then the same statement runs in the send's transaction, which answers the reason
# (``_create``) and reserves through the ledger (its refusal, as the customer's error). The final SELECT sees
# the snapshot from before the statement: the context's earlier holder, if any.
FALLBACK_SQLSTATE = "SPADM"
_KEY_GIVEN = "CAST(:idempotency_key AS text) IS NOT NULL"
_NEW = "(SELECT new FROM admit)"
RESEND, CONTEXT, RESERVATION = "a resend", "the context", "the reservation"
_ADMIT = compose(
    "admission.admit",
    f"""
    WITH {{key_claim}},
    claim AS (
        INSERT INTO edge_messages (customer_key, message_id, fingerprint, specialist_id, task_id)
        SELECT CAST(:customer_key AS text), CAST(:message_id AS text), CAST(:fingerprint AS bytea),
               CAST(:specialist_id AS text), CAST(:task_id AS varchar)
         WHERE :by_message_id AND (NOT {_KEY_GIVEN} OR EXISTS (SELECT FROM key_claim))
        ON CONFLICT (customer_key, message_id) DO NOTHING RETURNING 1
    ),
    admit AS (
        SELECT (NOT {_KEY_GIVEN} OR EXISTS (SELECT FROM key_claim))
               AND (NOT :by_message_id OR EXISTS (SELECT FROM claim)) AS new
    ),
    bound AS (
        INSERT INTO edge_contexts (context_id, customer_key)
        SELECT CAST(:context_id AS varchar), CAST(:customer_key AS text) WHERE {_NEW}
        ON CONFLICT (context_id) DO NOTHING RETURNING 1
    ),
    {{new_task}}, {{edge_row}}, {{outbox_row}},
    reserve AS (
        SELECT r.outcome
          FROM ledger_reserve(CAST(:customer_id AS text), CAST(:task_id AS text), CAST(:fingerprint_hex AS text),
                              CAST(:specialist_id AS text), CAST(:reserved_credits AS bigint), NULL) r
         WHERE {_NEW} AND CAST(:reserved_credits AS bigint) > 0 AND :at_once
    ),
    holder AS (SELECT customer_key FROM edge_contexts WHERE context_id = :context_id),
    verdict AS (
        SELECT CASE
            WHEN NOT {_NEW} THEN '{RESEND}'
            WHEN NOT EXISTS (SELECT FROM bound)
                 AND (SELECT customer_key FROM holder) IS DISTINCT FROM :customer_key THEN '{CONTEXT}'
            WHEN EXISTS (SELECT FROM reserve WHERE outcome <> 'created') THEN '{RESERVATION}'
        END AS fallback
    )
    SELECT v.fallback, CASE WHEN :at_once AND v.fallback IS NOT NULL THEN edge_admission_fallback(v.fallback) END,
           EXISTS (SELECT FROM key_claim) AS key_claimed, (SELECT customer_key FROM holder) AS context_holder
      FROM verdict v
    """,
    own=("message_id", "by_message_id", "fingerprint_hex", "at_once"),
    compact=True,
    key_claim=idempotency.CLAIM.cte("key_claim", when=_KEY_GIVEN),
    new_task=rows.NEW_TASK.cte("new_task", when=_NEW),
    edge_row=admitted.NEW_ROW.cte("edge_row", when=_NEW),
    outbox_row=outbox.NEW_ROW.cte("outbox_row", when=_NEW),
)
_ADMIT_SQL = db.compiled_for_psycopg(_ADMIT.clause)  # at once, on the driver: ``_admit_at_once``


def _admit(conn: Connection, send: _Send) -> Admitted:
    message = send.message
    if not message.task_id:
        return _create(conn, send)
    if send.checked.idempotency_key is not None:
        if not idempotency.claim(conn, **send.key_scope(), fingerprint=send.checked.fingerprint,
                                 task_id=message.task_id, retention_s=send.key_retention_s):
            return _replay_key(conn, send)
    if send.by_message_id:
        claimed = conn.execute(
            _CLAIM_MESSAGE,
            {
                "customer_key": send.identity.customer_key,
                "message_id": message.message_id,
                "fingerprint": send.checked.fingerprint,
                "specialist_id": send.specialist_id,
                "task_id": message.task_id,
            },
        ).first()
        if claimed is None:
            return _replay_message_id(conn, send, key_claimed=send.checked.idempotency_key is not None)
    return _continue(conn, send.loaded, send.owner, message, send)


def _replay_key(conn: Connection, send: _Send) -> Admitted:
    """A send whose Idempotency-Key has a live first use (read now: it may have committed while this send waited
    on it): replay it, or refuse."""
    key = send.checked.idempotency_key
    first = idempotency.first_use(conn, **send.key_scope())
    if first is None:  # it was rolled back, or expired, at that very moment: the caller may send again
        raise IdempotencyKeyConflict(
            f"Idempotency-Key {key!r} was being used by another request at the same moment; send again"
        )
    if send.identity.anonymous:
        # Anonymous callers share one namespace: a replay could reveal another caller's task.
        raise IdempotencyKeyConflict(
            f"Idempotency-Key {key!r} was already used; without an API key every send needs a new key"
        )
    if first.fingerprint != send.checked.fingerprint:
        raise IdempotencyKeyConflict(
            f"Idempotency-Key {key!r} was already used with other content; a resend with it must be identical, "
            "other content needs a new key",
        )
    return _replayed(conn, send, first.task_id)


def _replay_message_id(conn: Connection, send: _Send, *, key_claimed: bool) -> Admitted:
    """A send whose messageId was used before (the message_id policy): replay it, or refuse. A key this
    transaction just claimed is made to name the replayed task."""
    identity, message, checked = send.identity, send.message, send.checked
    first = conn.execute(_FIRST_SEND, {"c": identity.customer_key, "m": message.message_id}).one()
    if identity.anonymous:
        # Anonymous callers share one namespace: a resend could reveal another caller's task.
        raise MessageIdConflict(
            "this messageId was already used; without a key every message needs a new messageId",
        )
    if bytes(first.fingerprint) != checked.fingerprint or first.specialist_id != send.specialist_id:
        raise MessageIdConflict(
            f"messageId {message.message_id!r} was already sent with other content; a resend must be identical, "
            "a new message needs a new messageId",
        )
    if key_claimed:
        idempotency.repoint(conn, **send.key_scope(), task_id=first.task_id)
    return _replayed(conn, send, first.task_id)


def _replayed(conn: Connection, send: _Send, task_id: str) -> Admitted:
    """The task a resend repeats, and the direct Message it answered with, if it did."""
    task, version = rows.load(conn, task_id, send.owner)
    reply = None
    if (
        task.status.state == TaskState.TASK_STATE_COMPLETED
        and task.status.HasField("message")
        and admitted.reply_kind(conn, task_id) == admitted.REPLY_MESSAGE
    ):
        reply = task.status.message
    return Admitted(task=task, version=version, replay=True, reply=reply)


def _checked(params: dict[str, Any]) -> dict[str, Any]:
    _ADMIT.check(params)
    return params


def _new_task(send: _Send, *, at_once: bool) -> tuple[Task, dict[str, Any]]:
    """A new task for the send (SUBMITTED, the message its history) and the parameters of its statement."""
    spec, identity, message, checked = send.loaded.spec, send.identity, send.message, send.checked
    task_id = send.new_task_id
    context_id = message.context_id or str(uuid.uuid4())
    stored = Message()
    stored.CopyFrom(message)
    stored.task_id = task_id
    stored.context_id = context_id
    task = Task(id=task_id, context_id=context_id, status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
    rows.stamp(task)
    task.history.append(stored)
    params = {
        **rows.new_task_params(task, send.owner),
        "customer_key": identity.customer_key,
        "message_id": message.message_id,
        "fingerprint": checked.fingerprint,
        "idempotency_key": checked.idempotency_key,
        "key_retention_s": send.key_retention_s,
        "by_message_id": send.by_message_id,
        "customer_id": identity.customer_id,
        "key_id": identity.key_id,
        "specialist_id": spec.id,
        "skill_id": spec.skill.id,
        # From here on the spec's tariff is the task's reserved credits (docs/ARCHITECTURE.md, "Glossary").
        "reserved_credits": spec.tariff_credits,
        "fingerprint_hex": checked.fingerprint.hex(),
        "at_once": at_once,
        "executor": spec.executor,
        "message": stored.SerializeToString(),
        "trace_parent": telemetry.traceparent(),  # the job continues this request's trace (None: telemetry off)
    }
    return task, params


def _create(conn: Connection, send: _Send) -> Admitted:
    """A new task in the send's transaction: ``_ADMIT``, then the reason its ``fallback`` names answered, then
    the reservation."""
    identity, checked = send.identity, send.checked
    task, params = _new_task(send, at_once=False)
    task_id, context_id = task.id, task.context_id
    send.store_push(conn, task_id)
    row = _ADMIT.execute(conn, params).one()
    if row.fallback == RESEND:
        if send.checked.push is not None:  # a resend: its task already exists, the would-be task never will
            push.delete_task_configs(conn, task_id, send.owner)
        if checked.idempotency_key is not None and not row.key_claimed:
            return _replay_key(conn, send)
        return _replay_message_id(conn, send, key_claimed=row.key_claimed)
    if row.fallback == CONTEXT:
        holder = row.context_holder
        if holder is None:  # claimed by a transaction that committed after this statement's snapshot
            holder = conn.execute(_CONTEXT_HOLDER, {"x": context_id}).scalar_one()
        if holder != identity.customer_key:
            raise ContextUnavailable(
                "this contextId cannot be used with your key; omit contextId to start a new conversation"
            )
    assert row.fallback in (None, CONTEXT), row.fallback  # the reservation is the transaction's, below
    reserved_credits = params["reserved_credits"]
    if reserved_credits > 0:
        # After the rows, in the same transaction: a refusal rolls all of them back.
        assert identity.customer_id is not None  # anonymous callers only reach free specialists
        # The reservation's job id is the task id (taskstate.admitted records it so).
        ledger_port.reserve(
            conn,
            customer_id=identity.customer_id,
            task_id=task_id,
            fingerprint_hex=params["fingerprint_hex"],
            specialist_id=send.specialist_id,
            credits=reserved_credits,
        )
    return Admitted(task=task, version=1, replay=False, reserved_credits=reserved_credits)


def _continue(conn: Connection, loaded: LoadedSpec, owner: str, message: Message, send: _Send | None = None) -> Admitted:
    spec = loaded.spec
    locked = rows.lock(conn, message.task_id, owner, with_artifacts=True)
    if locked is None:
        raise TaskNotFound("Task not found")
    task = locked.task  # without its history until written (rows.Locked)
    if message.context_id and message.context_id != task.context_id:
        raise invalid(
            f"Context {message.context_id} does not match context {task.context_id} of task {task.id}",
            "context_id_mismatch",
        )
    if task.status.state in TERMINAL_TASK_STATES:
        raise UnsupportedOperation(
            f"Task {task.id} is in terminal state: {TaskState.Name(task.status.state)}; "
            "send a new message (same contextId, no taskId) to start a new task",
            code="task_terminal",
        )
    if task.status.state not in INTERRUPTED_TASK_STATES:
        raise TaskNotAwaitingInput(
            f"task {task.id} is {TaskState.Name(task.status.state)}, not waiting for input; "
            "send your message when it asks for input, or start a new task"
        )
    stored = Message()
    stored.CopyFrom(message)
    stored.context_id = task.context_id  # a follow-up may carry only taskId: the context is the task's
    if task.status.HasField("message"):
        task.history.append(task.status.message)
    task.history.append(stored)
    task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
    rows.stamp(task)
    event = TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=task.status)
    if send is not None:
        send.store_push(conn, task.id)  # the task is the caller's (locked above): before the event it notifies
    new_version = rows.write_event(conn, locked, event, returning_history=True, pushed_sql=push.configured_sql())
    outbox.enqueue(conn, task_id=task.id, specialist_id=spec.id, executor=spec.executor, owner=owner,
                   context_id=stored.context_id, message=stored.SerializeToString(),
                   trace_parent=telemetry.traceparent())
    return Admitted(task=task, version=new_version, replay=False, pushed=locked.pushed)
