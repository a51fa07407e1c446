"""Delegations of one agent of a root family: admission, the send, and what handles do afterwards.

``start`` checks the routes (routing on; for a paid peer also paid peers on,
a positive credit allowance, a skill and a key), then records the admission
durably and only then sends. The same ``request_id`` with the same inputs
returns the existing delegation; with other inputs it is refused. A send whose
answer was lost is ``unknown`` and is never resent: ``rlm reconcile`` attaches
a verified remote task id. The interface (URL and binding: JSON-RPC or
HTTP+JSON) is pinned from the card at admission and used for every later call.
Handles: ``status`` (no network), ``poll`` (GetTask
on the pinned interface), ``wait`` (a timeout leaves the work running),
``read``/``summary`` (bounded; the result stays on the host), ``reply`` (only
when the peer asked for input), ``cancel`` (records the peer's actual answer),
``follow_up`` (new work in the same remote context).

A paid delegation's hold is settled to the charge its finished task reports
(``rlmfamily.a2a.charge``), in the store's transaction that records the
finished state; a finished row whose hold is still ``held`` (recorded before
the charge came back) is settled by its next ``poll``.

Keys are read from the peer's named environment variable at send time and go
into one HTTP header; they are never stored, returned or logged.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from rlmfamily.a2a.errors import (
    A2ADisabled,
    A2AError,
    CreditAllowanceExhausted,
    DeadlineInvalid,
    DelegationNotOwned,
    DelegationPayloadTooLarge,
    DelegationReadTooLarge,
    DelegationReconcileRefused,
    FollowUpNotAllowed,
    MissingPeerCredential,
    PaidRoutesDisabled,
    PeerClientError,
    PeerProtocolError,
    PeerRefused,
    ReplyNotExpected,
    RequestIdConflict,
)
from rlmfamily.a2a.peers import PeerConfig, Peers, load_peers
from rlmfamily.a2a.store import TERMINAL_STATES, Admission, Delegation, DelegationStore, owner
from rlmfamily.settings import RLMSettings

if TYPE_CHECKING:
    from rlmfamily.a2a.client import PinnedInterface, StrictClient
    from rlmfamily.a2a.wire import RemoteView

# The wire format (a2a-sdk, protobuf) and the HTTP client are imported on first use: a run with
# routing off never pays for them.

# Open states that required work may not be left in when the agent answers (the model can act on each).
BLOCKING_STATES = ("sending", "submitted", "working", "input_required", "auth_required")
WAITING_STATES = ("sending", "submitted", "working")
MAX_REQUEST_ID_CHARS = 200
PREVIEW_CHARS = 200
QUOTED_STATUS_CHARS = 200  # of a peer's status text quoted in a refusal
MAX_SUMMARY_REFERENCES = 20  # file references a delegation's summary lists
RECONCILE_HISTORY_LENGTH = 100
# {"jsonrpc":"2.0","id":"<uuid>","method":"SendMessage","params":...}; an HTTP+JSON body is the params alone,
# so counting the envelope on both bindings keeps one limit that holds on either.
JSONRPC_ENVELOPE_BYTES = 120


def fingerprint(**inputs: Any) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _credential(env_name: str | None, alias: str) -> str | None:
    """The key, read on the host from the variable the peers file names, at the moment it is needed."""
    if env_name is None:
        return None
    value = os.environ.get(env_name)
    if not value:
        raise MissingPeerCredential(
            f"peer {alias!r} needs its key in the environment variable {env_name}, which is not set",
            setting="a2a_peers_file")
    return value


class Delegations:
    """The ``a2a`` namespace's host side for one agent (``agent_id``) of the root family ``root_id``."""

    def __init__(self, settings: RLMSettings, *, root_id: str, agent_id: str | None = None,
                 peers: Peers | None = None, store: DelegationStore | None = None,
                 client: StrictClient | None = None) -> None:
        self.settings = settings
        self.root_id = root_id
        self.agent_id = agent_id or root_id
        if peers is None:
            # Routing off: the file is not even read, so nothing in it can open a route.
            peers = load_peers(settings.a2a_peers_file) if settings.a2a_enabled else Peers(None, ())
        self.peer_config = peers
        self._store = store
        self._client = client
        self._cards: dict[str, PinnedInterface] = {}
        self._lock = threading.Lock()

    # ---------- plumbing ----------

    @property
    def store(self) -> DelegationStore:
        with self._lock:
            if self._store is None:
                self._store = DelegationStore(self.settings.a2a_path)
            return self._store

    @property
    def client(self) -> StrictClient:
        with self._lock:
            if self._client is None:
                from rlmfamily.a2a.client import StrictClient

                s = self.settings
                self._client = StrictClient(connect_timeout_s=s.a2a_connect_timeout_s,
                                            request_timeout_s=s.a2a_request_timeout_s,
                                            max_card_bytes=s.a2a_max_card_bytes)
            return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _require_routing(self) -> None:
        if not self.settings.a2a_enabled:
            raise A2ADisabled("A2A delegation is off; a user turns it on with RLM_A2A_ENABLED=true and a peers "
                              "file (RLM_A2A_PEERS_FILE). A key in the environment never enables it",
                              setting="a2a_enabled")

    def _interface(self, peer: PeerConfig) -> PinnedInterface:
        with self._lock:
            pinned = self._cards.get(peer.alias)
        if pinned is None:
            pinned = self.client.fetch_card(peer)
            with self._lock:
                self._cards[peer.alias] = pinned
        return pinned

    def owned(self, delegation_id: str) -> Delegation:
        """The delegation, if this root family created it (``a2a.handle(id)``'s ownership check)."""
        row = self.store.get(str(delegation_id))
        if row.root_id != self.root_id:
            raise DelegationNotOwned(f"delegation {delegation_id} belongs to another root family; only the family "
                                     "that started it may use it")
        return row

    # ---------- peers ----------

    def peers(self) -> list[dict[str, Any]]:
        self._require_routing()
        listed = []
        for peer in self.peer_config.peers:
            info = peer.public()
            why = self.route_problem(peer)
            info["available"] = why is None
            info["unavailable_because"] = why
            listed.append(info)
        return listed

    def route_problem(self, peer: PeerConfig) -> str | None:
        """Why a start to this peer would be refused before sending (no network), or None."""
        try:
            self._check_route(peer)
            _credential(peer.credential_env, peer.alias)
        except A2AError as exc:
            return f"[{exc.code}] {exc.message}"
        return None

    def card_problem(self, peer: PeerConfig) -> tuple[str | None, int | None]:
        """Read the peer's card the way ``start`` does (origin, skill, binding, its price against the tariff).

        Returns why a start would be refused after reading it (None: it would not) and the price per task the
        card states (None: none, or the card could not be read).
        """
        try:
            pinned = self._interface(peer)
        except A2AError as exc:
            return f"[{exc.code}] {exc.message}", exc.details.get("card_tariff_credits")
        return None, pinned.tariff_credits

    def _check_route(self, peer: PeerConfig) -> None:
        self._require_routing()
        if not peer.paid:
            return
        if not self.settings.a2a_paid_enabled:
            raise PaidRoutesDisabled(
                f"peer {peer.alias!r} is paid ({peer.tariff_credits} credits per task) and paid peers are off; "
                "a user turns them on with RLM_A2A_PAID_ENABLED=true and a credit allowance "
                "(RLM_A2A_CREDIT_ALLOWANCE)", setting="a2a_paid_enabled")
        if self.settings.a2a_credit_allowance <= 0:
            raise CreditAllowanceExhausted(
                f"peer {peer.alias!r} is paid and this root has no credit allowance; set "
                "RLM_A2A_CREDIT_ALLOWANCE to a positive number of credits when starting the root",
                setting="a2a_credit_allowance")

    # ---------- start ----------

    def start(self, peer_alias: str, task: str, context_text: str = "", *,
              evidence: list[dict[str, Any]] | None = None, required: bool = True,
              deadline_seconds: float | None = None, request_id: str | None = None,
              follow_up_of: Delegation | None = None) -> Delegation:
        self._require_routing()
        if not isinstance(task, str) or not task.strip():
            raise A2AError("a2a.start needs the task as non-empty text: a2a.start('review', 'Review this diff', diff)")
        if not isinstance(context_text, str):
            raise A2AError("the context must be text, a chunk, a search hit or a list of them")
        peer = self.peer_config.get(str(peer_alias))
        deadline_s = self._deadline(peer, deadline_seconds)
        if request_id is None:
            request_id = uuid.uuid4().hex
        if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
            raise A2AError(f"request_id must be text of 1-{MAX_REQUEST_ID_CHARS} characters")
        evidence = list(evidence or [])
        extra = {"evidence": evidence} if evidence else {}
        digest = fingerprint(peer=peer.alias, task=task, context=context_text, **extra, required=bool(required),
                             deadline_seconds=deadline_seconds, follow_up_of=follow_up_of.id if follow_up_of else None)
        existing = self.store.find(self.root_id, request_id)
        if existing is not None:
            return self._same_request(existing, digest)
        self._check_route(peer)
        _credential(peer.credential_env, peer.alias)  # fail before admission when the key is missing
        from rlmfamily.a2a.wire import send_params, user_message

        message_id = str(uuid.uuid4())
        message = user_message(
            [task, context_text], evidence_items=evidence, message_id=message_id,
            context_id=follow_up_of.remote_context_id if follow_up_of else None,
            reference_task_ids=[follow_up_of.remote_task_id] if follow_up_of and follow_up_of.remote_task_id else None,
            credit_ceiling=peer.tariff_credits if peer.paid else None,
        )
        params = send_params(message)
        request_bytes = len(json.dumps(params, ensure_ascii=False).encode()) + JSONRPC_ENVELOPE_BYTES
        if request_bytes > peer.max_payload_bytes:
            raise DelegationPayloadTooLarge(
                f"the task and context make a {request_bytes:,}-byte request; peer {peer.alias!r} accepts at most "
                f"{peer.max_payload_bytes:,} (max_payload_bytes in the peers file). Send a selection or a summary",
                setting="a2a_peers_file")
        interface = self._interface(peer)  # the card is read (strictly) before anything is recorded or sent
        now = time.time()
        row = Delegation(
            id="dlg_" + secrets.token_hex(8), root_id=self.root_id, agent_id=self.agent_id, request_id=request_id,
            fingerprint=digest, peer_alias=peer.alias, peer_origin=peer.origin, interface_url=interface.url,
            protocol_binding=interface.binding, protocol_version=interface.version,
            credential_env=peer.credential_env, message_id=message_id, task_preview=task[:PREVIEW_CHARS],
            request_bytes=request_bytes, required=bool(required),
            follow_up_of=follow_up_of.id if follow_up_of else None, remote_context_id=None, remote_task_id=None,
            direct_reply=False, state="sending", credits_held=peer.tariff_credits if peer.paid else 0,
            credit_ceiling=peer.tariff_credits if peer.paid else None, max_result_bytes=peer.max_result_bytes,
            deadline_at=now + deadline_s, owner=owner(), status_text="", result_text="", references_json="[]",
            error_code=None, error_message=None, cancel_outcome=None, reconcile_reason=None,
            created_at=now, updated_at=now, charge_state="held" if peer.paid else "free",
        )
        admission = Admission(
            max_tasks_for_peer=peer.max_tasks, max_concurrent_for_peer=peer.max_concurrent,
            max_delegations_for_root=self.settings.a2a_max_delegations,
            credits_allowed=self.settings.a2a_credit_allowance if peer.paid else None,
            tariff_credits=peer.tariff_credits,
        )
        row, created = self.store.admit(row, admission)
        if not created:  # another thread admitted the same request_id first
            return self._same_request(row, digest)
        return self._send(row, params)

    def _same_request(self, existing: Delegation, digest: str) -> Delegation:
        if existing.fingerprint != digest:
            raise RequestIdConflict(
                f"request_id {existing.request_id!r} was already used for another delegation ({existing.id}, to "
                f"{existing.peer_alias!r}) with other inputs; use a new request_id for new work")
        return existing

    def _deadline(self, peer: PeerConfig, deadline_seconds: Any) -> float:
        if deadline_seconds is None:
            return peer.deadline_s
        if isinstance(deadline_seconds, bool) or not isinstance(deadline_seconds, (int, float)) \
                or not 0 < deadline_seconds <= peer.deadline_s:
            raise DeadlineInvalid(
                f"deadline_seconds must be a number of seconds above 0 and at most {peer.deadline_s:g} for peer "
                f"{peer.alias!r} (deadline_s in the peers file)", setting="a2a_peers_file")
        return float(deadline_seconds)

    def _send(self, row: Delegation, params: dict[str, Any]) -> Delegation:
        from rlmfamily.a2a.wire import parse_send_result

        try:
            bearer = _credential(row.credential_env, row.peer_alias)
            result = self.client.call(row.protocol_binding, row.interface_url, "SendMessage", params, bearer=bearer,
                                     max_response_bytes=row.max_result_bytes)
            view = parse_send_result(result)
        except MissingPeerCredential as exc:  # the variable vanished since admission: nothing was sent
            return self._send_failed(row, exc, "not_sent")
        except PeerClientError as exc:
            return self._send_failed(row, exc, exc.outcome)
        return self._record(row, view, event="sent", only_if_state=("sending",))

    def _send_failed(self, row: Delegation, exc: A2AError, outcome: str) -> Delegation:
        if outcome == "unknown":
            # The peer may have accepted it: the credits stay drawn and nothing is resent.
            return self.store.update(
                row.id, event="unknown", detail=exc.message, only_if_state=("sending",), state="unknown",
                error_code=exc.code,
                error_message=exc.message + "; the outcome is unknown and the message is not resent: an operator "
                                            "checks the peer and runs `rlm reconcile`")
        # Nothing was accepted (not sent, or the peer refused before taking it): the draw is released.
        released = {"charge_state": "released", "charge_note": f"the send was {outcome.replace('_', ' ')}: the hold "
                                                              f"of {row.credits_held} credits went back"} \
            if row.charge_state == "held" else {}
        return self.store.update(row.id, event="send_failed", detail=f"{outcome}: {exc.message}",
                                 only_if_state=("sending",), state="failed", credits_held=0, error_code=exc.code,
                                 error_message=exc.message, **released)

    def _record(self, row: Delegation, view: RemoteView, *, event: str,
                only_if_state: tuple[str, ...] | None = None, **extra: Any) -> Delegation:
        if row.remote_task_id and view.task_id and view.task_id != row.remote_task_id:
            exc = PeerProtocolError(f"the peer answered about task {view.task_id}, not {row.remote_task_id}")
            return self.store.update(row.id, event="protocol_error", detail=exc.message, error_code=exc.code,
                                     error_message=exc.message)
        values: dict[str, Any] = {
            "state": view.state, "status_text": view.status_text, "error_code": None, "error_message": None,
        }
        if view.task_id:
            values["remote_task_id"] = view.task_id
        if view.context_id:
            values["remote_context_id"] = view.context_id
        if view.direct_reply:
            values["direct_reply"] = 1
        if view.result_text or view.references or view.state in TERMINAL_STATES:
            values["result_text"] = view.result_text
            values["references_json"] = json.dumps(view.references)
        values.update(extra)
        return self.store.update(row.id, event=event, detail=view.state, only_if_state=only_if_state,
                                 charge_reported=view.charge_reported, **values)

    # ---------- handles ----------

    def poll(self, delegation_id: str) -> Delegation:
        row = self.owned(delegation_id)
        # A finished row whose hold is still held was recorded before its charge could be read: ask once more.
        settling = row.state in TERMINAL_STATES and row.charge_state == "held"
        if (row.state in TERMINAL_STATES and not settling) or row.direct_reply or row.remote_task_id is None:
            return row  # nothing to ask: finished, a direct reply, unknown (reconcile first) or still sending
        self._require_routing()
        from rlmfamily.a2a.wire import parse_task

        try:
            result = self.client.call(row.protocol_binding, row.interface_url, "GetTask", {"id": row.remote_task_id},
                                     bearer=_credential(row.credential_env, row.peer_alias),
                                     max_response_bytes=row.max_result_bytes)
            view = parse_task(result)
        except (PeerClientError, MissingPeerCredential) as exc:
            if settling:  # the work is done: a failed read of its charge leaves the hold, and the record, as they are
                self.store.add_event(row.id, "charge_poll_failed", exc.message)
                return self.store.get(row.id)
            return self.store.update(row.id, event="poll_failed", detail=exc.message, error_code=exc.code,
                                     error_message=exc.message)
        return self._record(row, view, event="polled")

    def wait(self, delegation_id: str, timeout_s: float) -> tuple[Delegation, bool]:
        """Poll until the work finishes or asks for something, or ``timeout_s`` passes (the work keeps running)."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s < 0:
            raise A2AError("wait(timeout) takes a number of seconds, 0 or more")
        timeout_s = min(float(timeout_s), self.settings.a2a_max_wait_s)
        until = time.monotonic() + timeout_s
        while True:
            row = self.poll(delegation_id)
            if row.state not in WAITING_STATES:
                return row, False
            remaining = until - time.monotonic()
            if remaining <= 0:
                return row, True
            time.sleep(min(self.settings.a2a_poll_interval_s, remaining))

    def read(self, delegation_id: str, start: int = 0, size: int | None = None) -> str:
        row = self.owned(delegation_id)
        cap = self.settings.a2a_max_read_chars
        start = int(start or 0)
        if start < 0:
            raise A2AError("read(start, size): start must be 0 or more")
        if size is None:
            size = cap
        if int(size) > cap:
            raise DelegationReadTooLarge(
                f"read size {int(size):,} is above {cap:,} characters (RLM_A2A_MAX_READ_CHARS); read in slices",
                setting="a2a_max_read_chars")
        return row.result_text[start:start + max(0, int(size))]

    def reply(self, delegation_id: str, text: str) -> Delegation:
        row = self.owned(delegation_id)
        if row.state == "auth_required":
            raise ReplyNotExpected(
                f"peer {row.peer_alias!r} asks for authentication, not input ({row.status_text[:QUOTED_STATUS_CHARS]!r}); that is "
                "resolved outside the run (its key or account), or cancel() the delegation")
        if row.state != "input_required":
            raise ReplyNotExpected(f"delegation {row.id} is {row.state}; reply() answers a peer that asked for input")
        if not isinstance(text, str) or not text.strip():
            raise A2AError("reply(text) needs non-empty text")
        events = self.store.events(row.id)
        if events and events[-1]["kind"] == "reply_unknown":
            # The last reply may have reached the peer: sending input again needs a poll that shows the state first.
            raise ReplyNotExpected(f"the previous reply to {row.id} may have reached the peer (its answer was lost); "
                                   "poll() first: it shows whether the peer moved on")
        self._require_routing()
        from rlmfamily.a2a.wire import parse_send_result, send_params, user_message

        peer_limit = self.peer_config.get(row.peer_alias).max_payload_bytes
        message_id = str(uuid.uuid4())
        params = send_params(user_message([text], message_id=message_id, context_id=row.remote_context_id,
                                          task_id=row.remote_task_id))
        size = len(json.dumps(params, ensure_ascii=False).encode()) + JSONRPC_ENVELOPE_BYTES
        if size > peer_limit:
            raise DelegationPayloadTooLarge(f"the reply makes a {size:,}-byte request; peer {row.peer_alias!r} "
                                            f"accepts at most {peer_limit:,} (max_payload_bytes in the peers file)",
                                            setting="a2a_peers_file")
        self.store.add_event(row.id, "reply_sending", f"message_id={message_id}")  # durable before the send
        try:
            result = self.client.call(row.protocol_binding, row.interface_url, "SendMessage", params,
                                     bearer=_credential(row.credential_env, row.peer_alias),
                                     max_response_bytes=row.max_result_bytes)
            view = parse_send_result(result)
        except (PeerClientError, MissingPeerCredential) as exc:
            outcome = getattr(exc, "outcome", "not_sent")
            note = (". The reply may have reached the peer; it is not resent: poll() shows whether the task moved on"
                    if outcome == "unknown" else "")
            return self.store.update(row.id, event=f"reply_{outcome}", detail=exc.message, error_code=exc.code,
                                     error_message=exc.message + note)
        if view.direct_reply:  # an answer inside the task: keep the task's state, show what it said
            return self.store.update(row.id, event="replied", detail="message", status_text=view.result_text)
        return self._record(row, view, event="replied")

    def cancel(self, delegation_id: str) -> Delegation:
        row = self.owned(delegation_id)
        if row.state in TERMINAL_STATES or row.direct_reply:
            return self.store.update(row.id, event="cancel_not_sent", detail=row.state,
                                     cancel_outcome=f"not sent: the delegation is already {row.state}")
        if row.remote_task_id is None:
            return self.store.update(row.id, event="cancel_not_sent", detail=row.state,
                                     cancel_outcome=f"not sent: no remote task id is known (state {row.state}); "
                                                    "an operator reconciles it first")
        self._require_routing()
        from rlmfamily.a2a.wire import parse_task

        try:
            result = self.client.call(row.protocol_binding, row.interface_url, "CancelTask", {"id": row.remote_task_id},
                                     bearer=_credential(row.credential_env, row.peer_alias),
                                     max_response_bytes=row.max_result_bytes)
            view = parse_task(result)
        except PeerRefused as exc:
            # A refusal is not a cancellation: the state stays what the peer last said.
            return self.store.update(row.id, event="cancel_refused", detail=exc.message,
                                     cancel_outcome=f"refused by the peer: {exc.message}")
        except (PeerClientError, MissingPeerCredential) as exc:
            return self.store.update(row.id, event="cancel_unknown", detail=exc.message,
                                     cancel_outcome=f"unknown: {exc.message}")
        outcome = "canceled" if view.state == "canceled" else f"not canceled: the peer reports {view.state}"
        return self._record(row, view, event="cancel_answered", cancel_outcome=outcome)

    def follow_up(self, delegation_id: str, task: str, context_text: str = "", *,
                  evidence: list[dict[str, Any]] | None = None, required: bool = True,
                  deadline_seconds: float | None = None, request_id: str | None = None) -> Delegation:
        row = self.owned(delegation_id)
        if row.state not in TERMINAL_STATES:
            raise FollowUpNotAllowed(
                f"delegation {row.id} is {row.state}; follow_up() continues finished work (use reply() when the "
                "peer asks for input, wait() while it works)")
        if not row.remote_context_id:
            raise FollowUpNotAllowed(f"peer {row.peer_alias!r} gave delegation {row.id} no context id to continue")
        return self.start(row.peer_alias, task, context_text, evidence=evidence, required=required,
                          deadline_seconds=deadline_seconds, request_id=request_id, follow_up_of=row)

    def tasks(self) -> list[Delegation]:
        if not self.settings.a2a_path.exists():
            return []
        return self.store.list(self.root_id)

    # ---------- what the session asks ----------

    def pending_required(self) -> list[Delegation]:
        """Required delegations this agent started that are still open and actionable."""
        if not self.settings.a2a_path.exists():
            return []
        return [r for r in self.store.list(self.root_id)
                if r.agent_id == self.agent_id and r.required and r.state in BLOCKING_STATES]

    def answer_gate(self) -> str | None:
        """Why the agent may not answer yet, or None."""
        pending = self.pending_required()
        if not pending:
            return None
        listed = ", ".join(f"{r.id} to {r.peer_alias!r} is {r.state}" for r in pending[:MAX_LISTED_NAMES])
        return (f"required remote work is still open ({listed}). wait() on it, reply() if the peer asks for input, "
                "or cancel() it; then call final_answer again (or start work with required=False)")

    def evidence(self) -> list[dict[str, Any]]:
        """Every delegation of the family, summarised for the final result: remote work is unverified evidence."""
        return [self.summary_of(r) for r in self.tasks()]

    def describe(self, row: Delegation) -> dict[str, Any]:
        cap = self.settings.a2a_summary_chars
        left = row.deadline_at - time.time()
        return {
            "id": row.id, "peer": row.peer_alias, "state": row.state, "required": row.required,
            "request_id": row.request_id, "remote_task_id": row.remote_task_id, "direct_reply": row.direct_reply,
            "follow_up_of": row.follow_up_of, "status_text": row.status_text[:cap],
            "result_chars": len(row.result_text), "references": len(row.references),
            "error": f"[{row.error_code}] {row.error_message}" if row.error_code else None,
            "cancel_outcome": row.cancel_outcome, "reconcile_reason": row.reconcile_reason,
            "credits_held": row.credits_held, "credit_ceiling": row.credit_ceiling, "charge": row.charge_state,
            "credits_charged": row.credits_charged, "charge_note": row.charge_note, "deadline_in_s": round(left, 1),
            "overdue": left < 0 and row.state not in TERMINAL_STATES, "verified": False,
        }

    def summary_of(self, row: Delegation) -> dict[str, Any]:
        cap = self.settings.a2a_summary_chars
        data = self.describe(row)
        data["preview"] = row.result_text[:cap]
        data["preview_truncated"] = len(row.result_text) > cap
        data["file_references"] = row.references[:MAX_SUMMARY_REFERENCES]
        data["note"] = ("remote evidence from an A2A peer, unverified; read(start, size) returns more"
                        if row.result_text else "no result yet")
        return data


# ---------- the operator's side ----------


def reconcile(settings: RLMSettings, delegation_id: str, *, reason: str, remote_task_id: str | None = None,
              failed: bool = False, client: StrictClient | None = None) -> Delegation:
    """Resolve an ``unknown`` delegation: attach a verified remote task id, or mark it failed, with a reason."""
    if not reason or not reason.strip():
        raise DelegationReconcileRefused("reconciling needs --reason (who checked what, where)")
    if failed == (remote_task_id is not None):
        raise DelegationReconcileRefused("give exactly one of --remote-task-id ID or --failed")
    store = DelegationStore(settings.a2a_path)
    row = store.get(delegation_id)
    if row.state != "unknown":
        raise DelegationReconcileRefused(f"delegation {row.id} is {row.state}; only unknown delegations are "
                                         "reconciled")
    if failed:
        kept = {"charge_state": "unknown", "charge_note": f"charge unknown: an operator marked the delegation "
                                                          f"failed; the hold of {row.credits_held} credits is kept"} \
            if row.charge_state == "held" else {}
        # The credits stay drawn: an operator's word that nothing ran does not refill the family's allowance.
        return store.update(row.id, event="reconciled_failed", detail=reason.strip(), only_if_state=("unknown",),
                            state="failed", reconcile_reason=reason.strip(), error_code="reconciled_failed",
                            error_message="an operator marked this delegation failed", **kept)
    from a2a.types.a2a_pb2 import GetTaskRequest
    from google.protobuf.json_format import MessageToDict

    from rlmfamily.a2a.client import StrictClient
    from rlmfamily.a2a.wire import parse_task

    own_client = client is None
    client = client or StrictClient(connect_timeout_s=settings.a2a_connect_timeout_s,
                                    request_timeout_s=settings.a2a_request_timeout_s,
                                    max_card_bytes=settings.a2a_max_card_bytes)
    try:
        params = MessageToDict(GetTaskRequest(id=str(remote_task_id), history_length=RECONCILE_HISTORY_LENGTH))
        try:
            result = client.call(row.protocol_binding, row.interface_url, "GetTask", params,
                                bearer=_credential(row.credential_env, row.peer_alias),
                                max_response_bytes=row.max_result_bytes)
            view = parse_task(result)
        except PeerClientError as exc:
            raise DelegationReconcileRefused(
                f"the peer did not confirm task {remote_task_id}: [{exc.code}] {exc.message}") from None
    finally:
        if own_client:
            client.close()
    if view.task_id != remote_task_id:
        raise DelegationReconcileRefused(f"the peer answered about task {view.task_id}, not {remote_task_id}")
    if view.message_ids and row.message_id not in view.message_ids:
        raise DelegationReconcileRefused(
            f"task {remote_task_id}'s history does not hold this delegation's message id {row.message_id}: it is "
            "not this delegation's task")
    verified = ("its history holds our message id" if view.message_ids
                else "the peer confirmed the task; it returned no history to match our message id")
    values: dict[str, Any] = {
        "state": view.state, "remote_task_id": view.task_id, "status_text": view.status_text,
        "result_text": view.result_text, "references_json": json.dumps(view.references),
        "reconcile_reason": f"{reason.strip()} (verified: {verified})", "error_code": None, "error_message": None,
    }
    if view.context_id:
        values["remote_context_id"] = view.context_id
    return store.update(row.id, event="reconciled", detail=f"task {remote_task_id}; {verified}",
                        only_if_state=("unknown",), charge_reported=view.charge_reported, **values)
