"""An operator sets a customer's weight for worker slots and sees its share (issue 41): `specialists customers set
--weight` and `customers show`, the real command against the test database."""

from __future__ import annotations

import pytest

from tests.ops.test_operator_cli import added, cli, cli_json, refusal

pytestmark = pytest.mark.timeout(120)


def test_a_customers_weight_is_set_with_a_reason_and_shown_with_its_jobs_in_flight_and_waiting(service_env):
    customer = added(service_env)
    share = cli_json(service_env, "customers", "show", "--customer", customer)["fair_share"]
    assert (share["weight"], share["weight_is_default"], share["in_flight"], share["waiting"]) == (1, True, 0, 0)

    changed = cli_json(service_env, "customers", "set", "--customer", customer, "--weight", "3", "--reason",
                       "contract tier 3", "--operator", "alice")
    assert changed["weight"] == {"customer_id": customer, "outcome": "changed", "weight_before": None, "weight": 3}
    share = cli_json(service_env, "customers", "show", "--customer", customer)["fair_share"]
    assert (share["weight"], share["weight_is_default"], share["weight_changed_by"], share["weight_reason"]) == (
        3, False, "alice", "contract tier 3")
    again = cli_json(service_env, "customers", "set", "--customer", customer, "--weight", "3", "--reason", "again")
    assert again["weight"]["outcome"] == "unchanged"
    shown = cli(service_env, "customers", "show", "--customer", customer)
    assert shown.returncode == 0 and "fair share of worker slots" in shown.stdout, shown.stdout


def test_a_weight_out_of_bounds_or_nothing_to_set_is_a_usage_error_naming_what_to_give(service_env):
    customer = added(service_env)
    for weight in ("0", "1001"):
        error = refusal(service_env, "customers", "set", "--customer", customer, "--weight", weight, "--reason", "x",
                        expect=2)
        assert error["code"] == "weight_invalid" and "SPECIALISTS_DISPATCH_DEFAULT_WEIGHT" in error["message"]
    error = refusal(service_env, "customers", "set", "--customer", customer, "--reason", "x", expect=2)
    assert error["code"] == "nothing_to_set" and "--weight" in error["message"]
    assert cli_json(service_env, "customers", "show", "--customer", customer)["fair_share"]["weight_is_default"]
