"""Fixtures the operator command's tests share with the ledger's."""

from tests.ledger.conftest import ledger, t0  # noqa: F401
