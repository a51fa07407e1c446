"""``rlm resume RUN``: continue an interrupted root run from its records, or refuse with a stable code.

What comes back from where (the records are all under the data dir):

- the conversation, from the trajectory: ``run_started`` gives the system prompt
  and the first message, each ``turn`` the model's text and calls (with their
  ids), each ``step`` the observation the model was shown; calls that ran no
  step get the same fixed result as before. The next root call sends what the
  run would have sent;
- the namespace: Monty's from the checkpoint of the last step the trajectory
  records (one is written after every step, in the background: a crash may leave
  the newest one step behind, and that step then runs again from the one before,
  answered from the journal and required to print what it printed; or one step
  ahead, and that checkpoint is dropped: docs/RLM_DESIGN.md); the host kernel's
  by running the recorded steps again in a fresh
  process, each host call answered from the journal (rlmfamily/journal.py) and
  each step required to print what it printed;
- the step the crash cut off (a python call with no observation) runs again from
  that namespace; its host calls up to the crash are answered from the journal,
  so a sub-call that was answered is neither asked nor paid for again;
- the budget: the same allowance (the root id); the earlier processes' entries
  count as the run's own usage. A call that was in flight at the crash is
  ``unknown`` (the process ended while it was in flight), as ``rlm usage`` shows;
- turns, sub-calls and the time the run was alive (against ``max_run_s``);
- the family: ``Family.recover()`` settles each child (a running one whose
  identity is proven is ``reattached``, an ended one's result is ``recovered``,
  a dead one is ``interrupted``), and their handles in the namespace work again.

The run keeps its id and appends to its trajectory, after a ``run_resumed`` event.
Refusals (``rlmfamily.errors``): ``run_running`` (its process still holds the
trajectory's lock), ``run_finished``, ``resume_unsupported`` (a child run, a
namespace that cannot be rebuilt faithfully, a checkpoint that cannot be
loaded), ``resume_inconsistent`` (trajectory, journal, checkpoints or corpus
disagree). A refusal appends nothing: the run stays as it was.
"""

from __future__ import annotations

import argparse
from typing import Any

from rlmfamily.context import Context
from rlmfamily.errors import (
    ResumeEndpointChanged,
    ResumeNeedsReconcile,
    ResumeUnsupported,
    SettingsInvalid,
)
from rlmfamily.providers.base import PriceTable, Provider
from rlmfamily.resumption import ResumePoint
from rlmfamily.run_records import check_resumable, plan
from rlmfamily.session import Session, endpoint_of
from rlmfamily.settings import RLMSettings, load_settings
from rlmfamily.trajectory import find_run, read_trajectory

# check_resumable and plan live in rlmfamily/run_records.py; they are named here too, where resume's callers look.
__all__ = ["add_parser", "check_resumable", "plan", "prepare", "prepare_ask"]

Event = dict[str, Any]
# What run_started records of the limits; a resumed run runs under the same ones (the budget insists).
RECORDED_LIMITS = ("max_turns", "max_calls", "max_tokens", "max_usd", "max_subcalls", "max_observation_chars")
# What run_started records of the model endpoint (session.endpoint_of); a resume talks to it unless told otherwise.
ENDPOINT_FIELDS = ("provider", "base_url", "api_key_env")


# ---------- the command ----------


def add_parser(sub: Any) -> None:
    """``rlm resume RUN`` and ``rlm ask RUN QUESTION``: both continue a root run from its records."""
    resume = sub.add_parser("resume", help="continue an interrupted root run from its checkpoint and records")
    resume.add_argument("run", help="run id, unique prefix, 'last', or a trajectory file")
    _run_flags(resume)
    ask = sub.add_parser("ask", help="a follow-up question to a finished root run: the same conversation and "
                         "namespace, the family's budget (a child's: rlm follow-up)")
    ask.add_argument("run", help="run id, unique prefix, 'last', or a trajectory file")
    ask.add_argument("question")
    _run_flags(ask)


