"""The data-folder commands of ``rlm``: ``where`` (where data lives and which rule chose it) and ``init``
(make the current folder a project with its own ``.rlm/``). The rules are rlmfamily/data_location.py's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlmfamily import data_location
from rlmfamily.output import print_table
from rlmfamily.settings import RLMSettings, load_settings

COMMANDS = ("where", "init")
EXIT_OK = 0


def add_parsers(sub: Any) -> None:
    where = sub.add_parser("where", help="where runs, history and budgets live, and which rule chose the folder")
    where.add_argument("--json", action="store_true")

    init = sub.add_parser("init", help="give this project its own data folder, .rlm/ (runs here and below go there)")
    init.add_argument("folder", nargs="?", default=".", help="the project's folder (default: the current one)")
    init.add_argument("--json", action="store_true")


def main(args: argparse.Namespace, settings: RLMSettings, out: Console, err: Console) -> int:
    if args.command == "where":
        return _where(args, settings, out)
    return _init(args, settings, out)


def chosen_rule(args: argparse.Namespace, settings: RLMSettings) -> str:
    """The rule as the CLI can tell it: a set data_dir came from --data-dir or, failing that, RLM_DATA_DIR."""
    rule = settings.data_location.rule
    if rule == "setting":
        return "flag" if args.data_dir else "env"
    return rule


# ---------- where ----------


def _where(args: argparse.Namespace, settings: RLMSettings, out: Console) -> int:
    rule = chosen_rule(args, settings)
    report = {
        "data_dir": str(settings.data_dir), "rule": rule, "reason": _reason(rule, settings),
        "notice": settings.data_location.notice, "rules": _rules(args, rule),
        "files": {"runs": str(settings.runs_dir), "budget": str(settings.budget_path),
                  "history": str(settings.history_path), "family": str(settings.family_path),
                  "a2a": str(settings.a2a_path)},
    }
    if args.json:
        out.print_json(json.dumps(report))
        return EXIT_OK
    p = lambda text, style=None: out.print(text, style=style, markup=False, highlight=False)  # noqa: E731
    p(f"data dir: {report['data_dir']}", "bold")
    p(f"rule {rule}: {report['reason']}")
    table = Table(title="the rules, first that applies wins", title_justify="left")
    for column in ("", "rule", "folder", "applies"):
        table.add_column(column)
    for number, row in enumerate(report["rules"], start=1):
        table.add_row(str(number), row["label"], row["folder"] or "-",
                      row["note"], style="bold green" if row["chosen"] else None)
    print_table(out, table, ids=("folder",))
    for name, path in report["files"].items():
        p(f"  {name:8} {path}" + ("" if Path(path).exists() else "  (not yet)"))
    return EXIT_OK


def _reason(rule: str, settings: RLMSettings) -> str:
    if rule == "flag":
        return "--data-dir is given"
    if rule == "env":
        return "RLM_DATA_DIR is set"
    return settings.data_location.reason


def _rules(args: argparse.Namespace, rule: str) -> list[dict[str, Any]]:
    """Every rule in order: its folder (None: it has none here), whether it chose, and if not, why not."""
    found = data_location.survey()
    from_env = load_settings().data_location  # without --data-dir: what RLM_DATA_DIR alone chooses
    env_folder = str(from_env.path) if from_env.rule == "setting" else None
    legacy_why_not = "the platform folder exists too" if found.legacy.is_dir() else "does not exist"
    rows = [  # name, label, folder, applies, why it does not
        ("flag", "--data-dir DIR", str(Path(args.data_dir).expanduser()) if args.data_dir else None,
         bool(args.data_dir), "not given"),
        ("env", "RLM_DATA_DIR", env_folder, env_folder is not None, "not set"),
        ("project", f"project {data_location.PROJECT_DIR_NAME}/ (here or a parent, below home)",
         str(found.project) if found.project else None, found.project is not None, "none found"),
        ("legacy", "legacy ~/.rlm (while the platform folder is missing)", str(found.legacy), found.uses_legacy,
         legacy_why_not),
        ("platform", "platform data folder (XDG on Linux)", str(found.platform), True, ""),
    ]
    return [{"rule": name, "label": label, "folder": folder, "chosen": name == rule,
             "note": "chosen" if name == rule else ("a rule above wins" if applies else why_not)}
            for name, label, folder, applies, why_not in rows]


# ---------- init ----------


def _init(args: argparse.Namespace, settings: RLMSettings, out: Console) -> int:
    target, created = data_location.init_project(Path(args.folder).expanduser().absolute())
    rule = chosen_rule(args, settings)
    # The settings were built before the folder existed: only an explicit data_dir still stands.
    data_dir = settings.data_dir if rule in ("flag", "env") else data_location.locate(None).path
    effective_rule = rule if rule in ("flag", "env") else data_location.locate(None).rule
    if args.json:
        out.print_json(json.dumps({"project_dir": str(target), "created": created, "data_dir": str(data_dir),
                                   "rule": effective_rule}))
        return EXIT_OK
    p = lambda text: out.print(text, markup=False, highlight=False)  # noqa: E731
    if created:
        p(f"created {target}: runs started in {target.parent} and its subfolders go there "
          "(its .gitignore keeps them out of git)")
    else:
        p(f"{target} is already a project data folder")
    if effective_rule in ("flag", "env"):
        p(f"but {'--data-dir' if effective_rule == 'flag' else 'RLM_DATA_DIR'} is set and wins over it: "
          f"data goes to {data_dir} (rlm where explains)")
    elif data_dir != target:
        p(f"from the current folder, data goes to {data_dir} (rlm where explains)")
    return EXIT_OK
