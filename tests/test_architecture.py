"""The rooms' rules, checked from the source (docs/ARCHITECTURE.md, "Rooms"): who may import whom, no import
cycles, and one owner module for every table."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from core.settings import PROJECT_ROOT
from tests.import_graph import cycles, module_graph

ROOMS = ["core", "ledger", "taskstate", "app", "workers", "ops", "library/rlmfamily"]

# Which rooms each room may import (besides itself). Arrows point one way.
MAY_IMPORT = {
    "core": set(),
    "ledger": {"core"},
    "taskstate": {"core", "ledger"},
    "app": {"core", "ledger", "taskstate"},
    "workers": {"core", "ledger", "taskstate", "rlmfamily"},
    "ops": {"core", "ledger", "taskstate", "app", "workers", "rlmfamily"},
    "rlmfamily": set(),
}

# What no room's code may import: it does not ship.
NEVER_IMPORTED = {"tests", "bench"}

# Each room's section of the one settings object lives beside the room (docs/ARCHITECTURE.md, "Settings"):
# core.settings gathers them, the one import of core into the rooms. A section module may import nothing of the
# service but SETTINGS_BASE, and the packages above it nothing at all, so that gathering them makes no cycle.
SETTINGS_ROOT = "core.settings"
SETTINGS_BASE = "core.settings_base"
SECTION_MODULES = {"app.settings", "ledger.settings", "taskstate.settings", "workers.settings",
                   "workers.hosted_rlm.settings", "ops.settings", "ops.console.settings"}

# Every table of the schema, and the one module (or, for the ledger, the room) whose SQL may name it.
OWNERS = {
    "tasks": "taskstate/rows.py",
    "task_versions": "taskstate/rows.py",
    "task_events": "taskstate/rows.py",
    "task_counts": "taskstate/rows.py",
    "edge_tasks": "taskstate/admitted.py",
    "edge_idempotency_keys": "taskstate/idempotency.py",
    "dispatch_outbox": "taskstate/outbox.py",
    "dispatch_weights": "taskstate/outbox.py",
    "dispatch_turns": "taskstate/outbox.py",
    "job_claims": "taskstate/claims.py",
    "job_stale_reports": "taskstate/claims.py",
    "push_configs": "taskstate/push.py",
    "push_deliveries": "taskstate/push.py",
    "worker_beats": "taskstate/liveness.py",
    "push_disabled": "taskstate/push.py",
    "edge_messages": "app/admission.py",
    "edge_contexts": "app/admission.py",
    "edge_rate_windows": "app/ratelimit.py",
    "specialist_runs": "workers/hosted_rlm/journal.py",
    "specialist_calls": "workers/hosted_rlm/journal.py",
    "specialist_steps": "workers/hosted_rlm/journal.py",
    "specialist_checkpoints": "workers/hosted_rlm/store.py",
    "schema_compatibility": "core/db.py",
    "alembic_version": "core/db.py",
    # The ledger's tables change only through its server-side functions (migration 0002, called from
    # ledger/statements.py); its reads and its verification are the ledger room's own.
    "customers": "ledger/",
    "api_keys": "ledger/",
    "ledger_accounts": "ledger/",
    "ledger_grants": "ledger/",
    "ledger_lots": "ledger/",
    "ledger_entitlements": "ledger/",
    "ledger_reservations": "ledger/",
    "ledger_settlements": "ledger/",
    "ledger_journal": "ledger/",
    "ledger_account_changes": "ledger/",
    # The drill's own record of its runs: the one table an auditor writes (what it found, never what it audits).
    "drill_runs": "ops/drill/record.py",
    # The console's live sessions (logging out ends one on the server).
    "console_sessions": "ops/console/session_store.py",
}
# Auditors read every table to check what the owners did, and never write: an audit that went through the
# code it audits would trust it. The drill's scenarios and end-state audit are the service's auditors.
AUDITORS = ("ops/drill/",)
SQL = re.compile(r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM|CREATE TABLE|ALTER TABLE)\b")
WRITES = re.compile(r"\b(INSERT INTO|UPDATE|DELETE FROM|TRUNCATE)\s+(\w+)")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def sql_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of a file that read as SQL (f-strings by their literal parts), docstrings aside."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        else:
            continue
        if SQL.search(text):
            found.append((node.lineno, text))
    return found


def product_files() -> list[Path]:
    return [p for room in ROOMS if room != "library/rlmfamily" for p in sorted((PROJECT_ROOT / room).rglob("*.py"))]


def test_every_table_is_named_in_sql_only_by_its_owner():
    misplaced = []
    for path in product_files():
        where = path.relative_to(PROJECT_ROOT).as_posix()
        if where.startswith(AUDITORS):
            continue
        for line, sql in sql_strings(path):
            for table, owner in OWNERS.items():
                if re.search(rf"(?<![\w.]){table}(?!\w)", sql) and not where.startswith(owner):
                    misplaced.append(f"{where}:{line} names {table} (owner: {owner})")
    assert not misplaced, "SQL outside a table's owner:\n" + "\n".join(misplaced)


def test_auditors_only_read():
    writes = [
        f"{path.relative_to(PROJECT_ROOT)}:{line} {match.group(0)}"
        for room in AUDITORS
        for path in sorted((PROJECT_ROOT / room).rglob("*.py"))
        for line, sql in sql_strings(path)
        for match in WRITES.finditer(sql)
        if match.group(2) in OWNERS and not OWNERS[match.group(2)].startswith(AUDITORS)
    ]
    assert not writes, "an auditor writes:\n" + "\n".join(writes)


def test_the_ownership_table_knows_every_table_of_the_schema():
    created = set()
    for path in (PROJECT_ROOT / "migrations" / "versions").glob("*.py"):
        created |= set(re.findall(r"CREATE (?:UNLOGGED )?TABLE (?:IF NOT EXISTS )?(\w+)", path.read_text()))
    sdk_tables = {"tasks", "task_versions", "task_events"}  # created by migration 0010 from the a2a-sdk's models
    assert created | sdk_tables | {"alembic_version"} == set(OWNERS)


@functools.cache
def rooms_graph() -> dict[str, set[str]]:
    """The rooms' import graph, parsed once for the tests that read it (each parse reads every file)."""
    return module_graph(PROJECT_ROOT, ROOMS)


