"""``rlm show --html``: one self-contained HTML page of a run and of the family below it.

The page needs no server and no network. Its CSS and the few lines of JavaScript
that switch between the runs of the tree are inline, allowed by a
Content-Security-Policy with a fresh nonce over ``default-src 'none'``, so nothing
else loads or runs. Without JavaScript every run is shown one after the other.

Everything in a trajectory is text that a model, a corpus or a peer chose. Every
value is escaped where it is written into the page, and none goes into the
script. A value longer than ``html_max_text_chars`` (RLM_HTML_MAX_TEXT_CHARS) is
clipped, with a note.

Children's trajectories are found beside the run's own (``runs/<child id>/``)
through the ``child_started`` events, and each is embedded as its own section,
which its node in the tree opens. Follow-ups started from the command line
(which no trajectory records) are found by their ids. The budget chart is an
inline SVG of the family's tokens over time, one point per model call.
"""

from __future__ import annotations

import html
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from rlmfamily.a2a.charge import credits_text
from rlmfamily.budget import usage_text
from rlmfamily.errors import RLMError, TrajectoryInvalid
from rlmfamily.gates.spec import VERDICTS
from rlmfamily.gates.verdict import outcome_text, verdict_text
from rlmfamily.prompts import NO_OUTPUT, NO_OUTPUT_HINT
from rlmfamily.resumption import describe_resume, unfinished_text
from rlmfamily.run_records import last_question
from rlmfamily.trajectory import FILENAME, read_trajectory

# Runs embedded in one page. A family has at most max_children agents, plus their follow-ups; past this
# the tree names the run and `rlm show --html ID` gives it its own page.
MAX_RUNS_ON_PAGE = 200
CHART_W, CHART_H = 720, 220
CHART_MARGIN = {"left": 78, "right": 16, "top": 14, "bottom": 36}


@dataclass
class RunView:
    """One run on the page: its events, its place in the tree and what its parent recorded of it."""

    run_id: str
    name: str  # root, c1, c1.f1: as `rlm children` names them
    anchor: str  # the section's id: run-0, run-1, ... (never text from the trajectory)
    events: list[dict[str, Any]]
    missing: str | None = None  # why there is no trajectory to show
    record: dict[str, Any] = field(default_factory=dict)  # the parent's child_finished summary
    children: list[RunView] = field(default_factory=list)

    def first(self, kind: str) -> dict[str, Any]:
        return next((e for e in self.events if e.get("event") == kind), {})

    @property
    def finished(self) -> dict[str, Any]:
        """The last question's ``run_finished`` (an earlier question's is shown in the flow, before its follow-up)."""
        return next((e for e in reversed(last_question(self.events)) if e.get("event") == "run_finished"), {})

    def all(self) -> list[RunView]:
        return [self] + [v for c in self.children for v in c.all()]


# ---------- loading ----------


class _Loader:
    def __init__(self, runs_dir: Path, max_runs: int) -> None:
        self.runs_dir = runs_dir
        self.max_runs = max_runs
        self.views: dict[str, RunView] = {}
        self.left_out: list[str] = []

    def view(self, run_id: str, events: list[dict[str, Any]], missing: str | None = None) -> RunView:
        view = RunView(run_id, _name(run_id), f"run-{len(self.views)}", events, missing)
        self.views[run_id] = view
        return view

    def load_child(self, run_id: str) -> RunView | None:
        if run_id in self.views:
            return None
        if len(self.views) >= self.max_runs:
            self.left_out.append(run_id)
            return None
        path = self.runs_dir / run_id / FILENAME
        if not path.is_file():
            return self.view(run_id, [], "no trajectory: the run never started its session")
        try:
            return self.view(run_id, read_trajectory(path))
        except TrajectoryInvalid as exc:
            return self.view(run_id, [], f"its trajectory cannot be read: {exc.message}")

    def grow(self, view: RunView) -> None:
        """Add the children that ``view``'s trajectory started, depth first."""
        records = {e.get("id"): e for e in view.events if e.get("event") == "child_finished"}
        for run_id in dict.fromkeys(str(e.get("run")) for e in view.events if e.get("event") == "child_started"):
            child = self.load_child(run_id)
            if child is not None:
                child.record = records.get(run_id, {})
                view.children.append(child)
                self.grow(child)

    def adopt_strays(self, top: RunView) -> None:
        """Runs of the family that no trajectory started (a follow-up from the command line), under their agent."""
        if not self.runs_dir.is_dir():
            return
        for folder in sorted(self.runs_dir.glob(f"{top.run_id}.*")):
            run_id = folder.name
            parents = [v for v in self.views if run_id.startswith(v + ".")]
            if run_id in self.views or not parents or not (folder / FILENAME).is_file():
                continue
            child = self.load_child(run_id)
            if child is not None:
                self.views[max(parents, key=len)].children.append(child)
                self.grow(child)


