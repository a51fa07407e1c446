"""Grow a database in the shape real tasks leave, with a ledger that stays consistent (issue 18).

    .venv/bin/python bench/seed.py capture --url URL [--task TASK_ID] > bench/scale_template.json
    .venv/bin/python bench/seed.py grow --url URL --tasks 100000 [--customers 1000] [--hot-share 0.1]

``capture`` reads every row one real hosted task left, in every table it touched,
from a database where it ran (``./dev serve``, then ``./dev specialists demo``: a
completed reviewer task), and prints them as a template. The template in this folder
(``scale_template.json``) was captured that way.

``grow`` (and ``Seeder`` from Python: ``bench/scale.py`` and ``tests/test_query_plans.py``)
clones that template, in set-based statements, until the database holds the number of
tasks asked for: the same rows per task (the task row and its versions and events, the
edge's record, message and context, the outbox row, the claim, the rlm run's journal and
checkpoints, the reservation, its settlement and its journal postings), with fresh ids,
spread over ``customers`` customers of whom the first holds ``hot_share`` of the tasks,
and over a year of admissions (the jobs in flight over the last ten minutes). Ids inside
the JSON columns and inside the protobuf bytes
(the task's and the context's UUID, the message id) are replaced by ids of the same
length, so the bytes stay valid protobuf.

Most clones are completed and settled, like the template. A few are not, so that the
queries that look for them have something to find (per 10,000 tasks):

  running    30  claimed, lease in the future, reservation open, task WORKING
  expired     2  claimed, lease passed: what the lease sweeper looks for
  unknown    10  claim and reservation unknown: what an operator reconciles
  sent        2  handed to Cloud Tasks an hour ago, never claimed: the abandoned-job query's
  pending     5  admitted, not yet taken by a dispatcher

The rlm run's Monty checkpoints (about 30 KB a task, more than all its other rows) are kept as the
retention keeps them: for jobs that may still resume, and for a day after the others were admitted.

The ledger: each customer gets one grant (``ledger_grant``, the real function) with
credits for every task it will ever hold. The clones' reservations, settlements and
postings are then written as the template's are, and each lot's held and spent and each
account's held and open count are recomputed from them, so ``ledger verify`` finds
nothing (``tests/bench/test_seed.py`` checks it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text

TEMPLATE_PATH = Path(__file__).with_name("scale_template.json")

# The tables one hosted task writes, in an order that satisfies their foreign keys, and how to find the
# template task's rows in each (T: its task id, X: its context id, J: its job id).
TABLES: list[tuple[str, str]] = [
    ("tasks", "id = :T"),
    ("task_versions", "task_id = :T"),
    ("task_events", "task_id = :T"),
    ("edge_contexts", "context_id = :X"),
    ("edge_tasks", "task_id = :T"),
    ("edge_messages", "task_id = :T"),
    ("dispatch_outbox", "task_id = :T"),
    ("job_claims", "job_id = :J"),
    ("specialist_runs", "job_id = :J"),
    ("specialist_calls", "job_id = :J"),
    ("specialist_steps", "job_id = :J"),
    ("specialist_checkpoints", "job_id = :J"),
    ("ledger_reservations", "job_id = :T"),
    ("ledger_settlements", "job_id = :T"),
    ("ledger_journal", "job_id = :T"),
]
# Columns filled by their own default (sequences, identities) rather than copied.
GENERATED = {("task_events", "seq"), ("specialist_calls", "call_id"), ("ledger_journal", "posting_id")}

# Variants per 10,000 tasks (the rest are completed); see the module docstring.
VARIANTS_PER_10K = [("running", 30), ("expired", 2), ("unknown", 10), ("sent", 2), ("pending", 5)]
CUSTOMER_PREFIX = "scale-"
SPECIALIST = "reviewer"
YEAR_S = 365 * 24 * 3600
BATCH_TASKS = 10_000
# Jobs in flight were admitted minutes ago, whatever the size: a running job as old as the history would put
# every in-flight row into the ranges the sweeper's queries read for what is overdue.
IN_FLIGHT = "'running', 'expired', 'pending'"
IN_FLIGHT_S = 600
# SPECIALISTS_SPECIALIST_CHECKPOINT_RETENTION_S's default: a job that can no longer resume keeps its checkpoints
# this long, then a dispatcher deletes them (workers.hosted_rlm.store.prune_ended).
CHECKPOINTS_KEPT_S = 86_400


def capture(conn: Connection, task_id: str | None = None) -> dict[str, Any]:
    """Every row the task ``task_id`` (default: the newest completed one) left, as a template."""
    if task_id is None:
        task_id = conn.execute(text(
            "SELECT t.task_id FROM edge_tasks t JOIN ledger_settlements s ON s.job_id = t.task_id "
            "ORDER BY t.admitted_at DESC LIMIT 1")).scalar_one()
    edge = conn.execute(text("SELECT customer_id, owner, admitted_at FROM edge_tasks WHERE task_id = :t"),
                        {"t": task_id}).mappings().one()
    dispatch_id = conn.execute(text("SELECT min(dispatch_id) FROM dispatch_outbox WHERE task_id = :t"),
                               {"t": task_id}).scalar_one()
    task = conn.execute(text("SELECT context_id, history FROM tasks WHERE id = :t"), {"t": task_id}).mappings().one()
    keys = {"T": task_id, "X": task["context_id"], "J": f"{task_id}.{dispatch_id}"}
    rows = {}
    for table, where in TABLES:
        found = conn.execute(text(f"SELECT row_to_json(r)::text FROM {table} r WHERE {where}"), keys).scalars()
        rows[table] = list(found)
    return {
        "task_id": task_id,
        "context_id": task["context_id"],
        "message_id": task["history"][0]["messageId"],
        "dispatch_id": dispatch_id,
        "customer_id": edge["customer_id"],
        "owner": edge["owner"],
        "admitted_at": edge["admitted_at"].isoformat(),
        "entry_ids": sorted(conn.execute(text("SELECT DISTINCT entry_id FROM ledger_journal WHERE job_id = :t"),
                                         {"t": task_id}).scalars()),
        "rows": rows,
    }


# A column whose template value is longer than this (an rlm checkpoint's bytes) is copied as it is: running the
# id replacements over it for every clone cost two thirds of the seeding time, and nothing reads ids inside it.
LARGE_VALUE_CHARS = 4096


def _apart(row: str) -> tuple[str, dict[str, Any]]:
    """A template row's JSON without its large values, and those values (bytea as bytes)."""
    values = json.loads(row)
    large = {k: v for k, v in values.items() if isinstance(v, str) and len(v) > LARGE_VALUE_CHARS}
    for column, value in large.items():
        del values[column]
        if value.startswith("\\x"):
            large[column] = bytes.fromhex(value[2:])
    return json.dumps(values), large


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    return json.loads(path.read_text())


