"""The report of a results folder: a table for people, ``--json`` for scripts, ``--html`` for a page.

The page is one self-contained file: inline CSS under a Content-Security-Policy of ``default-src
'none'`` (a nonce for its one style block), inline SVG charts, no script, nothing loaded. Every
value is escaped. Offline experiments say, first thing, that they measure plumbing, not models.
"""

from __future__ import annotations

import html
import secrets
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlmfamily.eval.stats import DEFAULT_SEED, analyse
from rlmfamily.eval.store import ResultsStore
from rlmfamily.output import print_table

OFFLINE_NOTICE = ("Offline experiment: every condition is a scripted model making known-good or known-bad attempts. "
                  "These results measure the runner's plumbing, the graders and this report, not model quality.")
REPORT_SCHEMA = 1


def build_report(folder: Path, *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    store = ResultsStore(folder)
    manifest = store.manifest()
    records = store.records()
    conditions = [c["name"] for c in manifest["conditions"]]
    planned = len(manifest["tasks"]) * len(conditions) * manifest["repeats"]
    analysis = analyse(records, conditions, seed=seed)
    notes = []
    if manifest.get("offline"):
        notes.append(OFFLINE_NOTICE)
    if len(records) < planned:
        notes.append(f"Incomplete: {len(records)} of {planned} attempts have a record (an interrupted run, or one the "
                     "spend cap stopped); `rlm eval run` with the same arguments continues it.")
    if analysis["excluded_cut_by_spend_cap"]:
        notes.append(f"{len(analysis['excluded_cut_by_spend_cap'])} attempt(s) cut short by the spend cap are left "
                     "out of every figure.")
    if any(c["attempts_with_unknown_cost"] for c in analysis["conditions"]):
        notes.append("Some attempts have unknown cost: their condition's USD and USD per accepted task are null, and "
                     "the known part is a lower bound.")
    for raised in manifest.get("max_usd_raised", []):
        notes.append(f"The spend cap was raised from ${raised['from']:g} to ${raised['to']:g} when the experiment was "
                     "continued; attempts before it ran under the lower cap.")
    if manifest.get("rlm_environment"):
        notes.append("RLM_* variables were set when the experiment started (they apply to every condition): "
                     + ", ".join(manifest["rlm_environment"]))
    return {"schema": REPORT_SCHEMA, "results": str(folder), "pack": manifest["pack_name"],
            "pack_digest": manifest["pack_digest"], "repeats": manifest["repeats"], "max_usd": manifest["max_usd"],
            "offline": bool(manifest.get("offline")), "planned": planned, "recorded": len(records), "notes": notes,
            "cost_basis": {c["name"]: _basis(records, c["name"]) for c in manifest["conditions"]}, **analysis}


def _basis(records: list[dict[str, Any]], condition: str) -> str | None:
    return next((r["cost_basis"] for r in records if r["condition"] == condition), None)


# ---------- the table ----------

# The conditions table's columns, the same on the terminal and the page (``_condition_cells`` fills them).
CONDITION_COLUMNS = ("condition", "attempts", "accepted", "pass rate", "mean score", "USD", "USD / accepted",
                     "tokens in/out", "p50 s", "p90 s", "errors")


def _condition_cells(c: dict[str, Any]) -> tuple[str, ...]:
    cells = (c["condition"], str(c["attempts"]), str(c["accepted"]), _pct(c["pass_rate"]), _num(c["mean_score"]),
             _usd(c["usd"], c["usd_known_lower_bound"]), _usd(c["usd_per_accepted"]),
             f"{_int(c['input_tokens'])}/{_int(c['output_tokens'])}", _num(c["latency_s"]["p50"], 1),
             _num(c["latency_s"]["p90"], 1), str(c["errors"]))
    assert len(cells) == len(CONDITION_COLUMNS)
    return cells


def print_report(report: dict[str, Any], console: Console) -> None:
    console.print(f"pack {report['pack']} · {report['recorded']}/{report['planned']} attempts · "
                  f"{report['repeats']} repeat(s) · cap {_usd(report['max_usd'])}", highlight=False)
    for note in report["notes"]:
        console.print(f"note: {note}", style="yellow", highlight=False)
    table = Table(title="conditions")
    for column in CONDITION_COLUMNS:
        table.add_column(column, justify="left" if column == "condition" else "right")
    for c in report["conditions"]:
        table.add_row(*_condition_cells(c))
    print_table(console, table, ids=("condition",))
    for p in report["pairs"]:
        pairs = Table(title=f"{p['b']} minus {p['a']}: accepted rate difference over {p['tasks_compared']} task(s), "
                            f"{_diff(p['accepted_diff'])} {_ci(p['interval'])}")
        for column in ("task", "n", "accepted diff", "95% interval", "score diff", "wall s diff"):
            pairs.add_column(column, justify="left" if column == "task" else "right")
        for t in p["per_task"]:
            pairs.add_row(t["task"], str(t["n"]), _diff(t["accepted_diff"]), _ci(t["interval"]),
                          _diff(t["score_diff"]), _diff(t["wall_s_diff"]))
        console.print(pairs)
    for name, basis in report["cost_basis"].items():
        console.print(f"cost of {name}: {basis}", highlight=False)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _int(v: int | None) -> str:
    return "?" if v is None else f"{v:,}"


def _usd(v: float | None, lower: float | None = None) -> str:
    if v is None:
        return "none" if lower is None else f"unknown (>= ${lower:.4f})"
    return f"${v:.4f}"


def _diff(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _ci(interval: list[float] | None) -> str:
    return "-" if not interval else f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"


# ---------- the page ----------

CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}td:first-child,th:first-child{text-align:left}
.note{background:#fff6d6;border:1px solid #e0c060;padding:.5em 1em;margin:.5em 0}
.task{display:inline-block;vertical-align:top;margin:.5em 1em .5em 0}h3{font-size:13px;margin:.2em 0}"""
PALETTE = ("#3b6fb6", "#d9822b", "#4e9a4e", "#b64b6f", "#7a5cb6", "#5ca8a8")


def render_html(report: dict[str, Any]) -> str:
    nonce = secrets.token_urlsafe(16)
    e = html.escape
    conditions = [c["condition"] for c in report["conditions"]]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>"
             f"<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'nonce-{nonce}'\">"
             f"<title>rlm eval: {e(report['pack'])}</title><style nonce='{nonce}'>{CSS}</style></head><body>",
             f"<h1>Evaluation of pack {e(report['pack'])}</h1>",
             f"<p>{report['recorded']} of {report['planned']} attempts, {report['repeats']} repeat(s), spend cap "
             f"{e(_usd(report['max_usd']))}. Pack digest <code>{e(report['pack_digest'][:16])}</code>.</p>"]
    parts += [f"<div class='note'>{e(n)}</div>" for n in report["notes"]]
    parts.append(_conditions_table(report))
    for p in report["pairs"]:
        parts.append(f"<h2>{e(p['b'])} minus {e(p['a'])}</h2><p>accepted rate difference over {p['tasks_compared']} "
                     f"task(s): {e(_diff(p['accepted_diff']))} {e(_ci(p['interval']))} (95% bootstrap)</p>")
        parts.append(_forest(p))
    parts.append("<h2>Per task</h2><p>Bars: pass rate per condition. Dots: each attempt's partial score "
                 "(filled: accepted).</p>")
    parts += [_task_chart(t, conditions) for t in report["tasks"]]
    parts.append("<h2>Where the costs come from</h2><ul>")
    parts += [f"<li>{e(name)}: {e(basis or 'no record')}</li>" for name, basis in report["cost_basis"].items()]
    parts.append("</ul></body></html>")
    return "".join(parts)


def _conditions_table(report: dict[str, Any]) -> str:
    e = html.escape
    rows = ["<table><tr>" + "".join(f"<th>{e(column)}</th>" for column in CONDITION_COLUMNS) + "</tr>"]
    rows += ["<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in _condition_cells(c)) + "</tr>"
             for c in report["conditions"]]
    return "".join(rows) + "</table>"


def _task_chart(task: dict[str, Any], conditions: list[str]) -> str:
    e = html.escape
    width, bar_h, gap = 220, 14, 6
    height = len(conditions) * (bar_h + gap) + 6
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width + 110}' height='{height}' role='img'>"]
    for i, name in enumerate(conditions):
        cell = task["by_condition"][name]
        y = 3 + i * (bar_h + gap)
        rate = cell["accepted"] / cell["attempts"] if cell["attempts"] else 0
        colour = PALETTE[i % len(PALETTE)]
        svg.append(f"<text x='0' y='{y + 11}' font-size='11'>{e(name[:16])}</text>")
        svg.append(f"<rect x='105' y='{y}' width='{width}' height='{bar_h}' fill='#eee'/>")
        svg.append(f"<rect x='105' y='{y}' width='{rate * width:.1f}' height='{bar_h}' fill='{colour}' "
                   f"fill-opacity='0.35'><title>{cell['accepted']}/{cell['attempts']} accepted</title></rect>")
        for score, accepted in zip(cell["scores"], cell["accepted_by_repeat"]):
            x = 105 + (score or 0) * width
            svg.append(f"<circle cx='{x:.1f}' cy='{y + bar_h / 2}' r='4' stroke='{colour}' "
                       f"fill='{colour if accepted else 'white'}'><title>score {_num(score)}</title></circle>")
    svg.append("</svg>")
    return f"<div class='task'><h3>{e(task['task'])}</h3>{''.join(svg)}</div>"


def _forest(p: dict[str, Any]) -> str:
    """Each task's paired difference (-1..1) with its interval, and the overall one last."""
    e = html.escape
    rows = p["per_task"] + [{"task": "all tasks", "accepted_diff": p["accepted_diff"], "interval": p["interval"]}]
    width, row_h, left = 300, 16, 190
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + width + 20}' height='{len(rows) * row_h + 24}'>",
           f"<line x1='{left + width / 2}' y1='0' x2='{left + width / 2}' y2='{len(rows) * row_h}' stroke='#999'/>",
           f"<text x='{left}' y='{len(rows) * row_h + 16}' font-size='10'>-1 (favours {e(p['a'][:14])})</text>",
           f"<text x='{left + width}' y='{len(rows) * row_h + 16}' font-size='10' text-anchor='end'>+1 (favours "
           f"{e(p['b'][:14])})</text>"]
    for i, row in enumerate(rows):
        if row["accepted_diff"] is None:
            continue
        y = i * row_h + row_h / 2

        def x(v: float) -> float:
            return left + (v + 1) / 2 * width

        svg.append(f"<text x='0' y='{y + 4}' font-size='11'>{e(row['task'][:30])}</text>")
        if row["interval"]:
            lo, hi = row["interval"]
            svg.append(f"<line x1='{x(lo):.1f}' y1='{y}' x2='{x(hi):.1f}' y2='{y}' stroke='#333'/>")
        svg.append(f"<circle cx='{x(row['accepted_diff']):.1f}' cy='{y}' r='4' fill='#3b6fb6'>"
                   f"<title>{e(_diff(row['accepted_diff']))} {e(_ci(row['interval']))}</title></circle>")
    svg.append("</svg>")
    return "".join(svg)
