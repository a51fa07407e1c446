"""The comparison: per condition pass rate, cost per accepted task and latency; per pair of conditions,
per-task paired differences over matched repeats with a bootstrap interval, and their mean over tasks.

Pairs are matched by (task, repeat): only repeats where both conditions have a record count, and an
attempt cut short by the experiment's spend cap is left out of every pair (and listed). The
bootstrap is seeded, so the same records always give the same intervals: the overall interval
resamples tasks, then repeats within each task; a task's own interval resamples its repeats
(with two repeats it is coarse, and says n=2).
"""

from __future__ import annotations

import random
import statistics
from itertools import combinations
from typing import Any

BOOTSTRAP_RESAMPLES = 2_000
CONFIDENCE = 0.95
DEFAULT_SEED = 0


def analyse(records: list[dict[str, Any]], conditions: list[str], *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    excluded = [r["key"] for r in records if r.get("cut_by_spend_cap")]
    kept = [r for r in records if not r.get("cut_by_spend_cap")]
    cells: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in kept:
        cells.setdefault((r["task"], r["condition"]), {})[r["repeat"]] = r
    tasks = sorted({r["task"] for r in kept})
    return {
        "conditions": [condition_summary(c, [r for r in kept if r["condition"] == c]) for c in conditions],
        "tasks": [{"task": t, "by_condition": {c: _cell(cells.get((t, c), {})) for c in conditions}} for t in tasks],
        "pairs": [pair(a, b, tasks, cells, seed=seed) for a, b in combinations(conditions, 2)],
        "excluded_cut_by_spend_cap": excluded,
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "confidence": CONFIDENCE, "seed": seed},
    }


def condition_summary(name: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    accepted = sum(1 for r in records if r["accepted"])
    costs = [r["usage"]["cost_usd"] for r in records]
    unknown_cost = sum(1 for c in costs if c is None)
    known_usd = sum(c for c in costs if c is not None)
    scores = [r["score"] for r in records if r["score"] is not None]
    walls = sorted(r["wall_s"] for r in records)
    return {
        "condition": name, "attempts": len(records), "accepted": accepted,
        "pass_rate": accepted / len(records) if records else None,
        "mean_score": statistics.fmean(scores) if scores else None,
        "usd": None if unknown_cost else known_usd, "usd_known_lower_bound": known_usd,
        "attempts_with_unknown_cost": unknown_cost,
        # Unknown cost makes the figure unknown, not smaller: it is null, and the known part a lower bound.
        "usd_per_accepted": (known_usd / accepted) if accepted and not unknown_cost else None,
        "input_tokens": _sum_known(r["usage"]["input_tokens"] for r in records),
        "output_tokens": _sum_known(r["usage"]["output_tokens"] for r in records),
        "latency_s": {"p50": _quantile(walls, 0.5), "p90": _quantile(walls, 0.9)},
        "errors": sum(1 for r in records if "error" in r),
    }


def pair(a: str, b: str, tasks: list[str], cells: dict[tuple[str, str], dict[int, dict[str, Any]]], *,
         seed: int) -> dict[str, Any]:
    """``b`` minus ``a``: positive differences favour ``b``."""
    per_task, diffs_by_task = [], {}
    for task in tasks:
        ra, rb = cells.get((task, a), {}), cells.get((task, b), {})
        matched = sorted(set(ra) & set(rb))
        if not matched:
            continue
        d = [float(rb[r]["accepted"]) - float(ra[r]["accepted"]) for r in matched]
        diffs_by_task[task] = d
        score_d = [rb[r]["score"] - ra[r]["score"] for r in matched
                   if rb[r]["score"] is not None and ra[r]["score"] is not None]
        wall_d = [rb[r]["wall_s"] - ra[r]["wall_s"] for r in matched]
        per_task.append({"task": task, "n": len(matched), "accepted_diff": statistics.fmean(d),
                         "interval": _interval([d], _rng(seed, a, b, task)),
                         "score_diff": statistics.fmean(score_d) if score_d else None,
                         "wall_s_diff": statistics.fmean(wall_d)})
    overall = statistics.fmean(statistics.fmean(d) for d in diffs_by_task.values()) if diffs_by_task else None
    return {"a": a, "b": b, "tasks_compared": len(per_task), "accepted_diff": overall,
            "interval": _interval(list(diffs_by_task.values()), _rng(seed, a, b, "*")) if diffs_by_task else None,
            "per_task": per_task}


def _rng(seed: int, *parts: str) -> random.Random:
    return random.Random(":".join([str(seed), *parts]))  # a str seed is hashed with SHA-512: stable across runs


def _interval(groups: list[list[float]], rng: random.Random) -> list[float]:
    """Percentile bootstrap of the mean over groups of the mean within a group (groups, then members)."""
    means = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        picked = [groups[rng.randrange(len(groups))] for _ in groups]
        means.append(statistics.fmean(statistics.fmean(g[rng.randrange(len(g))] for _ in g) for g in picked))
    means.sort()
    tail = (1 - CONFIDENCE) / 2
    return [_quantile(means, tail), _quantile(means, 1 - tail)]


def _cell(by_repeat: dict[int, dict[str, Any]]) -> dict[str, Any]:
    records = [by_repeat[r] for r in sorted(by_repeat)]
    return {"attempts": len(records), "accepted": sum(1 for r in records if r["accepted"]),
            "scores": [r["score"] for r in records], "accepted_by_repeat": [r["accepted"] for r in records],
            "wall_s": [r["wall_s"] for r in records], "usd": [r["usage"]["cost_usd"] for r in records]}


def _sum_known(values: Any) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    position = q * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
