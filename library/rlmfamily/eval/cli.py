"""``rlm eval``: ``run`` an experiment, ``report`` a results folder, list a pack's ``tasks``.

Exit codes: 0 done (every planned attempt has a record), 1 the experiment stopped before its end
(the spend cap), 2 the command line, the pack or a condition is wrong (the message says what to change).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlmfamily.output import print_table

COMMANDS = ("eval",)


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("eval", help="the evaluation pack: graded tasks, paired comparisons, cost per accepted task")
    commands = parser.add_subparsers(dest="eval_command", required=True)
    run = commands.add_parser("run", help="run every task under every condition, N times (resumable)")
    run.add_argument("pack", help="a pack folder (pack.toml, tasks/<id>/task.toml), or a bundled pack's name: pilot")
    run.add_argument("--conditions", required=True, help="the conditions to compare, comma separated (A,B)")
    run.add_argument("--conditions-file", help="a TOML file of [conditions.<name>] tables, over the pack's own")
    run.add_argument("--repeats", type=int, default=1, help="attempts of each task under each condition (default 1)")
    run.add_argument("--max-usd", type=float, default=None,
                     help="the most the whole experiment may spend; required when a condition calls a paid model")
    run.add_argument("--results", required=True, help="the results folder (an existing one is continued)")
    run.add_argument("--tasks", help="only these task ids, comma separated")
    run.add_argument("--tag", action="append", default=[], help="only tasks with this tag (repeatable: any of them)")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    report = commands.add_parser("report", help="the table of a results folder; --json, --html FILE")
    report.add_argument("results")
    report.add_argument("--json", action="store_true", help="the whole report as JSON on stdout")
    report.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with per-task charts")
    report.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    tasks = commands.add_parser("tasks", help="validate a pack and list its tasks and conditions")
    tasks.add_argument("pack")
    tasks.add_argument("--json", action="store_true")


def main(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.eval_command == "run":
        return _run(args, out, err)
    if args.eval_command == "report":
        return _report(args, out)
    return _tasks(args, out)


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from rlmfamily.eval.conditions import choose, load_conditions_file, parse_conditions
    from rlmfamily.eval.errors import PackInvalid
    from rlmfamily.eval.pack import load_pack
    from rlmfamily.eval.runner import Experiment

    pack = load_pack(args.pack)
    if args.tasks:
        pack = pack.select([t.strip() for t in args.tasks.split(",") if t.strip()])
    if args.tag:
        tagged = [t.id for t in pack.tasks if set(t.spec.tags) & set(args.tag)]
        if not tagged:
            tags = sorted({tag for t in pack.tasks for tag in t.spec.tags})
            raise PackInvalid(f"no task of pack {pack.name} has the tag(s) {', '.join(args.tag)}; its tags are "
                              f"{', '.join(tags)}")
        pack = pack.select(tagged)
    raw = dict(pack.conditions)
    if args.conditions_file:
        raw |= load_conditions_file(Path(args.conditions_file))
    available = parse_conditions(raw, source=args.conditions_file or str(pack.folder / "pack.toml"))
    conditions = choose(available, [c.strip() for c in args.conditions.split(",") if c.strip()])

    def progress(line: str) -> None:
        if not args.quiet:
            err.print(line, markup=False, highlight=False)

    experiment = Experiment(pack, conditions, repeats=args.repeats, results=Path(args.results),
                            max_usd=args.max_usd, progress=progress)
    summary = experiment.run()
    if summary.stopped:
        err.print(f"rlm eval: stopped after {summary.ran} attempt(s) ({summary.skipped} done before): {summary.stopped}",
                  markup=False, highlight=False)
        return 1
    err.print(f"rlm eval: {summary.ran} attempt(s) run, {summary.skipped} done before; `rlm eval report "
              f"{args.results}` compares them", markup=False, highlight=False)
    return 0


def _report(args: argparse.Namespace, out: Console) -> int:
    from rlmfamily.eval.report import build_report, print_report, render_html

    report = build_report(Path(args.results), seed=args.seed)
    if args.html:
        Path(args.html).write_text(render_html(report))
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print_report(report, out)
    return 0


def _tasks(args: argparse.Namespace, out: Console) -> int:
    from rlmfamily.eval.conditions import parse_conditions
    from rlmfamily.eval.pack import load_pack

    pack = load_pack(args.pack)
    conditions = parse_conditions(pack.conditions, source=str(pack.folder / "pack.toml"))
    if args.json:
        print(json.dumps({"pack": pack.name, "digest": pack.digest,
                          "tasks": [{"id": t.id, "kind": t.spec.kind, "tags": t.spec.tags,
                                     "evaluator": t.spec.evaluator.kind} for t in pack.tasks],
                          "conditions": {n: c.to_dict() | {"paid": c.paid} for n, c in conditions.items()}}, indent=1))
        return 0
    table = Table(title=f"pack {pack.name}: {len(pack.tasks)} tasks")
    for column in ("task", "kind", "evaluator", "tags"):
        table.add_column(column)
    for t in pack.tasks:
        table.add_row(t.id, t.spec.kind, t.spec.evaluator.kind, ", ".join(t.spec.tags))
    print_table(out, table, ids=("task",))
    for name, c in conditions.items():
        out.print(f"condition {name}: {c.provider}{' ' + c.model if c.model else ''}, profile {c.profile}, kernel "
                  f"{c.kernel}{' (paid: needs --max-usd)' if c.paid else ' (offline)'}", highlight=False)
    return 0
