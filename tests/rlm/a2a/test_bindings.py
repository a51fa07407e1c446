"""Both HTTP bindings of A2A 1.0 against the a2a-sdk server on 127.0.0.1: the same delegation on either.

The card lists ``supportedInterfaces``; the client pins JSON-RPC when offered, else HTTP+JSON, unless
the peers file names a ``binding``. Whatever was pinned, send, GetTask, cancel, replies and errors
behave the same (the strictness of the HTTP path itself is tested on both in test_hostile).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.a2a.delegations import Delegations
from rlmfamily.a2a.errors import PeerCardInvalid, PeerRefused

from .peer_servers import HTTP_JSON, INTERFACE_PATHS, JSONRPC, SdkPeer, a2a_settings, peers_of

pytestmark = pytest.mark.timeout(30)

KEY = "peer-key-for-bindings"
BINDINGS = [JSONRPC, HTTP_JSON]


@pytest.fixture(scope="module")
def both() -> Iterator[SdkPeer]:
    """A peer whose card lists HTTP+JSON first, then JSON-RPC: the order alone does not choose."""
    served = SdkPeer(bindings=(HTTP_JSON, JSONRPC))
    yield served
    served.close()


@pytest.fixture(scope="module")
def rest_only() -> Iterator[SdkPeer]:
    served = SdkPeer(bindings=(HTTP_JSON,))
    yield served
    served.close()


@pytest.fixture(scope="module")
def jsonrpc_only() -> Iterator[SdkPeer]:
    served = SdkPeer(bindings=(JSONRPC,))
    yield served
    served.close()


def make(peer: SdkPeer, tmp_path: Path, **config: Any) -> Delegations:
    options = {"alias": "review", "url": peer.url, "skill": "code-review", **config}
    return Delegations(a2a_settings(tmp_path / "data"), root_id="root-1", peers=peers_of(options))


def pinned_to(binding: str, both: SdkPeer, tmp_path: Path) -> Delegations:
    """Delegations to ``both`` pinned on ``binding`` through the peers file."""
    return make(both, tmp_path, binding=binding)


def calls_on(peer: SdkPeer, binding: str) -> int:
    with peer.recorder.lock:
        return peer.recorder.bindings[binding]


def test_without_a_preference_json_rpc_is_chosen_whatever_the_cards_order(both: SdkPeer, tmp_path: Path) -> None:
    row = make(both, tmp_path).start("review", "review this")
    assert (row.protocol_binding, row.interface_url) == (JSONRPC, f"{both.url}/jsonrpc")


def test_a_card_offering_only_http_json_is_used_over_http_json(rest_only: SdkPeer, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINDINGS_PEER_KEY", KEY)
    delegations = make(rest_only, tmp_path, credential_env="BINDINGS_PEER_KEY")
    row = delegations.start("review", "review this diff", "--- a/x.py\n+++ b/x.py\n")
    assert (row.protocol_binding, row.interface_url) == (HTTP_JSON, f"{rest_only.url}/rest")
    done, timed_out = delegations.wait(row.id, 10)
    assert (done.state, timed_out) == ("completed", False)
    assert delegations.read(row.id).endswith("looks fine")
    assert calls_on(rest_only, JSONRPC) == 0 and rest_only.recorder.calls["GetTask"] >= 1
    assert set(rest_only.recorder.bearers) == {KEY}  # the key travels on this binding too, in the header


def test_the_peers_file_binding_is_preferred_and_must_be_offered(both: SdkPeer, jsonrpc_only: SdkPeer,
                                                                 tmp_path: Path) -> None:
    row = pinned_to(HTTP_JSON, both, tmp_path / "a").start("review", "review this")
    assert (row.protocol_binding, row.interface_url) == (HTTP_JSON, f"{both.url}/rest")
    delegations = make(jsonrpc_only, tmp_path / "b", binding=HTTP_JSON)
    with pytest.raises(PeerCardInvalid) as caught:
        delegations.start("review", "review this")
    assert "asks for binding 'HTTP+JSON'" in caught.value.message and "JSONRPC 1.0" in caught.value.message
    assert calls_on(jsonrpc_only, JSONRPC) == 0 and delegations.tasks() == []


@pytest.mark.parametrize("binding", BINDINGS)
def test_send_get_and_read_complete_a_delegation_on_either_binding(binding: str, both: SdkPeer,
                                                                   tmp_path: Path) -> None:
    before = calls_on(both, binding)
    delegations = pinned_to(binding, both, tmp_path)
    row = delegations.start("review", "review this diff", "--- a/x.py\n+++ b/x.py\n")
    done, _ = delegations.wait(row.id, 10)
    assert done.state == "completed" and done.remote_task_id == row.remote_task_id
    assert delegations.read(row.id).startswith("review of ")
    assert calls_on(both, binding) >= before + 2  # the send and at least one GetTask went this way

    reply = delegations.start("review", "hello there")  # a direct Message reply: no task id invented
    assert (reply.state, reply.direct_reply, reply.remote_task_id) == ("completed", True, None)
    assert reply.result_text == "hello yourself"


@pytest.mark.parametrize("binding", BINDINGS)
def test_input_required_is_answered_by_reply_on_either_binding(binding: str, both: SdkPeer, tmp_path: Path) -> None:
    delegations = pinned_to(binding, both, tmp_path)
    asked, _ = delegations.wait(delegations.start("review", "ask").id, 10)
    assert asked.state == "input_required" and asked.status_text == "Which branch should I review?"
    answered, _ = delegations.wait(delegations.reply(asked.id, "main").id, 10)
    assert (answered.state, answered.result_text) == ("completed", "reviewed branch main: no findings")


@pytest.mark.parametrize("binding", BINDINGS)
def test_cancel_and_a_refused_cancel_read_the_same_on_either_binding(binding: str, both: SdkPeer,
                                                                     tmp_path: Path) -> None:
    delegations = pinned_to(binding, both, tmp_path)
    running = delegations.start("review", f"held cancel-{binding}")
    canceled = delegations.cancel(running.id)
    assert (canceled.state, canceled.cancel_outcome) == ("canceled", "canceled")

    finished_remotely = delegations.start("review", "slow 0.1")  # never polled: locally it still looks open
    deadline = time.monotonic() + 10
    state = None
    while state != "TASK_STATE_COMPLETED" and time.monotonic() < deadline:  # ask the peer, not our record
        state = delegations.client.call(binding, finished_remotely.interface_url, "GetTask",
                                        {"id": finished_remotely.remote_task_id}, bearer=None,
                                        max_response_bytes=100_000)["status"]["state"]
    assert state == "TASK_STATE_COMPLETED"
    refused = delegations.cancel(finished_remotely.id)
    assert refused.state == finished_remotely.state != "canceled"
    assert refused.cancel_outcome is not None
    assert refused.cancel_outcome.startswith("refused by the peer: the peer refused CancelTask (-32002): ")


@pytest.mark.parametrize("binding", BINDINGS)
def test_an_unknown_task_is_the_same_refusal_on_either_binding(binding: str, both: SdkPeer, tmp_path: Path) -> None:
    client = make(both, tmp_path).client
    url = f"{both.url}{INTERFACE_PATHS[binding]}"
    for method in ("GetTask", "CancelTask"):
        with pytest.raises(PeerRefused) as caught:
            client.call(binding, url, method, {"id": "no-such-task"}, bearer=None, max_response_bytes=10_000)
        assert caught.value.outcome == "refused"
        assert (caught.value.details["rpc_code"], caught.value.details["reason"]) == (-32001, "TASK_NOT_FOUND")
        assert caught.value.message.startswith(f"the peer refused {method} (-32001): ")
