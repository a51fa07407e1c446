"""The charge comes back: a paid delegation's hold is settled to what its finished task reports, once, durably.

The peer is the a2a-sdk server on 127.0.0.1 (``SdkPeer``) whose ``charge JSON`` work completes with
``{"specialist": {"creditsCharged": JSON}}`` in the task's metadata, where the hosted service states it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.a2a.charge import settle
from rlmfamily.a2a.delegations import Delegations, reconcile
from rlmfamily.a2a.errors import CreditAllowanceExhausted
from rlmfamily.a2a.store import DelegationStore

from ..test_cli import rlm
from .peer_servers import HostilePeer, SdkPeer, a2a_settings, peers_of

pytestmark = pytest.mark.timeout(90)

KEY_ENV = "REVIEW_API_KEY"
KEY = "sk_test_charge_key_0123456789"
TARIFF = 20
ALLOWANCE = 50


@pytest.fixture(scope="module")
def peer() -> Iterator[SdkPeer]:
    served = SdkPeer(tariff_credits=TARIFF)
    yield served
    served.close()


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def peer_config(url: str) -> dict[str, Any]:
    return {"alias": "review", "url": url, "skill": "code-review", "credential_env": KEY_ENV,
            "tariff_credits": TARIFF, "max_concurrent": 50, "max_tasks": 50}


def paid(url: str, data: Path, *, root_id: str = "root-1") -> Delegations:
    settings = a2a_settings(data, a2a_paid_enabled=True, a2a_credit_allowance=ALLOWANCE)
    return Delegations(settings, root_id=root_id, peers=peers_of(peer_config(url)))


def charge_events(store: DelegationStore, delegation_id: str) -> list[str]:
    return [e["kind"] for e in store.events(delegation_id) if e["kind"].startswith("charge_")]


def test_a_finished_task_settles_its_hold_to_the_reported_charge_and_returns_the_rest(
        peer: SdkPeer, tmp_path: Path) -> None:
    delegations = paid(peer.url, tmp_path / "data")
    row = delegations.start("review", "charge 5")
    assert (row.charge_state, row.credits_held) in (("held", TARIFF), ("settled", 5))
    done, _ = delegations.wait(row.id, 10)
    assert (done.state, done.charge_state, done.credits_charged, done.credits_held, done.credit_ceiling) == (
        "completed", "settled", 5, 5, TARIFF)
    assert "reported 5 credits charged (metadata.specialist.creditsCharged)" in done.charge_note
    assert "15 of the 20 held returned" in done.charge_note
    store = delegations.store
    assert store.credits("root-1") == {"credits_allowed": ALLOWANCE, "credits_held": 5}

    # Polled, waited on and read again: nothing changes, nothing is settled twice.
    again = delegations.poll(row.id)
    delegations.wait(row.id, 1)
    assert (again.charge_state, again.credits_held) == ("settled", 5)
    assert charge_events(store, row.id) == ["charge_settled"]
    status = delegations.describe(again)
    assert (status["charge"], status["credits_charged"], status["credits_held"], status["credit_ceiling"]) == (
        "settled", 5, 5, TARIFF)

    # What came back is drawable again: 5 + 20 + 20 fit in 50; drawn at 20 a task, the third would not have.
    delegations.start("review", "held second")
    delegations.start("review", "held third")
    with pytest.raises(CreditAllowanceExhausted, match="drawn 45 of its 50"):
        delegations.start("review", "held fourth")
    peer.recorder.release("second")
    peer.recorder.release("third")


@pytest.mark.parametrize(("charge", "why"), [
    (None, "reports no charge (metadata.specialist.creditsCharged)"),
    ("null", "reports no charge"),
    ("5.5", "reports 5.5, not a whole number of credits"),
    ('"5"', "reports '5', not a whole number of credits"),
    ("true", "reports True, not a whole number of credits"),
    ("-1", "reports -1 credits, below 0"),
    ("21", "reports 21 credits, more than the 20 held"),
])
def test_a_charge_not_reported_or_not_a_whole_number_within_the_hold_keeps_the_hold_and_is_unknown(
        peer: SdkPeer, tmp_path: Path, charge: str | None, why: str) -> None:
    delegations = paid(peer.url, tmp_path / "data")
    row = delegations.start("review", "review this" if charge is None else f"charge {charge}")
    done, _ = delegations.wait(row.id, 10)
    assert (done.state, done.charge_state, done.credits_charged, done.credits_held) == (
        "completed", "unknown", None, TARIFF)
    assert done.charge_note.startswith("charge unknown: the peer") and why in done.charge_note
    assert done.charge_note.endswith("the hold of 20 credits is kept")
    assert delegations.store.credits("root-1")["credits_held"] == TARIFF
    assert delegations.poll(row.id).charge_state == "unknown"  # finished: not asked again
    assert charge_events(delegations.store, row.id) == ["charge_unknown"]


def test_the_settlement_rule_matches_its_table() -> None:
    assert settle(20, 5).credits_returned == 15 and settle(20, 5.0).credits_charged == 5
    assert settle(20, 0).credits_held == 0 and settle(20, 20).credits_returned == 0
    for bad in (None, 5.5, "5", True, -1, 21, [5], {"credits": 5}, float("nan"), float("inf")):
        outcome = settle(20, bad)
        assert (outcome.charge_state, outcome.credits_held, outcome.credits_charged) == ("unknown", 20, None), bad


START_AND_WAIT = """
import sys
from rlmfamily.a2a.delegations import Delegations, reconcile
from rlmfamily.a2a.peers import PeerConfig, Peers
from rlmfamily.settings import load_settings

