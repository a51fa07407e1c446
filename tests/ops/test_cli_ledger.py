"""The operator's ledger commands, run as the real `specialists` executable against the test database."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from tests import commands
from tests.ledger.conftest import new_customer, new_job

SPECIALISTS = Path(sys.executable).parent / "specialists"  # the environment that runs the tests has the project

pytestmark = pytest.mark.timeout(120)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return commands.specialists([*args, "--operator", "ops-test"], env)  # in this process (tests/commands.py)


def run_json(env: dict[str, str], *args: str, expect: int = 0) -> dict:
    done = run(env, *args, "--json")
    assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_grant_show_and_history_through_the_command(service_env):
    customer = new_customer("cli")
    key = f"invoice-{customer}"
    assert run_json(service_env, "customers", "add", "--customer", customer)["outcome"] == "created"
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
    assert [(r["job_id"], r["state"]) for r in unknown["reservations"]] == [(job, "unknown")]
    assert unknown["next_cursor"] is None

    reconciled = run_json(service_env, "reconcile", job, "--charged", "5", "--reason", "provider log shows success")
    assert (reconciled["outcome"], reconciled["charged"], reconciled["released"], reconciled["operator"]) == (
        "reconciled",
        5,
        15,
        "ops-test",
    )
    again = run_json(service_env, "reconcile", job, "--charged", "6", "--reason", "second try", expect=1)
    assert again["error"]["code"] == "reservation_already_resolved"
    assert run_json(service_env, "reservations", "list", "--unknown", "--customer", customer)["reservations"] == []
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


# --- reservation pages (issue 18) -------------------------------------------------


def test_reservations_list_pages_through_every_reservation_once(service_env, ledger, t0):
    customer = new_customer("cli")
    ledger.grant(customer, 1000, operator="test", skills=["review"], max_parallel=20, now=t0)
    jobs = [new_job() for _ in range(8)]
    for index, job in enumerate(jobs):  # three reserved at the same instant: the cursor breaks the tie by job id
        ledger.reserve(customer, job, "fp", "review", 5, now=t0 + timedelta(seconds=min(index, 3)))
    ledger.settle(jobs[0], 2)

    pages, cursor = [], None
    while True:
        args = ["reservations", "list", "--customer", customer, "--limit", "3"] + (["--before", cursor] if cursor else [])
        page = run_json(service_env, *args)
        pages.append([(r["created_at"], r["job_id"]) for r in page["reservations"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [3, 3, 2]
    assert all(p == sorted(p) for p in pages)  # each page oldest first
    assert sorted(key for p in pages for key in p) == [key for p in reversed(pages) for key in p]  # newest page first
    assert sorted(job for p in pages for _, job in p) == sorted(jobs)  # every reservation, once

    open_only = run_json(service_env, "reservations", "list", "--customer", customer, "--open", "--limit", "20")
    assert sorted(r["job_id"] for r in open_only["reservations"]) == sorted(jobs[1:])

    table = run(service_env, "reservations", "list", "--customer", customer, "--limit", "3")
    assert table.returncode == 0
    first_cursor = run_json(service_env, "reservations", "list", "--customer", customer, "--limit", "3")["next_cursor"]
    assert f"--before {first_cursor}" in table.stdout

    bad = run(service_env, "reservations", "list", "--before", "not-a-cursor")
    assert bad.returncode == 2 and "cursor" in bad.stderr


# --- verify: progress, and the database it reads (issue 18) ----------------------


@pytest.fixture(scope="module")
def other_database(server_url):
    """A second database at head on the same server, with a ledger of its own: five customers, one of them with
    a posting no operation made. It stands for a replica whose ledger differs from the primary's."""
    from sqlalchemy import create_engine

    from ledger.client import Ledger
    from tests.workers.system import drop_database, fresh_database

    url = fresh_database(server_url)
    engine = create_engine(url)
    try:
        ledger = Ledger(engine)
        customers = [new_customer("replica") for _ in range(5)]
        lots = [ledger.grant(customer, 10, operator="test", skills=["review"]).lot_id for customer in customers]
        broken = customers[2]
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO ledger_journal (entry_id, at, kind, customer_id, lot_id, from_account, to_account, "
                     "credits) VALUES (nextval('ledger_entry_seq'), now(), 'adjust', :c, :l, 'customer_available', "
                     "'revenue', 4)"),
                {"c": broken, "l": lots[2]},
            )
        yield {"url": url, "customers": sorted(customers), "broken": broken, "lot": lots[2]}
    finally:
        engine.dispose()
        drop_database(server_url, url)