def _run_flags(resume: argparse.ArgumentParser) -> None:
    source = resume.add_mutually_exclusive_group()
    source.add_argument("--repo", help="the run's repository, if it moved (default: where it was)")
    source.add_argument("--document", help="the run's document, if it moved (default: where it was)")
    source.add_argument("--bundle", help="the run's evidence bundle (needed: a bundle's file is not recorded)")
    resume.add_argument("--script", help="the scripted conversation the run was started with")
    resume.add_argument("--provider", choices=["openai", "anthropic", "gemini"], default=argparse.SUPPRESS,
                        help="the model API (default: the run's)")
    resume.add_argument("--base-url", default=argparse.SUPPRESS, help="the endpoint (RLM_BASE_URL)")
    resume.add_argument("--model", default=argparse.SUPPRESS, help="model id (default: the run's)")
    resume.add_argument("--api-key-env", default=argparse.SUPPRESS, help="NAME of the key's environment variable")
    resume.add_argument("--switch-endpoint", action="store_true",
                        help="resume against the endpoint given now (--provider, --base-url, --api-key-env or RLM_*), "
                             "not the one the run started with; the conversation so far is sent there")
    resume.add_argument("--json", action="store_true", help="print the result as JSON")
    resume.add_argument("--quiet", action="store_true", help="no live progress display")


def prepare_ask(args: argparse.Namespace) -> Session:
    """The session ``rlm ask`` asks its follow-up with (``Session.follow_up``): the run's settings, corpus and
    endpoint, as ``rlm resume`` finds them."""
    base = load_settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    path = find_run(base.runs_dir, args.run)
    events = read_trajectory(path)
    started = check_resumable(base, path, events, finished=True)
    _refuse_custom_tools(started, f"session.follow_up({args.question!r})")
    _check_budget(base, started["run_id"], "ask")
    settings = _settings(args, started)
    provider = _provider(args, started, settings)
    skip = getattr(provider, "skip_root_turns", None)
    if skip is not None:  # a script replays from its first turn; the run has had this many of them
        skip(max((int(e.get("turn") or 0) for e in events if e["event"] == "turn"), default=0))
    return Session(context=_context(args, started, settings), provider=provider, settings=settings,
                   run_id=started["run_id"], model=None if args.script else settings.model)


def _refuse_custom_tools(started: Event, call: str) -> None:
    """A run given custom tools (rlmfamily/tools.py) goes on only where its Python functions are: the caller's code."""
    names = started.get("custom_tools")
    if names:
        raise ResumeUnsupported(
            f"run {started['run_id']} was given custom tools ({', '.join(names)}), Python functions that the rlm "
            f"command cannot rebuild: continue it from Python with the same tools, Session(..., "
            f"run_id={started['run_id']!r}, tools=[...]) and {call} (docs/RLM.md, \"Custom tools\")")


def prepare(args: argparse.Namespace) -> tuple[Session, ResumePoint]:
    """The session and the point ``rlm resume`` goes on from (the command shows its progress: cli.py)."""
    base = load_settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    path = find_run(base.runs_dir, args.run)
    events = read_trajectory(path)
    started = check_resumable(base, path, events)
    _refuse_custom_tools(started, "session.resume(plan(settings, path, events, context))")
    _check_budget(base, started["run_id"])
    settings = _settings(args, started)
    context = _context(args, started, settings)
    provider = _provider(args, started, settings)
    point = plan(settings, path, events, context)
    now = endpoint_of(provider)
    if args.switch_endpoint and now != started.get("endpoint"):
        point.record["endpoint_changed"] = {"from": started.get("endpoint"), "to": now}
    skip = getattr(provider, "skip_root_turns", None)
    if skip is not None:  # a script replays from its first turn; the run has had point.turns of them
        skip(point.turns)
    session = Session(context=context, provider=provider, settings=settings, run_id=point.run_id,
                      model=None if args.script else settings.model)
    return session, point


def _settings(args: argparse.Namespace, started: Event) -> RLMSettings:
    """The run's own kernel, profile and limits, the provider flags given now; the run's model unless one is named."""
    overrides: dict[str, Any] = {"kernel": started["kernel"], "protocol": started.get("protocol") or "tools"}
    for name in ("profile", "observation_strategy"):  # recorded since the python-bash profile came
        if started.get(name):
            overrides[name] = started[name]
    if started.get("profile") == "python-bash":
        overrides["bash_tool"] = "bash" in (started.get("tools") or ())
    overrides.update({k: v for k, v in (started.get("limits") or {}).items() if k in RECORDED_LIMITS})
    if started.get("gates"):  # the run's completion gates, as it started with them (from RLM_GATES or --gate)
        overrides["gates"] = started["gates"]
    if hasattr(args, "model"):
        overrides["model"] = args.model
    overrides.update(_endpoint(args, started))
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    settings = load_settings(**overrides)
    if settings.model is None and started.get("model") and not args.script:
        settings = load_settings(**overrides, model=started["model"])
    return settings


