"""A hostile peer on 127.0.0.1: each misbehaviour is handled as specified, and nothing is ever resent.

Every test runs on both bindings the client speaks (the ``hostile`` fixture's parameter): the
strictness is a property of the one HTTP path, not of JSON-RPC.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.a2a.delegations import Delegations, reconcile
from rlmfamily.a2a.errors import (
    DelegationReconcileRefused,
    PeerCardInvalid,
    PeerCardMovesOrigin,
    PeerRedirectRefused,
    PeerRefused,
    ReplyNotExpected,
)
from rlmfamily.a2a.store import DelegationStore

from ..conftest import REPO_ROOT
from .peer_servers import HTTP_JSON, INTERFACE_PATHS, JSONRPC, HostilePeer, a2a_settings, peers_of

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=[JSONRPC, HTTP_JSON])
def hostile(request: pytest.FixtureRequest) -> Iterator[Callable[[str], HostilePeer]]:
    made: list[HostilePeer] = []

    def make(mode: str) -> HostilePeer:
        peer = HostilePeer(mode, binding=request.param)
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.close()


def delegations_for(peer: HostilePeer, tmp_path: Path, **peer_config: Any) -> Delegations:
    settings = a2a_settings(tmp_path / "data")
    config = {"alias": "hostile", "url": peer.url, "max_result_bytes": 100_000, **peer_config}
    return Delegations(settings, root_id="root-1", peers=peers_of(config))


def test_a_redirected_card_is_not_followed_and_no_task_is_sent(hostile: Any, tmp_path: Path) -> None:
    peer = hostile("redirect_card")
    delegations = delegations_for(peer, tmp_path)
    with pytest.raises(PeerRedirectRefused, match="redirects are never followed"):
        delegations.start("hostile", "review this")
    assert peer.hits["GET /.well-known/agent-card.json"] == 1
    assert peer.hits["SendMessage"] == 0 and delegations.tasks() == []


def test_a_card_that_moves_the_origin_is_refused_before_anything_is_sent(hostile: Any, tmp_path: Path) -> None:
    peer = hostile("moved_card")
    delegations = delegations_for(peer, tmp_path)
    with pytest.raises(PeerCardMovesOrigin) as caught:
        delegations.start("hostile", "review this")
    assert "http://127.0.0.2:8443" in caught.value.message and "may not move the origin" in caught.value.message
    assert peer.hits["SendMessage"] == 0 and delegations.tasks() == []


def test_a_card_whose_interface_url_holds_a_tab_is_refused_before_it_is_pinned(hostile: Any,
                                                                              tmp_path: Path) -> None:
    # Issue 15: urlsplit drops the tab, so the origin check passed, the URL was pinned, and every later
    # call raised a raw httpx.InvalidURL. Now the card is refused, naming the peer and the character.
    peer = hostile("tab_card")
    delegations = delegations_for(peer, tmp_path)
    for _ in range(2):  # nothing was pinned: the second start reads the card again and is refused again
        with pytest.raises(PeerCardInvalid) as caught:
            delegations.start("hostile", "review this")
        assert caught.value.code == "peer_card_invalid" and caught.value.outcome == "not_sent"
        assert "'hostile'" in caught.value.message and "'\\t'" in caught.value.message
    assert peer.hits["GET /.well-known/agent-card.json"] == 2
    assert peer.hits["SendMessage"] == 0 and delegations.tasks() == []


def test_a_redirect_in_answer_to_a_send_is_not_followed_and_the_send_fails(hostile: Any, tmp_path: Path) -> None:
    peer = hostile("redirect_rpc")
    delegations = delegations_for(peer, tmp_path)
    row = delegations.start("hostile", "review this", request_id="r1")
    assert row.protocol_binding == peer.binding  # the card's one interface was pinned
    assert (row.state, row.error_code) == ("failed", "peer_redirect_refused")
    assert delegations.start("hostile", "review this", request_id="r1").id == row.id
    assert peer.hits["SendMessage"] == 1


def test_a_compressed_answer_is_refused_unread_and_the_send_becomes_unknown(hostile: Any, tmp_path: Path) -> None:
    peer = hostile("gzip")
    delegations = delegations_for(peer, tmp_path)
    row = delegations.start("hostile", "review this", request_id="r1")
    assert (row.state, row.error_code) == ("unknown", "peer_compressed_response_refused")
    assert row.remote_task_id is None
    # Nothing is resent: not by the same request, not by poll or wait.
    assert delegations.start("hostile", "review this", request_id="r1").id == row.id
    assert delegations.poll(row.id).state == "unknown"
    assert delegations.wait(row.id, 5)[0].state == "unknown"
    assert peer.hits["SendMessage"] == 1 and peer.hits["GetTask"] == 0


@pytest.mark.parametrize("mode", ["oversized", "endless"])
def test_an_oversized_answer_is_cut_off_at_the_byte_limit_while_reading(hostile: Any, tmp_path: Path,
                                                                         mode: str) -> None:
    peer = hostile(mode)  # "oversized" announces 3 MB; "endless" announces nothing; neither body ever ends
    delegations = delegations_for(peer, tmp_path)
    row = delegations.start("hostile", "review this")
    # A client that read on to the end would have waited for a2a_request_timeout_s and come back
    # peer_outcome_unknown: returning too large while the body is still held is the cut-off.
    assert peer.hold.let_go == 0
    assert (row.state, row.error_code) == ("unknown", "peer_response_too_large")
    assert "100,000" in (row.error_message or "")
    assert peer.hits["SendMessage"] == 1


def test_a_lost_acknowledgement_is_unknown_never_resent_and_reconciled_with_a_verified_task_id(
        hostile: Any, tmp_path: Path) -> None:
    peer = hostile("drop_after_accept")
    delegations = delegations_for(peer, tmp_path)
    row = delegations.start("hostile", "review this", request_id="r1")
    assert (row.state, row.error_code, row.remote_task_id) == ("unknown", "peer_outcome_unknown", None)
    assert peer.accepted_message_ids == [row.message_id]
    assert delegations.start("hostile", "review this", request_id="r1").id == row.id
    assert delegations.cancel(row.id).cancel_outcome.startswith("not sent: no remote task id")
    assert delegations.wait(row.id, 5)[0].state == "unknown"
    assert peer.hits["SendMessage"] == 1 and peer.hits["CancelTask"] == 0

    settings = delegations.settings
    with pytest.raises(DelegationReconcileRefused, match="needs --reason"):
        reconcile(settings, row.id, remote_task_id=peer.task_id, reason=" ")
    with pytest.raises(DelegationReconcileRefused, match="did not confirm"):
        reconcile(settings, row.id, remote_task_id="not-a-task", reason="checked the console")
    fixed = reconcile(settings, row.id, remote_task_id=peer.task_id, reason="ops: found it in the peer's console")
    assert (fixed.state, fixed.remote_task_id) == ("completed", peer.task_id)
    assert "verified: its history holds our message id" in (fixed.reconcile_reason or "")
    assert delegations.read(row.id) == "the result that was lost"
    with pytest.raises(DelegationReconcileRefused, match="only unknown"):
        reconcile(settings, row.id, failed=True, reason="again")
    assert peer.hits["SendMessage"] == 1


def test_reconcile_refuses_a_task_whose_history_lacks_our_message_and_can_mark_it_failed(
        hostile: Any, tmp_path: Path) -> None:
    peer = hostile("drop_after_accept")
    delegations = delegations_for(peer, tmp_path)
    row = delegations.start("hostile", "review this")
    peer.mode = "wrong_task"
    with pytest.raises(DelegationReconcileRefused, match="not this delegation's task"):
        reconcile(delegations.settings, row.id, remote_task_id=peer.task_id, reason="guessed")
    failed = reconcile(delegations.settings, row.id, failed=True, reason="peer support: no such task")
    assert (failed.state, failed.reconcile_reason) == ("failed", "peer support: no such task")


def test_a_send_interrupted_by_the_death_of_its_process_becomes_unknown(tmp_path: Path) -> None:
    """A process admits a delegation (state sending) and is killed before any answer: it is unknown, not resent."""
    data = tmp_path / "data"
    script = f"""