def load_family(path: Path, *, max_runs: int = MAX_RUNS_ON_PAGE) -> tuple[RunView, list[str]]:
    """The run of the trajectory at ``path`` with every run below it, and the ids left out past ``max_runs``."""
    events = read_trajectory(path)
    run_id = str(next((e["run_id"] for e in events if e.get("event") == "run_started" and e.get("run_id")),
                      path.parent.name))
    loader = _Loader(path.parent.parent, max_runs)
    top = loader.view(run_id, events)
    loader.grow(top)
    loader.adopt_strays(top)
    return top, loader.left_out


def _name(run_id: str) -> str:
    return run_id.split(".", 1)[1] if "." in run_id else "root"


# ---------- the page ----------


class PageUnwritable(RLMError):
    code = "page_unwritable"


def write_page(trajectory: Path, output: str | None, *, max_text_chars: int, out: Console, err: Console) -> None:
    """Write the page of ``trajectory`` to ``output`` ('-': stdout; None: trajectory.html beside it)."""
    top, left_out = load_family(trajectory)
    page = render_page(top, left_out, max_text_chars=max_text_chars)
    if output == "-":
        out.file.write(page)
        out.file.flush()
        return
    target = Path(output).expanduser() if output else trajectory.with_suffix(".html")
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise PageUnwritable(f"cannot write the page to {target}: {exc.strerror or exc}; choose another file "
                             "with -o FILE") from None
    runs = len(top.all())
    err.print(f"wrote {target} ({len(page.encode()):,} bytes, {runs} run{'s' if runs != 1 else ''}); "
              f"open {target.resolve().as_uri()} in a browser", markup=False, highlight=False)


def render_page(top: RunView, left_out: list[str], *, max_text_chars: int) -> str:
    nonce = secrets.token_urlsafe(18)
    out = _Page(max_text_chars)
    views = top.all()
    policy = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
              "base-uri 'none'; form-action 'none'")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>rlm run {out.text(top.run_id)}</title>",
        f'<style nonce="{nonce}">{CSS}</style></head><body>',
        f"<header><h1>run {out.text(top.run_id)}</h1>{out.family_totals(top)}</header>",
        out.chart(views),
        '<div class="layout"><nav class="tree" aria-label="runs of the family">',
        out.tree(top),
        out.left_out(left_out),
        "</nav><main>",
        *[out.section(v) for v in views],
        "</main></div>",
        f'<script nonce="{nonce}">{SCRIPT}</script>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