def _endpoint(args: argparse.Namespace, started: Event) -> dict[str, Any]:
    """The endpoint settings of the resumed run: the ones it started with, so its conversation goes nowhere else.

    Another endpoint (a flag that differs, or a run recorded without its endpoint) is refused unless
    ``--switch-endpoint`` says so; then the flags and RLM_* variables given now choose it, and run_resumed records
    the switch. RLM_BASE_URL and the like never redirect a resume on their own: the recorded values override them.
    """
    given = {name: getattr(args, name) for name in ENDPOINT_FIELDS if hasattr(args, name)}
    if args.switch_endpoint or args.script:
        return given
    recorded = started.get("endpoint")
    run_id = started["run_id"]
    if recorded is None:
        if started.get("provider") == "scripted":
            return given
        raise ResumeEndpointChanged(
            f"run {run_id} was recorded without its model endpoint (an older rlmfamily): give the endpoint it used "
            "with --base-url and --api-key-env, and --switch-endpoint to confirm the conversation may go there")
    differs = {name: value for name, value in given.items() if value != recorded.get(name)}
    if differs:
        told = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in differs.items())
        raise ResumeEndpointChanged(
            f"run {run_id} started against {recorded['provider']} at {recorded['base_url']} (key in "
            f"{recorded.get('api_key_env')}); {told} is another endpoint, and the conversation so far would be sent "
            "there. Drop the flag to resume against the run's own endpoint, or add --switch-endpoint to send it there",
            recorded=recorded)
    return {name: recorded.get(name) for name in ENDPOINT_FIELDS if recorded.get(name) is not None}


def _check_budget(settings: RLMSettings, run_id: str, command: str = "resume") -> None:
    """Refuse a resume (or ``rlm ask``: ``command="ask"``) that could only ask for the final answer: the family's
    unknown usage (a call in flight at a kill) blocks its token or USD limit until reconciled, so say which entries
    and the command, before anything runs."""
    if not settings.budget_path.is_file():
        return
    from rlmfamily.budget import BudgetLedger

    blocking = BudgetLedger(settings.budget_path).blocking(run_id)
    if not blocking:
        return
    ids = ", ".join(str(e.id) for e in blocking)
    first = blocking[0].id
    raise ResumeNeedsReconcile(
        f"run {run_id}'s family has {len(blocking)} call(s) whose usage nobody knows (entries {ids}; a call in flight "
        "when the run was killed is one), and its token or USD limit cannot admit another call until they are "
        f"reconciled: {'resumed' if command == 'resume' else 'asked'} now, the run would go straight to a forced "
        "final answer. Check the provider's "
        f"console, record each with `rlm usage --reconcile {first} --tokens N --usd X --reason \"...\"`, then "
        f"`rlm {command} {run_id}{' QUESTION' if command == 'ask' else ''}` again", entries=[e.id for e in blocking])


def _context(args: argparse.Namespace, started: Event, settings: RLMSettings) -> Context:
    corpus = started.get("corpus") or {}
    if args.repo or (not args.document and not args.bundle and corpus.get("source") == "repository"):
        return Context.from_repository(args.repo or corpus["root"], settings)
    if args.document or (not args.bundle and corpus.get("source") == "document"):
        return Context.from_document(args.document or corpus["root"], settings)
    if not args.bundle:
        raise SettingsInvalid(f"run {started['run_id']} read an evidence bundle, whose file is not recorded: "
                              "give it again with --bundle FILE")
    return Context.from_bundle_file(args.bundle, settings)


def _provider(args: argparse.Namespace, started: Event, settings: RLMSettings) -> Provider:
    prices = PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file)
    if args.script:
        from rlmfamily.providers.scripted import ScriptedProvider

        return ScriptedProvider.from_file(args.script, prices=prices)
    if started.get("provider") == "scripted":
        raise SettingsInvalid(f"run {started['run_id']} was answered by a scripted provider: "
                              "give its script again with --script FILE")
    from rlmfamily.providers.select import build_provider

    return build_provider(settings, prices)
