"""Paid peers: two opt-ins, a positive family allowance, a skill and a key; credits drawn atomically, never refilled."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.a2a.delegations import Delegations
from rlmfamily.a2a.errors import (
    A2AError,
    CreditAllowanceExhausted,
    CreditAllowanceMismatch,
    MissingPeerCredential,
    PaidRoutesDisabled,
    PeerTariffBelowPrice,
)
from rlmfamily.a2a.store import DelegationStore
from rlmfamily.errors import SettingsInvalid
from rlmfamily.settings import load_settings

from .peer_servers import HostilePeer, SdkPeer, a2a_settings, peers_of

pytestmark = pytest.mark.timeout(60)

KEY_ENV = "REVIEW_API_KEY"
KEY = "sk_test_paid_route_key_0123456789"


@pytest.fixture(scope="module")
def peer() -> Iterator[SdkPeer]:
    served = SdkPeer(tariff_credits=3)
    yield served
    served.close()


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def paid(url: str, tmp_path: Path, *, root_id: str = "root-1", tariff: int = 3, **settings: Any) -> Delegations:
    options: dict[str, Any] = {"a2a_paid_enabled": True, "a2a_credit_allowance": 10, **settings}
    config = {"alias": "review", "url": url, "skill": "code-review", "credential_env": KEY_ENV,
              "tariff_credits": tariff, "max_concurrent": 50, "max_tasks": 50}
    return Delegations(a2a_settings(tmp_path / "data", **options), root_id=root_id, peers=peers_of(config))


def test_a_paid_route_needs_both_opt_ins_a_positive_allowance_and_a_key(
        peer: SdkPeer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = peer.recorder.calls["SendMessage"]
    with pytest.raises(SettingsInvalid, match="a2a_paid_enabled needs a2a_enabled"):
        load_settings(data_dir=tmp_path, a2a_paid_enabled=True)
    monkeypatch.setenv(KEY_ENV, KEY)
    cases: list[tuple[dict[str, Any], type[A2AError], str]] = [
        ({"a2a_paid_enabled": False}, PaidRoutesDisabled, "a2a_paid_enabled"),
        ({"a2a_credit_allowance": 0}, CreditAllowanceExhausted, "a2a_credit_allowance"),
    ]
    for overrides, error, setting in cases:
        with pytest.raises(error) as caught:
            paid(peer.url, tmp_path, root_id=f"root-{setting}", **overrides).start("review", "review")
        assert caught.value.setting == setting
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(MissingPeerCredential) as missing:
        paid(peer.url, tmp_path, root_id="root-nokey").start("review", "review")
    assert KEY_ENV in missing.value.message
    assert peer.recorder.calls["SendMessage"] == before
    listed = paid(peer.url, tmp_path, root_id="root-nokey").peers()
    assert listed[0]["available"] is False and "missing_peer_credential" in listed[0]["unavailable_because"]

    monkeypatch.setenv(KEY_ENV, KEY)
    row = paid(peer.url, tmp_path, root_id="root-ok").start("review", "review")
    assert row.state != "failed" and (row.credits_held, row.credit_ceiling) == (3, 3)
    assert peer.recorder.bearers[-1] == KEY


def test_each_paid_request_states_its_credit_ceiling_as_whole_credits(peer: SdkPeer, tmp_path: Path,
                                                                      key: str) -> None:
    paid(peer.url, tmp_path).start("review", "review")
    metadata = peer.recorder.bodies[-1]["params"]["message"]["metadata"]
    assert metadata == {"credit_ceiling": 3} and type(metadata["credit_ceiling"]) is int


def test_the_family_allowance_is_drawn_atomically_by_racing_agents(peer: SdkPeer, tmp_path: Path, key: str) -> None:
    before = peer.recorder.calls["SendMessage"]
    admitted: list[str] = []
    refused: list[str] = []
    unexpected: list[str] = []
    barrier = threading.Barrier(8)

    def agent(n: int) -> None:
        # Each thread is its own agent of the same root family (as children are), with its own store handle.
        # Generous timeouts: eight threads and the in-process peer share one GIL on a loaded 2-core machine.
        delegations = paid(peer.url, tmp_path, a2a_request_timeout_s=30.0, a2a_connect_timeout_s=15.0)
        delegations.agent_id = f"agent-{n}"
        barrier.wait()
        try:
            admitted.append(delegations.start("review", f"review part {n}").id)
        except CreditAllowanceExhausted as exc:
            refused.append(exc.message)
        except BaseException as exc:  # anything else is a bug the assertion below must show, not a lost thread
            unexpected.append(repr(exc))

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert unexpected == []
    assert (len(admitted), len(refused)) == (3, 5)  # 3 x 3 credits fit in 10, a fourth would not
    assert peer.recorder.calls["SendMessage"] - before == 3
    assert DelegationStore(tmp_path / "data" / "a2a.sqlite3").credits("root-1") == {
        "credits_allowed": 10, "credits_held": 9}
    assert "drawn 9 of its 10" in refused[0]


def test_the_allowance_is_never_refilled_by_a_restart_or_a_child(peer: SdkPeer, tmp_path: Path, key: str) -> None:
    paid(peer.url, tmp_path).start("review", "one")
    paid(peer.url, tmp_path).start("review", "two")
    with pytest.raises(CreditAllowanceMismatch) as caught:
        paid(peer.url, tmp_path, a2a_credit_allowance=100).start("review", "three")  # a child asking for more
    assert "never refilled" in caught.value.message and caught.value.setting == "a2a_credit_allowance"
    restarted = paid(peer.url, tmp_path)  # same figure after a restart: the drawn credits still count
    restarted.start("review", "three")
    with pytest.raises(CreditAllowanceExhausted):
        restarted.start("review", "four")


def test_a_refused_paid_send_releases_its_draw_and_an_unknown_one_keeps_it(tmp_path: Path, key: str) -> None:
    refusing, dropping = HostilePeer("error_rpc"), HostilePeer("drop_after_accept")
    try:
        refused = paid(refusing.url, tmp_path, root_id="root-a").start("review", "review")
        assert (refused.state, refused.error_code, refused.credits_held) == ("failed", "peer_refused", 0)
        assert "credit_ceiling below the tariff" in (refused.error_message or "")
        unknown = paid(dropping.url, tmp_path, root_id="root-b").start("review", "review")
        assert (unknown.state, unknown.credits_held) == ("unknown", 3)
        assert (refusing.hits["SendMessage"], dropping.hits["SendMessage"]) == (1, 1)
    finally:
        refusing.close()
        dropping.close()


def test_a_card_that_charges_more_than_the_configured_tariff_is_refused_before_sending(
        peer: SdkPeer, tmp_path: Path, key: str) -> None:
    before = peer.recorder.calls["SendMessage"]
    with pytest.raises(PeerTariffBelowPrice, match="charges 3 credits per task"):
        paid(peer.url, tmp_path, tariff=2).start("review", "review")
    assert peer.recorder.calls["SendMessage"] == before


def test_a2a_limits_are_checked_at_start_up_only_when_routing_is_on(tmp_path: Path) -> None:
    assert load_settings(data_dir=tmp_path, host_call_timeout_s=1.0, subcall_timeout_s=0.5).a2a_enabled is False
    with pytest.raises(SettingsInvalid, match="a2a_max_wait_s \\+ a2a_request_timeout_s must fit"):
        load_settings(data_dir=tmp_path, a2a_enabled=True, host_call_timeout_s=100.0, subcall_timeout_s=50.0)
