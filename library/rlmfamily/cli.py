"""The ``rlm`` command: ``run`` a question over a repository or document, ``show`` a run, ``usage`` of budgets.

Exit codes: 0 the run produced an answer (or the command succeeded), 1 the run
ended without an answer, 2 the command line or the configuration is wrong
(the message names the flag or setting to change). A run with completion gates
exits 0 only when it is accepted, and 3 when it is not (a gate failed, or the
gates could not say: ``not_verified``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rlmfamily.budget import BudgetLedger, usage_text
from rlmfamily.context import Context
from rlmfamily.errors import RLMError, SettingsInvalid
from rlmfamily.family.progress import RunningChildren
from rlmfamily.gates.verdict import outcome_text, verdict_text
from rlmfamily.memo import memo_usage
from rlmfamily.output import consoles, print_table
from rlmfamily.prompts import NO_OUTPUT, NO_OUTPUT_HINT
from rlmfamily.providers.base import PriceTable, Provider
from rlmfamily.providers.scripted import ScriptedProvider
from rlmfamily.session import RunResult, Session
from rlmfamily.settings import RLMSettings, load_settings
from rlmfamily.resumption import describe_resume, endpoint_switch, unfinished_text
from rlmfamily.run_records import last_question
from rlmfamily.trajectory import find_run, read_trajectory

EXIT_OK, EXIT_NO_ANSWER, EXIT_USAGE, EXIT_NOT_ACCEPTED = 0, 1, 2, 3


def _limit_int(text: str) -> int | None:
    return None if text.lower() in ("none", "off") else int(text)


def _limit_float(text: str) -> float | None:
    return None if text.lower() in ("none", "off") else float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlm", description="Recursive Language Model runs over your own files.")
    parser.add_argument("--data-dir", help="where runs, history and budgets live (RLM_DATA_DIR; default: a project's "
                        ".rlm/, else the platform's data folder; rlm where shows which)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="answer a question over a repository, a document or an evidence bundle")
    run.add_argument("question")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--repo", help="a repository folder: its git-tracked files are the corpus")
    source.add_argument("--document", help="one text file as the corpus")
    source.add_argument("--bundle", help="a JSON file of evidence items {path, start, end, text}")
    run.add_argument("--kernel", choices=["host", "monty", "container"], default=argparse.SUPPRESS,
                     help="where the model's code runs (RLM_KERNEL; default monty; container: see RLM_CONTAINER_*)")
    run.add_argument("--script", help="replay a scripted conversation (TOML or JSON) instead of calling a model")
    run.add_argument("--provider", choices=["openai", "anthropic", "gemini"], default=argparse.SUPPRESS,
                     help="the model API: any OpenAI-compatible endpoint, Anthropic's Messages API or Google's "
                          "Gemini API (RLM_PROVIDER; default openai)")
    run.add_argument("--base-url", default=argparse.SUPPRESS, help="the endpoint (RLM_BASE_URL; default: the provider's)")
    run.add_argument("--protocol", choices=["tools", "text", "auto"], default=argparse.SUPPRESS,
                     help="how the model sends code: the python tool, ```python blocks in text (servers without "
                          "tool calling), or auto: tools, then text if refused (RLM_PROTOCOL; default tools)")
    run.add_argument("--model", default=argparse.SUPPRESS, help="model id (RLM_MODEL)")
    run.add_argument("--api-key-env", default=argparse.SUPPRESS, help="NAME of the environment variable holding the key (RLM_API_KEY_ENV)")
    run.add_argument("--temperature", type=float, default=argparse.SUPPRESS, help="sampling temperature (RLM_TEMPERATURE)")
    run.add_argument("--max-completion-tokens", type=int, default=argparse.SUPPRESS,
                     help="output tokens per model call (RLM_MAX_COMPLETION_TOKENS)")
    run.add_argument("--max-turns", type=int, default=argparse.SUPPRESS, help="root turns (RLM_MAX_TURNS)")
    run.add_argument("--max-calls", type=_limit_int, default=argparse.SUPPRESS, help="model calls, root and sub-calls ('none' = no limit)")
    run.add_argument("--max-tokens", type=_limit_int, default=argparse.SUPPRESS, help="tokens over all calls ('none' = no limit)")
    run.add_argument("--final-reserve-tokens", type=int, default=argparse.SUPPRESS,
                     help="tokens of --max-tokens kept for the final answer (default: a tenth of it, at most 50,000)")
    run.add_argument("--max-usd", type=_limit_float, default=argparse.SUPPRESS, help="USD over all calls ('none' = no limit; needs prices)")
    run.add_argument("--memoise-subcalls", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                     help="answer a sub-call the family already asked from the memo, unpaid (RLM_MEMOISE_SUBCALLS; default on)")
    run.add_argument("--profile", choices=["python", "python-bash"], default=argparse.SUPPRESS,
                     help="python-bash adds command jobs in the repository: bash.run(...) and the bash tool "
                          "(RLM_PROFILE; default python)")
    run.add_argument("--bash-tool", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                     help="with --profile python-bash: offer the bash tool beside python (RLM_BASH_TOOL; default on)")
    run.add_argument("--observation-strategy", choices=["transcript", "receipts"], default=argparse.SUPPRESS,
                     help="what the model sees of outputs: head and tail, or compact receipts with history "
                          "references (RLM_OBSERVATION_STRATEGY; default transcript)")
    run.add_argument("--gate", action="append", metavar="NAME=COMMAND", default=argparse.SUPPRESS,
                     help="a completion gate: a command run in the workspace when the model answers; the run is "
                          "accepted only when every gate exits 0 (repeatable; replaces RLM_GATES)")
    run.add_argument("--gate-deadline-s", dest="gate_default_deadline_s", type=float, default=argparse.SUPPRESS,
                     help="each gate's deadline in seconds (RLM_GATE_DEFAULT_DEADLINE_S; default 300)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--quiet", action="store_true", help="no live progress display")

    demo = sub.add_parser("demo", help="the offline demo: a scripted run over the bundled harbor repository")
    demo.add_argument("--kernel", choices=["host", "monty"], default=argparse.SUPPRESS, help="where the model's code runs (RLM_KERNEL; default monty)")
    demo.add_argument("--json", action="store_true", help="print the result as JSON")
    demo.add_argument("--quiet", action="store_true", help="no live progress display")

    show = sub.add_parser("show", help="replay a run's trajectory")
    show.add_argument("run", help="run id, unique prefix, 'last', or a trajectory file")
    shown_as = show.add_mutually_exclusive_group()
    shown_as.add_argument("--json", action="store_true", help="print the raw events as a JSON list")
    shown_as.add_argument("--html", action="store_true", help="write one self-contained HTML page of the run and "
                          "its children (no server, no network)")
    show.add_argument("-o", "--output", help="with --html: the page's file ('-' = stdout; default: "
                      "trajectory.html beside the run's trajectory)")

    usage = sub.add_parser("usage", help="inference budgets: calls, tokens, USD and unknown usage")
    usage.add_argument("--run", help="list one run's usage entries: run id, unique prefix, 'last' (as show); "
                       "a child's is its family's")
    usage.add_argument("--json", action="store_true")
    usage.add_argument("--reconcile", type=int, metavar="ENTRY", help="record the real usage of an unknown entry")
    usage.add_argument("--tokens", type=int, help="with --reconcile: the real token count")
    usage.add_argument("--usd", type=float, help="with --reconcile: the real cost in USD")
    usage.add_argument("--reason", help="with --reconcile: the audit reason (who checked what, where)")

    from rlmfamily import resume

    resume.add_parser(sub)  # resume, ask
    from rlmfamily.family import cli as family_cli

    family_cli.add_parsers(sub)  # inbox, message, follow-up, children
    from rlmfamily.a2a import cli as a2a_cli

    a2a_cli.add_parsers(sub)  # peers, delegations, reconcile
    from rlmfamily import data_cli

    data_cli.add_parsers(sub)  # where, init
    from rlmfamily.bash import cli as bash_cli

    bash_cli.add_parsers(sub)  # jobs
    from rlmfamily.eval import cli as eval_cli

    eval_cli.add_parsers(sub)  # eval run, eval report, eval tasks
    from rlmfamily.container import cli as container_cli

    container_cli.add_parsers(sub)  # container image, container sweep
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out, err = consoles()
    try:
        if args.command == "demo":
            return _run(_demo_args(args), out, err)
        if args.command == "run":
            return _run(args, out, err)
        if args.command == "show":
            return _show(args, out, err)
        if args.command == "resume":
            return _resume(args, out, err)
        if args.command == "ask":
            return _ask(args, out, err)
        from rlmfamily.family import cli as family_cli

        if args.command in family_cli.COMMANDS:
            return family_cli.main(args, _settings(args), out, err)
        from rlmfamily.a2a import cli as a2a_cli

        if args.command in a2a_cli.COMMANDS:
            return a2a_cli.main(args, _settings(args), out, err)
        from rlmfamily import data_cli

        if args.command in data_cli.COMMANDS:
            return data_cli.main(args, _settings(args), out, err)
        from rlmfamily.bash import cli as bash_cli

        if args.command in bash_cli.COMMANDS:
            return bash_cli.main(args, _settings(args), out, err)
        from rlmfamily.eval import cli as eval_cli

        if args.command in eval_cli.COMMANDS:
            return eval_cli.main(args, out, err)
        from rlmfamily.container import cli as container_cli

        if args.command in container_cli.COMMANDS:
            return container_cli.main(args, _settings(args), out, err)
        return _usage(args, out)
    except RLMError as exc:
        err.print(f"rlm: [{exc.code}] {exc.message}", markup=False, highlight=False)
        return EXIT_USAGE


# ---------- demo ----------

EXAMPLES = Path(__file__).resolve().parent / "examples"
DEMO_QUESTION = "How many times does harbor try an upload in production before giving up, and what decides it?"


def _demo_args(args: argparse.Namespace) -> argparse.Namespace:
    """``rlm demo`` is ``rlm run`` over the bundled example, with its script and question (no model, no key)."""
    demo = argparse.Namespace(**vars(args))
    demo.command, demo.question = "run", DEMO_QUESTION
    demo.repo, demo.document, demo.bundle = str(EXAMPLES / "harbor"), None, None
    demo.script = str(EXAMPLES / "harbor_demo.toml")
    return demo


# ---------- run ----------


OVERRIDES = ("kernel", "max_turns", "provider", "protocol", "base_url", "model", "api_key_env", "temperature",
             "max_completion_tokens", "max_calls", "max_tokens", "max_usd", "memoise_subcalls", "a2a_peers_file",
             "profile", "bash_tool", "observation_strategy", "gate_default_deadline_s", "final_reserve_tokens")


def _settings(args: argparse.Namespace) -> RLMSettings:
    # Flags default to "absent" (SUPPRESS), so "--max-tokens none" can override a default with no limit.
    overrides = {name: getattr(args, name) for name in OVERRIDES if hasattr(args, name)}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if hasattr(args, "gate"):
        overrides["gates"] = [_gate_flag(text) for text in args.gate]
    settings = load_settings(**overrides)
    if settings.data_location.notice:  # the legacy ~/.rlm is in use: say once per command how to move it
        print(settings.data_location.notice, file=sys.stderr)
    return settings


def _gate_flag(text: str) -> dict[str, str]:
    """``--gate NAME=COMMAND``: the name before the first ``=``, the command after it (checked by the settings)."""
    name, sep, command = text.partition("=")
    if not sep:
        raise SettingsInvalid(f"--gate {text!r}: give NAME=COMMAND, e.g. --gate 'tests=python -m unittest'",
                              setting="gates")
    return {"name": name.strip(), "command": command}


def _exit_code(result: RunResult, settings: RLMSettings) -> int:
    """With completion gates only an accepted run succeeds; without, a run that answered does."""
    if settings.gates:
        return EXIT_OK if result.verdict == "accepted" else EXIT_NOT_ACCEPTED
    return EXIT_OK if result.answer is not None else EXIT_NO_ANSWER


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    settings = _settings(args)
    context = _context(args, settings)
    provider = _provider(args, settings)
    progress = _Progress(settings.max_turns, children=RunningChildren(settings))
    # Rendered at each refresh, not only at the root's events: children progress while the root waits on them.
    live = None if args.quiet or args.json else Live(get_renderable=progress.render, console=err,
                                                     refresh_per_second=8, transient=True)

    def on_event(event: dict[str, Any]) -> None:
        progress.update(event)
        if event.get("event") == "protocol_fallback":
            err.print(Text(f"note: the endpoint refused the python tool ({event['reason']}); the run goes on with "
                           "```python blocks in text (set RLM_PROTOCOL=text to start so)", style="yellow"))

    session = Session(context=context, provider=provider, settings=settings, on_event=on_event,
                      model=None if args.script else settings.model)
    if live is not None:
        with live:
            result = session.run(args.question)
    else:
        result = session.run(args.question)
    _print_result(result, out, err, as_json=args.json)
    return _exit_code(result, settings)


def _resume(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``rlm resume RUN``: rlmfamily/resume.py finds where the run was cut off; it goes on as ``rlm run`` shows it."""
    from rlmfamily import resume

    session, point = resume.prepare(args)
    if "endpoint_changed" in point.record:
        err.print(f"resuming against another endpoint than the run's: {endpoint_switch(point.record)}",
                  style="yellow", markup=False)
    return _continue(args, out, err, session, lambda: session.resume(point))


