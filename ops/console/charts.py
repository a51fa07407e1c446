"""Charts as inline SVG, drawn on the server from the rows the ledger's reads returned (no second copy of the
numbers, no script): presentation attributes only, so the console's CSP (no inline style) holds."""

from __future__ import annotations

from datetime import date

from markupsafe import Markup, escape

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 16, 36
# Colour-blind-safe (Okabe-Ito), in a fixed order so a series keeps its colour across pages.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


def _ticks(top: int) -> list[int]:
    if top <= 0:
        return [0]
    step = 1
    while top / step > 5:
        for factor in (2, 5, 10):
            if top / (step * factor) <= 5:
                step *= factor
                break
        else:
            step *= 10
    return list(range(0, top + step, step))


def stacked_bars(days: list[date], series: dict[str, dict[date, int]], *, title: str) -> Markup:
    """One bar per day, stacked by series (sorted by name), a legend, and each bar's total in its tooltip."""
    names = sorted(series)
    totals = [sum(series[name].get(day, 0) for name in names) for day in days]
    ticks = _ticks(max(totals, default=0))
    top = ticks[-1] or 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(days), 1)
    bar = max(1.0, slot * 0.7)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT + 18 * ((len(names) + 3) // 4)}" '
             f'role="img" aria-label="{escape(title)}" class="chart"><title>{escape(title)}</title>']
    for tick in ticks:
        y = TOP + plot_h - plot_h * tick / top
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" fill="#444">{tick:,}</text>')
    for index, day in enumerate(days):
        x = LEFT + slot * index + (slot - bar) / 2
        y = TOP + plot_h
        for n, name in enumerate(names):
            value = series[name].get(day, 0)
            if value <= 0:
                continue
            h = plot_h * value / top
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                         f'fill="{PALETTE[n % len(PALETTE)]}"><title>{day.isoformat()} {escape(name)}: {value:,}'
                         f'</title></rect>')
        if len(days) <= 16 or index % max(1, len(days) // 8) == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{TOP + plot_h + 14}" text-anchor="middle" font-size="10" '
                         f'fill="#444">{day.strftime("%m-%d")}</text>')
    if not names:
        parts.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" text-anchor="middle" '
                     f'font-size="13" fill="#666">nothing in this period</text>')
    for n, name in enumerate(names):
        x = LEFT + (n % 4) * 180
        y = HEIGHT + 18 * (n // 4) - 4
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{PALETTE[n % len(PALETTE)]}"/>'
                     f'<text x="{x + 14}" y="{y}" font-size="11" fill="#222">{escape(name)} '
                     f'({sum(series[name].values()):,})</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
