"""Noisy-neighbour benchmark (issue 41): a victim's short task alone, behind another customer's slot flood, and
beside another customer's CPU-spinning jobs, in one run.

    .venv/bin/python bench/noisy_neighbour.py [--reps 3] [--rounds 2] [--flood 8] [--long-s 8]
                                              [--spinners 3] [--spin-s 10] [--spin-lead-s 0.5] [--victim-model-s 0.3]
                                              [--victim-iterations 4000000] [--setting NAME=VALUE] [--json]

Starts its own database: a fresh database on the server named by DATABASE_URL when it
is set (dropped afterwards), otherwise an embedded PostgreSQL in a temporary folder.

The whole product on one machine, as `specialists serve` runs it (an ``ops.topology`` role):
the edge, the embedded dispatcher and one worker with 4 job slots, on 127.0.0.1. Two
customers, each with its own key and credits, send over HTTP (returnImmediately):

  victim    the analyst (the shipped spec) on a scripted route: a Monty turn that counts
            to ``--victim-iterations`` (its own CPU work) and asks one semantic call that
            takes ``--victim-model-s``, then its cited answer. About a second alone.
  neighbour the reviewer (the shipped spec, its default ``max_parallel``) on a scripted
            route whose bundle says what it does: MODE-FLOOD asks one semantic call that
            takes ``--long-s`` (a long task that holds a slot, not the CPU); MODE-SPIN
            spins the CPU in the sandbox for ``--spin-s`` (Monty code that loops, in turns
            of at most SPIN_TURN_S under the spec's step timeout); MODE-IDLE (the warm-up)
            does neither.

Scenarios, one after the other on the same service:

  alone     the victim's task, ``--reps`` times, one at a time: the baseline.
  flood     the neighbour sends ``--flood`` long tasks at once (within its cap), which fill
            the worker's slots and queue the rest; once the slots are full the victim sends
            its task. ``--rounds`` times.
  cpu       the neighbour sends ``--spinners`` spinning tasks; ``--spin-lead-s`` after they run,
            the victim sends its task. ``--rounds`` times.

For each victim task, on the database's clock: admission (``edge_tasks.admitted_at``) to
start (the job's first claim: it holds a slot) and to finish (the claim finished, the
reservation settled). Ratios are each scenario's median over the baseline's median. Also
shown: how many of the neighbour's jobs started between the victim's admission and its
start (a fair order starts at most the slots' turnover ahead of it).

After every scenario, once every task of it is terminal and its reservation closed, the
ledger is verified (``Ledger.audit``, what `specialists ledger verify` runs); a violation,
a victim task that did not complete, or a task that never settled ends the run with exit
status 1. Speed never fails it. Goal (issue 41): both ratios to finish at or under 1.5x.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import bindparam, text  # noqa: E402

from bench.admission import database, free_port  # noqa: E402
from bench.one_machine import KEY_SECRET, serve_env  # noqa: E402
from ops.topology import Ready, Role, ops_cli  # noqa: E402
from taskstate.ids import job_id_sql  # noqa: E402

SLOTS = 4  # the worker's job slots (worker_max_concurrent_jobs), as in the issue's review
VICTIM, NEIGHBOUR = "analyst", "reviewer"
CREDITS = 1_000_000
SPIN_TURN_S = 5.0  # a spinning turn's wall time at most: well inside the reviewer's 20 s step timeout
SETTLE_TIMEOUT_S = 300.0
POLL_S = 0.05
FLOOD_SETTLE_S = 1.0  # after the neighbour's third job runs, before the victim sends: a fourth starts if it may
TERMINAL = ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED")

VICTIM_SCRIPT = '''
model = "scripted-victim"
default_answer = "NONE"

[[root]]
code = \'\'\'
n = 0
for i in range({iterations}):
    n = n + i
hits = context.search(r"ERROR", limit=4)
why = llm_query("What failed here, in one line?", hits[0]["snippet"])
print(len(hits), "error line(s);", why.text)
\'\'\'

[[root]]
code = \'\'\'final_answer({{"answer": "The import failed: %s (%s:%d)" % (why.text, hits[0]["path"], hits[0]["line"]),
               "citations": [{{"path": hits[0]["path"], "line": hits[0]["line"]}}]}})\'\'\'

[[subcall]]
pattern = \'ERROR:\\s*([^\\n]*)\'
answer = \'\\1\'
delay_s = {model_s}
'''

NEIGHBOUR_TURN = '''
[[root]]
code = \'\'\'
import time
if mode == "MODE-SPIN":
    end = time.monotonic() + {seconds}
    n = 0
    while time.monotonic() < end:
        for i in range(20000):
            n = n + i
print(mode)
\'\'\'
'''

NEIGHBOUR_SCRIPT = '''
model = "scripted-neighbour"
default_answer = "OK"

[[root]]
code = \'\'\'
import time
mode = context.search(r"MODE-(FLOOD|SPIN|IDLE)", limit=1)[0]["match"]
if mode == "MODE-FLOOD":
    held = llm_query("Hold the slot: " + mode)
print(mode)
\'\'\'
{spin_turns}
[[root]]
code = \'\'\'final_answer({{"summary": "done: " + mode, "findings": []}})\'\'\'

[[subcall]]
pattern = \'MODE-FLOOD\'
answer = "held"
delay_s = {long_s}
'''

_TIMES = text(
    f"""
    SELECT e.task_id, t.status ->> 'state' AS state, r.state::text AS reservation,
           extract(epoch FROM c.first_claimed_at - e.admitted_at) AS to_start,
           extract(epoch FROM c.finished_at - e.admitted_at) AS to_finish,
           e.admitted_at, c.first_claimed_at, (c.outcome_detail ->> 'cpu_seconds')::float AS cpu_s,
           extract(epoch FROM run.started_at - c.first_claimed_at) AS to_run,
           extract(epoch FROM run.ended_at - run.started_at) AS run,
           extract(epoch FROM c.finished_at - run.ended_at) AS after_run
      FROM edge_tasks e JOIN tasks t ON t.id = e.task_id
      LEFT JOIN ledger_reservations r ON r.job_id = e.reservation_id
      LEFT JOIN dispatch_outbox o ON o.task_id = e.task_id
      LEFT JOIN job_claims c ON c.job_id = {job_id_sql('o')}
      LEFT JOIN specialist_runs run ON run.job_id = c.job_id
     WHERE e.task_id IN :tasks
    """
).bindparams(bindparam("tasks", expanding=True))

_AHEAD = text(
    f"""
    SELECT count(*) FROM edge_tasks e JOIN dispatch_outbox o ON o.task_id = e.task_id
      JOIN job_claims c ON c.job_id = {job_id_sql('o')}
     WHERE e.task_id IN :tasks AND c.first_claimed_at > :admitted AND c.first_claimed_at < :started
    """
).bindparams(bindparam("tasks", expanding=True))

_RUNNING = text(
    f"""
    SELECT count(*) FROM edge_tasks e JOIN dispatch_outbox o ON o.task_id = e.task_id
      JOIN job_claims c ON c.job_id = {job_id_sql('o')}
     WHERE e.task_id IN :tasks AND c.state = 'running'
    """
).bindparams(bindparam("tasks", expanding=True))


@dataclass
class Victim:
    task_id: str
    to_start_s: float
    to_finish_s: float
    neighbour_started_ahead: int = 0
    cpu_s: float | None = None  # the job's CPU seconds, where the worker records them (issue 41 section 2)
    # Where its time went after the claim: the job's process and runner start, the run, its finish and settlement.
    claim_to_run_s: float = float("nan")
    run_s: float = float("nan")
    run_to_finish_s: float = float("nan")


@dataclass
class Scenario:
    name: str
    victims: list[Victim] = field(default_factory=list)
    neighbour_states: dict[str, int] = field(default_factory=dict)
    neighbour_cpu_s: list[float] = field(default_factory=list)
    ledger_clean: bool = False
    seconds: float = 0.0

    def median(self, attribute: str) -> float:
        return statistics.median(getattr(v, attribute) for v in self.victims)


class Service:
    """The running service, its database, and the two customers' keys."""

    def __init__(self, base: str, engine: Any) -> None:
        self.base = base
        self.engine = engine
        self.http = httpx.Client(timeout=60)
        self.tokens: dict[str, str] = {}

    def customer(self, role: str, skill: str) -> None:
        from ledger import keys
        from ledger.client import Ledger

        customer = f"bench-{role}-{uuid.uuid4().hex[:6]}"
        self.tokens[role] = keys.issue_key(self.engine, keys.KeySigner([KEY_SECRET], "test"), customer_id=customer,
                                           ttl=timedelta(days=1)).token
        # The neighbour keeps the default max_parallel: the flood is within its own limits, as in the issue.
        Ledger(self.engine).grant(customer, CREDITS, operator="bench", skills=[skill], reason="noisy neighbour")

    def send(self, role: str, specialist: str, question: str, files: dict[str, str]) -> str:
        parts = [{"text": question}] + [
            {"raw": base64.b64encode(content.encode()).decode(), "filename": name, "mediaType": "text/plain"}
            for name, content in files.items()]
        body = {"message": {"messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER", "parts": parts},
                "configuration": {"returnImmediately": True}}
        answer = self.http.post(f"{self.base}/specialists/{specialist}/message:send", json=body,
                                headers={"Authorization": f"Bearer {self.tokens[role]}", "A2A-Version": "1.0"})
        if answer.status_code != 200:
            raise SystemExit(f"{role}'s task was refused: {answer.status_code} {answer.text[:300]}")
        return answer.json()["task"]["id"]

    def victim(self) -> str:
        return self.send("victim", VICTIM, "Why did the nightly import fail?",
                         {"logs/import.log": "12:00:01 INFO start\n12:00:02 INFO read 100 rows\n"
                                             "12:00:03 ERROR: the orders table is locked\n12:00:04 INFO stop\n"})

    def neighbour(self, mode: str) -> str:
        return self.send("neighbour", NEIGHBOUR, "Review this.", {"src/mode.txt": f"# {mode}\nx = 1\n"})

    def rows(self, tasks: list[str]) -> list[Any]:
        with self.engine.connect() as conn:
            return conn.execute(_TIMES, {"tasks": tasks}).all()

    def wait(self, what: str, done: Any, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise SystemExit(f"gave up waiting for {what} after {timeout_s:.0f} s")
            time.sleep(POLL_S)

    def wait_running(self, tasks: list[str], count: int) -> None:
        def running() -> bool:
            with self.engine.connect() as conn:
                return conn.execute(_RUNNING, {"tasks": tasks}).scalar_one() >= count
        self.wait(f"{count} of the neighbour's jobs to run", running)

    def wait_settled(self, tasks: list[str]) -> list[Any]:
        """Every task terminal, its claim finished and its reservation closed; their rows."""
        found: list[Any] = []

        def settled() -> bool:
            nonlocal found
            found = self.rows(tasks)
            return len(found) == len(tasks) and all(
                r.state in TERMINAL and r.reservation not in (None, "open") and r.to_finish is not None for r in found)
        self.wait(f"{len(tasks)} task(s) to settle", settled)
        return found

    def verify(self) -> bool:
        from ledger.client import Ledger

        audit = Ledger(self.engine).audit()
        for violation in audit.violations:
            print(f"LEDGER VIOLATION: {violation}", file=sys.stderr)
        return not audit.violations

    def victim_times(self, task_id: str, neighbours: list[str]) -> Victim:
        (row,) = self.rows([task_id])
        if row.state != "TASK_STATE_COMPLETED":
            raise SystemExit(f"the victim's task {task_id} ended {row.state}, not completed: see the serve log")
        ahead = 0
        if neighbours:
            with self.engine.connect() as conn:
                ahead = conn.execute(_AHEAD, {"tasks": neighbours, "admitted": row.admitted_at,
                                              "started": row.first_claimed_at}).scalar_one()
        stages = [float("nan") if value is None else float(value) for value in (row.to_run, row.run, row.after_run)]
        return Victim(task_id, float(row.to_start), float(row.to_finish), ahead, row.cpu_s, *stages)


def run_scenario(service: Service, name: str, rounds: int, neighbours_of_round: Any) -> Scenario:
    scenario = Scenario(name)
    started = time.monotonic()
    everything: list[str] = []
    for _ in range(rounds):
        neighbours = neighbours_of_round()
        victim = service.victim()
        everything += neighbours + [victim]
        service.wait_settled([victim])
        scenario.victims.append(service.victim_times(victim, neighbours))
        for row in service.wait_settled(neighbours) if neighbours else []:
            scenario.neighbour_states[row.state] = scenario.neighbour_states.get(row.state, 0) + 1
            if row.cpu_s is not None:
                scenario.neighbour_cpu_s.append(row.cpu_s)
    service.wait_settled(everything)
    scenario.seconds = time.monotonic() - started
    scenario.ledger_clean = service.verify()
    return scenario


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="the victim's tasks alone (the baseline)")
    parser.add_argument("--rounds", type=int, default=2, help="victim tasks per scenario, each with its own load")
    parser.add_argument("--flood", type=int, default=8, help="the neighbour's long tasks in the flood")
    parser.add_argument("--long-s", type=float, default=8.0, help="a long task's model time (it holds a slot)")
    parser.add_argument("--spinners", type=int, default=3, help="the neighbour's CPU-spinning tasks")
    parser.add_argument("--spin-s", type=float, default=10.0, help="how long each spinning task spins")
    parser.add_argument("--spin-lead-s", type=float, default=0.5,
                        help="how long the spinners run before the victim sends (their demotion comes later)")
    parser.add_argument("--victim-model-s", type=float, default=0.3, help="the victim's semantic call's time")
    parser.add_argument("--victim-iterations", type=int, default=4_000_000,
                        help="the victim's own CPU work: a Monty loop of this many additions")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the service, e.g. worker_job_cpu_share=off (SPECIALISTS_ + NAME upper-cased); "
                             "repeatable")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    if args.spinners >= SLOTS or args.flood <= SLOTS:
        parser.error(f"--spinners must leave the victim a slot (< {SLOTS}); --flood must queue (> {SLOTS})")
    if any("=" not in setting for setting in args.setting):
        parser.error("--setting is NAME=VALUE, e.g. worker_job_cpu_share=off")

    from core import db
    from core.settings import Settings

    load_before = Path("/proc/loadavg").read_text().strip()
    folder = Path(tempfile.mkdtemp(prefix="bench-noisy-"))
    spin_turns = []
    left = args.spin_s
    while left > 0:
        spin_turns.append(NEIGHBOUR_TURN.format(seconds=min(left, SPIN_TURN_S)))
        left -= SPIN_TURN_S
    (folder / "victim.toml").write_text(VICTIM_SCRIPT.format(iterations=args.victim_iterations,
                                                             model_s=args.victim_model_s))
    (folder / "neighbour.toml").write_text(NEIGHBOUR_SCRIPT.format(spin_turns="".join(spin_turns), long_s=args.long_s))
    (folder / "routes.toml").write_text(
        f'[routes.analyst]\nkind = "scripted"\nscript = "{folder / "victim.toml"}"\n\n'
        f'[routes.reviewer]\nkind = "scripted"\nscript = "{folder / "neighbour.toml"}"\n')
    url, cleanup = database(os.environ.get("DATABASE_URL"))
    port, worker_port = free_port(), free_port()
    env = serve_env(url, routes_file=folder / "routes.toml", edge_port=port, worker_port=worker_port, extra={
        "SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS": str(SLOTS), "SPECIALISTS_DATA_DIR": str(folder / "data"),
        **{f"SPECIALISTS_{name.strip().upper()}": value for name, value in
           (setting.split("=", 1) for setting in args.setting)},
    })
    base = f"http://127.0.0.1:{port}"
    log = folder / "serve.log"
    serve = Role("serve", ops_cli("serve"), env, Ready.http(f"{base}/readyz"), log, cwd=ROOT, stop_grace_s=20).start()
    engine = db.make_engine(url, Settings(database={"url": url}))
    service = Service(base, engine)
    try:
        serve.wait_ready()
        service.customer("victim", VICTIM)
        service.customer("neighbour", NEIGHBOUR)
        if not args.json:
            print(f"service up (log {log}); load average {load_before}")
        # Warm-up, not counted: imports, the Monty pool, connections, both scripts once.
        service.wait_settled([service.victim(), service.neighbour("MODE-IDLE")])

        def flood() -> list[str]:
            with ThreadPoolExecutor(args.flood) as pool:
                tasks = list(pool.map(lambda _: service.neighbour("MODE-FLOOD"), range(args.flood)))
            # Every slot the neighbour may take is taken, the rest queued: all of them, or all but the one the
            # dispatcher keeps free for another customer (c3adfb1); then a moment for a fourth to start if it may.
            service.wait_running(tasks, SLOTS - 1)
            time.sleep(FLOOD_SETTLE_S)
            return tasks

        def spin() -> list[str]:
            tasks = [service.neighbour("MODE-SPIN") for _ in range(args.spinners)]
            service.wait_running(tasks, args.spinners)
            time.sleep(args.spin_lead_s)  # past the first turn's start: they spin
            return tasks

        scenarios = [run_scenario(service, "alone", args.reps, list),
                     run_scenario(service, "flood", args.rounds, flood),
                     run_scenario(service, "cpu", args.rounds, spin)]
        load_after = Path("/proc/loadavg").read_text().strip()
        report(args, scenarios, load_before, load_after)
        dirty = [s.name for s in scenarios if not s.ledger_clean]
        if dirty:
            print(f"ledger verify is NOT clean after: {', '.join(dirty)}", file=sys.stderr)
            return 1
        return 0
    finally:
        service.http.close()
        engine.dispose()
        serve.stop()
        cleanup()


