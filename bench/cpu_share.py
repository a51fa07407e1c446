"""What each CPU share mechanism of ``workers.cpu_share`` gives a short job beside spinning ones (issue 41 §2).

    .venv/bin/python bench/cpu_share.py [--spinners 3] [--victim-loops 3000000] [--reps 5] [--json]

No service: the mechanisms alone, with real processes on this machine. A *victim* (a process that counts to
``--victim-loops``: a short job's own CPU work, about half a second) runs alone, then beside ``--spinners`` processes
that loop forever (jobs spinning in the sandbox, each past its demotion threshold), under each mechanism:

  off      the spinners as the worker is: every process one share (before issue 41 §2)
  nice     each spinner at SPECIALISTS_WORKER_JOB_CPU_DEMOTED_NICE's default (the victim at 0)
  cgroup   each spinner in a job cgroup of its own at SPECIALISTS_WORKER_JOB_CPU_DEMOTED_WEIGHT's default, inside
           the neighbour's customer group, the victim in its own at SPECIALISTS_WORKER_JOB_CPU_WEIGHT's inside the
           victim's: ``cpu_share.enter_cgroup``; skipped where this process may not make cgroups

The figure is the victim's wall time from its start to its exit, the median of ``--reps``, and its ratio over the
victim alone measured in the same run (alone runs are interleaved with the others, so the machine's other load
weighs on both). Speed never fails it. Goal (issue 41): at or under 1.5x.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers import cpu_share  # noqa: E402
from workers.settings import WorkerSettings  # noqa: E402

SPIN = "while True: pass"
# The settings' defaults, as a worker runs them.
JOB_WEIGHT, DEMOTED_WEIGHT, DEMOTED_NICE = (WorkerSettings.model_fields[name].default for name in (
    "job_cpu_weight", "job_cpu_demoted_weight", "job_cpu_demoted_nice"))


def victim_s(loops: int, placed: Callable[[int], Callable[[], None]]) -> float:
    """Wall seconds of one victim run; ``placed(pid)`` puts it in its share before it starts counting and returns
    how to undo that. The victim waits on its stdin until it is placed, so no loop runs before."""
    child = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdin.read(1)\nfor _ in range({loops}): pass"],
                             stdin=subprocess.PIPE)
    undo = placed(child.pid)
    assert child.stdin is not None
    start = time.perf_counter()
    child.stdin.write(b"x")
    child.stdin.close()
    child.wait()
    elapsed = time.perf_counter() - start
    undo()
    return elapsed


def spinners(count: int, placed: Callable[[int], Callable[[], None]]) -> Callable[[], None]:
    """Start ``count`` spinning processes, each placed in its share; returns how to end them."""
    children = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    undos = [placed(child.pid) for child in children]

    def end() -> None:
        for child in children:
            child.send_signal(signal.SIGKILL)
            child.wait()
        for undo in undos:
            undo()

    return end


def as_is(pid: int) -> Callable[[], None]:
    return lambda: None


def niced(pid: int) -> Callable[[], None]:
    os.setpriority(os.PRIO_PROCESS, pid, DEMOTED_NICE)
    return lambda: None


def in_cgroup(weight: int, customer: str) -> Callable[[int], Callable[[], None]]:
    def place(pid: int) -> Callable[[], None]:
        group = cpu_share.enter_cgroup(pid, weight, customer, JOB_WEIGHT)
        assert group is not None, "no cgroup could be made"

        def undo() -> None:  # its process has exited: the group is empty, removed as a worker removes a job's
            cpu_share.remove_cgroup(group)

        return undo

    return place


def cgroups_available() -> bool:
    probe = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        group = cpu_share.enter_cgroup(probe.pid, JOB_WEIGHT, "probe")
    finally:
        probe.kill()
        probe.wait()
    if group is None:
        return False
    cpu_share.remove_cgroup(group)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spinners", type=int, default=3)
    parser.add_argument("--victim-loops", type=int, default=3_000_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scenarios: dict[str, tuple[Callable[[int], Callable[[], None]], Callable[[int], Callable[[], None]]]] = {
        "off": (as_is, as_is),
        "nice": (as_is, niced),
    }
    if cgroups_available():
        scenarios["cgroup"] = (in_cgroup(JOB_WEIGHT, "victim"), in_cgroup(DEMOTED_WEIGHT, "neighbour"))
    times: dict[str, list[float]] = {"alone": [], **{name: [] for name in scenarios}}
    for _ in range(args.reps):
        for name, (victim_place, spinner_place) in scenarios.items():
            times["alone"].append(victim_s(args.victim_loops, victim_place))
            end = spinners(args.spinners, spinner_place)
            try:
                time.sleep(0.2)  # the spinners running before the victim starts
                times[name].append(victim_s(args.victim_loops, victim_place))
            finally:
                end()
    alone = statistics.median(times["alone"])
    figures = {name: {"median_s": round(statistics.median(values), 3), "ratio": round(statistics.median(values) / alone, 2),
                      "runs_s": [round(value, 3) for value in values]} for name, values in times.items()}
    if args.json:
        print(json.dumps({"cores": os.cpu_count(), "spinners": args.spinners, "figures": figures}))
        return 0
    print(f"victim: counts to {args.victim_loops}; {args.spinners} spinners; {os.cpu_count()} cores; {args.reps} reps; "
          f"weights {JOB_WEIGHT} -> {DEMOTED_WEIGHT}, nice {DEMOTED_NICE}")
    print(f"{'scenario':<10}{'median s':>10}{'ratio':>8}  runs (s)")
    for name, figure in figures.items():
        print(f"{name:<10}{figure['median_s']:>10.3f}{figure['ratio']:>8.2f}  {figure['runs_s']}")
    if "cgroup" not in figures:
        print("cgroup: skipped (this process may not make a CPU cgroup here)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
