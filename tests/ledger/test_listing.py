"""Reservation listings page with a keyset cursor on (created_at, job_id): every reservation exactly once (issue 18)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from ledger import reads
from ledger.errors import LedgerInputInvalid
from tests.ledger.conftest import new_customer, new_job

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tied(ledger):
    """A customer with twelve reservations, four at each of three instants, a few settled, one unknown."""
    customer = new_customer("page")
    ledger.grant(customer, 10_000, operator="test", skills=["review"], max_parallel=50)
    at = ledger.account(customer).lots[0].created_at - timedelta(hours=1)  # older than anything made later
    jobs = [new_job() for _ in range(12)]
    for index, job in enumerate(jobs):
        ledger.reserve(customer, job, "fp", "review", 3, now=at + timedelta(seconds=index // 4))
    for job in jobs[:3]:
        ledger.settle(job, 1)
    ledger.mark_unknown(jobs[5], "lease expired", "test")
    return customer, jobs


def _all_pages(ledger, limit, **filters) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = ledger.reservation_page(limit=limit, before=cursor, **filters)
        pages.append([r.job_id for r in page.reservations])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


def _newest_first(engine, where: str = "true", params: dict | None = None) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(
            text(f"SELECT job_id FROM ledger_reservations r WHERE {where} ORDER BY created_at DESC, job_id DESC"),
            params or {},
        ).scalars())


@pytest.mark.parametrize("limit", [1, 5, 7, 1000])
def test_paging_lists_every_reservation_exactly_once_newest_page_first(engine, ledger, tied, limit):
    pages = _all_pages(ledger, limit)
    assert all(0 < len(page) <= limit for page in pages)
    newest_first = [job for page in pages for job in reversed(page)]  # each page is printed oldest first
    assert newest_first == _newest_first(engine)


@pytest.mark.parametrize(
    "filters, where",
    [
        ({"states": ("open",)}, "r.state = 'open'"),
        ({"states": ("unknown",)}, "r.state = 'unknown'"),
        ({"states": ("open", "unknown")}, "r.state IN ('open', 'unknown')"),
        ({"states": ("settled",)}, "r.state = 'settled'"),
    ],
    ids=["open", "unknown", "unresolved", "settled"],
)
def test_paging_a_filtered_listing_lists_each_match_exactly_once(engine, ledger, tied, filters, where):
    customer, _ = tied
    for scope, clause, params in ((None, where, {}), (customer, f"{where} AND r.customer_id = :c", {"c": customer})):
        pages = _all_pages(ledger, 3, customer_id=scope, **filters)
        assert [job for page in pages for job in reversed(page)] == _newest_first(engine, clause, params)


def test_a_reservation_made_or_settled_while_paging_does_not_shift_the_pages(engine, ledger, tied):
    customer, jobs = tied
    existing = _newest_first(engine, "r.customer_id = :c", {"c": customer})
    page = ledger.reservation_page(customer_id=customer, limit=4)
    listed = [r.job_id for r in page.reservations]
    made = new_job()
    ledger.reserve(customer, made, "fp", "review", 3)  # newer than every page after the first
    ledger.settle(jobs[6], 2)  # a state changes, not the keyset
    while page.next_cursor is not None:
        page = ledger.reservation_page(customer_id=customer, limit=4, before=page.next_cursor)
        listed += [r.job_id for r in page.reservations]
    assert sorted(listed) == sorted(existing) and len(listed) == len(set(listed))
    assert made not in listed


def test_a_cursor_no_listing_made_and_an_unknown_state_are_refused(ledger):
    for cursor in ("", "not-a-cursor", "W10", "x" * (reads.MAX_CURSOR_CHARS + 1),
                   reads.encode_cursor.__name__):
        with pytest.raises(LedgerInputInvalid, match="cursor"):
            ledger.reservation_page(before=cursor)
    with pytest.raises(LedgerInputInvalid, match="states"):
        ledger.reservation_page(states=("pending",))
