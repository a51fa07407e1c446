"""``rlm peers``, ``rlm delegations [RUN]`` and ``rlm reconcile DELEGATION``: tables, or JSON with ``--json``.

``peers`` shows each configured peer and whether its route is open (and why
not), with its key variable marked set or missing, never its value. A route
that is open by the settings is then checked against the peer's card, read
the way ``a2a.start`` reads it (``Delegations.card_problem``): a card that
moves the origin, lacks the skill or charges more than the peers file's
``tariff_credits`` closes it, with the reason.
``delegations`` lists delegations by root run, each with its credits (held;
charged, once the peer reported it; or held with the charge unknown) and each
root's allowance with what its family has drawn. ``reconcile`` resolves an
``unknown`` delegation: ``--remote-task-id ID`` after the peer confirms the
task (GetTask on the pinned interface; its history must hold our message id
when it has one), or ``--failed``; ``--reason`` is required and kept.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlmfamily.a2a.charge import credits_text
from rlmfamily.a2a.delegations import Delegations, reconcile
from rlmfamily.a2a.errors import A2AError
from rlmfamily.a2a.peers import load_peers
from rlmfamily.a2a.store import Delegation, DelegationStore
from rlmfamily.errors import MAX_LISTED_NAMES, RunNotFound, SettingsInvalid
from rlmfamily.output import print_table
from rlmfamily.settings import RLMSettings

COMMANDS = ("peers", "delegations", "reconcile")
EXIT_OK = 0
NOTE_COLUMN_CHARS = 60  # of a delegation's task shown in the note column of `rlm delegations`


def add_parsers(sub: Any) -> None:
    peers = sub.add_parser("peers", help="the configured A2A peers and whether each route is open")
    peers.add_argument("--peers-file", dest="a2a_peers_file", default=argparse.SUPPRESS,
                       help="the peers file, TOML or JSON (RLM_A2A_PEERS_FILE)")
    peers.add_argument("--json", action="store_true")

    delegations = sub.add_parser("delegations", help="A2A delegations: peer, state, remote task, credits")
    delegations.add_argument("run", nargs="?", help="a root run id or unique prefix (default: every run)")
    delegations.add_argument("--json", action="store_true")

    rec = sub.add_parser("reconcile", help="resolve an unknown A2A delegation with an audit reason")
    rec.add_argument("delegation", help="the delegation id (dlg_...)")
    outcome = rec.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--remote-task-id", help="the task id the peer confirms it created for this delegation")
    outcome.add_argument("--failed", action="store_true", help="the peer has no such task: mark it failed")
    rec.add_argument("--reason", required=True, help="who checked what, where")
    rec.add_argument("--json", action="store_true")


def main(args: argparse.Namespace, settings: RLMSettings, out: Console, err: Console) -> int:
    if args.command == "peers":
        return _peers(args, settings, out)
    if args.command == "delegations":
        return _delegations(args, settings, out)
    return _reconcile(args, settings, out)


def _peers(args: argparse.Namespace, settings: RLMSettings, out: Console) -> int:
    if settings.a2a_peers_file is None:
        raise SettingsInvalid("no peers file: give --peers-file FILE or set RLM_A2A_PEERS_FILE",
                              setting="a2a_peers_file")
    peers = load_peers(settings.a2a_peers_file)
    probe = Delegations(settings, root_id="rlm-peers", peers=peers)
    rows = []
    for peer in peers.peers:
        why = probe.route_problem(peer)
        card_tariff = None
        if why is None:
            why, card_tariff = probe.card_problem(peer)
        rows.append({
            "alias": peer.alias, "url": peer.url, "skill": peer.skill, "description": peer.description,
            "tariff_credits": peer.tariff_credits, "credential_env": peer.credential_env,
            "credential": None if peer.credential_env is None else
            ("set" if os.environ.get(peer.credential_env) else "missing"),
            "max_tasks": peer.max_tasks, "max_concurrent": peer.max_concurrent,
            "max_payload_bytes": peer.max_payload_bytes, "max_result_bytes": peer.max_result_bytes,
            "deadline_s": peer.deadline_s, "card_tariff_credits": card_tariff, "route_open": why is None,
            "why_not": why,
        })
    probe.close()
    routing = {"a2a_enabled": settings.a2a_enabled, "a2a_paid_enabled": settings.a2a_paid_enabled,
               "a2a_credit_allowance": settings.a2a_credit_allowance, "peers_file": str(peers.path)}
    if args.json:
        out.print_json(json.dumps({"routing": routing, "peers": rows}))
        return EXIT_OK
    out.print(f"peers file {peers.path}: routing {'on' if settings.a2a_enabled else 'off (RLM_A2A_ENABLED)'}, "
              f"paid peers {'on' if settings.a2a_paid_enabled else 'off (RLM_A2A_PAID_ENABLED)'}, "
              f"credit allowance {settings.a2a_credit_allowance}", markup=False, highlight=False)
    table = Table(title_justify="left")
    for column in ("alias", "url", "skill", "tariff", "key variable", "limits (tasks/open/payload/result/deadline)",
                   "route"):
        table.add_column(column, overflow="fold")
    for r in rows:
        key = "-" if r["credential_env"] is None else f"{r['credential_env']} ({r['credential']})"
        limits = (f"{r['max_tasks']}/{r['max_concurrent']}/{r['max_payload_bytes']:,}/{r['max_result_bytes']:,}/"
                  f"{r['deadline_s']:g}s")
        tariff = str(r["tariff_credits"]) + ("" if r["card_tariff_credits"] is None
                                             else f" (card: {r['card_tariff_credits']})")
        cells = (r["alias"], r["url"], r["skill"] or "-", tariff, key, limits,
                 "open" if r["route_open"] else f"closed: {r['why_not']}")
        table.add_row(*(escape(c) for c in cells))  # error codes are [bracketed]: not markup
    print_table(out, table, ids=("alias", "key variable"))
    return EXIT_OK


def _rows(settings: RLMSettings, run: str | None) -> tuple[list[Delegation], DelegationStore | None]:
    if not settings.a2a_path.exists():
        if run:
            raise RunNotFound(f"no delegations for run {run!r}: there are none in {settings.a2a_path}")
        return [], None
    store = DelegationStore(settings.a2a_path)
    if not run:
        return store.list(), store
    roots = store.roots()
    matches = [r for r in roots if r == run] or [r for r in roots if r.startswith(run)]
    if len(matches) != 1:
        raise RunNotFound(f"no delegations for run {run!r}" if not matches
                          else f"run prefix {run!r} matches {len(matches)} runs: {', '.join(matches[:MAX_LISTED_NAMES])}")
    return store.list(matches[0]), store


def _delegations(args: argparse.Namespace, settings: RLMSettings, out: Console) -> int:
    rows, store = _rows(settings, args.run)
    if args.json:
        data = []
        for row in rows:
            item = row.to_dict()
            item["result_chars"] = len(item.pop("result_text"))
            item["references"] = row.references
            item.pop("references_json")
            item["events"] = store.events(row.id) if store else []
            data.append(item)
        out.print_json(json.dumps({"delegations": data, "allowances": _allowances(rows, store)}))
        return EXIT_OK
    table = Table(title=f"A2A delegations ({settings.a2a_path})", title_justify="left")
    for column in ("delegation", "run", "peer", "state", "remote task", "credits", "required", "age", "note"):
        table.add_column(column, no_wrap=column in ("delegation", "state"))
    now = time.time()
    for r in rows:
        note = r.reconcile_reason or r.cancel_outcome or (f"[{r.error_code}] {r.error_message}" if r.error_code
                                                          else r.task_preview[:NOTE_COLUMN_CHARS])
        remote = r.remote_task_id or ("(direct reply)" if r.direct_reply else "-")
        cells = (r.id, r.root_id, r.peer_alias, r.state, remote, credits_text(r.to_dict(), short=True),
                 "yes" if r.required else "no", f"{now - r.created_at:,.0f}s", note)
        table.add_row(*(escape(c) for c in cells))
    print_table(out, table, ids=("delegation", "run", "remote task"))
    for allowance in _allowances(rows, store):
        out.print(f"root {allowance['root_id']}: {allowance['credits_held']} of its {allowance['credits_allowed']} "
                  "credits drawn (holds, and charges the peers reported)", markup=False, highlight=False)
    unsettled = [r for r in rows if r.charge_state == "unknown"]
    if unsettled:
        out.print("\ncharges unknown (the hold stays drawn):", style="yellow")
        for r in unsettled:
            out.print(f"  {r.id} to {r.peer_alias}: {r.charge_note}", markup=False, highlight=False)
    unknown = [r for r in rows if r.state == "unknown"]
    if unknown:
        out.print("\nunknown outcomes (never resent; after checking the peer: rlm reconcile DELEGATION "
                  "--remote-task-id ID --reason TEXT, or --failed --reason TEXT):", style="yellow")
        for r in unknown:
            out.print(f"  {r.id} to {r.peer_alias}: message id {r.message_id}, sent "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.created_at))}", markup=False,
                      highlight=False)
    return EXIT_OK


def _allowances(rows: list[Delegation], store: DelegationStore | None) -> list[dict[str, Any]]:
    """Each listed root's credit allowance and what its family has drawn (roots of paid delegations only)."""
    roots = list(dict.fromkeys(r.root_id for r in rows if r.credit_ceiling is not None))
    return [{"root_id": root, **store.credits(root)} for root in roots] if store else []