def test_the_whole_verify_shows_progress_on_stderr_and_only_its_json_on_stdout(service_env, other_database):
    env = service_env | {"DATABASE_URL": other_database["url"], "SPECIALISTS_LEDGER_VERIFY_CUSTOMERS_PER_CHUNK": "2"}
    done = run(env, "ledger", "verify", "--json")
    assert done.returncode == 1, done.stderr
    verdict = json.loads(done.stdout)  # nothing but the JSON on stdout
    assert [(v["check"], v["customer_id"]) for v in verdict["violations"]] == [("lot_mismatch", other_database["broken"])]
    assert (verdict["customers"], verdict["database"]["url"], verdict["database"]["standby"]) == (
        5, other_database["url"], False)
    lines = [line for line in done.stderr.splitlines() if line.startswith("ledger verify:")]
    assert lines[0].startswith("ledger verify: 5 customers from ") and "2 per statement, in one snapshot" in lines[0]
    assert [line.split(",")[0] for line in lines[1:]] == [
        "ledger verify: 2 of 5 customers", "ledger verify: 4 of 5 customers", "ledger verify: 5 of 5 customers"]
    broken_at = other_database["customers"].index(other_database["broken"])  # violations so far, range by range
    assert [" 1 violation(s)" in line for line in lines[1:]] == [broken_at < 2, broken_at < 4, True]

    table = run(env, "ledger", "verify")
    assert table.returncode == 1 and "lot_mismatch" in table.stdout
    assert f"read 5 customer(s) from {other_database['url']} (primary)" in table.stdout


def test_verify_reads_the_database_its_setting_names(service_env, ledger, other_database):
    primary_customer = new_customer("cli")  # exists only in the service's database
    ledger.grant(primary_customer, 10, operator="test", skills=["review"])
    env = service_env | {"SPECIALISTS_LEDGER_VERIFY_DATABASE_URL": other_database["url"]}

    whole = run_json(env, "ledger", "verify", expect=1)
    assert whole["database"]["url"] == other_database["url"]
    assert [(v["check"], v["customer_id"]) for v in whole["violations"]] == [("lot_mismatch", other_database["broken"])]
    assert whole["customers"] == 5

    broken = run_json(env, "ledger", "verify", "--customer", other_database["broken"], expect=1)
    assert [v["subject"] for v in broken["violations"]] == [f"lot {other_database['lot']} of {other_database['broken']}"]
    absent = run_json(env, "ledger", "verify", "--customer", primary_customer, expect=1)  # not in the replica
    assert absent["error"]["code"] == "customer_not_found" and other_database["url"] in absent["error"]["message"]
    assert run_json(service_env, "ledger", "verify", "--customer", primary_customer)["customers"] == 1


def test_a_bad_or_unreachable_verify_database_names_its_setting(service_env):
    invalid = run(service_env | {"SPECIALISTS_LEDGER_VERIFY_DATABASE_URL": "mysql://replica/x"}, "ledger", "verify")
    assert invalid.returncode == 3 and "SPECIALISTS_LEDGER_VERIFY_DATABASE_URL" in invalid.stderr
    unreachable = run(service_env | {"SPECIALISTS_LEDGER_VERIFY_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"},
                      "ledger", "verify", "--json")
    assert unreachable.returncode == 4 and unreachable.stderr == ""  # with --json, the error is the JSON alone
    error = json.loads(unreachable.stdout)["error"]
    assert error["code"] == "database_unavailable" and "SPECIALISTS_LEDGER_VERIFY_DATABASE_URL" in error["message"]