import os, time, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from rlmfamily.a2a.store import Admission, DelegationStore, Delegation, owner
now = time.time()
row = Delegation(id="dlg_dead", root_id="root-1", agent_id="root-1", request_id="r1", fingerprint="f",
    peer_alias="p", peer_origin="http://127.0.0.1:9", interface_url="http://127.0.0.1:9/jsonrpc",
    protocol_binding="JSONRPC", protocol_version="1.0", credential_env=None, message_id="m1", task_preview="t",
    request_bytes=10, required=True, follow_up_of=None, remote_context_id=None, remote_task_id=None,
    direct_reply=False, state="sending", credits_held=0, credit_ceiling=None, max_result_bytes=1000,
    deadline_at=now + 60, owner=owner(), status_text="", result_text="", references_json="[]", error_code=None,
    error_message=None, cancel_outcome=None, reconcile_reason=None, created_at=now, updated_at=now)
DelegationStore({str(data / 'a2a.sqlite3')!r}).admit(row, Admission(5, 5, 5, None, 0))
print("admitted", flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "admitted"
        store = DelegationStore(data / "a2a.sqlite3")
        assert store.get("dlg_dead").state == "sending"  # its process is alive: still sending
        proc.kill()
        proc.wait(10)
        row = store.get("dlg_dead")
        assert (row.state, row.error_code) == ("unknown", "sender_died")
        assert [e["kind"] for e in store.events("dlg_dead")] == ["admitted", "unknown"]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_reply_whose_acknowledgement_was_lost_is_not_sent_again_until_a_poll_shows_the_state(
        hostile: Any, tmp_path: Path) -> None:
    peer = hostile("ask_then_drop_reply")
    delegations = delegations_for(peer, tmp_path)
    asked = delegations.start("hostile", "review this")
    assert (asked.state, asked.status_text) == ("input_required", "Which branch?")
    lost = delegations.reply(asked.id, "main")
    assert lost.state == "input_required" and "it is not resent" in (lost.error_message or "")
    with pytest.raises(ReplyNotExpected, match="poll\\(\\) first"):
        delegations.reply(asked.id, "main")
    assert peer.hits["SendMessage"] == 2
    peer.task_state = "TASK_STATE_WORKING"  # the peer did get the reply
    assert delegations.poll(asked.id).state == "working"
    with pytest.raises(ReplyNotExpected, match="is working"):
        delegations.reply(asked.id, "main")
    assert peer.hits["SendMessage"] == 2


def test_a_refusal_reads_the_same_on_both_bindings(hostile: Any, tmp_path: Path) -> None:
    peer = hostile("error_rpc")  # refuses every send: JSON-RPC -32602, or HTTP 400 with reason INVALID_PARAMS
    delegations = delegations_for(peer, tmp_path)
    row = delegations.start("hostile", "review this")
    assert (row.state, row.error_code, row.credits_held) == ("failed", "peer_refused", 0)
    assert row.error_message == "the peer refused SendMessage (-32602): credit_ceiling below the tariff"
    with pytest.raises(PeerRefused) as caught:
        delegations.client.call(peer.binding, f"{peer.url}{INTERFACE_PATHS[peer.binding]}", "GetTask",
                                {"id": "not-this-peers-task"}, bearer=None, max_response_bytes=10_000)
    assert caught.value.outcome == "refused"
    assert (caught.value.details["rpc_code"], caught.value.details["reason"]) == (-32001, "TASK_NOT_FOUND")
