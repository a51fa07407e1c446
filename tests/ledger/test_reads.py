"""The operator's reads the console and the CLI share (issue 20): usage per day and the journal a page at a time,
against real PostgreSQL. Every read is bounded and refuses what it cannot answer whole."""

from __future__ import annotations

import random
import uuid
from datetime import date, datetime, timedelta, timezone

import pytest

from ledger.client import Ledger
from ledger.errors import CustomerNotFound, LedgerInputInvalid, ReadTooLarge
from ledger.limits import LedgerSettings
from ledger.reads import JOURNAL_KINDS, UsageRow
from tests.ledger.conftest import new_customer, new_job

pytestmark = pytest.mark.timeout(60)


def far_day() -> datetime:
    """Midnight UTC of a day no other test settles on: a period of this test's own."""
    return datetime(2100, 1, 1, tzinfo=timezone.utc) + timedelta(days=random.randrange(300_000))


def opened(ledger: Ledger, credits: int = 1000, *, operator: str = "ops") -> str:
    customer = new_customer("reads")
    ledger.open_account(customer, operator=operator, max_parallel=50)
    ledger.grant(customer, credits, operator=operator, skills=["reviewer", "analyst"], require_customer=True)
    return customer


def settled(ledger: Ledger, customer: str, specialist: str, credits: int, charged: int, at: datetime) -> str:
    job = new_job()
    assert ledger.reserve(customer, job, "fp", specialist, credits, now=at).outcome == "created"
    resolved = ledger.settle(job, charged, "done", now=at) if charged else ledger.void(job, "nothing done", now=at)
    assert resolved.outcome in ("settled", "voided"), resolved
    return job


def test_usage_sums_what_was_charged_per_utc_day_specialist_and_customer(ledger):
    day = far_day()
    alice, bob = opened(ledger), opened(ledger)
    settled(ledger, alice, "reviewer", 10, 7, day + timedelta(hours=1))
    settled(ledger, alice, "reviewer", 10, 3, day + timedelta(hours=23, minutes=59))
    settled(ledger, alice, "reviewer", 10, 0, day + timedelta(hours=2))  # a void: a settlement charging 0
    settled(ledger, alice, "analyst", 5, 5, day + timedelta(hours=3))
    settled(ledger, bob, "reviewer", 10, 10, day + timedelta(days=1))
    settled(ledger, bob, "reviewer", 10, 10, day + timedelta(days=2))  # at `until`: outside the period
    ledger.reserve(bob, new_job(), "fp", "reviewer", 10, now=day)  # open: nothing charged yet

    rows = ledger.usage(since=day, until=day + timedelta(days=2))
    d0, d1 = day.date(), (day + timedelta(days=1)).date()
    assert rows == [
        UsageRow(d0, alice, "analyst", 5, 1),
        UsageRow(d0, alice, "reviewer", 10, 3),
        UsageRow(d1, bob, "reviewer", 10, 1),
    ]
    assert ledger.usage(since=day, until=day + timedelta(days=3), customer_id=bob) == [
        UsageRow(d1, bob, "reviewer", 10, 1), UsageRow(date.fromordinal(d1.toordinal() + 1), bob, "reviewer", 10, 1)]
    # A zone other than UTC names the same instants; the days stay UTC days.
    paris = timezone(timedelta(hours=1))
    assert ledger.usage(since=day.astimezone(paris), until=(day + timedelta(days=1)).astimezone(paris)) == rows[:2]


def test_a_usage_period_is_bounded_and_a_customer_nobody_added_is_refused(ledger):
    day = far_day()
    with pytest.raises(LedgerInputInvalid, match="SPECIALISTS_LEDGER_MAX_USAGE_DAYS"):
        ledger.usage(since=day, until=day + timedelta(days=367))
    with pytest.raises(LedgerInputInvalid, match="ends after it starts"):
        ledger.usage(since=day, until=day)
    with pytest.raises(LedgerInputInvalid, match="time zone"):
        ledger.usage(since=day.replace(tzinfo=None), until=day.replace(tzinfo=None) + timedelta(days=1))
    with pytest.raises(CustomerNotFound):
        ledger.usage(since=day, until=day + timedelta(days=1), customer_id=new_customer("nobody"))
    with pytest.raises(LedgerInputInvalid, match="is not valid"):
        ledger.usage(since=day, until=day + timedelta(days=1), customer_id="BAD NAME")


