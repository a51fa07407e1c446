"""A local `rlm` root delegates a review to this project's own hosted service, end to end.

The service runs as `specialists serve` (edge, embedded dispatcher and a worker) on
127.0.0.1 with the shipped specs and the scripted demo routes. The operator issues a
key and grants credits with the `specialists` command; a local RLM run (Monty kernel,
scripted root model) sends the example project's files as evidence to the hosted
`reviewer` through `a2a.start`, waits, and reads the findings through a bounded
handle. The ledger shows one reservation settled once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import PROJECT_ROOT
from tests import commands
from tests.serve import running_service

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

EXAMPLE = PROJECT_ROOT / "specs" / "demo" / "shop"
KEY_ENV = "SPECIALISTS_REVIEW_KEY"
REVIEWER_TARIFF = 20
ALLOWANCE = 50


def specialists(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return commands.specialists(args, env)  # in this process (tests/commands.py)


@pytest.fixture(scope="module")
def hosted(server_url, engine, tmp_path_factory):
    # One service for both bindings (a start is most of this test's time); each binding is its own customer.
    engine.dispose()  # hand the session engine's idle connections back; the server allows 100
    with running_service(server_url, tmp_path_factory.mktemp("hosted")) as service:
        yield service.base_url, service.env


# The peers file pins the binding: the client uses it or refuses the peer before sending anything.
@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
def test_a_local_rlm_root_delegates_a_review_to_the_hosted_service_and_is_charged_once(hosted, tmp_path, binding):
    base, env = hosted
    customer = f"rlm-user-{binding.lower().replace('+', '-')}"
    added = specialists(env, "customers", "add", "--customer", customer, "--json")
    assert added.returncode == 0, added.stdout + added.stderr
    issued = specialists(env, "keys", "issue", "--customer", customer, "--json")
    assert issued.returncode == 0, issued.stdout + issued.stderr
    key = json.loads(issued.stdout)["key"]
    granted = specialists(env, "credits", "grant", "--customer", customer, "--credits", "100",
                          "--skill", "review", "--json")  # the skill on the reviewer's card, as the peer names it
    assert granted.returncode == 0, granted.stdout + granted.stderr

    peers = tmp_path / "peers.toml"
    peers.write_text(
        "[[peers]]\n"
        'alias = "reviewer"\n'
        f'url = "{base}/specialists/reviewer"\n'
        'description = "The hosted reviewer"\n'
        'skill = "review"\n'
        f'credential_env = "{KEY_ENV}"\n'
        f"tariff_credits = {REVIEWER_TARIFF}\n"
        "deadline_s = 120\n"
        f'binding = "{binding}"\n'
    )
    script = tmp_path / "root.toml"
    script.write_text(
        'model = "scripted-root"\n'
        "[[root]]\n"
        "code = '''\n"
        'files = context.select("shop/*.py")\n'
        "h = a2a.start('reviewer', 'Find SQL statements built from caller input.', files.chunk(4000),\n"
        "              request_id='review-1')\n"
        "r = h.wait(90)\n"
        "print(r['state'], r['timed_out'])\n"
        "'''\n"
        "[[root]]\n"
        "code = '''\n"
        "again = a2a.start('reviewer', 'Find SQL statements built from caller input.', files.chunk(4000),\n"
        "                  request_id='review-1')\n"
        "print('same handle:', again.id == h.id)\n"
        "final_answer(h.read(0, 2000))\n"
        "'''\n"
    )
    rlm_env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECIALISTS_", "RLM_"))}
    rlm_env.update({
        KEY_ENV: key,
        "RLM_DATA_DIR": str(tmp_path / "rlm"),
        "RLM_A2A_ENABLED": "true",
        "RLM_A2A_PAID_ENABLED": "true",
        "RLM_A2A_CREDIT_ALLOWANCE": str(ALLOWANCE),
        "RLM_A2A_PEERS_FILE": str(peers),
    })
    run = subprocess.run(
        [str(Path(sys.executable).parent / "rlm"), "run", "--repo", str(EXAMPLE), "--script", str(script),
         "--json", "Is there SQL built from caller input in the shop?"],
        env=rlm_env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=150,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["stop_reason"] == "answered", result
    # The hosted reviewer found the defect in the file the root sent as evidence, read through the handle.
    assert "shop/customers.py" in result["answer"], json.dumps(result, indent=1)[:6000]
    assert "same handle: True" in Path(result["trajectory_path"]).read_text()  # request_id: nothing sent twice
    [delegation] = result["extra"]["delegations"]
    assert delegation["state"] == "completed" and delegation["verified"] is False
    assert key not in run.stdout + run.stderr

    # Exactly one reservation, settled once, for the one task; the ledger verifies.
    shown = json.loads(specialists(env, "reservations", "list", "--customer", customer, "--json").stdout)
    rows = shown if isinstance(shown, list) else shown["reservations"]
    assert len(rows) == 1 and rows[0]["state"] == "settled", rows
    history = json.loads(specialists(env, "credits", "history", "--customer", customer, "--json").stdout)
    entries = history if isinstance(history, list) else history["entries"]
    journal_entries = {(e["entry_id"], e["kind"]) for e in entries}  # history lists postings; count entries
    kinds = sorted(kind for _, kind in journal_entries)
    assert kinds == ["grant", "reserve", "settle"], kinds
    verify = specialists(env, "ledger", "verify", "--json")
    assert verify.returncode == 0, verify.stdout

    # The charge comes back: the task's metadata says what the service settled, and the local hold is settled to
    # it, the rest returned to the family's allowance (reserved 20, charged less).
    charged = rows[0]["charged"]
    assert 0 < charged < REVIEWER_TARIFF, rows
    assert (delegation["charge"], delegation["credits_charged"], delegation["credits_held"]) == (
        "settled", charged, charged), delegation
    listed = json.loads(rlm(rlm_env, "delegations", "--json").stdout)
    [row] = listed["delegations"]
    assert (row["charge_state"], row["credits_charged"], row["credits_held"], row["credit_ceiling"]) == (
        "settled", charged, charged, REVIEWER_TARIFF), row
    assert listed["allowances"] == [{"root_id": result["run_id"], "credits_allowed": ALLOWANCE,
                                     "credits_held": charged}]
    assert [e["kind"] for e in row["events"]].count("charge_settled") == 1
    table = rlm(rlm_env, "delegations").stdout
    assert f"{charged} charged of {REVIEWER_TARIFF} held" in " ".join(table.split()), table
    shown = rlm(rlm_env, "show", result["run_id"]).stdout
    assert f"{charged} credits charged of {REVIEWER_TARIFF} held" in " ".join(shown.split()), shown

    # Whole numbers stay whole: the service sends a finding's line as 8, and it is read back as 8, not 8.0.
    findings = json.loads(result["answer"].split("=== findings ===", 1)[1])
    assert [(f["path"], f["line"]) for f in findings] == [("shop/customers.py", 8)], findings
    # The text too (a finding's keys come in no fixed order, so no neighbour is assumed).
    assert type(findings[0]["line"]) is int and re.search(r'"line": 8\b(?!\.)', result["answer"]), result["answer"]


def rlm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(Path(sys.executable).parent / "rlm"), *args], env={**env, "COLUMNS": "200"},
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_rlm_peers_shows_the_route_refused_when_the_peers_file_tariff_is_below_the_cards_price(
        hosted, tmp_path):
    base, _ = hosted
    peers = tmp_path / "peers.toml"
    peers.write_text(
        "[[peers]]\n"
        'alias = "reviewer"\n'
        f'url = "{base}/specialists/reviewer"\n'
        'skill = "review"\n'
        f'credential_env = "{KEY_ENV}"\n'
        f"tariff_credits = {REVIEWER_TARIFF - 1}\n"
    )
    rlm_env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECIALISTS_", "RLM_"))}
    rlm_env.update({KEY_ENV: "sk_not_used_by_a_card_read", "RLM_DATA_DIR": str(tmp_path / "rlm"),
                    "RLM_A2A_ENABLED": "true", "RLM_A2A_PAID_ENABLED": "true",
                    "RLM_A2A_CREDIT_ALLOWANCE": str(ALLOWANCE), "RLM_A2A_PEERS_FILE": str(peers)})
    [peer] = json.loads(rlm(rlm_env, "peers", "--json").stdout)["peers"]
    assert peer["route_open"] is False and peer["card_tariff_credits"] == REVIEWER_TARIFF, peer
    assert peer["why_not"].startswith(f"[peer_tariff_below_price] peer 'reviewer' charges {REVIEWER_TARIFF} credits")
    assert "raise tariff_credits for 'reviewer' in the peers file (RLM_A2A_PEERS_FILE)" in peer["why_not"], peer
    table = " ".join(rlm(rlm_env, "peers").stdout.split())
    assert "closed: [peer_tariff_below_price]" in table and f"(card: {REVIEWER_TARIFF})" in table, table


def test_the_example_peer_in_the_docs_is_the_hosted_reviewer_and_its_route_is_open(hosted, tmp_path):
    base, _ = hosted
    docs = (PROJECT_ROOT / "docs" / "RLM.md").read_text()
    section = docs[docs.index("## Delegating to A2A peers"):]
    example = section[section.index("```toml\n") + len("```toml\n"):section.index("```\n", section.index("```toml"))]
    peers = tmp_path / "peers.toml"
    peers.write_text(example.replace("https://specialists.example.com", base))
    rlm_env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECIALISTS_", "RLM_"))}
    rlm_env.update({"SPECIALISTS_API_KEY": "sk_not_used_by_a_card_read", "RLM_DATA_DIR": str(tmp_path / "rlm"),
                    "RLM_A2A_ENABLED": "true", "RLM_A2A_PAID_ENABLED": "true",
                    "RLM_A2A_CREDIT_ALLOWANCE": str(ALLOWANCE), "RLM_A2A_PEERS_FILE": str(peers)})
    [peer] = json.loads(rlm(rlm_env, "peers", "--json").stdout)["peers"]
    assert (peer["url"], peer["skill"]) == (f"{base}/specialists/reviewer", "review"), peer
    assert peer["route_open"] is True, peer["why_not"]
    assert peer["tariff_credits"] == peer["card_tariff_credits"] == REVIEWER_TARIFF