class _Page:
    """The page's HTML, piece by piece; every value from a trajectory passes through ``text``."""

    def __init__(self, max_text_chars: int) -> None:
        self.max_text_chars = max_text_chars
        self.anchors: dict[str, str] = {}  # run id -> section id, for the buttons that open a child

    def text(self, value: Any) -> str:
        """``value`` as escaped text, clipped at max_text_chars with a note."""
        shown = value if isinstance(value, str) else "" if value is None else str(value)
        note = ""
        if len(shown) > self.max_text_chars:
            more = len(shown) - self.max_text_chars
            shown = shown[: self.max_text_chars]
            note = f'<span class="clipped">[{more:,} more characters not shown (RLM_HTML_MAX_TEXT_CHARS)]</span>'
        return html.escape(shown, quote=True) + note

    def pre(self, cls: str, value: Any) -> str:
        return f'<pre class="{cls}">{self.text(value)}</pre>'

    # ---------- the tree ----------

    def tree(self, top: RunView) -> str:
        for view in top.all():
            self.anchors[view.run_id] = view.anchor
        return f'<ul>{self._node(top)}</ul>'

    def _node(self, view: RunView) -> str:
        label = f"{view.name} · {_state(view)}"
        turns = view.finished.get("turns")
        if turns is not None:
            label += f" · {turns} turns"
        children = "".join(self._node(c) for c in view.children)
        return (f'<li><button type="button" class="node" data-open="{view.anchor}" title="{self.text(view.run_id)}">'
                f'{self.text(label)}</button>' + (f"<ul>{children}</ul>" if children else "") + "</li>")

    def left_out(self, run_ids: list[str]) -> str:
        if not run_ids:
            return ""
        names = ", ".join(run_ids)
        return (f'<p class="note">{len(run_ids)} more runs are not on this page (at most {MAX_RUNS_ON_PAGE}); '
                f"<code>rlm show --html ID</code> gives each its own: {self.text(names)}</p>")

    def _open(self, run_id: Any, label: str) -> str:
        anchor = self.anchors.get(str(run_id))
        if anchor is None:
            return ""
        return f' <button type="button" class="open-run" data-open="{anchor}">{self.text(label)}</button>'

    # ---------- one run ----------

    def section(self, view: RunView) -> str:
        body = [self._header(view), self._outcome(view)]
        if view.missing:
            body.append(f'<p class="note">{self.text(view.missing)}</p>')
        body.extend(self._flow(view))
        body.append(self._delegations(view))
        body.append(self._gates(view))
        return (f'<section class="run" id="{view.anchor}" data-run="{self.text(view.run_id)}">'
                + "\n".join(b for b in body if b) + "</section>")

    def _header(self, view: RunView) -> str:
        started = view.first("run_started")
        corpus = started.get("corpus") or {}
        question = started.get("question") or view.record.get("prompt") or ""
        rows = [("run", view.run_id), ("kernel", started.get("kernel")), ("provider", started.get("provider")),
                ("model", started.get("model")),
                ("corpus", f"{corpus.get('source', '?')} {corpus.get('root', '')}: {corpus.get('files', 0):,} files, "
                           f"{corpus.get('bytes', 0):,} bytes" if corpus else None),
                ("started", _when(started.get("ts"))), ("limits", _limits(started.get("limits")))]
        meta = "".join(f"<dt>{k}</dt><dd>{self.text(v)}</dd>" for k, v in rows if v is not None)
        return (f"<h2>{self.text(view.name)}</h2>"
                f'<p class="question">{self.text(question)}</p><dl class="meta">{meta}</dl>')

    def _outcome(self, view: RunView, done: dict[str, Any] | None = None) -> str:
        """How the run's last question ended (or ``done``, an earlier question's ``run_finished``)."""
        done = view.finished if done is None else done
        if not done:
            return f'<div class="outcome unfinished">{self.text(unfinished_text(view.events, view.run_id))}</div>'
        own = done.get("usage") or done.get("budget") or {}
        family = done.get("budget") or {}
        line = (f"{done.get('stop_reason')} after {done.get('turns')} turns, {done.get('subcalls')} sub-calls, "
                f"{usage_text(own)}")
        if family and own.get("calls") != family.get("calls"):
            line += f"; family total {usage_text(family)}"
        answer = done.get("answer")
        parts = [f'<div class="outcome"><p class="stop">{self.text(line)}</p>']
        verdict = done.get("verdict")
        if verdict in VERDICT_CLASSES:  # a trajectory from before completion gates has none
            shown = verdict_text(verdict, done.get("verdict_reason"))
            parts.append(f'<p class="verdict {VERDICT_CLASSES[verdict]}">{self.text(shown)}</p>')
            for blocker in done.get("blocked_by") or []:
                parts.append(f'<p class="blocked">blocked by: {self.text(blocker)}</p>')
        if done.get("error"):
            parts.append(f'<p class="error">{self.text(done["error"])}</p>')
        parts.append(self.pre("answer", answer) if answer is not None else '<p class="note">(no answer)</p>')
        return "".join(parts) + "</div>"

    def _flow(self, view: RunView) -> list[str]:
        """The events in order: one open ``details`` per turn, notes between turns."""
        blocks: list[str] = []
        turn: list[str] | None = None
        last = view.finished
        for e in view.events:
            kind = e.get("event")
            if kind == "run_started" or e is last:
                continue
            if kind in ("run_finished", "follow_up"):  # a session of several questions: each one's end, the next
                if turn is not None:
                    blocks.append("".join(turn) + "</details>")
                    turn = None
                blocks.append(self._outcome(view, e) if kind == "run_finished" else self._follow_up(e))
                continue
            if kind == "turn":
                if turn is not None:
                    blocks.append("".join(turn) + "</details>")
                turn = [self._turn(e)]
            elif kind in ("final_request", "final_reply_rejected", "budget_refused", "run_resumed", "answer_withdrawn",
                          "acceptance_blocked"):
                if turn is not None:
                    blocks.append("".join(turn) + "</details>")
                    turn = None
                blocks.append(self._banner(e))
            else:
                item = self._item(e)
                if turn is None:
                    blocks.append(item)
                else:
                    turn.append(item)
        if turn is not None:
            blocks.append("".join(turn) + "</details>")
        return blocks

    def _turn(self, e: dict[str, Any]) -> str:
        tokens = (e.get("usage") or {}).get("total_tokens")
        summary = f"turn {e.get('turn')} · {f'{tokens:,}' if isinstance(tokens, int) else 'unknown'} tokens"
        if e.get("model"):
            summary += f" · {e['model']}"
        parts = [f'<details class="turn" open><summary>{self.text(summary)}</summary>']
        if e.get("text"):
            parts.append(f'<div class="model-text">{self.text(e["text"])}</div>')
        names = [c.get("name") for c in e.get("calls") or []]
        for index, code in enumerate(e.get("code") or []):
            tool = names[index] if index < len(names) else "python"
            parts.append(self.pre("code", code if tool in ("python", None) else f"{tool}$ {code}"))
        return "".join(parts)

    def _follow_up(self, e: dict[str, Any]) -> str:
        how = describe_resume(e) + ("; the conversation before was compacted into a summary for the model"
                                    if e.get("compacted") else "")
        title = f"follow-up {e.get('number')}: {e.get('question')}"
        after = f"after turn {e.get('turn')}; {how}"
        return f'<h3 class="follow-up">{self.text(title)}</h3><p class="banner">{self.text(after)}</p>'

    def _banner(self, e: dict[str, Any]) -> str:
        kind = e.get("event")
        if kind == "final_request":
            text = f"asked for a final answer: {e.get('why')}"
        elif kind == "final_reply_rejected":
            text = f"not an answer: {e.get('reason')}"
        elif kind == "run_resumed":
            text = (f"resumed after turn {e.get('turn')} (pid {e.get('pid')}; the process before, pid "
                    f"{e.get('after_pid')}, ended without finishing): {describe_resume(e)}")
        elif kind == "answer_withdrawn":
            text = (f"answer withdrawn (attempt {e.get('attempt')}): {', '.join(e.get('failed') or [])} failed; "
                    "the model was told and went on")
        elif kind == "acceptance_blocked":
            text = "the answer cannot be accepted: " + "; ".join(str(b) for b in e.get("blocked_by") or [])
        else:
            text = f"budget refused turn {e.get('turn')}: {e.get('message')}"
        return f'<p class="banner">{self.text(text)}</p>'

    def _item(self, e: dict[str, Any]) -> str:
        kind = e.get("event")
        if kind == "step":
            return self._step(e)
        if kind == "subcall":
            return self._subcall(e)
        if kind == "child_started":
            name = _name(str(e.get("run")))
            what = f"started child {name} ({e.get('kind')}): {e.get('prompt', '')}"
            return f'<div class="child">{self.text(what)}{self._open(e.get("run"), "open " + name)}</div>'
        if kind == "child_finished":
            name = _name(str(e.get("id")))
            detail = e.get("answer") if e.get("answer") is not None else (e.get("error") or e.get("note") or "")
            what = f"child {name} {e.get('state')}: {detail}"
            return f'<div class="child">{self.text(what)}{self._open(e.get("id"), "open " + name)}</div>'
        if kind == "children_wait":
            return f'<p class="note">waiting for {len(e.get("runs") or [])} active children before the run ends</p>'
        if kind == "delegation":
            what = f"delegation {e.get('action')} {e.get('id')} to {e.get('peer')}: {e.get('state')}"
            return f'<div class="delegation">{self.text(what)}</div>'
        if kind == "job":  # a command job of the python-bash profile: its receipt
            failed = e.get("state") != "exited" or e.get("exit_code") != 0
            return f'<div class="job">{self.pre("receipt" + (" failed" if failed else ""), e.get("receipt", ""))}</div>'
        if kind == "job_released":
            what = f"job {e.get('job_id')} released by the model: {e.get('reason')}"
            return f'<p class="note">{self.text(what)}</p>'
        if kind == "gate":  # a completion gate's run: how it ended, and the head and tail of its output
            return self._gate(e)
        if kind == "tool_call":  # a custom tool's call (rlmfamily/tools.py)
            status = "ok" if e.get("ok") else f"failed: {e.get('error')}"
            call = f"tool {e.get('name')}({e.get('arguments', '')}) [{status}]"
            return f'<p class="note">{self.text(call)}</p>'
        if kind == "tool_step":  # the receipt is in its job event; a refused call has none
            return "" if e.get("job_id") else self.pre("output failed", str(e.get("observation", "")))
        # An event this page does not know (a newer library wrote it): shown as its fields.
        fields = {k: v for k, v in e.items() if k not in ("event", "seq", "ts")}
        return f'<div class="event">{self.text(kind)} {self.text(json.dumps(fields, default=str))}</div>'

    def _step(self, e: dict[str, Any]) -> str:
        observation = str(e.get("observation", ""))
        if e.get("full_chars") == 0:  # the model's hint is for the model
            observation = observation.replace(NO_OUTPUT_HINT, NO_OUTPUT)
        return self.pre("output" + ("" if e.get("ok") else " failed"), observation)

    def _subcall(self, e: dict[str, Any]) -> str:
        status = "ok" if e.get("ok") else f"error {e.get('error_code')}"
        tokens = 0 if e.get("cached") else (e.get("usage") or {}).get("total_tokens")  # a memo hit cost nothing
        head = f"sub-call {e.get('seq')} · {status} · {tokens if tokens is not None else 'unknown'} tokens"
        if e.get("cached"):
            head += " · cached"
        if e.get("sources"):  # which chunks it answered (path:lines), as rlm show says
            head += " · on " + ", ".join(e["sources"])
        return (f'<div class="subcall"><p>{self.text(head)}</p>{self.pre("prompt", e.get("prompt", ""))}'
                f'{self.pre("response", e.get("response", ""))}</div>')

    def _gate(self, e: dict[str, Any]) -> str:
        passed = bool(e.get("passed"))
        head = f"gate {e.get('name')} (attempt {e.get('attempt')}): {outcome_text(e)}"
        excerpt = self.pre("output failed", e["excerpt"]) if e.get("excerpt") else ""
        return (f'<div class="gate {"passed" if passed else "failed"}"><p>{self.text(head)}</p>'
                f'{self.pre("code", "$ " + str(e.get("command", "")))}{excerpt}</div>')

    def _gates(self, view: RunView) -> str:
        """Every gate run of the run, attempt by attempt, as its final record keeps them."""
        runs = [r for r in view.finished.get("gates") or [] if isinstance(r, dict)]
        if not runs:
            return ""
        columns = ("attempt", "gate", "command", "outcome")
        head = "".join(f"<th>{c}</th>" for c in columns)
        rows = "".join(
            f'<tr class="{"passed" if r.get("passed") else "failed"}">'
            + "".join(f"<td>{self.text(v)}</td>" for v in (r.get("attempt"), r.get("name"), r.get("command"),
                                                           outcome_text(r)))
            + "</tr>" for r in runs)
        return f'<h3>completion gates</h3><table class="gates"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'

    def _delegations(self, view: RunView) -> str:
        sent = [e for e in view.events if e.get("event") == "delegation"]
        # A run's final record holds the evidence of the whole family: each run shows that of its own delegations.
        own = {e.get("id") for e in sent}
        evidence = [d for d in view.finished.get("delegations") or [] if isinstance(d, dict) and d.get("id") in own]
        if not sent and not evidence:
            return ""
        parts = ["<h3>delegations</h3>"]
        if sent:
            columns = ("turn", "action", "id", "peer", "state", "required", "remote_task_id", "error")
            head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in columns)
            rows = "".join("<tr>" + "".join(f"<td>{self.text(e.get(c))}</td>" for c in columns) + "</tr>" for e in sent)
            parts.append(f'<table class="delegations"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>')
        for d in evidence:
            credits = credits_text(d)
            what = (f"remote evidence (unverified): {d.get('id')} from {d.get('peer')}: {d.get('state')}, "
                    f"{d.get('result_chars', 0):,} characters" + (f"; {credits}" if credits else "")
                    + (f"; {d['error']}" if d.get("error") else ""))
            preview = self.pre("response", d["preview"]) if d.get("preview") else ""
            parts.append(f'<div class="evidence"><p>{self.text(what)}</p>{preview}</div>')
        return "".join(parts)

    # ---------- the family ----------

    def family_totals(self, top: RunView) -> str:
        budget = top.finished.get("budget") or {}
        if not budget:
            return ""
        limits = _limits(budget.get("limits")) or "no limits"
        return f'<p class="totals">family allowance: {self.text(usage_text(budget))}; limits {self.text(limits)}</p>'

    def chart(self, views: list[RunView]) -> str:
        return _Chart(views, self.text).svg()