def test_usage_over_the_row_limit_is_refused_never_cut(ledger, engine):
    day = far_day()
    customer = opened(ledger)
    for offset in range(3):
        settled(ledger, customer, "reviewer", 10, 1, day + timedelta(days=offset))
    small = Ledger(engine, LedgerSettings(max_rows_per_listing=2))
    with pytest.raises(ReadTooLarge, match="SPECIALISTS_LEDGER_MAX_ROWS_PER_LISTING") as refused:
        small.usage(since=day, until=day + timedelta(days=3), customer_id=customer)
    assert refused.value.code == "read_too_large"
    assert len(small.usage(since=day, until=day + timedelta(days=2), customer_id=customer)) == 2


def test_the_journal_pages_newest_first_and_every_posting_is_listed_once(ledger):
    customer = opened(ledger)
    jobs = [settled(ledger, customer, "reviewer", 10, 4, datetime.now(timezone.utc)) for _ in range(3)]
    whole = ledger.journal(customer_id=customer, limit=100)
    assert whole.next_before is None and {line.customer_id for line in whole.lines} == {customer}
    ids = [line.posting_id for line in whole.lines]
    # The grant; per job a reserve, and a settle's two postings (4 charged to revenue, 6 released).
    assert ids == sorted(ids, reverse=True) and len(ids) == 1 + 3 * 3
    assert list(dict.fromkeys(line.job_id for line in whole.lines if line.kind == "settle")) == jobs[::-1]

    seen, before = [], None
    while True:
        page = ledger.journal(customer_id=customer, before=before, limit=3)
        seen += [line.posting_id for line in page.lines]
        if page.next_before is None:
            break
        assert page.next_before == page.lines[-1].posting_id
        before = page.next_before
    assert seen == ids
    # history() is the first page of one customer's journal, as before.
    assert ledger.history(customer, limit=4) == list(whole.lines[:4])


def test_the_journal_filters_by_operator_and_kind_and_refuses_an_unknown_kind(ledger):
    operator = f"alice-{uuid.uuid4().hex[:8]}"
    customer = opened(ledger, operator=operator)
    ledger.adjust(customer, -5, "goodwill taken back", operator)
    settled(ledger, customer, "reviewer", 10, 4, datetime.now(timezone.utc))
    by_operator = ledger.journal(operator=operator, limit=100)
    assert [(line.kind, line.customer_id) for line in by_operator.lines] == [("adjust", customer), ("grant", customer)]
    assert all(line.operator == operator for line in by_operator.lines)
    grants = ledger.journal(kinds=("grant",), limit=5)
    assert grants.lines[0].customer_id == customer and {line.kind for line in grants.lines} == {"grant"}
    mine = ledger.journal(customer_id=customer, kinds=("settle", "reserve"), limit=100)
    assert [line.kind for line in mine.lines] == ["settle", "settle", "reserve"]
    assert ledger.journal(customer_id=customer, kinds=(), limit=100).lines == ledger.journal(
        customer_id=customer, limit=100).lines  # no kinds named: every kind

    with pytest.raises(LedgerInputInvalid) as unknown:
        ledger.journal(kinds=("grant", "refund"))
    assert unknown.value.message == f"journal kinds are {', '.join(JOURNAL_KINDS)}; got refund"
    with pytest.raises(CustomerNotFound):
        ledger.journal(customer_id=new_customer("nobody"))
    with pytest.raises(LedgerInputInvalid, match="posting id"):
        ledger.journal(before=0)


def test_a_journal_page_is_capped_by_the_listing_limit(ledger, engine):
    customer = opened(ledger)
    for _ in range(2):
        settled(ledger, customer, "reviewer", 10, 1, datetime.now(timezone.utc))
    page = Ledger(engine, LedgerSettings(max_rows_per_listing=2)).journal(customer_id=customer, limit=1000)
    assert len(page.lines) == 2 and page.next_before == page.lines[-1].posting_id
