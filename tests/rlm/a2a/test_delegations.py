"""Delegating to a well-behaved peer built with the a2a-sdk server on 127.0.0.1: the handle's whole life."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.a2a.delegations import Delegations
from rlmfamily.a2a.errors import (
    A2ADisabled,
    DelegationLimitReached,
    DelegationNotOwned,
    DelegationPayloadTooLarge,
    DelegationReadTooLarge,
    FollowUpNotAllowed,
    PeerCardInvalid,
    ReplyNotExpected,
    RequestIdConflict,
)

from .peer_servers import BIG_RESULT_CHARS, HostilePeer, SdkPeer, a2a_settings, peers_of

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def peer() -> Iterator[SdkPeer]:
    served = SdkPeer()
    yield served
    served.close()


def make(peer: SdkPeer, tmp_path: Path, *, root_id: str = "root-1", settings: dict[str, Any] | None = None,
         **config: Any) -> Delegations:
    options = {"alias": "review", "url": peer.url, "skill": "code-review", **config}
    return Delegations(a2a_settings(tmp_path / "data", **(settings or {})), root_id=root_id,
                       peers=peers_of(options))


def sends(peer: SdkPeer) -> int:
    return peer.recorder.calls["SendMessage"]


def test_a_delegation_completes_and_its_result_is_read_in_bounded_slices(peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path)
    row = delegations.start("review", "review this diff", "--- a/x.py\n+++ b/x.py\n")
    assert row.state in ("submitted", "working", "completed") and row.remote_task_id
    assert row.interface_url == f"{peer.url}/jsonrpc"  # pinned from the card at admission
    done, timed_out = delegations.wait(row.id, 10)
    assert (done.state, timed_out) == ("completed", False)
    text = delegations.read(row.id)
    assert text.startswith("review of ") and text.endswith("looks fine")
    assert delegations.read(row.id, 0, 6) == "review" and delegations.read(row.id, 7, 2) == "of"
    with pytest.raises(DelegationReadTooLarge) as caught:
        delegations.read(row.id, 0, 20_001)
    assert caught.value.setting == "a2a_max_read_chars"
    summary = delegations.summary_of(done)
    assert summary["verified"] is False and "unverified" in summary["note"] and summary["preview"] == text


def test_a_large_result_stays_on_the_host_and_what_the_code_sees_is_bounded(peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path, settings={"a2a_summary_chars": 300})
    row, _ = delegations.wait(delegations.start("review", "big").id, 10)
    assert row.state == "completed" and len(row.result_text) >= BIG_RESULT_CHARS - 14
    status = delegations.describe(row)
    assert status["result_chars"] == len(row.result_text) and "preview" not in status
    summary = delegations.summary_of(row)
    assert len(summary["preview"]) == 300 and summary["preview_truncated"] is True
    assert delegations.read(row.id, 14, 14) == "line 00001 ok\n"


def test_a_wait_that_times_out_leaves_the_work_running(peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path)
    row = delegations.start("review", "held wait-test")
    waited, timed_out = delegations.wait(row.id, 0.2)
    assert timed_out is True and waited.state in ("submitted", "working")
    peer.recorder.release("wait-test")
    finished, timed_out = delegations.wait(row.id, 10)
    assert (finished.state, timed_out) == ("completed", False)
    assert delegations.read(row.id) == "held review done"


def test_cancel_records_the_peers_actual_answer_and_a_refusal_is_not_a_cancellation(
        peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path)
    running = delegations.start("review", "held until-cancelled")
    delegations.wait(running.id, 0.2)
    canceled = delegations.cancel(running.id)
    assert (canceled.state, canceled.cancel_outcome) == ("canceled", "canceled")

    finished_remotely = delegations.start("review", "slow 0.1")  # never polled: locally it still looks open
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # ask the peer directly, leaving our record untouched
        task = delegations.client.rpc(finished_remotely.interface_url, "GetTask",
                                      {"id": finished_remotely.remote_task_id}, bearer=None, max_response_bytes=100_000)
        if task["status"]["state"] == "TASK_STATE_COMPLETED":
            break
        time.sleep(0.05)
    refused = delegations.cancel(finished_remotely.id)
    assert refused.cancel_outcome.startswith("refused by the peer")
    assert refused.state == finished_remotely.state != "canceled"
    assert delegations.poll(refused.id).state == "completed"

    cancels = peer.recorder.calls["CancelTask"]
    again = delegations.cancel(refused.id)
    assert again.cancel_outcome == "not sent: the delegation is already completed"
    assert peer.recorder.calls["CancelTask"] == cancels


def test_input_required_is_answered_by_reply_while_auth_required_stays_distinct(peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path)
    asked, _ = delegations.wait(delegations.start("review", "ask").id, 10)
    assert asked.state == "input_required" and asked.status_text == "Which branch should I review?"
    answered = delegations.reply(asked.id, "main")
    answered, _ = delegations.wait(answered.id, 10)
    assert (answered.state, answered.result_text) == ("completed", "reviewed branch main: no findings")
    last = peer.recorder.messages[-1]
    assert last["taskId"] == asked.remote_task_id and last["contextId"] == asked.remote_context_id
    with pytest.raises(ReplyNotExpected, match="reply\\(\\) answers a peer that asked for input"):
        delegations.reply(asked.id, "again")

    auth, _ = delegations.wait(delegations.start("review", "auth").id, 10)
    assert auth.state == "auth_required" and "Sign in" in auth.status_text
    before = sends(peer)
    with pytest.raises(ReplyNotExpected, match="asks for authentication, not input"):
        delegations.reply(auth.id, "my password")
    assert sends(peer) == before


def test_a_direct_message_reply_completes_without_an_invented_task_id(peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path)
    row = delegations.start("review", "hello there")
    assert (row.state, row.direct_reply, row.remote_task_id) == ("completed", True, None)
    assert row.result_text == "hello yourself" and row.remote_context_id
    polls = peer.recorder.calls["GetTask"]
    assert delegations.poll(row.id).state == "completed" and delegations.wait(row.id, 5)[0].state == "completed"
    assert peer.recorder.calls["GetTask"] == polls


def test_follow_up_sends_new_work_in_the_same_remote_context_after_the_first_finished(
        peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path)
    first, _ = delegations.wait(delegations.start("review", "review part one").id, 10)
    second = delegations.follow_up(first.id, "now review part two")
    assert second.follow_up_of == first.id and second.id != first.id
    sent = peer.recorder.bodies[-1]["params"]["message"]
    assert sent["contextId"] == first.remote_context_id and sent["referenceTaskIds"] == [first.remote_task_id]
    second, _ = delegations.wait(second.id, 10)
    assert second.state == "completed" and second.remote_task_id != first.remote_task_id
    assert delegations.owned(first.id).state == "completed"  # the first keeps its own record
    running = delegations.start("review", "held until-cancelled")
    with pytest.raises(FollowUpNotAllowed, match="follow_up\\(\\) continues finished work"):
        delegations.follow_up(running.id, "more")
    delegations.cancel(running.id)


def test_the_same_request_id_returns_the_same_delegation_and_other_inputs_are_refused(
        peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path)
    before = sends(peer)
    first = delegations.start("review", "review once", request_id="job-7")
    assert delegations.start("review", "review once", request_id="job-7").id == first.id
    with pytest.raises(RequestIdConflict) as caught:
        delegations.start("review", "review something else", request_id="job-7")
    assert caught.value.code == "request_id_conflict" and first.id in caught.value.message

    results: list[str] = []
    barrier = threading.Barrier(6)

    def racer() -> None:
        barrier.wait()
        results.append(make(peer, tmp_path).start("review", "raced", request_id="job-8").id)

    threads = [threading.Thread(target=racer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 6 and len(set(results)) == 1
    assert sends(peer) - before == 2


def test_a_handle_reconnects_after_a_restart_but_only_within_its_root_family(peer: SdkPeer, tmp_path: Path) -> None:
    row = make(peer, tmp_path).start("review", "review for later")
    restarted = make(peer, tmp_path)  # a new process of the same root family
    assert restarted.owned(row.id).id == row.id and [r.id for r in restarted.tasks()] == [row.id]
    assert restarted.wait(row.id, 10)[0].state == "completed"
    stranger = make(peer, tmp_path, root_id="another-root")
    with pytest.raises(DelegationNotOwned) as caught:
        stranger.owned(row.id)
    assert caught.value.code == "delegation_not_owned"
    with pytest.raises(DelegationNotOwned):
        stranger.read(row.id)
    assert stranger.tasks() == []


def test_file_references_in_results_are_kept_as_references_and_never_fetched(peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path)
    row, _ = delegations.wait(delegations.start("review", "file please").id, 10)
    assert row.references == [{"url": f"{peer.url}/files/report.txt", "media_type": "text/plain",
                               "filename": "report.txt"}]
    assert "[file reference, not fetched:" in row.result_text
    assert delegations.summary_of(row)["file_references"] == row.references
    assert peer.recorder.file_fetches == 0


def test_payload_task_and_concurrency_limits_are_checked_before_sending(peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path, max_payload_bytes=2000, max_concurrent=1, max_tasks=2)
    before = sends(peer)
    with pytest.raises(DelegationPayloadTooLarge) as too_big:
        delegations.start("review", "review", "x" * 5000)
    assert "accepts at most 2,000" in too_big.value.message
    running = delegations.start("review", "held until-cancelled")
    with pytest.raises(DelegationLimitReached, match="max_concurrent"):
        delegations.start("review", "another")
    delegations.cancel(running.id)
    delegations.start("review", "second")
    with pytest.raises(DelegationLimitReached, match="max_tasks"):
        delegations.start("review", "third")
    assert sends(peer) - before == 2


def test_a_card_without_the_configured_skill_is_refused(peer: SdkPeer, tmp_path: Path) -> None:
    delegations = make(peer, tmp_path, skill="translation")
    with pytest.raises(PeerCardInvalid, match="does not list skill 'translation'"):
        delegations.start("review", "review")


def test_routing_off_refuses_every_route_even_with_a_key_in_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watcher = HostilePeer("error_rpc")  # counts any request at all
    try:
        monkeypatch.setenv("REVIEW_API_KEY", "sk_test_present")
        peers_file = tmp_path / "peers.toml"
        peers_file.write_text(f'[[peers]]\nalias = "review"\nurl = "{watcher.url}"\nskill = "code-review"\n'
                              'credential_env = "REVIEW_API_KEY"\n')
        settings = a2a_settings(tmp_path / "data", a2a_enabled=False, a2a_peers_file=peers_file)
        delegations = Delegations(settings, root_id="root-1")
        for call in (delegations.peers, lambda: delegations.start("review", "review")):
            with pytest.raises(A2ADisabled) as caught:
                call()
            assert caught.value.setting == "a2a_enabled" and "never enables" in caught.value.message
        assert sum(watcher.hits.values()) == 0
    finally:
        watcher.close()
