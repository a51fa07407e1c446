"""A reason is refused over SPECIALISTS_LEDGER_MAX_REASON_CHARS by every operation that keeps one, never clipped.

With the limit below the schema's 500 characters, a caller that clipped reasons to 500 used to be refused
in the middle of its work (issue 14); the ledger's own operations refuse over the setting, naming it, and
take a reason exactly at it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.errors import ServiceError
from core.settings import Settings
from ledger import keys
from ledger.errors import LedgerInputInvalid
from ledger.client import Ledger
from tests.conftest import TEST_SECRET
from tests.ledger.conftest import new_customer, new_job

MAX_REASON_CHARS = 50
AT_LIMIT = "r" * MAX_REASON_CHARS
OVER_LIMIT = "r" * (MAX_REASON_CHARS + 1)


@pytest.fixture(scope="module")
def short_reasons(engine) -> Ledger:
    return Ledger(engine, Settings(ledger={"max_reason_chars": MAX_REASON_CHARS}).ledger)


def refused(operation) -> str:
    with pytest.raises(ServiceError) as refusal:
        operation()
    assert "SPECIALISTS_LEDGER_MAX_REASON_CHARS" in refusal.value.message
    assert f"at most {MAX_REASON_CHARS}" in refusal.value.message
    return refusal.value.code


def open_reservation(ledger: Ledger, t0) -> str:
    customer = new_customer("reason")
    ledger.grant(customer, 100, operator="test", skills=["review"], now=t0)
    job = new_job()
    assert ledger.reserve(customer, job, "fp", "review", 10, now=t0).ok
    return job


def test_a_grant_and_an_adjustment_refuse_a_reason_over_the_setting(short_reasons, t0):
    customer = new_customer("reason")
    code = refused(lambda: short_reasons.grant(customer, 10, operator="test", skills=["review"], reason=OVER_LIMIT, now=t0))
    assert code == LedgerInputInvalid.code
    granted = short_reasons.grant(customer, 10, operator="test", skills=["review"], reason=AT_LIMIT, now=t0)
    assert granted.outcome == "created"
    refused(lambda: short_reasons.adjust(customer, 5, OVER_LIMIT, "test", now=t0))
    assert short_reasons.adjust(customer, 5, AT_LIMIT, "test", now=t0).outcome == "adjusted"


def test_settle_void_mark_unknown_and_reconcile_refuse_a_reason_over_the_setting(short_reasons, t0):
    settled, voided, unknown = (open_reservation(short_reasons, t0) for _ in range(3))
    refused(lambda: short_reasons.settle(settled, 5, OVER_LIMIT, now=t0))
    assert short_reasons.settle(settled, 5, AT_LIMIT, now=t0).reason == AT_LIMIT
    refused(lambda: short_reasons.void(voided, OVER_LIMIT, now=t0))
    assert short_reasons.void(voided, AT_LIMIT, now=t0).reason == AT_LIMIT
    refused(lambda: short_reasons.mark_unknown(unknown, OVER_LIMIT, "test", now=t0))
    assert short_reasons.mark_unknown(unknown, AT_LIMIT, "test", now=t0).unknown_reason == AT_LIMIT
    refused(lambda: short_reasons.reconcile(unknown, 5, OVER_LIMIT, "test", now=t0))
    assert short_reasons.reconcile(unknown, 5, AT_LIMIT, "test", now=t0).reason == AT_LIMIT


def test_a_key_revocation_refuses_a_reason_over_the_setting_instead_of_clipping_it(engine):
    limits = Settings(ledger={"max_reason_chars": MAX_REASON_CHARS}).ledger
    signer = keys.KeySigner([TEST_SECRET], "test")
    issued = keys.issue_key(engine, signer, customer_id=new_customer("revoke"), ttl=timedelta(days=1))
    key_id = issued.identity.key_id
    code = refused(lambda: keys.revoke_key(engine, key_id, reason=OVER_LIMIT, operator="test", limits=limits))
    assert code == "reason_too_long"
    assert keys.revoke_key(engine, key_id, reason=AT_LIMIT, operator="test", limits=limits) is True
    (row,) = [k for k in keys.list_keys(engine) if k["key_id"] == key_id]
    assert row["revoked_reason"] == AT_LIMIT
