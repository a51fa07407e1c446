"""The operator's ledger commands, run as the real `specialists` executable against the test database."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.ledger.conftest import new_customer, new_job

SPECIALISTS = Path(sys.executable).parent / "specialists"  # the environment that runs the tests has the project

pytestmark = pytest.mark.timeout(120)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SPECIALISTS), *args, "--operator", "ops-test"], env=env, capture_output=True, text=True, timeout=60
    )


def run_json(env: dict[str, str], *args: str, expect: int = 0) -> dict:
    done = run(env, *args, "--json")
    assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_grant_show_and_history_through_the_command(service_env):
    customer = new_customer("cli")
    key = f"invoice-{customer}"
    granted = run_json(
        service_env, "credits", "grant", "--customer", customer, "--credits", "120", "--skill", "review",
        "--expires-in-days", "30", "--max-parallel", "3", "--idempotency-key", key, "--reason", "order 17",
    )
    assert (granted["outcome"], granted["credits"], granted["max_parallel"]) == ("created", 120, 3)
    replay = run_json(
        service_env, "credits", "grant", "--customer", customer, "--credits", "120", "--skill", "review",
        "--expires-in-days", "30", "--max-parallel", "3", "--idempotency-key", key, "--reason", "order 17",
    )
    assert replay["outcome"] == "exists" and replay["grant_id"] == granted["grant_id"]
    refused = run_json(
        service_env, "credits", "grant", "--customer", customer, "--credits", "999", "--idempotency-key", key, expect=1
    )
    assert refused["error"]["code"] == "grant_idempotency_mismatch"

    shown = run_json(service_env, "credits", "show", "--customer", customer)
    assert (shown["available"], shown["held"], shown["max_parallel"]) == (120, 0, 3)
    assert [e["skill"] for e in shown["entitlements"]] == ["review"]
    assert shown["lots"][0]["granted"] == 120

    history = run_json(service_env, "credits", "history", "--customer", customer)
    assert [(h["kind"], h["credits"], h["operator"]) for h in history] == [("grant", 120, "ops-test")]

    table = run(service_env, "credits", "show", "--customer", customer)
    assert table.returncode == 0 and "available" in table.stdout and "120" in table.stdout


def test_unknown_reservations_are_listed_and_reconciled_once(service_env, ledger):
    customer = new_customer("cli")
    ledger.grant(customer, 50, operator="test", skills=["review"])
    job = new_job()
    assert ledger.reserve(customer, job, "fp", "review", 20).outcome == "created"

    marked = run_json(service_env, "reservations", "mark-unknown", job, "--reason", "worker lease expired")
    assert (marked["outcome"], marked["unknown_by"]) == ("marked", "ops-test")
    unknown = run_json(service_env, "reservations", "list", "--unknown", "--customer", customer)
    assert [(r["job_id"], r["state"]) for r in unknown] == [(job, "unknown")]

    reconciled = run_json(service_env, "reconcile", job, "--charged", "5", "--reason", "provider log shows success")
    assert (reconciled["outcome"], reconciled["charged"], reconciled["released"], reconciled["operator"]) == (
        "reconciled",
        5,
        15,
        "ops-test",
    )
    again = run_json(service_env, "reconcile", job, "--charged", "6", "--reason", "second try", expect=1)
    assert again["error"]["code"] == "reservation_already_resolved"
    assert run_json(service_env, "reservations", "list", "--unknown", "--customer", customer) == []
    shown = run_json(service_env, "reservations", "show", job)
    assert (shown["resolution_kind"], shown["resolved_by"]) == ("reconcile", "ops-test")


def test_adjust_and_its_refusal_exit_codes(service_env, ledger):
    customer = new_customer("cli")
    ledger.grant(customer, 10, operator="test", skills=["review"])
    added = run_json(service_env, "credits", "adjust", "--customer", customer, "--credits", "5", "--reason", "goodwill")
    assert added["available"] == 15
    refused = run_json(
        service_env, "credits", "adjust", "--customer", customer, "--credits", "-16", "--reason", "too much", expect=1
    )
    assert refused["error"]["code"] == "adjust_exceeds_available"
    removed = run(service_env, "credits", "adjust", "--customer", customer, "--credits", "-15", "--reason", "refund")
    assert removed.returncode == 0


def test_bad_arguments_exit_2_with_what_to_fix(service_env):
    bad_customer = run(service_env, "credits", "grant", "--customer", "Not-Valid", "--credits", "5", "--skill", "review")
    assert bad_customer.returncode == 2 and "customer id" in bad_customer.stderr
    bad_date = run(service_env, "credits", "grant", "--customer", "x", "--credits", "5", "--expires-at", "next tuesday")
    assert bad_date.returncode == 2 and "ISO 8601" in bad_date.stderr
    no_reason = run(service_env, "reconcile", new_job(), "--charged", "1")
    assert no_reason.returncode == 2


def test_verify_exits_0_when_clean_and_1_listing_violations(service_env, ledger, engine):
    clean = new_customer("cli")
    ledger.grant(clean, 10, operator="test", skills=["review"])
    verdict = run_json(service_env, "ledger", "verify", "--customer", clean)
    assert verdict["clean"] is True and verdict["violations"] == []

    broken = new_customer("planted")
    lot = ledger.grant(broken, 10, operator="test", skills=["review"]).lot_id
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO ledger_journal (entry_id, at, kind, customer_id, lot_id, from_account, to_account, credits) "
                "VALUES (nextval('ledger_entry_seq'), now(), 'adjust', :c, :l, 'issued', 'customer_available', 3)"
            ),
            {"c": broken, "l": lot},
        )
    verdict = run_json(service_env, "ledger", "verify", "--customer", broken, expect=1)
    assert verdict["clean"] is False
    assert {v["check"] for v in verdict["violations"]} >= {"lot_mismatch"}
    table = run(service_env, "ledger", "verify", "--customer", broken)
    assert table.returncode == 1 and "lot_mismatch" in table.stdout


def test_ledger_expire_reports_what_it_moved(service_env, ledger, engine):
    customer = new_customer("cli")
    ledger.grant(customer, 10, operator="test", skills=["review"], expires_in=timedelta(days=1))
    with engine.begin() as conn:  # age the lot instead of waiting a day: only the expiry instant changes
        conn.execute(
            text("UPDATE ledger_lots SET expires_at = now() - interval '1 second', created_at = now() - interval '2 days' "
                 "WHERE customer_id = :c"),
            {"c": customer},
        )
    moved = run_json(service_env, "ledger", "expire")
    assert [(m["customer_id"], m["credits"]) for m in moved if m["customer_id"] == customer] == [(customer, 10)]
    assert run_json(service_env, "credits", "show", "--customer", customer)["available"] == 0


def test_an_invalid_ledger_setting_exits_3_naming_the_variable(service_env):
    env = service_env | {"SPECIALISTS_LEDGER_MAX_CREDITS_PER_OPERATION": "0"}
    done = run(env, "credits", "show", "--customer", new_customer("cli"))
    assert done.returncode == 3
    assert "SPECIALISTS_LEDGER_MAX_CREDITS_PER_OPERATION" in done.stderr
