"""`rlm peers`, `rlm delegations` and `rlm reconcile`, run as a user runs them (the installed console script)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..test_cli import rlm
from .peer_servers import HostilePeer, SdkPeer

pytestmark = pytest.mark.timeout(120)

KEY = "sk_test_cli_key_value_5e1d"


def test_rlm_peers_shows_each_route_and_whether_its_key_is_set_never_the_key(tmp_path: Path) -> None:
    card_peer = SdkPeer(tariff_credits=5)
    try:
        peers_file = tmp_path / "peers.toml"
        peers_file.write_text(
            f'[[peers]]\nalias = "review"\nurl = "{card_peer.url}"\n'
            'skill = "code-review"\ncredential_env = "REVIEW_API_KEY"\ntariff_credits = 5\n\n'
            '[[peers]]\nalias = "echo"\nurl = "http://127.0.0.1:9"\ncredential_env = "ECHO_KEY"\n')
        env = {"REVIEW_API_KEY": KEY}
        off = rlm("peers", "--peers-file", str(peers_file), "--json", data_dir=tmp_path / "data", env=env)
        assert off.returncode == 0, off.stderr
        data = json.loads(off.stdout)
        assert data["routing"]["a2a_enabled"] is False
        assert [(p["alias"], p["credential"], p["route_open"]) for p in data["peers"]] == [
            ("review", "set", False), ("echo", "missing", False)]
        assert "a2a_disabled" in data["peers"][0]["why_not"]
        assert card_peer.recorder.calls["card"] == 0  # routing off: no card is read

        on = rlm("peers", "--peers-file", str(peers_file), data_dir=tmp_path / "data",
                 env={**env, "RLM_A2A_ENABLED": "true", "RLM_A2A_PAID_ENABLED": "true",
                      "RLM_A2A_CREDIT_ALLOWANCE": "20"})
        assert on.returncode == 0, on.stderr
        assert "routing on, paid peers on, credit allowance 20" in on.stdout
        review_line = next(line for line in on.stdout.splitlines() if "review" in line and "REVIEW_API_KEY" in line)
        assert "REVIEW_API_KEY (set)" in review_line and "open" in review_line and "5 (card: 5)" in review_line
        assert "ECHO_KEY (missing)" in on.stdout and "missing_peer_credential" in on.stdout
        assert card_peer.recorder.calls["card"] == 1  # read the way a2a.start reads it
        assert KEY not in off.stdout + off.stderr + on.stdout + on.stderr
    finally:
        card_peer.close()

    inline = tmp_path / "bad.toml"
    inline.write_text(f'[[peers]]\nalias = "x"\nurl = "https://x.example"\napi_key = "{KEY}"\n')
    refused = rlm("peers", "--peers-file", str(inline), data_dir=tmp_path / "data")
    assert refused.returncode == 2 and "[peers_file_invalid]" in refused.stderr and KEY not in refused.stderr


def test_rlm_peers_shows_a_route_refused_when_its_tariff_is_below_the_cards_price_as_a2a_start_does(
        tmp_path: Path, fixture_repo: Path) -> None:
    card_peer = SdkPeer(tariff_credits=20)
    try:
        peers_file = tmp_path / "peers.toml"
        peers_file.write_text(f'[[peers]]\nalias = "review"\nurl = "{card_peer.url}"\nskill = "code-review"\n'
                              'credential_env = "REVIEW_API_KEY"\ntariff_credits = 5\n')
        env = {"REVIEW_API_KEY": KEY, "RLM_A2A_ENABLED": "true", "RLM_A2A_PAID_ENABLED": "true",
               "RLM_A2A_CREDIT_ALLOWANCE": "50", "RLM_A2A_PEERS_FILE": str(peers_file)}
        data = tmp_path / "data"
        listed = rlm("peers", "--json", data_dir=data, env=env)
        assert listed.returncode == 0, listed.stderr
        [peer] = json.loads(listed.stdout)["peers"]
        assert (peer["route_open"], peer["tariff_credits"], peer["card_tariff_credits"]) == (False, 5, 20)
        assert peer["why_not"].startswith("[peer_tariff_below_price] peer 'review' charges 20 credits per task")
        assert "raise tariff_credits for 'review' in the peers file (RLM_A2A_PEERS_FILE)" in peer["why_not"]
        table = " ".join(rlm("peers", data_dir=data, env=env).stdout.split())
        assert "5 (card: 20)" in table and "closed: [peer_tariff_below_price]" in table

        # a2a.start refuses it by the same rule, before anything is held or sent.
        script = tmp_path / "script.toml"
        script.write_text("[[root]]\ncode = '''\n"
                          "try:\n    a2a.start('review', 'review the ferry')\n"
                          "except ValueError as exc:\n    final_answer(str(exc))\n'''\n")
        ran = rlm("run", "delegate", "--repo", str(fixture_repo), "--script", str(script), "--quiet",
                  data_dir=data, env=env)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.startswith("[peer_tariff_below_price] peer 'review' charges 20 credits per task")
        assert card_peer.recorder.calls["SendMessage"] == 0
        assert json.loads(rlm("delegations", "--json", data_dir=data).stdout)["delegations"] == []
    finally:
        card_peer.close()


def test_a_run_whose_acknowledgement_was_lost_is_listed_and_reconciled_from_the_command_line(
        tmp_path: Path, fixture_repo: Path) -> None:
    peer = HostilePeer("drop_after_accept")
    try:
        peers_file = tmp_path / "peers.toml"
        peers_file.write_text(f'[[peers]]\nalias = "hostile"\nurl = "{peer.url}"\n')
        script = tmp_path / "script.toml"
        script.write_text(
            "[[root]]\ncode = '''\n"
            "a = a2a.start('hostile', 'review the ferry', request_id='one')\n"
            "b = a2a.start('hostile', 'review the docks', request_id='two')\n"
            "final_answer(a.status()['state'] + ' ' + b.status()['state'])\n'''\n")
        env = {"RLM_A2A_ENABLED": "true", "RLM_A2A_PEERS_FILE": str(peers_file)}
        data = tmp_path / "data"
        ran = rlm("run", "delegate", "--repo", str(fixture_repo), "--script", str(script), "--quiet",
                  data_dir=data, env=env)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == "unknown unknown"
        assert ran.stderr.count("remote evidence (unverified): dlg_") == 2 and "to hostile: unknown" in ran.stderr

        listed = json.loads(rlm("delegations", "--json", data_dir=data).stdout)["delegations"]
        assert [d["state"] for d in listed] == ["unknown", "unknown"]
        first, second = listed
        assert [e["kind"] for e in first["events"]] == ["admitted", "unknown"]
        table = rlm("delegations", first["root_id"][:10], data_dir=data)
        assert table.returncode == 0 and "unknown outcomes (never resent" in table.stdout

        no_reason = rlm("reconcile", first["id"], "--remote-task-id", peer.task_id, data_dir=data)
        assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
        attached = rlm("reconcile", first["id"], "--remote-task-id", peer.task_id, "--reason",
                       "ops checked the peer's task list", data_dir=data)
        assert attached.returncode == 0, attached.stderr
        assert f"{first['id']} is now completed (remote task {peer.task_id})" in attached.stdout
        failed = rlm("reconcile", second["id"], "--failed", "--reason", "the peer has no such task", "--json",
                     data_dir=data)
        assert json.loads(failed.stdout)["state"] == "failed"
        again = rlm("reconcile", second["id"], "--failed", "--reason", "twice", data_dir=data)
        assert again.returncode == 2 and "[delegation_reconcile_refused]" in again.stderr

        after = {d["id"]: d for d in json.loads(rlm("delegations", "--json", data_dir=data).stdout)["delegations"]}
        assert after[first["id"]]["result_chars"] == len("the result that was lost")
        assert peer.hits["SendMessage"] == 2  # one per delegation, nothing resent
    finally:
        peer.close()
