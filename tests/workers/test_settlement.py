"""The tariff policy the settlement applies when a job finishes (docs/WORKERS.md)."""

from __future__ import annotations

import pytest

from workers.settlement import charged_credits


@pytest.mark.parametrize(
    ("outcome", "charged"),
    [("completed", 7), ("failed", 7), ("canceled", 7), ("rejected", 0), ("input_required", None)],
)
def test_the_tariff_policy_charges_executions_not_rejections_and_waits_while_a_task_asks_for_input(outcome, charged):
    assert charged_credits(outcome, 7) == charged