def _hex(value: str) -> str:
    return value.encode().hex()


@dataclass
class Seeder:
    """Grows one database; ``grow_to(n)`` adds tasks until it holds ``n`` seeded tasks."""

    engine: Engine
    customers: int = 1000
    hot_share: float = 0.10
    final_tasks: int = 1_000_000  # the admissions are spread over a year at this size
    template: dict[str, Any] | None = None
    parallel: int = 2  # batches cloned at once, one connection each

    def __post_init__(self) -> None:
        self.template = self.template or load_template()
        if len(self.template["message_id"]) != 41:
            raise ValueError("the template's message id must be 41 characters long (demo-<uuid>)")
        self._columns = self._read_columns()

    # --- the schema ---------------------------------------------------------

    def _read_columns(self) -> dict[str, list[tuple[str, str]]]:
        with self.engine.connect() as conn:
            found = conn.execute(text(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position")).all()
        columns: dict[str, list[tuple[str, str]]] = {}
        for table, column, kind in found:
            columns.setdefault(table, []).append((column, kind))
        return columns

    def seeded(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM edge_tasks WHERE customer_id LIKE :p"), {"p": CUSTOMER_PREFIX + "%"}).scalar_one())

    # --- customers ----------------------------------------------------------

    def customer_id(self, index: int) -> str:
        return f"{CUSTOMER_PREFIX}{index:04d}"

    @property
    def hot_customer(self) -> str:
        return self.customer_id(0)

    def ensure_customers(self) -> None:
        """One grant per customer, through the real ``ledger_grant``: credits for every task it will hold."""
        credits = 40 * max(self.final_tasks, 1000)
        with self.engine.begin() as conn:
            conn.execute(text(
                "SELECT ledger_grant(:p || lpad(c::text, 4, '0'), :credits, 0, NULL, interval '3650 days', 10000, 8, "
                "ARRAY[:skill], NULL, 'scale-seed-' || c, 'scale-seed', 'bench', 'scale seed') "
                "FROM generate_series(0, :n - 1) c"),
                {"p": CUSTOMER_PREFIX, "credits": credits, "skill": SPECIALIST, "n": self.customers})

    # --- tasks --------------------------------------------------------------

    def grow_to(self, tasks: int, progress: Callable[[int, int], None] | None = None) -> None:
        self.ensure_customers()
        start = self.seeded()
        batches = [(lo, min(tasks, lo + BATCH_TASKS)) for lo in range(start, tasks, BATCH_TASKS)]
        done = start

        def clone(batch: tuple[int, int]) -> int:
            with self.engine.begin() as conn:
                self._clone(conn, *batch)
            return batch[1] - batch[0]

        with ThreadPoolExecutor(self.parallel) as pool:  # batches are independent: their ids are their own
            for added in pool.map(clone, batches):
                done += added
                if progress:
                    progress(done, tasks)
        with self.engine.begin() as conn:
            self._recompute_ledger(conn)
            conn.execute(text("ANALYZE"))

    def _numbered(self) -> str:
        """The clones of one batch: ids, customer, variant, admission time (``n``)."""
        variant = "CASE"
        start = 0
        for name, per_10k in VARIANTS_PER_10K:
            variant += f" WHEN i % 10000 BETWEEN {start} AND {start + per_10k - 1} THEN '{name}'"
            start += per_10k
        variant += " ELSE 'completed' END"
        hot_every = max(1, round(1 / self.hot_share)) if self.hot_share > 0 else 0
        customer = (f"CASE WHEN {hot_every} > 0 AND i % {hot_every} = 0 THEN 0 "
                    f"ELSE 1 + abs(hashint4(i)) % {max(self.customers - 1, 1)} END")
        t = self.template
        return f"""
        n AS MATERIALIZED (
            SELECT i, s.t, s.x, s.m, s.d, s.t || '.' || s.d AS j, s.c, s.c || :owner_suffix AS owner, s.v, s.at,
                   s.at - CAST('{t["admitted_at"]}' AS timestamptz) AS shift,
                   (SELECT lot_id FROM ledger_lots l WHERE l.customer_id = s.c ORDER BY lot_id LIMIT 1) AS lot,
                   nextval('ledger_entry_seq') AS e_reserve, nextval('ledger_entry_seq') AS e_settle
              FROM (SELECT r.*, CASE WHEN r.v IN ({IN_FLIGHT}) THEN now() - make_interval(secs => r.i % {IN_FLIGHT_S})
                                     ELSE r.spread_at END AS at
                      FROM (SELECT i, gen_random_uuid()::text AS t, gen_random_uuid()::text AS x,
                                   'seed-' || gen_random_uuid()::text AS m,
                                   nextval('dispatch_outbox_dispatch_id_seq') AS d,
                                   '{CUSTOMER_PREFIX}' || lpad(({customer})::text, 4, '0') AS c, {variant} AS v,
                                   now() - make_interval(secs => {YEAR_S} * (1 - CAST(i AS float8) / {self.final_tasks}))
                                     AS spread_at
                              FROM generate_series(:lo, :hi - 1) i) r) s
        )"""

    def _substituted(self, param: str, row: str) -> str:
        """A template row's JSON with the clone's ids in place of the template's (text and hex)."""
        expr = f"CAST(:{param} AS text)"
        for index, (old, new) in enumerate(self._replacements()):
            if old in row:
                expr = f"replace({expr}, CAST(:old_{index} AS text), {new})"
                row = row.replace(old, "")
        # A task that is not finished shows the state it is in.
        if "TASK_STATE_COMPLETED" not in row:
            return expr
        return (f"replace({expr}, 'TASK_STATE_COMPLETED', CASE n.v WHEN 'completed' THEN 'TASK_STATE_COMPLETED' "
                "WHEN 'pending' THEN 'TASK_STATE_SUBMITTED' ELSE 'TASK_STATE_WORKING' END)")

    def _type(self, table: str, column: str) -> str:
        return dict(self._columns[table])[column]

    def _replacements(self) -> list[tuple[str, str]]:
        """(the template's value, the clone's as SQL over ``n``), longest first where one contains another."""
        t = self.template
        return [
            (f"{t['task_id']}.{t['dispatch_id']}", "n.j"),
            (t["task_id"], "n.t"), (_hex(t["task_id"]), "encode(convert_to(n.t, 'UTF8'), 'hex')"),
            (t["context_id"], "n.x"), (_hex(t["context_id"]), "encode(convert_to(n.x, 'UTF8'), 'hex')"),
            (t["message_id"], "n.m"), (_hex(t["message_id"]), "encode(convert_to(n.m, 'UTF8'), 'hex')"),
            (t["owner"], "n.owner"), (t["customer_id"], "n.c"),
        ]

    def _overrides(self, table: str) -> tuple[dict[str, str], str]:
        """Column expressions that differ from the template's, and which clones get the row at all."""
        t = self.template
        reserve_entry = t["entry_ids"][0]  # the template's reserve entry; its settle entry is the other one
        if table == "job_claims":
            return {
                "state": "CASE n.v WHEN 'completed' THEN 'finished' WHEN 'unknown' THEN 'unknown' ELSE 'running' END",
                "lease_expires_at": "CASE n.v WHEN 'running' THEN now() + interval '1 hour' "
                                    "WHEN 'expired' THEN now() - interval '1 minute' END",
                "outcome": "CASE WHEN n.v = 'completed' THEN (r).outcome END",
                "outcome_detail": "CASE WHEN n.v = 'completed' THEN (r).outcome_detail END",
                "finished_at": "CASE WHEN n.v = 'completed' THEN (r).finished_at + n.shift END",
                "unknown_at": "CASE WHEN n.v = 'unknown' THEN (r).claimed_at + n.shift + interval '10 minutes' END",
                "unknown_reason": "CASE WHEN n.v = 'unknown' THEN 'its lease expired while it ran (seeded)' END",
            }, "n.v NOT IN ('sent', 'pending')"
        if table == "dispatch_outbox":
            return {
                "dispatch_id": "n.d",
                "status": "CASE WHEN n.v IN ('completed', 'unknown') THEN 'done' WHEN n.v = 'pending' THEN 'pending' "
                          "ELSE 'sent' END",
                "finished_at": "CASE WHEN n.v IN ('completed', 'unknown') THEN (r).finished_at + n.shift END",
                "sent_at": "CASE WHEN n.v IN ('running', 'expired') THEN n.at WHEN n.v = 'sent' "
                           "THEN now() - interval '1 hour' END",
                "taken_at": "CASE WHEN n.v <> 'pending' THEN (r).taken_at + n.shift END",
                "taken_by": "CASE WHEN n.v <> 'pending' THEN (r).taken_by END",
                "available_at": "CASE WHEN n.v = 'pending' THEN now() ELSE (r).available_at + n.shift END",
            }, "true"
        if table == "ledger_reservations":
            return {
                "hold_lot_ids": "ARRAY[n.lot]",
                "state": "CAST(CASE WHEN n.v = 'completed' THEN 'settled' WHEN n.v = 'unknown' THEN 'unknown' "
                         "ELSE 'open' END AS ledger_reservation_state)",
                "charged": "CASE WHEN n.v = 'completed' THEN (r).charged END",
                "resolved_at": "CASE WHEN n.v = 'completed' THEN (r).resolved_at + n.shift END",
                "unknown_at": "CASE WHEN n.v = 'unknown' THEN n.at + interval '10 minutes' END",
                "unknown_reason": "CASE WHEN n.v = 'unknown' THEN 'its lease expired while it ran (seeded)' END",
                "unknown_by": "CASE WHEN n.v = 'unknown' THEN 'lease-sweeper' END",
            }, "true"
        if table == "ledger_settlements":
            return {"entry_id": "n.e_settle"}, "n.v = 'completed'"
        if table == "ledger_journal":
            return {
                "lot_id": "n.lot",
                "entry_id": f"CASE (r).entry_id WHEN {reserve_entry} THEN n.e_reserve ELSE n.e_settle END",
            }, f"(n.v = 'completed' OR (r).kind = 'reserve')"
        if table == "specialist_runs":
            return {"state": "CASE WHEN n.v = 'completed' THEN (r).state ELSE 'running' END",
                    "ended_at": "CASE WHEN n.v = 'completed' THEN (r).ended_at + n.shift END",
                    "outcome": "CASE WHEN n.v = 'completed' THEN (r).outcome END"}, "n.v NOT IN ('sent', 'pending')"
        if table == "specialist_calls":
            return {"superseded_by": "NULL"}, "n.v NOT IN ('sent', 'pending')"
        if table == "specialist_steps":
            return {}, "n.v NOT IN ('sent', 'pending')"
        if table == "specialist_checkpoints":  # kept while the job may resume, and a day after (the retention)
            return {}, f"n.v IN ('running', 'expired') OR n.at > now() - make_interval(secs => {CHECKPOINTS_KEPT_S})"
        return {}, "true"

    def _clone(self, conn: Connection, lo: int, hi: int) -> None:
        ctes = [self._numbered()]
        params: dict[str, Any] = {"lo": lo, "hi": hi, "owner_suffix": f":{SPECIALIST}"}
        params.update({f"old_{index}": old for index, (old, _) in enumerate(self._replacements())})
        for table, _ in TABLES:
            overrides, which = self._overrides(table)
            for index, row in enumerate(self.template["rows"][table]):
                param = f"{table}_{index}"
                row, large = _apart(row)
                params[param] = row
                for column, value in large.items():  # the same in every clone: bound once, not substituted
                    params[f"{param}_{column}"] = value
                    overrides = {**overrides, column: f"CAST(:{param}_{column} AS {self._type(table, column)})"}
                columns = [(c, k) for c, k in self._columns[table] if (table, c) not in GENERATED]
                values = []
                for column, kind in columns:
                    if column in overrides:
                        values.append(overrides[column])
                    elif kind.startswith("timestamp"):
                        values.append(f"(r).{column} + n.shift")
                    else:
                        values.append(f"(r).{column}")
                names = ", ".join(c for c, _ in columns)
                ctes.append(
                    f"{param} AS (INSERT INTO {table} ({names}) SELECT {', '.join(values)} FROM "
                    f"(SELECT n.*, json_populate_record(NULL::{table}, CAST({self._substituted(param, row)} AS json)) AS r "
                    f"FROM n OFFSET 0) n WHERE {which})")
        conn.execute(text("WITH " + ",\n".join(ctes) + " SELECT 1"), params)

    # --- the ledger's totals ------------------------------------------------

    def _recompute_ledger(self, conn: Connection) -> None:
        """Each seeded lot's held and spent, each seeded account's held and open count, from what was written."""
        conn.execute(text("""
            UPDATE ledger_lots l SET held = x.held, spent = x.spent
              FROM (SELECT lot_id,
                           coalesce(sum(credits) FILTER (WHERE to_account = 'customer_held'), 0)
                             - coalesce(sum(credits) FILTER (WHERE from_account = 'customer_held'), 0) AS held,
                           coalesce(sum(credits) FILTER (WHERE to_account = 'revenue'), 0) AS spent
                      FROM ledger_journal WHERE customer_id LIKE :p GROUP BY lot_id) x
             WHERE l.lot_id = x.lot_id AND (l.held, l.spent) IS DISTINCT FROM (x.held, x.spent)"""),
                     {"p": CUSTOMER_PREFIX + "%"})
        conn.execute(text("""
            UPDATE ledger_accounts a SET held = x.held, open_reservations = x.open
              FROM (SELECT customer_id, sum(credits) AS held, count(*) AS open FROM ledger_reservations
                     WHERE customer_id LIKE :p AND state IN ('open', 'unknown') GROUP BY customer_id) x
             WHERE a.customer_id = x.customer_id AND (a.held, a.open_reservations) IS DISTINCT FROM (x.held, x.open)"""),
                     {"p": CUSTOMER_PREFIX + "%"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture", help="print the rows one real task left, as a template")
    cap.add_argument("--url", required=True)
    cap.add_argument("--task")
    grow = sub.add_parser("grow", help="grow the database to --tasks seeded tasks")
    grow.add_argument("--url", required=True)
    grow.add_argument("--tasks", type=int, default=1_000_000)
    grow.add_argument("--customers", type=int, default=1000)
    grow.add_argument("--hot-share", type=float, default=0.10)
    args = parser.parse_args(argv)
    from core import db

    engine = create_engine(db.sqlalchemy_url(args.url))
    if args.command == "capture":
        with engine.connect() as conn:
            print(json.dumps(capture(conn, args.task), indent=1))
        return 0
    seeder = Seeder(engine, customers=args.customers, hot_share=args.hot_share, final_tasks=args.tasks)
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        print(f"\r{done:,} / {total:,} tasks ({time.monotonic() - started:.0f} s)", end="", file=sys.stderr, flush=True)

    seeder.grow_to(args.tasks, progress)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
