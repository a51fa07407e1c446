"""Ledger test helpers: a Ledger on the run's database and a fresh customer per test, so tests never interfere."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from ledger.client import Ledger


def new_customer(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def new_job() -> str:
    return "job-" + uuid.uuid4().hex


def verified(ledger: Ledger, customer: str) -> list:
    """The customer's violations, after checking that its own verify (its rows only) finds exactly what the
    whole ledger's verify finds for it."""
    scoped = ledger.verify(customer)
    assert scoped == [v for v in ledger.verify() if v.customer_id == customer]
    return scoped


@pytest.fixture(scope="session")
def ledger(engine) -> Ledger:
    return Ledger(engine)


@pytest.fixture
def customer() -> str:
    return new_customer()


@pytest.fixture
def t0() -> datetime:
    """A fixed 'now' for a test; pass it (and later instants) explicitly instead of sleeping."""
    return datetime.now(timezone.utc).replace(microsecond=0)