def test_rooms_import_only_downward():
    graph = rooms_graph()
    upward = [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if (room := module.split(".")[0]) != (other := target.split(".")[0])
        and other in MAY_IMPORT.keys() | NEVER_IMPORTED  # the standard library and third-party packages are not rooms
        and other not in MAY_IMPORT[room]
        and not (module == SETTINGS_ROOT and target in SECTION_MODULES)
    ]
    assert not upward, "imports against docs/ARCHITECTURE.md's rooms:\n" + "\n".join(upward)


def test_no_module_is_part_of_an_import_cycle():
    found = cycles(rooms_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(cycle) for cycle in found)


def test_the_rooms_settings_sections_import_only_the_settings_base():
    graph = rooms_graph()
    service = set(MAY_IMPORT) | NEVER_IMPORTED
    found = {module for module in graph if module.endswith(".settings") and module.split(".")[0] != "rlmfamily"}
    assert found - {SETTINGS_ROOT} == SECTION_MODULES, "a room's settings module that core.settings does not gather"
    wrong = []
    for module in sorted(SECTION_MODULES):
        packages = [".".join(module.split(".")[:depth]) for depth in range(1, module.count(".") + 1)]
        for importer in [module, *packages]:
            allowed = {SETTINGS_BASE} if importer == module else set()
            wrong += [f"{importer} imports {target}" for target in sorted(graph[importer])
                      if target.split(".")[0] in service and target not in allowed]
    gatherers = sorted(m for m, targets in graph.items() if targets & SECTION_MODULES and m != SETTINGS_ROOT
                       and m.split(".")[0] == "core")
    assert not wrong and not gatherers, ("a settings section must stand on core.settings_base alone:\n"
                                         + "\n".join(wrong + [f"{m} imports a room's section" for m in gatherers]))