@dataclass(frozen=True)
class _Call:
    ts: float
    label: str  # "c1 turn 2", "root sub-call 3"
    tokens: int | None  # None: the call's usage is unknown
    top: bool  # a call of the page's own run (not of a child)


def _calls(view: RunView, *, top: bool) -> list[_Call]:
    found = []
    for e in view.events:
        if e.get("event") not in ("turn", "subcall") or not isinstance(e.get("ts"), (int, float)):
            continue
        tokens = 0 if e.get("cached") else (e.get("usage") or {}).get("total_tokens")
        what = f"turn {e.get('turn')}" if e["event"] == "turn" else f"sub-call {e.get('seq')}"
        found.append(_Call(float(e["ts"]), f"{view.name} {what}", tokens if isinstance(tokens, int) else None, top))
    return found


class _Chart:
    """The family's known tokens over time as an inline SVG: a step line, one point per model call."""

    def __init__(self, views: list[RunView], text: Callable[[Any], str]) -> None:
        self.text = text
        self.top_name = views[0].name
        self.calls = sorted((c for i, v in enumerate(views) for c in _calls(v, top=i == 0)), key=lambda c: c.ts)
        firsts = [e["ts"] for v in views for e in v.events[:1] if isinstance(e.get("ts"), (int, float))]
        self.start = min([c.ts for c in self.calls] + firsts, default=0.0)
        self.span_s = max((self.calls[-1].ts - self.start) if self.calls else 0.0, 1e-3)
        self.total = sum(c.tokens or 0 for c in self.calls)
        self.limit = _limit_of(views[0], "max_tokens")
        # The limit line is drawn when it is near enough to be seen; otherwise the caption gives the share used.
        near = self.limit is not None and self.limit <= 2 * max(self.total, 1)
        self.y_max = self.limit if near and self.limit else max(self.total, 1)
        self.left, self.top = CHART_MARGIN["left"], CHART_MARGIN["top"]
        self.w = CHART_W - self.left - CHART_MARGIN["right"]
        self.h = CHART_H - self.top - CHART_MARGIN["bottom"]

    def xy(self, ts: float, tokens: int) -> tuple[float, float]:
        return (round(self.left + self.w * (ts - self.start) / self.span_s, 1),
                round(self.top + self.h - self.h * tokens / self.y_max, 1))

    def svg(self) -> str:
        if not self.calls:
            return '<p class="note">no model calls recorded</p>'
        line, dots, used = [self.xy(self.start, 0)], [], 0
        for call in self.calls:
            line.append(self.xy(call.ts, used))
            used += call.tokens or 0
            x, y = self.xy(call.ts, used)
            line.append((x, y))
            kind = "call" + ("" if call.top else " member") + (" unknown" if call.tokens is None else "")
            shown = f"{call.tokens:,} tokens" if call.tokens is not None else "unknown usage"
            dots.append(f'<circle class="{kind}" cx="{x}" cy="{y}" r="4"><title>{self.text(call.label)} · {shown} · '
                        f"{call.ts - self.start:.1f} s; {used:,} in all</title></circle>")
        caption = self.text(self.caption())
        points = " ".join(f"{x},{y}" for x, y in line)
        return (f'<figure class="budget"><svg id="budget-chart" role="img" viewBox="0 0 {CHART_W} {CHART_H}" '
                f'width="{CHART_W}" height="{CHART_H}" aria-label="tokens over time"><title>{caption}</title>'
                f'{self.axes()}<polyline class="tokens" points="{points}"/>{"".join(dots)}</svg>'
                f"<figcaption>{caption}</figcaption></figure>")

    def axes(self) -> str:
        left, top, w, h = self.left, self.top, self.w, self.h
        parts = [f'<line class="axis" x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}"/>',
                 f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + h}"/>',
                 f'<text x="{left - 6}" y="{top + h}" text-anchor="end">0</text>',
                 f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">{self.y_max:,}</text>',
                 f'<text x="{left}" y="{CHART_H - 12}">0 s</text>',
                 f'<text x="{left + w}" y="{CHART_H - 12}" text-anchor="end">{self.span_s:.1f} s</text>']
        if self.y_max == self.limit:
            parts.append(f'<line class="limit" x1="{left}" y1="{top}" x2="{left + w}" y2="{top}"/>')
        return "".join(parts)

    def caption(self) -> str:
        members = any(not c.top for c in self.calls)
        text = f"tokens over time: {len(self.calls)} model calls"
        text += f" ({self.top_name}'s filled, its children's hollow)" if members else ""
        text += f", {self.total:,} known tokens"
        if self.limit is not None:
            text += f" of the {self.limit:,}-token limit ({100 * self.total / self.limit:.1f}%)"
        unknown = sum(c.tokens is None for c in self.calls)
        return text + (f"; {unknown} calls of unknown usage (orange)" if unknown else "")