def report(args: argparse.Namespace, scenarios: list[Scenario], load_before: str, load_after: str) -> None:
    alone = scenarios[0]
    base_start, base_finish = alone.median("to_start_s"), alone.median("to_finish_s")
    figures = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "scenarios": {s.name: {
            "to_start_s_median": s.median("to_start_s"),
            "to_finish_s_median": s.median("to_finish_s"),
            "start_ratio": s.median("to_start_s") / base_start if base_start > 0 else float("nan"),
            "finish_ratio": s.median("to_finish_s") / base_finish,
            "victims": [asdict(v) for v in s.victims],
            "neighbour_states": s.neighbour_states,
            "neighbour_cpu_s": s.neighbour_cpu_s,
            "ledger_clean": s.ledger_clean,
            "seconds": s.seconds,
        } for s in scenarios},
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"\n{'scenario':<8} {'n':>2} {'to start s':>11} {'x alone':>8} {'to finish s':>12} {'x alone':>8} "
          f"{'ahead':>6} {'cpu s':>6} {'ledger':>7}  each victim's finish (s)")
    for s in scenarios:
        f = figures["scenarios"][s.name]
        ahead = max(v.neighbour_started_ahead for v in s.victims)
        cpu = [v.cpu_s for v in s.victims if v.cpu_s is not None]
        print(f"{s.name:<8} {len(s.victims):>2} {f['to_start_s_median']:>11.2f} {f['start_ratio']:>7.1f}x "
              f"{f['to_finish_s_median']:>12.2f} {f['finish_ratio']:>7.1f}x {ahead:>6} "
              f"{statistics.median(cpu) if cpu else float('nan'):>6.2f} "
              f"{'clean' if s.ledger_clean else 'DIRTY':>7}  {', '.join(f'{v.to_finish_s:.2f}' for v in s.victims)}")
    print("\nmedians; x alone = over the 'alone' median; ahead = most neighbour jobs started between a victim's "
          "admission and its start; cpu s = the victim job's CPU seconds as the worker recorded them (nan: not recorded)")
    print("the victim's time after its claim, medians (s): " + "; ".join(
        f"{s.name} {s.median('claim_to_run_s'):.2f} to its run's start, {s.median('run_s'):.2f} the run, "
        f"{s.median('run_to_finish_s'):.2f} to finished" for s in scenarios))
    for s in scenarios[1:]:
        cpu = s.neighbour_cpu_s
        print(f"neighbour's tasks ({s.name}): {s.neighbour_states}; CPU s each, median "
              f"{statistics.median(cpu) if cpu else float('nan'):.2f}, max {max(cpu, default=float('nan')):.2f}")
    print(f"goal (issue 41): to finish <= 1.5x alone in both; load average before {load_before}, after {load_after}")


if __name__ == "__main__":
    sys.exit(main())