def _ask(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``rlm ask RUN QUESTION``: a follow-up question to a finished root run (``Session.follow_up``)."""
    from rlmfamily import resume

    session = resume.prepare_ask(args)
    return _continue(args, out, err, session, lambda: session.follow_up(args.question))


def _continue(args: argparse.Namespace, out: Console, err: Console, session: Session,
              go_on: Callable[[], RunResult]) -> int:
    """A run taken up again (``rlm resume``, ``rlm ask``), its progress shown as ``rlm run`` shows it."""
    progress = _Progress(session.settings.max_turns, children=RunningChildren(session.settings))
    live = None if args.quiet or args.json else Live(progress.render(), console=err, refresh_per_second=8, transient=True)

    def on_event(event: dict[str, Any]) -> None:
        progress.update(event)
        if live is not None:
            live.update(progress.render())

    session.on_event = on_event
    if live is not None:
        with live:
            result = go_on()
    else:
        result = go_on()
    _print_result(result, out, err, as_json=args.json)
    return _exit_code(result, session.settings)


def _context(args: argparse.Namespace, settings: RLMSettings) -> Context:
    if args.repo:
        return Context.from_repository(args.repo, settings)
    if args.document:
        return Context.from_document(args.document, settings)
    return Context.from_bundle_file(args.bundle, settings)


def _provider(args: argparse.Namespace, settings: RLMSettings) -> Provider:
    prices = PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file)
    if args.script:
        return ScriptedProvider.from_file(args.script, prices=prices)
    from rlmfamily.providers.select import build_provider

    return build_provider(settings, prices)


class _Progress:
    """The live line: turn, sub-calls, budget used, running children."""

    def __init__(self, max_turns: int, *, children: RunningChildren | None = None) -> None:
        self.children = children
        self.turn = 0
        self.max_turns = max_turns
        self.subcalls = 0
        self.budget: dict[str, Any] = {}
        self.state = "starting"

    def update(self, event: dict[str, Any]) -> None:
        self.turn = event.get("turn", self.turn)
        self.max_turns = event.get("max_turns", self.max_turns)
        self.subcalls = event.get("subcalls", self.subcalls)
        self.budget = event.get("budget", self.budget)
        kind = event.get("event", "")
        if kind in ("run_started", "run_resumed", "follow_up") and self.children is not None:
            self.children.watch(event["run_id"])
        self.state = {"turn_started": "model thinking", "step_started": "running code", "subcall": "sub-calls",
                      "step_finished": "model thinking", "run_finished": "done",
                      "gate_started": f"gate {event.get('gate')} (attempt {event.get('attempt')})",
                      "answer_withdrawn": "a gate failed: the answer was withdrawn"}.get(kind, self.state)
        if event.get("final"):
            self.state = "asking for the final answer"

    def render(self) -> Text:
        b = self.budget
        limits = b.get("limits", {})

        def of(used: Any, cap: Any, fmt: str = "{:,}") -> str:
            shown = fmt.format(used) if used is not None else "?"
            return shown + ("/" + fmt.format(cap) if cap is not None else "")

        line = Text()
        line.append(f"turn {self.turn}/{self.max_turns}", style="bold")
        line.append(f" · sub-calls {self.subcalls}")
        if b:
            line.append(f" · calls {of(b.get('calls'), limits.get('max_calls'))}")
            line.append(f" · tokens {of(b.get('tokens'), limits.get('max_tokens'))}")
            line.append(f" · ${of(b.get('usd'), limits.get('max_usd'), '{:.4f}')}")
            unknown = b.get("unknown_tokens") or 0
            if unknown:
                line.append(f" · {unknown} unknown", style="yellow")
        family = self.children.line() if self.children is not None else ""
        if family:
            line.append(f" · {family}", style="blue")
        line.append(f" · {self.state}", style="dim")
        return line


def _print_result(result: RunResult, out: Console, err: Console, *, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(result.to_dict(), default=str))
        return
    b = result.budget
    err.print(
        f"run {result.run_id}: {result.stop_reason} after {result.turns} turns, {result.subcalls} sub-calls"
        + (f" ({result.subcalls_cached} cached)" if result.subcalls_cached else "") + ", "
        f"{b.calls} calls, {b.tokens:,} tokens"
        + (f" (+{b.unknown_tokens} calls with unknown usage, counted at {b.unknown_tokens_estimate:,} estimated"
           " tokens; `rlm usage` lists them)" if b.unknown_tokens else "")
        + f", ${b.usd:.4f}" + (f" (+{b.unknown_usd} calls of unknown cost)" if b.unknown_usd else "")
        + f"; trajectory: rlm show {result.run_id}",
        markup=False, highlight=False,
    )
    if result.error:
        err.print(f"error: {result.error}", markup=False, highlight=False)
    if "gates" in result.extra or result.extra.get("blocked_by"):
        for line in verdict_lines(result.verdict, result.extra):
            err.print(line, markup=False, highlight=False)
    from rlmfamily.a2a.cli import print_evidence

    print_evidence(result.extra, err)
    if result.answer is None:
        err.print("no answer", markup=False)
    else:
        out.print(result.answer, markup=False, highlight=False)


def verdict_lines(verdict: str, record: dict[str, Any]) -> list[str]:
    """The verdict, why, what blocked acceptance and the gates of the last attempt (rlm run, rlm show)."""
    lines = [verdict_text(verdict, record.get("verdict_reason"))]
    lines += [f"  blocked by: {blocker}" for blocker in record.get("blocked_by") or []]
    runs = record.get("gates") or []
    last = max((r.get("attempt") or 0 for r in runs), default=0)
    for run in (r for r in runs if r.get("attempt") == last):
        lines.append(f"  gate {run.get('name')}: {outcome_text(run)}")
    return lines


# ---------- show ----------


def _show(args: argparse.Namespace, out: Console, err: Console) -> int:
    settings = _settings(args)
    path = find_run(settings.runs_dir, args.run)
    if args.html:
        from rlmfamily.show_html import write_page

        write_page(path, args.output, max_text_chars=settings.html_max_text_chars, out=out, err=err)
        return EXIT_OK
    if args.output:
        raise SettingsInvalid("-o/--output goes with --html: rlm show --html RUN -o page.html")
    events = read_trajectory(path)
    if args.json:
        out.print_json(json.dumps(events, default=str))
        return EXIT_OK
    for event in events:
        _show_event(event, out)
    if not any(e["event"] == "run_finished" for e in last_question(events)):
        _show_unfinished(events, path.parent.name, out)
    return EXIT_OK


def _show_unfinished(events: list[dict[str, Any]], run_id: str, out: Console) -> None:
    """A trajectory without run_finished: the run is still going, or its process ended without finishing."""
    out.print(f"\n── {unfinished_text(events, run_id)}", style="bold red", markup=False, highlight=False)


def _show_event(e: dict[str, Any], out: Console) -> None:
    kind = e["event"]
    p = lambda text, style=None: out.print(text, style=style, markup=False, highlight=False)  # noqa: E731
    if kind == "run_started":
        corpus = e.get("corpus", {})
        p(f"run {e['run_id']}  kernel {e.get('kernel')}  provider {e.get('provider')}  model {e.get('model')}", "bold")
        p(f"question: {e.get('question')}")
        p(f"corpus: {corpus.get('source')} {corpus.get('root')}: {corpus.get('files', 0):,} files, "
          f"{corpus.get('bytes', 0):,} bytes")
    elif kind == "turn":
        p(f"\n── turn {e['turn']} " + "─" * 40, "bold cyan")
        if e.get("text"):
            p(e["text"], "italic")
        names = [c.get("name") for c in e.get("calls") or []]
        for index, code in enumerate(e.get("code") or []):
            tool = names[index] if index < len(names) else "python"
            p(("" if tool in ("python", None) else f"{tool}$ ") + code.rstrip(), "green")
    elif kind == "step":
        observation = e.get("observation", "")
        if e.get("full_chars") == 0:  # the model's hint is for the model
            observation = observation.replace(NO_OUTPUT_HINT, NO_OUTPUT)
        p(observation, None if e.get("ok") else "red")
    elif kind == "job":
        p(e.get("receipt") or f"[job {e.get('job_id')} {e.get('state')}]", "blue")
    elif kind == "job_released":
        p(f"[job {e.get('job_id')} released by the model: {e.get('reason')}]", "yellow")
    elif kind == "tool_step":
        if not e.get("job_id"):  # a refused call: its job event never came
            p(e.get("observation", ""), "red")
    elif kind == "subcall":
        status = "ok" if e.get("ok") else f"error {e.get('error_code')}"
        tokens = (e.get("usage") or {}).get("total_tokens")
        cost = "cached, 0 tokens" if e.get("cached") else (f"{tokens} tokens" if tokens is not None else "usage unknown")
        on = f" on {', '.join(e['sources'])}" if e.get("sources") else ""  # the chunks it answered (path:lines)
        p(f"  · sub-call {e.get('seq')} [{status}, {cost}]{on}: "
          f"{_one_line(e.get('prompt', ''), 70)} → {_one_line(e.get('response', ''), 90)}", "magenta")
    elif kind == "run_resumed":
        p(f"\n── resumed after turn {e.get('turn')} (pid {e.get('pid')}; the process before, pid {e.get('after_pid')}, "
          f"ended without finishing): {describe_resume(e)}", "bold yellow")
    elif kind == "follow_up":
        p(f"\n══ follow-up {e.get('number')}: {e.get('question')}", "bold")
        p(f"   after turn {e.get('turn')}; {describe_resume(e)}"
          + (f"; the conversation before ({e['compacted']['messages']} messages, {e['compacted']['chars']:,} "
             "characters) was compacted into a summary for the model, the record kept whole"
             if e.get("compacted") else ""), "bold yellow")
    elif kind == "tool_call":
        status = "ok" if e.get("ok") else f"failed: {e.get('error')}"
        p(f"  · tool {e.get('name')}({_one_line(e.get('arguments', ''), 70)}) [{status}]", "magenta")
    elif kind == "final_request":
        p(f"\n[asked for a final answer: {e.get('why')}]", "yellow")
    elif kind == "protocol_fallback":
        p(f"  the endpoint refused the python tool ({e.get('reason')}); went on with ```python blocks in text", "yellow")
    elif kind == "final_reply_rejected":
        p(f"[not an answer: {e.get('reason')}]", "yellow")
    elif kind == "gate":
        p(f"  gate {e.get('name')} (attempt {e.get('attempt')}): {outcome_text(e)}", "green" if e.get("passed") else "red")
        if e.get("excerpt"):
            p(e["excerpt"], "red")
    elif kind == "answer_withdrawn":
        p(f"[answer withdrawn: {', '.join(e.get('failed') or [])} failed; the model was told and went on]", "yellow")
    elif kind == "acceptance_blocked":
        p("[the answer cannot be accepted: " + "; ".join(e.get("blocked_by") or []) + "]", "yellow")
    elif kind == "budget_refused":
        p(f"[budget refused turn {e.get('turn')}: {e.get('message')}]", "yellow")
    elif kind in ("child_started", "child_finished", "children_wait"):
        from rlmfamily.family.cli import show_event

        show_event(e, p)
    elif kind == "run_finished":
        budget = e.get("budget", {})
        own = e.get("usage") or budget  # a trajectory from before "usage" has the allowance's totals only
        family = f"; family total {usage_text(budget)}" if own.get("calls") != budget.get("calls") else ""
        cached = f" ({e['subcalls_cached']} cached)" if e.get("subcalls_cached") else ""
        p(f"\n── {e.get('stop_reason')} after {e.get('turns')} turns, {e.get('subcalls')} sub-calls{cached}, "
          f"{usage_text(own)}{family}", "bold")
        if e.get("verdict"):
            for line in verdict_lines(e["verdict"], e):
                p(line, "bold green" if e["verdict"] == "accepted" else "bold red")
        seen = e.get("observations") or {}
        if seen.get("chars_produced"):
            p(f"observations ({seen.get('strategy')}): {seen.get('chars_shown', 0):,} characters shown of "
              f"{seen['chars_produced']:,} produced")
        if e.get("error"):
            p(f"error: {e['error']}", "red")
        from rlmfamily.a2a.cli import evidence_line

        for delegation in e.get("delegations") or []:
            p(evidence_line(delegation), "yellow")
        p(e.get("answer") if e.get("answer") is not None else "(no answer)")


def _one_line(text: str, width: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# ---------- usage ----------


def _usage(args: argparse.Namespace, out: Console) -> int:
    settings = _settings(args)
    ledger = BudgetLedger(settings.budget_path)
    if args.reconcile is not None:
        if args.tokens is None or not args.reason:
            raise SettingsInvalid("--reconcile needs --tokens N and --reason TEXT (and --usd X under a USD limit)")
        entry = ledger.reconcile(args.reconcile, tokens=args.tokens, usd=args.usd, reason=args.reason)
        if args.json:
            out.print_json(json.dumps(entry.to_dict()))
        else:
            out.print(f"entry {entry.id} of {entry.root_id} reconciled: {entry.tokens:,} tokens, "
                      f"USD {entry.cost_usd if entry.cost_usd is not None else 'unknown'}; reason: {entry.reason}",
                      markup=False, highlight=False)
        return EXIT_OK
    root = _usage_root(settings, ledger, args.run) if args.run else None
    roots = [root] if root else ledger.roots()
    summaries = [_root_summary(settings, ledger, r) for r in roots]
    totals = _usage_totals(summaries)
    unresolved = [e.to_dict() for r in roots for e in ledger.entries(r, unresolved_only=True)]
    entries = [e.to_dict() for e in ledger.entries(root)] if root else []
    if args.json:
        out.print_json(json.dumps({"roots": summaries, "totals": totals, "unresolved": unresolved,
                                   "entries": entries}))
        return EXIT_OK
    print_table(out, _usage_table(settings, summaries, totals), ids=("run",))
    for run_id, hits in (summaries[0]["cached"]["by_run"].items() if root else ()):
        out.print(f"  cached: {hits['hits']} sub-call(s) of {run_id} answered from the memo "
                  f"({hits['tokens_saved']:,} tokens not spent)", markup=False, highlight=False)
    for e in entries:
        out.print(f"  entry {e['id']}: {e['purpose']} {e['state']} tokens {e['tokens']} USD {e['cost_usd']}"
                  + (f" ({e['note']})" if e["note"] else ""), markup=False, highlight=False)
    if unresolved:
        out.print("\nunknown usage (reconcile with: rlm usage --reconcile ENTRY --tokens N [--usd X] --reason TEXT):",
                  style="yellow")
        for e in unresolved:
            out.print(f"  entry {e['id']} of {e['root_id']}: {e['purpose']} {e['state']}, tokens {e['tokens']}, "
                      f"USD {e['cost_usd']} - {e['note'] or ''}", markup=False, highlight=False)
    return EXIT_OK


def _usage_root(settings: RLMSettings, ledger: BudgetLedger, run: str) -> str:
    """The allowance ``--run`` names: a root id, or a run found as ``rlm show`` finds it (a child's is its root's)."""
    if run in ledger.roots():
        return run
    from rlmfamily.family.store import family_root

    return family_root(settings.family_path, find_run(settings.runs_dir, run).parent.name)


def _root_summary(settings: RLMSettings, ledger: BudgetLedger, root_id: str) -> dict[str, Any]:
    """A family's allowance, what its memo answered without a call (``cached``), and the limits it went past."""
    summary = ledger.snapshot(root_id).to_dict()
    summary["cached"] = memo_usage(settings.memo_path, root_id).to_dict()
    summary["overshoot"] = ledger.overshoot(root_id)
    return summary


def _usage_totals(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    total = lambda key: sum(s[key] for s in summaries)  # noqa: E731
    return {"runs": len(summaries), "calls": total("calls"), "tokens": total("tokens"), "usd": total("usd"),
            "unknown_tokens": total("unknown_tokens"), "cached": sum(s["cached"]["hits"] for s in summaries),
            "cached_tokens_saved": sum(s["cached"]["tokens_saved"] for s in summaries)}


def _usage_table(settings: RLMSettings, summaries: list[dict[str, Any]], totals: dict[str, Any]) -> Table:
    table = Table(title=f"inference budgets ({settings.budget_path})", title_justify="left")
    table.add_column("run", no_wrap=True)
    for column in ("calls", "tokens", "USD", "unknown", "cached"):
        table.add_column(column, justify="right", no_wrap=column != "tokens")
    table.add_column("limits (calls/tokens/USD)")
    for s in summaries:
        limits, over, cached = s["limits"], s["overshoot"], s["cached"]["hits"]
        unknown = s["unknown_tokens"] + (s["unknown_usd"] if limits["max_usd"] is not None else 0)
        table.add_row(
            s["root_id"], f"{s['calls']:,}", _past("{:,}", s["tokens"], over.get("tokens")),
            _past("{:.4f}", s["usd"], over.get("usd")), str(unknown) if unknown else "-", str(cached) if cached else "-",
            "/".join("-" if limits[k] is None else f"{limits[k]:,}" for k in ("max_calls", "max_tokens", "max_usd")),
        )
    if len(summaries) > 1:
        table.add_row("total", f"{totals['calls']:,}", f"{totals['tokens']:,}", f"{totals['usd']:.4f}",
                      str(totals["unknown_tokens"] or "-"), str(totals["cached"] or "-"), "", style="bold")
    return table


def _past(fmt: str, used: float, over: dict[str, Any] | None) -> str:
    """A used amount, and how far past its limit it went (only the final answer is admitted past one)."""
    if over is None:
        return fmt.format(used)
    cause = " by the final answer" if over["by_final_answer"] else ""
    return (f"{fmt.format(used)} / {fmt.format(over['limit'])} "
            f"(+{fmt.format(over['over'])} past the limit{cause})")


if __name__ == "__main__":
    sys.exit(main())