VERDICT_CLASSES = {verdict: verdict.replace("_", "-") for verdict in VERDICTS}  # the page's CSS classes


def _state(view: RunView) -> str:
    if view.record.get("state"):
        return str(view.record["state"])
    if view.finished:
        gated = view.finished.get("gates") or view.finished.get("blocked_by")
        verdict = f" · {str(view.finished.get('verdict')).replace('_', ' ')}" if gated else ""
        return str(view.finished.get("stop_reason")) + verdict
    return "no trajectory" if view.missing else "did not finish"




def _limits(limits: Any) -> str | None:
    if not isinstance(limits, dict):
        return None
    shown = [f"{k.removeprefix('max_').replace('_', ' ')} " + (f"{v:,}" if isinstance(v, int) else str(v))
             for k, v in limits.items() if v is not None]
    return ", ".join(shown) or None


def _limit_of(view: RunView, name: str) -> int | None:
    value = (view.first("run_started").get("limits") or {}).get(name)
    return value if isinstance(value, int) and value > 0 else None


def _when(ts: Any) -> str | None:
    if not isinstance(ts, (int, float)):
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


CSS = """
:root { color-scheme: light; --fg: #1d2330; --muted: #5d6678; --line: #d8dce4; --accent: #2f5fb3; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: #f6f7f9; }
header, figure.budget { padding: 12px 20px; margin: 0; }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 0; } h3 { font-size: 14px; }
.layout { display: flex; gap: 16px; padding: 0 20px 20px; align-items: flex-start; }
nav.tree { position: sticky; top: 8px; min-width: 220px; max-width: 320px; background: #fff;
  border: 1px solid var(--line); border-radius: 6px; padding: 8px; }
nav.tree ul { list-style: none; margin: 0; padding-left: 14px; } nav.tree > ul { padding-left: 0; }
button.node, button.open-run { font: inherit; cursor: pointer; border: 1px solid var(--line); background: #fff;
  border-radius: 4px; padding: 2px 6px; margin: 2px 0; text-align: left; }
button.node[aria-current="true"] { border-color: var(--accent); background: #e8effb; }
button.open-run { color: var(--accent); }
main { flex: 1; min-width: 0; }
section.run { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 12px 16px;
  margin-bottom: 16px; }
.question { font-weight: 600; white-space: pre-wrap; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 0 12px; color: var(--muted); margin: 6px 0; }
dl.meta dd { margin: 0; overflow-wrap: anywhere; }
details.turn { border-top: 1px solid var(--line); padding: 6px 0; }
details.turn > summary { cursor: pointer; font-weight: 600; color: var(--accent); }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 6px 0; padding: 6px 8px; border-radius: 4px;
  font: 12.5px/1.4 ui-monospace, monospace; max-height: 480px; overflow: auto; }
pre.code { background: #f0f6ee; } pre.output { background: #f4f4f6; } pre.failed { background: #fbeeee; }
pre.prompt, pre.response { background: #f7f2fb; max-height: 200px; } pre.answer { background: #eef3fb; }
.model-text { font-style: italic; white-space: pre-wrap; overflow-wrap: anywhere; }
.subcall, .child, .delegation, .evidence, .event, .job, .gate { margin: 6px 0 6px 12px; padding-left: 8px;
  border-left: 3px solid var(--line); overflow-wrap: anywhere; }
.gate.passed { border-color: #3c8c5a; } .gate.failed { border-color: #c44; } .gate p { margin: 2px 0; }
.verdict { font-weight: 600; margin: 4px 0; } .verdict.accepted { color: #2d7a4a; }
.verdict.gates-failed, .verdict.not-verified, .blocked { color: #a33; } .blocked { margin: 2px 0; }
table.gates { border-collapse: collapse; } table.gates td, table.gates th { border: 1px solid var(--line);
  padding: 2px 6px; text-align: left; } table.gates tr.failed td { background: #fbeeee; }
.subcall { border-color: #a77bd1; } .child { border-color: var(--accent); } .delegation { border-color: #c98a2b; } .job { border-color: #3c8c5a; }
.subcall p, .evidence p { margin: 2px 0; }
.outcome { margin: 8px 0; } .outcome .stop { font-weight: 600; margin: 0; } .unfinished, .error { color: #a33; }
.banner { color: #8a5a00; font-weight: 600; } .note, .clipped { color: var(--muted); font-style: italic; }
table.delegations { border-collapse: collapse; } table.delegations td, table.delegations th {
  border: 1px solid var(--line); padding: 2px 6px; text-align: left; }
svg#budget-chart { background: #fff; border: 1px solid var(--line); border-radius: 6px; max-width: 100%;
  height: auto; }
svg text { font: 11px system-ui, sans-serif; fill: var(--muted); }
svg .axis { stroke: #9aa3b2; } svg .limit { stroke: #c44; stroke-dasharray: 4 3; }
svg .tokens { fill: none; stroke: var(--accent); stroke-width: 2; }
svg .call { fill: var(--accent); stroke: var(--accent); stroke-width: 2; } svg .call.member { fill: #fff; }
svg .call.unknown { fill: #e0a030; stroke: #e0a030; }
figcaption { color: var(--muted); }
"""

# Switches between the runs: one section at a time, opened from the tree or from a child's record.
SCRIPT = """
(function () {
  var sections = Array.prototype.slice.call(document.querySelectorAll("section.run"));
  var nodes = Array.prototype.slice.call(document.querySelectorAll("button.node"));
  function open(id) {
    sections.forEach(function (s) { s.hidden = s.id !== id; });
    nodes.forEach(function (n) { n.setAttribute("aria-current", String(n.dataset.open === id)); });
    window.scrollTo(0, 0);
  }
  document.querySelectorAll("[data-open]").forEach(function (b) {
    b.addEventListener("click", function () { open(b.dataset.open); });
  });
  if (sections.length) { open(sections[0].id); }
})();
"""
