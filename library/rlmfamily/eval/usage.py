"""What one attempt used, read from its own RLM data folder: the family's budget entries (root turns,
sub-calls and children's calls alike) and the trajectories (prompt-cache reads).

Unknown stays unknown: a total is null when any call's figure is unknown, and the known part is kept
beside it as a lower bound. Reasoning tokens are null: the provider seam (``Usage``) does not carry them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlmfamily.budget import FINAL_PURPOSE, BudgetLedger


def attempt_usage(data_dir: Path) -> dict[str, Any]:
    budget_file = data_dir / "budget.sqlite3"
    entries = BudgetLedger(budget_file).entries() if budget_file.exists() else []
    known = [e for e in entries if e.state != "unknown" and e.tokens is not None]
    unknown = len(entries) - len(known)
    input_known = sum(e.prompt_tokens or 0 for e in known)
    output_known = sum(e.completion_tokens or 0 for e in known)
    cost_unknown = unknown + sum(1 for e in known if e.cost_usd is None)
    cost_known = sum(e.cost_usd or 0.0 for e in known)
    cached = _cache_reads(data_dir / "runs")
    return {
        "calls": len(entries),
        "root_calls": sum(1 for e in entries if e.purpose in ("root", FINAL_PURPOSE)),
        "subcalls": sum(1 for e in entries if e.purpose == "subcall"),
        "unknown_usage_calls": unknown,
        "unknown_cost_calls": cost_unknown,
        "input_tokens": None if unknown else input_known,
        "cached_input_tokens": None if unknown else cached,
        "output_tokens": None if unknown else output_known,
        "reasoning_tokens": None,
        "cost_usd": None if cost_unknown else round(cost_known, 10),
        "known_lower_bound": {"input_tokens": input_known, "output_tokens": output_known,
                              "cost_usd": round(cost_known, 10)},
    }


def _cache_reads(runs: Path) -> int | None:
    """Prompt tokens read from the provider's cache, over every run of the attempt; None when no call said."""
    total, reported = 0, False
    for trajectory in sorted(runs.glob("*/trajectory.jsonl")) if runs.is_dir() else []:
        for line in trajectory.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill
            usage = event.get("usage") if event.get("event") in ("turn", "subcall") else None
            if isinstance(usage, dict) and usage.get("cache_read_tokens") is not None:
                total += int(usage["cache_read_tokens"])
                reported = True
    return total if reported else None
