"""The family commands of ``rlm``: ``inbox``, ``message``, ``follow-up`` and ``children``.

``RUN`` is a root run id (a unique prefix, or ``last`` for the newest family).
Each command first settles what the family's children became (``recover``: a
child whose process is gone without a result is marked interrupted, a live one
is reattached), so the tables show the truth after a crash or restart.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from rlmfamily.errors import MAX_LISTED_NAMES, SettingsInvalid
from rlmfamily.family.children import Family, summary
from rlmfamily.family.errors import ChildNotFound, FamilyNotFound
from rlmfamily.family.inbox import Inbox, family_messages
from rlmfamily.family.store import FamilyStore
from rlmfamily.output import print_table
from rlmfamily.settings import RLMSettings

COMMANDS = ("inbox", "message", "follow-up", "children")
EXIT_OK, EXIT_NO_ANSWER = 0, 1
PREVIEW_CHARS = 100


def add_parsers(sub: Any) -> None:
    inbox = sub.add_parser("inbox", help="a family agent's messages (reading does not consume them)")
    inbox.add_argument("run", help="root run id, unique prefix, or 'last'")
    inbox.add_argument("--agent", help="whose inbox (default: the root); an agent id or a child suffix such as c1")
    inbox.add_argument("--all", action="store_true", help="include acknowledged messages")
    inbox.add_argument("--family", action="store_true", help="every message of the family, whoever sent or got it")
    inbox.add_argument("--limit", type=int, default=50, help="messages shown (at most RLM_MAX_INBOX_READ per agent)")
    inbox.add_argument("--json", action="store_true")

    message = sub.add_parser("message", help="send a family message (costs no inference, wakes no model)")
    message.add_argument("run", help="root run id, unique prefix, or 'last'")
    message.add_argument("text")
    message.add_argument("--to", required=True, help="recipient agent id (or a child suffix such as c1)")
    message.add_argument("--from", dest="sender", help="sending agent (default: the root)")
    message.add_argument("--delivery-id", help="makes the send idempotent: the same id again delivers nothing new")
    message.add_argument("--json", action="store_true")

    follow = sub.add_parser("follow-up", help="new work for a completed child, continuing its conversation "
                            "(a finished root's follow-up question: rlm ask)")
    follow.add_argument("run", help="root run id, unique prefix, or 'last'")
    follow.add_argument("child", help="the child's agent id or run id (or a suffix such as c1)")
    follow.add_argument("prompt")
    follow.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the answer (default 600)")
    follow.add_argument("--detach", action="store_true", help="start it and return; `rlm children RUN` shows it")
    follow.add_argument("--json", action="store_true")

    children = sub.add_parser("children", help="a family's child runs, after settling what each became")
    children.add_argument("run", help="root run id, unique prefix, or 'last'")
    children.add_argument("--cancel", metavar="CHILD", help="stop a child run's process tree (run id or suffix)")
    children.add_argument("--json", action="store_true")


def resolve_root(store: FamilyStore, settings: RLMSettings, run: str) -> str:
    with store.reading() as conn:
        if run in ("last", "latest"):
            row = conn.execute("SELECT root_id FROM families ORDER BY created_at DESC LIMIT 1").fetchone()
            if row is None:
                raise FamilyNotFound(f"no runs in {settings.family_path} yet (data dir: RLM_DATA_DIR / --data-dir)")
            return str(row["root_id"])
        exact = conn.execute("SELECT root_id FROM families WHERE root_id = ?", (run,)).fetchone()
        if exact is not None:
            return str(exact["root_id"])
        rows = conn.execute("SELECT root_id FROM families WHERE substr(root_id, 1, ?) = ?", (len(run), run)).fetchall()
    if len(rows) == 1:
        return str(rows[0]["root_id"])
    if not rows:
        raise FamilyNotFound(f"no run {run!r} in {settings.family_path} (data dir: RLM_DATA_DIR / --data-dir)")
    raise FamilyNotFound(f"{run!r} matches {len(rows)} runs: {', '.join(r['root_id'] for r in rows[:MAX_LISTED_NAMES])}")


def _agent_id(store: FamilyStore, root_id: str, name: str | None) -> str:
    if name is None or name == "root":
        return root_id
    for candidate in (name, f"{root_id}.{name}"):
        agent = store.agent(candidate)
        if agent is not None and agent.root_id == root_id:
            return candidate
    raise ChildNotFound(f"no agent {name!r} in family {root_id}; `rlm children {root_id}` lists them")


def main(args: argparse.Namespace, settings: RLMSettings, out: Console, err: Console) -> int:
    store = FamilyStore(settings.family_path)
    root_id = resolve_root(store, settings, args.run)
    family = Family(settings, root_id, store=store)
    report = family.recover()
    if args.command == "inbox":
        return _inbox(args, settings, store, root_id, out)
    if args.command == "message":
        return _message(args, settings, store, root_id, out)
    if args.command == "follow-up":
        return _follow_up(args, family, store, root_id, out, err)
    return _children(args, family, report, out)


def _print_json(out: Console, data: Any) -> None:
    out.print_json(json.dumps(data, default=str))


def _inbox(args: argparse.Namespace, settings: RLMSettings, store: FamilyStore, root_id: str, out: Console) -> int:
    agent_id = _agent_id(store, root_id, args.agent)
    if args.family:
        messages = family_messages(store, root_id, limit=args.limit)
    else:
        messages = Inbox(store, settings, root_id, agent_id).read(args.limit, include_acked=args.all)
    if args.json:
        _print_json(out, {"root": root_id, "agent": None if args.family else agent_id, "messages": messages})
        return EXIT_OK
    title = f"messages of family {root_id}" if args.family else f"inbox of {short(root_id, agent_id)} in {root_id}"
    table = Table(title=title + ("" if args.all or args.family else " (unacknowledged)"), title_justify="left")
    for column in ("id", "from", "to", "acked", "text"):
        table.add_column(column, no_wrap=column != "text")
    for m in messages:
        table.add_row(str(m["id"]), short(root_id, m["from"]), short(root_id, m["to"]), "yes" if m["acked"] else "no",
                      _preview(m["text"]))
    print_table(out, table, ids=("id", "from", "to"))
    if not messages:
        out.print("(no messages)")
    return EXIT_OK


def _message(args: argparse.Namespace, settings: RLMSettings, store: FamilyStore, root_id: str, out: Console) -> int:
    sender = _agent_id(store, root_id, args.sender)
    to = _agent_id(store, root_id, args.to)
    sent = Inbox(store, settings, root_id, sender).send(to, args.text, args.delivery_id)
    if args.json:
        _print_json(out, {"from": sender, **sent})
        return EXIT_OK
    what = "already delivered as" if sent["duplicate"] else "delivered as"
    out.print(f"{what} message {sent['id']} from {sender} to {sent['to']} (delivery id {sent['delivery_id']})",
              markup=False, highlight=False)
    return EXIT_OK


def _follow_up(args: argparse.Namespace, family: Family, store: FamilyStore, root_id: str, out: Console,
               err: Console) -> int:
    if args.timeout <= 0:
        raise SettingsInvalid("--timeout must be a positive number of seconds")
    child = args.child if store.run(args.child) is not None else _agent_id(store, root_id, args.child)
    run = family.follow_up(None, child, args.prompt)
    if not args.detach:
        err.print(f"follow-up {run.run_id} started; waiting up to {args.timeout:g} s (the wait does not cancel it)",
                  markup=False, highlight=False)
        run = family.wait(None, run.run_id, args.timeout)
    data = summary(run)
    if args.json:
        _print_json(out, data)
    else:
        _runs_table(out, root_id, f"follow-up of {run.agent_id}", [data])
        if run.answer is not None:
            out.print(run.answer, markup=False, highlight=False)
    if args.detach:
        return EXIT_OK
    return EXIT_OK if run.state == "completed" and run.answer is not None else EXIT_NO_ANSWER


def _children(args: argparse.Namespace, family: Family, report: list[dict[str, Any]], out: Console) -> int:
    outcome = {r["run_id"]: r["outcome"] for r in report}
    if args.cancel:
        run_id = args.cancel if family.store.run(args.cancel) is not None else f"{family.root_id}.{args.cancel}"
        family.cancel(None, run_id, note="cancelled from the command line")
    rows = [{**summary(r), "outcome": outcome.get(r.run_id)} for r in family.children(None)]
    if args.json:
        _print_json(out, {"root": family.root_id, "children": rows})
        return EXIT_OK
    _runs_table(out, family.root_id, f"children of {family.root_id}", rows)
    return EXIT_OK


def _runs_table(out: Console, root_id: str, title: str, rows: list[dict[str, Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for column in ("run", "kind", "state", "stop", "outcome", "answer or error"):
        table.add_column(column, no_wrap=column != "answer or error")
    for r in rows:
        detail = r["answer"] if r["answer"] is not None else (r["error"] or r["note"] or "")
        table.add_row(short(root_id, r["id"]), r["kind"], r["state"], r["stop_reason"] or "-", r.get("outcome") or "-",
                      _preview(detail))
    print_table(out, table, ids=("run",))
    if not rows:
        out.print("(no children)")


def show_event(e: dict[str, Any], p: Callable[..., None]) -> None:
    """How ``rlm show`` prints the family's trajectory events."""
    if e["event"] == "child_started":
        p(f"  + child {e.get('run')} ({e.get('kind')}): {_preview(e.get('prompt', ''))}", "blue")
    elif e["event"] == "children_wait":
        p(f"[waiting for {len(e.get('runs') or [])} active children before the run ends]", "yellow")
    else:
        detail = e.get("answer") if e.get("answer") is not None else (e.get("error") or e.get("note") or "")
        p(f"  = child {e.get('id')} {e.get('state')}: {_preview(detail)}", "blue")


def short(root_id: str, agent_id: str) -> str:
    """``root`` for the root, ``c1.c2`` for its descendants (the commands accept both forms)."""
    if agent_id == root_id:
        return "root"
    return agent_id[len(root_id) + 1:] if agent_id.startswith(root_id + ".") else agent_id


def _preview(text: str) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"
