"""The `specialists` command as a new operator found it (issue 20): skills by the name on the card, global flags
in either position, ids checked everywhere, the concurrency cap, a task's usage, and output a person or a script
can read. Each test runs the real executable against the test database."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from app import ledger_port
from core.settings import PROJECT_ROOT
from core.specs import load_specs
from ledger.client import Ledger
from tests import commands
from tests.ledger.conftest import new_customer, new_job
from tests.workers.hosted_rlm import support
from workers.hosted_rlm.journal import Journal

SPECIALISTS = Path(sys.executable).parent / "specialists"
SHIPPED_SKILLS = "analyze, drill, review, tck"  # the skills of the cards in specs/

pytestmark = pytest.mark.timeout(120)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The command exactly as given (the flags where the test puts them)."""
    return commands.specialists(args, env)  # in this process: an interpreter per command cost most of the file


def cli_process(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The command in a process of its own: its output's width is read from its own start (COLUMNS, a pipe)."""
    return subprocess.run([str(SPECIALISTS), *args], env=env, capture_output=True, text=True, timeout=60)


def cli_json(env: dict[str, str], *args: str, expect: int = 0) -> dict:
    done = cli(env, *args, "--json")
    assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def refusal(env: dict[str, str], *args: str, expect: int) -> dict:
    """A refused command with --json: its error, which is the JSON on stdout and nothing else."""
    done = cli(env, *args, "--json")
    assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
    assert done.stderr == "", done.stderr
    return json.loads(done.stdout)["error"]


def added(env: dict[str, str]) -> str:
    customer = new_customer("op")
    assert cli_json(env, "customers", "add", "--customer", customer, "--operator", "ops-test")["outcome"] == "created"
    return customer


# --- entitlements: the skill a customer sees on the card --------------------------------------------------------


def test_an_entitlement_is_granted_by_the_skill_on_the_card_and_admits_the_customer(service_env, engine):
    customer = added(service_env)
    granted = cli_json(service_env, "credits", "grant", "--customer", customer, "--credits", "100", "--skill", "review")
    assert (granted["skills"], granted["specialist_ids"]) == (["review"], ["reviewer"])
    shown = cli_json(service_env, "credits", "show", "--customer", customer)
    assert [(e["skill"], e["specialist_id"], e["active"]) for e in shown["entitlements"]] == [("review", "reviewer", True)]
    table = cli(service_env, "credits", "show", "--customer", customer)
    assert re.search(r"│ review\s+│ reviewer\s+│", table.stdout), table.stdout

    # The edge reserves a reviewer task under what the card's skill was granted to: the customer is admitted.
    reviewer = load_specs(PROJECT_ROOT / "specs")["reviewer"].spec
    task_id = str(uuid.uuid4())
    with engine.begin() as conn:
        held = ledger_port.reserve(conn, customer_id=customer, task_id=task_id, fingerprint_hex="ab" * 16,
                                   specialist_id=reviewer.id, credits=reviewer.tariff_credits)
    assert held == task_id
    Ledger(engine).void(task_id, "test over")


def test_a_skill_no_card_publishes_is_refused_listing_the_skills_and_nothing_is_granted(service_env):
    customer = added(service_env)
    unknown = refusal(service_env, "credits", "grant", "--customer", customer, "--credits", "10", "--skill", "review",
                      "--skill", "nonsuch", expect=2)
    assert unknown["code"] == "skill_unknown"
    assert "'nonsuch'" in unknown["message"] and f"The skills are: {SHIPPED_SKILLS}" in unknown["message"]
    by_id = refusal(service_env, "credits", "grant", "--customer", customer, "--credits", "10", "--skill", "reviewer",
                    expect=2)
    assert by_id["code"] == "skill_unknown" and "its card's skill is 'review'" in by_id["message"]
    assert cli_json(service_env, "credits", "history", "--customer", customer) == []  # no credit moved
    assert cli_json(service_env, "credits", "show", "--customer", customer)["entitlements"] == []


# --- global flags ------------------------------------------------------------------------------------------------


def test_global_flags_work_before_or_after_the_command_and_two_operators_are_refused(service_env):
    customer = added(service_env)
    for args in (("--json", "keys", "issue", "--customer", customer), ("keys", "issue", "--customer", customer, "--json")):
        issued = cli(service_env, *args)
        assert issued.returncode == 0, issued.stderr
        assert json.loads(issued.stdout)["customer_id"] == customer  # JSON, not a table, wherever --json is

    before = cli(service_env, "--operator", "alice", "credits", "adjust", "--customer", customer, "--credits", "5",
                 "--reason", "goodwill")
    after = cli(service_env, "credits", "adjust", "--customer", customer, "--credits", "-1", "--reason", "fix",
                "--operator", "bob")
    assert (before.returncode, after.returncode) == (0, 0), before.stderr + after.stderr
    both = cli(service_env, "--operator", "alice", "credits", "adjust", "--customer", customer, "--credits", "7",
               "--reason", "who?", "--operator", "bob")
    assert both.returncode == 2 and "--operator is given twice (alice, bob)" in both.stderr
    history = cli_json(service_env, "credits", "history", "--customer", customer)
    assert [(h["kind"], h["credits"], h["operator"]) for h in history] == [("adjust", 1, "bob"), ("adjust", 5, "alice")]


# --- ids: a customer exists once added, and a typo is an error ------------------------------------------------------


def test_only_customers_add_creates_a_customer_so_a_mistyped_id_is_refused(service_env):
    typo = new_customer("typo")
    for args in (("credits", "grant", "--customer", typo, "--credits", "10", "--skill", "review"),
                 ("keys", "issue", "--customer", typo)):
        error = refusal(service_env, *args, expect=1)
        assert error["code"] == "customer_not_found", error
        assert f"`specialists customers add --customer {typo}`" in error["message"]
    assert refusal(service_env, "credits", "show", "--customer", typo, expect=1)["code"] == "customer_not_found"

    added_now = cli_json(service_env, "customers", "add", "--customer", typo, "--max-parallel", "3", "--reason", "new")
    assert (added_now["outcome"], added_now["max_parallel"]) == ("created", 3)
    again = cli_json(service_env, "customers", "add", "--customer", typo, "--max-parallel", "5")
    assert (again["outcome"], again["max_parallel"]) == ("exists", 3)  # nothing changed
    cli_json(service_env, "credits", "grant", "--customer", typo, "--credits", "10", "--skill", "review")
    listed = cli_json(service_env, "customers", "list", "--after", typo[:-1], "--limit", "1")
    assert [(c["customer_id"], c["available"], c["max_parallel"]) for c in listed["customers"]] == [(typo, 10, 3)]


def mistyped(identifier: str) -> str:
    """One character off, and never the id itself (reversing the last characters of a random id gave the id back
    whenever they read the same both ways, as `c1c` did in a CI run)."""
    return identifier[:-1] + ("0" if identifier[-1] != "0" else "1")


def test_an_unknown_customer_or_key_id_is_refused_with_the_near_ids_the_service_knows(service_env):
    customer = added(service_env)
    typo = mistyped(customer)
    for command in (("credits", "show"), ("customers", "show"), ("keys", "issue")):
        unknown = refusal(service_env, *command, "--customer", typo, expect=1)
        assert unknown["code"] == "customer_not_found" and f"did you mean {customer!r}" in unknown["message"], unknown
    table = cli(service_env, "credits", "show", "--customer", typo)
    assert f"did you mean {customer!r}" in " ".join(table.stderr.split()), table.stderr
    far = refusal(service_env, "credits", "show", "--customer", new_customer("zz"), expect=1)
    assert "did you mean" not in far["message"]  # nothing near: no guess

    key_id = cli_json(service_env, "keys", "issue", "--customer", customer)["key_id"]
    key_typo = mistyped(key_id)
    unknown_key = refusal(service_env, "keys", "revoke", key_typo, "--reason", "lost", expect=1)
    # The nearest first (the run's database holds other tests' keys, which may follow it).
    assert unknown_key["code"] == "key_not_found" and f"did you mean {key_id!r}" in unknown_key["message"], unknown_key


@pytest.mark.parametrize("command", [("reservations", "list"), ("ledger", "verify"), ("credits", "history"),
                                     ("credits", "show"), ("keys", "list"), ("credits", "adjust", "--credits", "1",
                                                                              "--reason", "r"),
                                     ("credits", "usage"), ("ledger", "journal"), ("customers", "show")])
def test_every_command_on_one_customer_refuses_an_id_that_is_malformed_or_unknown(service_env, command):
    malformed = refusal(service_env, *command, "--customer", "BAD NAME", expect=2)
    assert malformed["code"] == "ledger_input_invalid" and "customer id 'BAD NAME' is not valid" in malformed["message"]
    nobody = new_customer("nobody")
    unknown = refusal(service_env, *command, "--customer", nobody, expect=1)
    assert unknown["code"] == "customer_not_found" and nobody in unknown["message"]


# --- the concurrency cap -------------------------------------------------------------------------------------------


def test_max_parallel_0_is_refused_and_the_cap_changes_without_a_grant(service_env, ledger):
    customer = added(service_env)  # the default cap, 8
    for args in (("credits", "grant", "--customer", customer, "--credits", "10", "--skill", "review",
                  "--max-parallel", "0"),
                 ("customers", "set", "--customer", customer, "--max-parallel", "0", "--reason", "pause"),
                 ("customers", "add", "--customer", new_customer("zero"), "--max-parallel", "0")):
        error = refusal(service_env, *args, expect=2)
        assert "--max-parallel" in error["message"] and "specialists keys revoke" in error["message"], error
    cli_json(service_env, "credits", "grant", "--customer", customer, "--credits", "100", "--skill", "review")
    jobs = [new_job() for _ in range(3)]
    for job in jobs[:2]:
        assert ledger.reserve(customer, job, "fp", "reviewer", 10).outcome == "created"

    below = refusal(service_env, "customers", "set", "--customer", customer, "--max-parallel", "1", "--reason", "x",
                    expect=1)
    assert below["code"] == "max_parallel_below_open"
    changed = cli_json(service_env, "customers", "set", "--customer", customer, "--max-parallel", "2", "--reason",
                       "contract tier 2", "--operator", "alice")
    assert (changed["outcome"], changed["max_parallel_before"], changed["max_parallel"]) == ("changed", 8, 2)
    assert cli_json(service_env, "credits", "show", "--customer", customer)["max_parallel"] == 2
    assert ledger.reserve(customer, jobs[2], "fp", "reviewer", 10).outcome == "concurrency_cap"  # in force now
    assert [h["kind"] for h in cli_json(service_env, "credits", "history", "--customer", customer)] == [
        "reserve", "reserve", "grant"]  # no grant came with it
    same = cli_json(service_env, "customers", "set", "--customer", customer, "--max-parallel", "2", "--reason", "again")
    assert (same["outcome"], same["change_id"]) == ("unchanged", None)
    for job in jobs[:2]:
        ledger.void(job, "test over")


# --- a task's usage -------------------------------------------------------------------------------------------------


def test_usage_of_a_task_id_lists_its_jobs_and_the_table_shows_whole_job_ids(service_env, engine):
    reviewer = load_specs(PROJECT_ROOT / "specs")["reviewer"].spec
    task = str(uuid.uuid4())
    jobs = [f"{task}.3", f"{task}.17"]  # dispatch ids are global: a task's first job is rarely .1
    for job in jobs:
        Journal(engine, job_id=job, fencing_token=support.claim(engine, job)).open_run(
            specialist_id="reviewer", route="test", pricing=reviewer.pricing, reserved_credits=reviewer.tariff_credits,
            session_id=f"session-{job}")

    listed = cli_json(service_env, "usage", "--job", task)
    assert listed["task_id"] == task and sorted(j["job_id"] for j in listed["jobs"]) == sorted(jobs)
    table = cli(service_env, "usage", "--job", task)
    assert table.returncode == 0 and f"rlm jobs of task {task}" in table.stdout
    for job in jobs:
        assert job in table.stdout  # whole, on one line: what the operator copies into the next command
    one = cli(service_env, "usage", "--job", jobs[0])
    assert one.returncode == 0 and jobs[0] in one.stdout and "model calls of" in one.stdout

    missing = refusal(service_env, "usage", "--job", str(uuid.uuid4()), expect=1)
    assert missing["code"] == "job_not_found" and "a task's id lists all of its jobs" in missing["message"]
    nonsuch = refusal(service_env, "usage", "--specialist", "nonsuch", expect=2)
    assert nonsuch["code"] == "specialist_unknown" and "reviewer" in nonsuch["message"]


# --- output ---------------------------------------------------------------------------------------------------------


def test_tables_keep_their_titles_whole_and_show_no_python_records(service_env):
    customer = added(service_env)
    cli_json(service_env, "credits", "grant", "--customer", customer, "--credits", "10", "--skill", "review")
    verify = cli(service_env, "ledger", "verify", "--customer", customer)
    assert verify.returncode == 0
    assert f"ledger is clean; account balances of {customer}'s postings" in verify.stdout  # on one line
    adjust = cli(service_env, "credits", "adjust", "--customer", customer, "--credits", "-4", "--reason", "refund")
    assert adjust.returncode == 0 and "{" not in adjust.stdout and "'" not in adjust.stdout, adjust.stdout
    lot = cli_json(service_env, "credits", "show", "--customer", customer)["lots"][0]["lot_id"]
    assert re.search(rf"│ lots\s+│ lot {lot}: -4\s+│", adjust.stdout), adjust.stdout


def test_a_table_is_whole_when_piped_and_fits_the_terminal_or_columns_without_cutting_an_id(service_env):
    # Issue 42: tables were cut at 200 columns, ignored COLUMNS, and cut values with an ellipsis.
    import fcntl
    import os
    import pty
    import struct
    import termios

    customer = added(service_env)
    label = "a label of a hundred and ninety characters " * 4 + "end"
    issued = cli_json(service_env, "keys", "issue", "--customer", customer, "--label", label)
    piped = cli_process(service_env, "keys", "list", "--customer", customer)
    assert label in piped.stdout and "…" not in piped.stdout, piped.stdout  # one line, whole
    assert max(len(line) for line in piped.stdout.splitlines()) > 200

    narrow = cli_process(service_env | {"COLUMNS": "100"}, "keys", "list", "--customer", customer)
    lines = narrow.stdout.splitlines()
    label_cells = [line.split("│")[6].strip() for line in lines if line.startswith("│")]  # key_id ... tier, label
    assert "…" not in narrow.stdout and "".join("".join(label_cells).split()) == "".join(label.split())  # wrapped
    assert any(issued["key_id"] in line and customer in line for line in lines)  # ids whole, on the key's line
    assert all(len(line) <= 160 for line in lines)  # as narrow as whole ids allow (100 columns cannot hold them)

    leader, follower = pty.openpty()  # a terminal 150 columns wide, and no COLUMNS
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
    env = {k: v for k, v in service_env.items() if k not in ("COLUMNS", "LINES")} | {"TERM": "dumb"}
    # Not a role (ops/topology.py): a command to completion whose terminal (a pty) is what is under test.
    command = subprocess.Popen([str(SPECIALISTS), "keys", "list", "--customer", customer], env=env, stdout=follower,
                               stderr=subprocess.PIPE)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the command closed its end
            break
        if not chunk:
            break
        shown += chunk
    assert command.wait(60) == 0, command.stderr.read()
    os.close(leader)
    terminal = [line for line in shown.decode().splitlines() if line.strip()]
    assert terminal and all(len(line) <= 150 for line in terminal), terminal
    assert any(issued["key_id"] in line and customer in line for line in terminal)


def test_each_command_in_one_process_takes_its_width_from_its_own_environment(service_env):
    # A command's width was read once, when ops/output.py was imported: in a process that runs several commands
    # (tests/commands.py; the suite under load once had every later table wrapped at 80 after a first command saw
    # COLUMNS), the first command's width held for all. Each command now reads COLUMNS and its streams as it prints.
    customer = new_customer("op-a-customer-id-long-enough-to-wrap-at-sixty")
    assert cli_json(service_env, "customers", "add", "--customer", customer)["outcome"] == "created"
    label = "a label long enough to be wrapped in sixty columns " * 3
    cli_json(service_env, "keys", "issue", "--customer", customer, "--label", label)
    narrow = cli(service_env | {"COLUMNS": "60"}, "keys", "list", "--customer", customer)
    whole = cli(service_env, "keys", "list", "--customer", customer)
    assert label.strip() not in narrow.stdout, narrow.stdout  # wrapped to COLUMNS
    assert label.strip() in whole.stdout and any(customer in line for line in whole.stdout.splitlines()), whole.stdout


def test_a_key_issued_into_a_file_leaves_its_record_on_a_piped_stderr_whole(service_env):
    # The record of `keys issue > key.txt` is a table on stderr; piped too (`2> issued.txt`), it is as whole as a
    # piped stdout: a long customer id is not wrapped at 80 columns.
    customer = new_customer("op-a-customer-id-long-enough-to-wrap-at-eighty")
    assert cli_json(service_env, "customers", "add", "--customer", customer)["outcome"] == "created"
    issued = cli(service_env, "keys", "issue", "--customer", customer)
    assert issued.returncode == 0, issued.stderr
    assert issued.stdout.startswith("sk_test_") and len(issued.stdout.split()) == 1, issued.stdout  # the key alone
    assert any(customer in line for line in issued.stderr.splitlines()), issued.stderr


def test_a_misspelled_setting_is_warned_about_at_start_up_naming_the_nearest_real_one(service_env):
    # Issue 42: SPECIALISTS_PUSH_MAX_ATEMPTS=3 was ignored without a word, the default of 8 in force.
    typo = service_env | {"SPECIALISTS_PUSH_MAX_ATEMPTS": "3", "SPECIALISTS_NOTHING_LIKE_IT": "1"}
    done = cli(typo, "db", "status", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)  # stdout stays the command's JSON
    warned = " ".join(done.stderr.split())
    assert ("warning [setting_unknown] SPECIALISTS_PUSH_MAX_ATEMPTS is not a setting of this service and is "
            "ignored; did you mean SPECIALISTS_PUSH_MAX_ATTEMPTS?") in warned, done.stderr
    assert "SPECIALISTS_NOTHING_LIKE_IT is not a setting of this service and is ignored; docs/SETTINGS.md" in warned
    clean = cli(service_env, "db", "status", "--json")
    assert "setting_unknown" not in clean.stderr  # the suite's own variables are all settings


def test_with_json_an_error_is_json_on_stdout_and_nothing_on_stderr(service_env):
    customer = added(service_env)
    refused = refusal(service_env, "credits", "adjust", "--customer", customer, "--credits", "-5", "--reason", "x",
                      expect=1)
    assert refused["code"] == "adjust_exceeds_available"
    usage = refusal(service_env, "credits", "grant", "--customer", customer, expect=2)  # --credits missing
    assert usage["code"] == "usage_error" and "--credits" in usage["message"]
    bad_value = refusal(service_env, "--json", "credits", "grant", "--credits", "ten", "--customer", customer, expect=2)
    assert bad_value["code"] == "usage_error" and "'ten' is not a whole number" in bad_value["message"]
    unreachable = refusal(service_env | {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"}, "credits", "show",
                          "--customer", customer, expect=4)
    assert unreachable["code"] == "database_unavailable"
    # For a person, the same error goes to stderr, and stdout stays empty.
    person = cli(service_env, "credits", "adjust", "--customer", customer, "--credits", "-5", "--reason", "x")
    assert person.returncode == 1 and person.stdout == "" and "adjust_exceeds_available" in person.stderr