settings = load_settings(data_dir=sys.argv[1], a2a_enabled=True, a2a_paid_enabled=True, a2a_credit_allowance=50,
                         a2a_poll_interval_s=0.05)
peers = Peers(None, (PeerConfig(alias="review", url=sys.argv[2], skill="code-review", credential_env="REVIEW_API_KEY",
                                tariff_credits=20),))
delegations = Delegations(settings, root_id="root-1", peers=peers)
row = delegations.start("review", "held restart 5", request_id="the-one")
print(row.id, flush=True)
delegations.wait(row.id, 60)  # killed while waiting: the remote work finishes after this process is gone
"""


def test_a_charge_reported_after_the_process_died_is_settled_once_by_whoever_polls_next(
        peer: SdkPeer, tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = subprocess.Popen([sys.executable, "-c", START_AND_WAIT, str(data), peer.url], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, KEY_ENV: KEY})
    try:
        delegation_id = first.stdout.readline().strip()  # printed once the delegation is recorded and sent
        assert delegation_id.startswith("dlg_"), first.communicate(timeout=10)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    store = DelegationStore(data / "a2a.sqlite3")
    assert (store.get(delegation_id).state, store.get(delegation_id).charge_state) in (
        ("submitted", "held"), ("working", "held"))
    peer.recorder.release("restart")  # the work finishes now, with nobody left waiting on it

    # The next run of the family (eight agents, each its own process's view of the file) waits: one settles.
    settled: list[Any] = []
    failures: list[str] = []
    barrier = threading.Barrier(8)

    def agent() -> None:
        barrier.wait()
        try:
            settled.append(paid(peer.url, data).wait(delegation_id, 20)[0])
        except BaseException as exc:  # shown by the assertion below, not lost in a thread
            failures.append(repr(exc))

    threads = [threading.Thread(target=agent) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    assert {(r.state, r.charge_state, r.credits_held, r.credits_charged) for r in settled} == {
        ("completed", "settled", 5, 5)}
    assert charge_events(store, delegation_id) == ["charge_settled"]
    assert store.credits("root-1") == {"credits_allowed": ALLOWANCE, "credits_held": 5}
    restarted = paid(peer.url, data)
    assert restarted.start("review", "held restart 5", request_id="the-one").id == delegation_id  # not resent
    assert restarted.poll(delegation_id).credits_held == 5 and charge_events(store, delegation_id) == ["charge_settled"]


LEGACY_SCHEMA = """
CREATE TABLE delegations (
    id TEXT PRIMARY KEY, root_id TEXT NOT NULL, agent_id TEXT NOT NULL, request_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL, peer_alias TEXT NOT NULL, peer_origin TEXT NOT NULL, interface_url TEXT NOT NULL,
    protocol_binding TEXT NOT NULL, protocol_version TEXT NOT NULL, credential_env TEXT,
    message_id TEXT NOT NULL UNIQUE, task_preview TEXT NOT NULL, request_bytes INTEGER NOT NULL,
    required INTEGER NOT NULL, follow_up_of TEXT, remote_context_id TEXT, remote_task_id TEXT,
    direct_reply INTEGER NOT NULL DEFAULT 0, state TEXT NOT NULL, credits_held INTEGER NOT NULL DEFAULT 0,
    credit_ceiling INTEGER, max_result_bytes INTEGER NOT NULL, deadline_at REAL NOT NULL, owner TEXT NOT NULL,
    status_text TEXT NOT NULL DEFAULT '', result_text TEXT NOT NULL DEFAULT '',
    references_json TEXT NOT NULL DEFAULT '[]', error_code TEXT, error_message TEXT, cancel_outcome TEXT,
    reconcile_reason TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL, UNIQUE (root_id, request_id)
);
"""


def test_a_file_from_before_the_charge_came_back_is_upgraded_and_its_finished_holds_settle_at_the_next_poll(
        peer: SdkPeer, tmp_path: Path) -> None:
    # Work done by this version, then recorded the way the previous one left it: finished, its hold drawn.
    fresh = paid(peer.url, tmp_path / "fresh")
    done, _ = fresh.wait(fresh.start("review", "charge 5").id, 10)
    free_peer = SdkPeer()  # its card states no price
    try:
        free = Delegations(a2a_settings(tmp_path / "fresh"), root_id="root-1",
                           peers=peers_of({"alias": "free", "url": free_peer.url}))
        done_free, _ = free.wait(free.start("free", "review this").id, 10)
    finally:
        free_peer.close()
    legacy = tmp_path / "data" / "a2a.sqlite3"
    legacy.parent.mkdir()
    with sqlite3.connect(legacy) as conn:
        conn.executescript(LEGACY_SCHEMA)
        for row in (done, done_free):
            values = {k: v for k, v in row.to_dict().items()
                      if k not in ("charge_state", "credits_charged", "charge_note")}
            values["credits_held"] = row.credit_ceiling or 0
            conn.execute(f"INSERT INTO delegations ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                         list(values.values()))
    conn.close()

    delegations = paid(peer.url, tmp_path / "data")
    before = delegations.store.get(done.id)
    assert (before.state, before.charge_state, before.credits_held) == ("completed", "held", TARIFF)
    assert delegations.store.get(done_free.id).charge_state == "free"
    after = delegations.poll(done.id)  # one GetTask: the finished task still says what it was charged
    assert (after.charge_state, after.credits_held, after.credits_charged) == ("settled", 5, 5)
    assert delegations.poll(done.id).credits_held == 5 and charge_events(delegations.store, done.id) == [
        "charge_settled"]


def test_rlm_delegations_show_and_the_runs_record_say_what_was_charged_and_what_is_unknown(
        peer: SdkPeer, tmp_path: Path, fixture_repo: Path) -> None:
    peers_file = tmp_path / "peers.toml"
    peers_file.write_text(f'[[peers]]\nalias = "review"\nurl = "{peer.url}"\nskill = "code-review"\n'
                          f'credential_env = "{KEY_ENV}"\ntariff_credits = {TARIFF}\n')
    script = tmp_path / "script.toml"
    script.write_text("[[root]]\ncode = '''\n"
                      "a = a2a.start('review', 'charge 5', request_id='charged')\n"
                      "b = a2a.start('review', 'review the ferry', request_id='silent')\n"
                      "a.wait(20)\nb.wait(20)\n"
                      "final_answer(str(a.status()['credits_charged']) + ' ' + b.status()['charge'])\n'''\n")
    env = {KEY_ENV: KEY, "RLM_A2A_ENABLED": "true", "RLM_A2A_PAID_ENABLED": "true",
           "RLM_A2A_CREDIT_ALLOWANCE": str(ALLOWANCE), "RLM_A2A_PEERS_FILE": str(peers_file)}
    data = tmp_path / "data"
    ran = rlm("run", "delegate", "--repo", str(fixture_repo), "--script", str(script), "--json", data_dir=data,
              env=env)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["answer"] == "5 unknown"
    charged, silent = result["extra"]["delegations"]
    assert (charged["charge"], charged["credits_charged"], charged["credits_held"]) == ("settled", 5, 5)
    assert (silent["charge"], silent["credits_charged"], silent["credits_held"]) == ("unknown", None, TARIFF)

    listed = json.loads(rlm("delegations", "--json", data_dir=data).stdout)
    assert [(d["charge_state"], d["credits_charged"], d["credits_held"]) for d in listed["delegations"]] == [
        ("settled", 5, 5), ("unknown", None, TARIFF)]
    assert listed["allowances"] == [{"root_id": result["run_id"], "credits_allowed": ALLOWANCE,
                                     "credits_held": 5 + TARIFF}]
    table = " ".join(rlm("delegations", data_dir=data).stdout.split())
    assert "5 charged of 20 held" in table and "20 held, charge unknown" in table
    assert f"root {result['run_id']}: 25 of its 50 credits drawn" in table
    assert "charges unknown (the hold stays drawn):" in table and "reports no charge" in table

    shown = " ".join(rlm("show", result["run_id"], data_dir=data).stdout.split())
    assert "5 credits charged of 20 held (15 returned)" in shown and "20 credits held, charge unknown" in shown
    page = tmp_path / "run.html"
    assert rlm("show", "--html", result["run_id"], "-o", str(page), data_dir=data).returncode == 0
    text = page.read_text()
    assert "5 credits charged of 20 held (15 returned)" in text and "20 credits held, charge unknown" in text


def test_an_unknown_send_reconciled_to_its_finished_task_is_settled_to_the_charge_the_task_reports(
        tmp_path: Path) -> None:
    peer = HostilePeer("drop_after_accept")  # accepts the task, then drops the connection before answering
    peer.task_metadata = {"specialist": {"creditsCharged": 7}}
    try:
        data = tmp_path / "data"
        delegations = paid(peer.url, data)
        unknown = delegations.start("review", "review the ferry")
        assert (unknown.state, unknown.charge_state, unknown.credits_held) == ("unknown", "held", TARIFF)
        settings = a2a_settings(data, a2a_paid_enabled=True, a2a_credit_allowance=ALLOWANCE)
        done = reconcile(settings, unknown.id, reason="ops found the task", remote_task_id=peer.task_id)
        assert (done.state, done.charge_state, done.credits_charged, done.credits_held) == ("completed", "settled", 7, 7)
        assert delegations.store.credits("root-1")["credits_held"] == 7

        other = delegations.start("review", "review the docks")
        failed = reconcile(settings, other.id, reason="the peer has no such task", failed=True)
        assert (failed.state, failed.charge_state, failed.credits_held) == ("failed", "unknown", TARIFF)
        assert "an operator marked the delegation failed" in failed.charge_note
        assert peer.hits["SendMessage"] == 2
    finally:
        peer.close()
