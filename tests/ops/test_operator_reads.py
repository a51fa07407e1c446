"""The operator's reads on the command line (issue 20), the ones the console shows too: usage per day (a table, JSON
or CSV), the journal a page at a time, and who issued and revoked each key. Each test runs the real executable
against the test database."""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime, timedelta, timezone

import pytest

from a2a.types.a2a_pb2 import TaskState

from tests.ledger.test_reads import far_day, opened, settled
from tests.ops.test_operator_cli import added, cli, cli_json, refusal
from tests.taskstate.test_reads import admitted, ran

pytestmark = pytest.mark.timeout(120)


def test_credits_usage_prints_a_table_json_and_csv_of_the_same_rows(service_env, ledger):
    day = far_day()
    customer = opened(ledger)
    settled(ledger, customer, "reviewer", 10, 7, day + timedelta(hours=1))
    settled(ledger, customer, "analyst", 5, 5, day + timedelta(days=1, hours=2))
    period = ("--since", day.date().isoformat(), "--until", (day + timedelta(days=2)).date().isoformat())

    shown = cli_json(service_env, "credits", "usage", *period, "--customer", customer)
    assert [(r["day"], r["specialist_id"], r["credits_charged"], r["settlements"]) for r in shown["usage"]] == [
        (day.date().isoformat(), "reviewer", 7, 1), ((day + timedelta(days=1)).date().isoformat(), "analyst", 5, 1)]
    assert shown["since"] == day.isoformat() and shown["customer_id"] == customer

    spreadsheet = cli(service_env, "credits", "usage", *period, "--customer", customer, "--csv")
    assert spreadsheet.returncode == 0, spreadsheet.stderr
    assert list(csv.DictReader(io.StringIO(spreadsheet.stdout))) == [
        {k: str(v) for k, v in row.items()} for row in shown["usage"]]

    table = cli(service_env, "credits", "usage", *period, "--customer", customer)
    assert table.returncode == 0 and re.search(rf"│ {day.date().isoformat()}\s+│ reviewer\s+│ {customer}\s+│ 7 ",
                                               table.stdout), table.stdout
    assert "12 credits charged in 2 settlements" in table.stdout


def test_credits_usage_refuses_a_long_period_an_unknown_customer_and_two_outputs(service_env):
    day = far_day()
    long = refusal(service_env, "credits", "usage", "--since", day.date().isoformat(), "--until",
                   (day + timedelta(days=400)).date().isoformat(), expect=2)
    assert long["code"] == "ledger_input_invalid" and "SPECIALISTS_LEDGER_MAX_USAGE_DAYS" in long["message"]
    nobody = refusal(service_env, "credits", "usage", "--customer", "nobody-here", expect=1)
    assert nobody["code"] == "customer_not_found"
    both = refusal(service_env, "credits", "usage", "--csv", expect=2)
    assert both["code"] == "usage_error" and "--csv" in both["message"]


def test_ledger_journal_filters_pages_and_prints_where_the_next_page_starts(service_env, ledger):
    customer = added(service_env)
    cli_json(service_env, "credits", "grant", "--customer", customer, "--credits", "50", "--skill", "review",
             "--operator", "carol-journal")
    for credits in ("3", "4"):
        cli_json(service_env, "credits", "adjust", "--customer", customer, "--credits", credits, "--reason", "goodwill",
                 "--operator", "carol-journal")
    page = cli_json(service_env, "ledger", "journal", "--customer", customer, "--kind", "adjust", "--limit", "1")
    assert [(line["kind"], line["credits"], line["operator"]) for line in page["lines"]] == [
        ("adjust", 4, "carol-journal")]
    older = cli_json(service_env, "ledger", "journal", "--customer", customer, "--kind", "adjust", "--limit", "1",
                     "--before", str(page["next_before"]))
    assert [line["credits"] for line in older["lines"]] == [3] and older["next_before"] is None
    # After the command, --operator filters; the postings of others are not listed.
    mine = cli_json(service_env, "ledger", "journal", "--operator", "carol-journal", "--customer", customer)
    assert [line["kind"] for line in mine["lines"]] == ["adjust", "adjust", "grant"]

    table = cli(service_env, "ledger", "journal", "--customer", customer, "--limit", "2")
    assert table.returncode == 0, table.stderr
    assert f"older postings: the same command with --before {mine['lines'][1]['posting_id']}" in table.stdout
    unknown = refusal(service_env, "ledger", "journal", "--kind", "refund", expect=2)
    assert unknown["message"] == ("journal kinds are grant, reserve, settle, void, reconcile, expire, adjust; "
                                  "got refund")
    assert refusal(service_env, "ledger", "journal", "--customer", "nobody-here", expect=1)["code"] == \
        "customer_not_found"


def test_keys_list_shows_who_issued_and_who_revoked_each_key(service_env):
    customer = added(service_env)
    issued = cli_json(service_env, "--operator", "dana", "keys", "issue", "--customer", customer)
    assert issued["issued_by"] == "dana"
    other = cli_json(service_env, "keys", "issue", "--customer", customer, "--operator", "erin")
    cli_json(service_env, "keys", "revoke", other["key_id"], "--reason", "leaked", "--operator", "frank")
    listed = cli_json(service_env, "keys", "list", "--customer", customer)
    assert sorted((k["key_id"], k["issued_by"], k["revoked_by"]) for k in listed) == sorted(
        [(issued["key_id"], "dana", None), (other["key_id"], "erin", "frank")])
    table = cli(service_env, "keys", "list", "--customer", customer)
    assert re.search(rf"│ {other['key_id']}\s+│.*│ erin\s+│.*│ frank\s+│", table.stdout), table.stdout


def test_customers_show_lists_its_balances_keys_and_newest_tasks_with_their_money(service_env, ledger, engine):
    customer = opened(ledger)
    now = datetime.now(timezone.utc)
    task, job = admitted(engine, customer=customer, specialist="reviewer", at=now - timedelta(minutes=2),
                         state=TaskState.TASK_STATE_WORKING, credits=10, ledger=ledger)
    ran(engine, job, "w-show", None)  # its worker died: unknown until reconciled
    free, free_job = admitted(engine, customer=customer, specialist="drill", at=now - timedelta(minutes=1),
                              state=TaskState.TASK_STATE_COMPLETED)
    issued = cli_json(service_env, "keys", "issue", "--customer", customer, "--operator", "gina")
    shown = cli_json(service_env, "customers", "show", "--customer", customer)
    assert shown["balances"] == {"available": 990, "held": 10, "expired_unswept": 0, "open_reservations": 1,
                                 "max_parallel": 50}
    assert [(k["key_id"], k["issued_by"]) for k in shown["keys"]] == [(issued["key_id"], "gina")]
    assert [(t["task_id"], t["state"], t["reserved_credits"], t["charged_credits"], t["job_ids"])
            for t in shown["tasks"]] == [(free, "completed", None, None, [free_job]), (task, "unknown", 10, None, [job])]
    table = cli(service_env, "customers", "show", "--customer", customer, "--limit", "1")
    assert table.returncode == 0 and free in table.stdout and task not in table.stdout, table.stdout