def _reconcile(args: argparse.Namespace, settings: RLMSettings, out: Console) -> int:
    if not settings.a2a_path.exists():
        raise A2AError(f"no delegations in {settings.a2a_path}")
    row = reconcile(settings, args.delegation, reason=args.reason, remote_task_id=args.remote_task_id,
                    failed=args.failed)
    if args.json:
        out.print_json(json.dumps({"id": row.id, "state": row.state, "remote_task_id": row.remote_task_id,
                                   "reconcile_reason": row.reconcile_reason}))
    else:
        out.print(f"{row.id} is now {row.state}" + (f" (remote task {row.remote_task_id})" if row.remote_task_id
                                                       else "") + f"; reason: {row.reconcile_reason}",
                  markup=False, highlight=False)
    return EXIT_OK


def print_evidence(extra: dict[str, Any], err: Console) -> None:
    """After a run: one line per delegation, so remote work is never mistaken for checked work."""
    for d in extra.get("delegations") or []:
        err.print(evidence_line(d), markup=False, highlight=False)


def evidence_line(d: dict[str, Any]) -> str:
    """One delegation of a run's record, as ``rlm run`` and ``rlm show`` print it."""
    credits = credits_text(d)
    return (f"remote evidence (unverified): {d['id']} to {d['peer']}: {d['state']}, {d['result_chars']:,} characters"
            + (f"; {credits}" if credits else "") + (f"; {d['error']}" if d.get("error") else ""))
