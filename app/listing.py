"""ListTasks: the edge's own listing, its page tokens and its totalSize (issue 18; docs/A2A_EDGE.md, "Listing tasks").

The a2a-sdk store read all of an owner's tasks and sorted them for every page, and
counted them too. Here a page is ``taskstate.rows.list_page``: keyset ranges of an
index in the listing's order, so the first page and the thousandth read what they
return, for a customer of 100k tasks as for one of ten. What the SDK's handler does
after its store is done the same way: ``historyLength`` trims the history (0: the
history column is not even read), and artifacts are returned only with
``includeArtifacts`` (otherwise not read).

A page token is opaque: ``v1.`` + base64url(JSON position, digest of the filters,
total) + ``.`` + base64url(HMAC). The HMAC is keyed from the key-signing secrets
(the newest signs, all verify) and covers the owner, so a token works only for the
caller it was issued to, with the filters it was issued for, and anything else is
``page_token_invalid``. The a2a-sdk store's own cursors (base64url of
``{"ts": <ns>, "id": <task id>}``), which instances of the release before this one
issued, are accepted as positions while ``list_tasks_accept_sdk_page_tokens`` is on:
a listing that spans a rolling deploy keeps paging.

totalSize: without a filter, the owner's count of tasks (``rows.owner_total``, kept
by triggers: exact, one index lookup). With one, the matching tasks counted on the
first page, reading at most ``list_tasks_scan_max_rows`` rows (exact below that, a
floor at it), and carried in the token to every later page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, TaskState
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.task import apply_history_length, decode_list_tasks_cursor, validate_history_length, validate_page_size
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import InvalidValue
from core.settings import Settings
from taskstate import rows
from taskstate.rows import ListingFilter, Position

# The store holds task ids in varchar(36) (app.admission.MAX_ID_CHARS): a token naming a longer one was forged.
MAX_TOKEN_ID_CHARS = 36
# Tokens this edge issues are about 170 characters, the SDK's cursors under 100: a longer one is refused unread.
MAX_PAGE_TOKEN_CHARS = 256
TOKEN_VERSION = "v1"
_MAC_BYTES = 16
_MAC_CONTEXT = b"specialists ListTasks page token v1\x00"
_EPOCH = datetime(1970, 1, 1)
# The latest instant PostgreSQL's timestamp (and Python's datetime) hold: 9999-12-31, in ns since the epoch.
_MAX_CURSOR_NS = 253_402_300_799 * 10**9
_TERMINAL = "send the nextPageToken of a previous ListTasks answer unchanged, or omit pageToken for the first page"


def _refused(reason: str) -> InvalidValue:
    return InvalidValue(f"pageToken {reason}; {_TERMINAL}", code="page_token_invalid")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _moment(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)  # OverflowError past year 9999


def filters_of(params: ListTasksRequest) -> ListingFilter:
    """The request's filters as the listing reads them; an unknown status or an unusable timestamp is refused."""
    state = None
    if params.status:
        try:
            state = TaskState.Name(params.status)
        except ValueError:
            raise InvalidValue(f"status {params.status} is not an A2A TaskState; send one of "
                               f"{', '.join(TaskState.keys()[1:])}, or no status", code="status_invalid") from None
    after = None
    if params.HasField("status_timestamp_after"):
        try:
            after = params.status_timestamp_after.ToDatetime()
        except (ValueError, OverflowError):
            raise InvalidValue("statusTimestampAfter is outside the years 1 to 9999; send a time in them",
                               code="status_timestamp_invalid") from None
    return ListingFilter(context_id=params.context_id or None, state=state, updated_after=after)


