"""Output that survives a pipe (issue 45): tables print whole when not written to a terminal, fit a terminal's
width without cutting an id, and every listing command has ``--json``.

``rlm usage`` is run in this process (``rlmfamily.cli.main``), its stdout captured: not a terminal, as a pipe.
"""

from __future__ import annotations

import pytest

from rlmfamily.budget import Budget, BudgetLimits
from rlmfamily.cli import build_parser, main
from rlmfamily.providers.base import Usage
from rlmfamily.settings import RLMSettings

pytestmark = pytest.mark.timeout(30)

ROOT = "20261206-101500-a1b2c3-a-root-id-long-enough-to-be-cut"
# Every command that lists things, with the arguments it needs: each has --json for scripts.
LISTINGS = [["usage"], ["show", "last"], ["jobs"], ["peers"], ["delegations"], ["inbox", "RUN"], ["children", "RUN"],
            ["where"], ["eval", "tasks", "pilot"], ["eval", "report", "DIR"], ["container", "image"],
            ["container", "sweep"]]


@pytest.fixture
def one_budget(settings: RLMSettings) -> RLMSettings:
    budget = Budget(settings.budget_path, ROOT, BudgetLimits(max_calls=300, max_tokens=3_000_000))
    budget.settle(budget.admit("root", tokens_estimate=10), Usage(1_000, 20, None))
    return settings


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if ROOT[:8] in line]


def test_a_piped_table_prints_whole_rows_never_wrapped_at_80_columns(one_budget: RLMSettings, capsys,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["usage"]) == 0
    printed = capsys.readouterr().out
    [title] = [line for line in printed.splitlines() if "inference budgets" in line]
    assert str(one_budget.budget_path) in title  # the title whole, on one line
    [row] = _table_lines(printed)
    assert ROOT in row and "300/3,000,000/-" in row and len(row) > 80


def test_on_a_narrow_terminal_a_table_wraps_its_other_columns_but_never_cuts_an_id(
        one_budget: RLMSettings, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # a terminal's width, as rich reads it
    assert main(["usage"]) == 0
    printed = capsys.readouterr().out
    assert any(ROOT in line for line in printed.splitlines()), printed
    assert "…" not in printed


@pytest.mark.parametrize("command", LISTINGS, ids=lambda c: " ".join(c))
def test_every_listing_command_has_json(command: list[str]) -> None:
    assert build_parser().parse_args([*command, "--json"]).json is True
