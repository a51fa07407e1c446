"""``verify`` at every scope finds the same violations: one customer's rows, the whole ledger in one statement, and
the whole ledger a range of customers at a time inside one snapshot (issue 18).

The ledger is corrupted on purpose, one way per customer (a posting no operation made, a held total nobody
explains, a second resolution, a settlement without its reservation, postings under a customer that has no
account, a job's posting filed under another customer), so each comparison has violations to find.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from ledger import verify as ledger_verify
from ledger.client import Ledger
from ledger.limits import LedgerSettings
from tests.ledger.conftest import new_customer, new_job

pytestmark = pytest.mark.timeout(120)

_POSTING = text(
    "INSERT INTO ledger_journal (entry_id, at, kind, customer_id, lot_id, job_id, from_account, to_account, credits) "
    "VALUES (nextval('ledger_entry_seq'), now(), CAST(:kind AS ledger_entry_kind), :c, :l, :j, "
    "CAST(:src AS ledger_account), CAST(:dst AS ledger_account), :n)"
)


def _post(engine, customer, lot, *, src, dst, credits, kind="adjust", job=None) -> None:
    with engine.begin() as conn:
        conn.execute(_POSTING, {"kind": kind, "c": customer, "l": lot, "j": job, "src": src, "dst": dst, "n": credits})


def _funded(ledger, prefix, credits=100):
    customer = new_customer(prefix)
    return customer, ledger.grant(customer, credits, operator="test", skills=["review"]).lot_id


def _ghost(prefix: str) -> str:
    """A customer id with no account, sorting before every test customer ("0..."), among them ("m...") or after them ("zz...")."""
    return f"{prefix}ghost-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def planted(engine, ledger) -> dict[str, set[str]]:
    """Customers whose rows were made to disagree, each with the checks its corruption must trip."""
    expected: dict[str, set[str]] = {}

    customer, lot = _funded(ledger, "planted")  # a posting no operation made
    _post(engine, customer, lot, src="customer_available", dst="revenue", credits=7)
    expected[customer] = {"lot_mismatch"}

    customer, lot = _funded(ledger, "planted")  # more credits spent than the lot ever had
    _post(engine, customer, lot, src="customer_available", dst="revenue", credits=1000)
    expected[customer] = {"lot_mismatch", "negative_availability"}

    customer, _ = _funded(ledger, "planted")  # a held total and an open count that no reservation explains
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger_accounts SET held = 5, open_reservations = 1 WHERE customer_id = :c"),
                     {"c": customer})
    expected[customer] = {"account_held_mismatch", "open_count_mismatch"}

    customer, _ = _funded(ledger, "planted")  # an open reservation whose holds were rewritten
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 5)
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger_reservations SET hold_credits = ARRAY[4]::bigint[] WHERE job_id = :j"),
                     {"j": job})
    expected[customer] = {"hold_mismatch", "lot_holds_mismatch"}

    customer, lot = _funded(ledger, "planted")  # a job resolved twice
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 10)
    ledger.settle(job, 10)
    _post(engine, customer, lot, src="customer_held", dst="revenue", credits=10, kind="settle", job=job)
    expected[customer] = {"resolved_twice", "hold_mismatch", "lot_mismatch"}

    customer, _ = _funded(ledger, "planted")  # a settlement of a job it never reserved
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO ledger_settlements (job_id, customer_id, kind, charged, released, expired, reason, "
                 "entry_id, at) VALUES (:j, :c, 'settle', 3, 0, 0, 'planted', nextval('ledger_entry_seq'), now())"),
            {"j": new_job(), "c": customer},
        )
    expected[customer] = {"resolution_mismatch"}

    owner, _ = _funded(ledger, "planted")  # a job's reserve posting filed under another customer's id and lot
    other, other_lot = _funded(ledger, "planted")
    job = new_job()
    ledger.reserve(owner, job, "fp", "review", 5)
    _post(engine, other, other_lot, src="customer_available", dst="customer_held", credits=5, kind="reserve", job=job)
    expected[other] = {"hold_mismatch", "lot_mismatch"}

    for prefix in ("0", "m", "zz"):  # postings of customers that do not exist, below, among and above the accounts
        ghost = _ghost(prefix)
        _post(engine, ghost, 987654321, src="issued", dst="customer_available", credits=3, kind="grant")
        expected[ghost] = {"journal_unknown_lot"}
    return expected


def test_every_planted_corruption_is_found_by_the_checks_it_breaks(ledger, planted):
    for customer, checks in planted.items():
        found = {v.check for v in ledger.verify(customer)}
        assert checks <= found, (customer, found)


def test_a_customers_verify_finds_exactly_what_the_whole_verify_finds_for_it(ledger, planted):
    whole = ledger.verify()
    for customer in planted:
        assert ledger.verify(customer) == [v for v in whole if v.customer_id == customer], customer
    assert {v.customer_id for v in whole} >= set(planted)


@pytest.mark.parametrize("customers_per_chunk", [1, 2, 7, 100_000])
def test_the_verify_in_chunks_finds_exactly_what_the_one_statement_verify_finds(
    engine, ledger, planted, customers_per_chunk
):
    seen = []
    audit = Ledger(engine, LedgerSettings(verify_customers_per_chunk=customers_per_chunk)).audit(
        on_progress=seen.append
    )
    assert audit.violations == ledger.verify()  # the ghosts below, among and above the accounts included
    assert audit.totals == ledger.totals()
    with engine.connect() as conn:
        accounts = conn.execute(text("SELECT count(*) FROM ledger_accounts")).scalar_one()
    assert audit.customers == accounts
    assert [p.customers_done for p in seen] == sorted(p.customers_done for p in seen)
    assert seen[0].customers_done == 0 and seen[-1].customers_done == accounts == seen[-1].customers_total
    assert seen[-1].violations == len(audit.violations)
    assert len(seen) == 1 + audit.chunks


def test_the_verify_in_chunks_reads_one_snapshot_while_money_moves(engine, ledger, planted):
    """Between two ranges another session grants credits to a customer in a range not yet read and to one in a
    range already read: neither is seen, and the totals are those of the moment the verify began."""
    before = ledger.totals()
    with engine.connect() as conn:
        accounts = conn.execute(text("SELECT count(*) FROM ledger_accounts")).scalar_one()
    late = [new_customer("0snap"), new_customer("zzsnap")]  # below the first range and above the last

    def grant_between_ranges(at: ledger_verify.Progress) -> None:
        if at.customers_done == 2:
            for customer in late:
                ledger.grant(customer, 11, operator="test", skills=["review"])

    audit = Ledger(engine, LedgerSettings(verify_customers_per_chunk=2)).audit(on_progress=grant_between_ranges)
    assert audit.totals == before
    assert audit.customers == accounts
    assert all(v.customer_id not in late for v in audit.violations)
    assert ledger.totals() != before  # the grants did land
    assert ledger.audit(late[0]).customers == 1


def test_a_customers_audit_totals_its_own_postings_only(ledger):
    customer, _ = _funded(ledger, "t", credits=40)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 10)
    ledger.settle(job, 4)
    audit = ledger.audit(customer)
    assert (audit.violations, audit.customers, audit.standby) == ([], 1, False)
    assert {t.account: t.balance for t in audit.totals} == {
        "issued": -40, "customer_available": 36, "customer_held": 0, "revenue": 4,
    }