def _filters_digest(filters: ListingFilter) -> str:
    bound = [filters.context_id, filters.state,
             None if filters.updated_after is None else _micros(filters.updated_after)]
    return hashlib.sha256(json.dumps(bound, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PageToken:
    position: Position
    total: int | None  # the filtered listing's totalSize, counted on its first page (None: count it now)


class PageTokens:
    """Issues and reads the page tokens of one edge (every instance with the same secrets reads them all)."""

    def __init__(self, secrets_newest_first: list[str], *, accept_sdk_cursors: bool) -> None:
        # Without a key-signing secret no caller has a key, and listing needs one; a process key keeps this total.
        keys = secrets_newest_first or [secrets.token_hex(32)]
        self._keys = [hmac.new(secret.encode(), _MAC_CONTEXT, hashlib.sha256).digest() for secret in keys]
        self.accept_sdk_cursors = accept_sdk_cursors

    def _mac(self, key: bytes, owner: str, payload: bytes) -> bytes:
        return hmac.new(key, owner.encode() + b"\x00" + payload, hashlib.sha256).digest()[:_MAC_BYTES]

    def issue(self, owner: str, filters: ListingFilter, position: Position, total: int | None) -> str:
        micros = None if position.last_updated is None else _micros(position.last_updated)
        payload = json.dumps({"ts": micros, "id": position.task_id, "f": _filters_digest(filters), "n": total},
                             separators=(",", ":")).encode()
        return f"{TOKEN_VERSION}.{_b64(payload)}.{_b64(self._mac(self._keys[0], owner, payload))}"

    def read(self, token: str, owner: str, filters: ListingFilter) -> PageToken:
        """The position (and total) a token carries, or ``page_token_invalid``, saying why."""
        if len(token) > MAX_PAGE_TOKEN_CHARS:
            raise _refused(f"has {len(token)} characters, more than any this service issues")
        if token.startswith(TOKEN_VERSION + "."):
            return self._read_own(token, owner, filters)
        if "." in token:
            raise _refused("is of a version this service does not read")
        return self._read_sdk_cursor(token)

    def _read_own(self, token: str, owner: str, filters: ListingFilter) -> PageToken:
        parts = token.split(".")
        try:
            payload, mac = _unb64(parts[1]), _unb64(parts[2]) if len(parts) == 3 else b""
        except (binascii.Error, ValueError):
            raise _refused("is not one this service issued") from None
        if not any(hmac.compare_digest(mac, self._mac(key, owner, payload)) for key in self._keys):
            raise _refused("is not one this service issued to this key for this specialist")
        content = json.loads(payload)
        if content["f"] != _filters_digest(filters):
            raise _refused("was issued for other filters: send it with the contextId, status and "
                           "statusTimestampAfter of the request that returned it")
        moment = None if content["ts"] is None else _moment(content["ts"])
        return PageToken(Position(moment, content["id"]), content["n"])

    def _read_sdk_cursor(self, token: str) -> PageToken:
        cursor = decode_list_tasks_cursor(token)
        if cursor is None or not self.accept_sdk_cursors:
            raise _refused("is not one this service issued")
        if (not 0 < len(cursor.task_id) <= MAX_TOKEN_ID_CHARS or not cursor.task_id.isprintable()
                or (cursor.timestamp_ns is not None and not 0 <= cursor.timestamp_ns <= _MAX_CURSOR_NS)):
            raise _refused("is not one this service issued")
        moment = None if cursor.timestamp_ns is None else _moment(cursor.timestamp_ns // 1000)
        return PageToken(Position(moment, cursor.task_id), None)


class TaskListing:
    """ListTasks for every specialist of one edge, on the edge's engine."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine = engine
        self.scan_max_rows = settings.edge.list_tasks_scan_max_rows
        self.tokens = PageTokens([s.get_secret_value() for s in settings.keys.signing_secrets],
                                 accept_sdk_cursors=settings.edge.list_tasks_accept_sdk_page_tokens)

    async def list(self, params: ListTasksRequest, owner: str) -> ListTasksResponse:
        """One page of the owner's tasks, as the a2a-sdk's handler answers it (same checks, same shape)."""
        filters = filters_of(params)
        token = self.tokens.read(params.page_token, owner, filters) if params.page_token else None
        validate_history_length(params)
        if params.HasField("page_size"):
            validate_page_size(params.page_size)
        page_size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        with_history = not (params.HasField("history_length") and params.history_length == 0)
        async with self.engine.connect() as conn:
            page = await conn.run_sync(
                rows.list_page, owner, filters, None if token is None else token.position, page_size,
                with_history=with_history, with_artifacts=params.include_artifacts, examine_max=self.scan_max_rows,
            )
            if not filters.narrows:
                total = await conn.run_sync(rows.owner_total, owner)
            elif token is not None and token.total is not None:
                total = token.total
            else:
                total, _ = await conn.run_sync(rows.count_matching, owner, filters, self.scan_max_rows)
        carried = total if filters.narrows else None
        return ListTasksResponse(
            tasks=[apply_history_length(task, params) for task in page.tasks],
            next_page_token="" if page.next is None else self.tokens.issue(owner, filters, page.next, carried),
            page_size=page_size,
            total_size=total,
        )
