"""Benchmark of the python-bash profile (issue 21): the command broker's cost, and what the model is shown.

Run: .venv/bin/python bench/rlm_bash.py [--commands 200] [--rounds 3] [--container-commands 30]

Prints, each next to its baseline in the same run:
- the broker's overhead per command: ``CommandBroker.run`` (admission and the
  receipt in jobs.sqlite3, the workspace lease, a process group, output through
  pipes into files, previews) against a bare ``subprocess.run`` of the same
  ``bash --noprofile --norc -c`` command, for ``true`` and for a command that prints
  64 KiB, interleaved round by round;
- the same in a run's container (the container kernel's launcher, with
  ``--container-commands`` N > 0): ``CommandBroker.run`` through the job runner
  against a bare ``<engine> exec`` of the same Bash command in the same
  container, for the same two commands;
- characters shown to the model under ``transcript`` and ``receipts`` on the
  bundled ``tally`` example (scripted model, a fresh copy of the repository
  each time), against the characters those steps produced.

A benchmark, not a test: it never fails on speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "library"))

from rlmfamily.bash.broker import CommandBroker
from rlmfamily.bash.host import prepare
from rlmfamily.bash.store import JobStore
from rlmfamily.context import Context
from rlmfamily.providers import ScriptedProvider
from rlmfamily.session import Session
from rlmfamily.settings import load_settings

EXAMPLES = ROOT / "library" / "rlmfamily" / "examples"
COMMANDS = {"true": "true", "print 64 KiB": "head -c 65536 /dev/zero | tr '\\0' 'x'"}


def bench_overhead(commands: int, rounds: int, data: Path) -> None:
    settings = load_settings(data_dir=data / "overhead", profile="python-bash", bash_max_jobs=1_000_000)
    workspace = data / "work"
    workspace.mkdir(parents=True, exist_ok=True)
    host = prepare(settings, set())
    broker = CommandBroker(settings, host, JobStore(settings.jobs_path, output_dir=settings.runs_dir),
                           workspace=workspace, root_id="bench", agent_id="bench", run_id="bench")
    print(f"broker overhead: {commands} commands a round, {rounds} rounds, bash {host.version} ({host.path})")
    for name, command in COMMANDS.items():
        compare_per_command(name, "bare subprocess.run", lambda: subprocess.run(
            [host.path, "--noprofile", "--norc", "-c", command], cwd=workspace, env=host.env,
            stdin=subprocess.DEVNULL, capture_output=True, check=True), lambda: broker.run(command), commands, rounds)


def compare_per_command(name: str, bare_label: str, bare: Callable[[], object], brokered: Callable[[], object],
                        commands: int, rounds: int) -> None:
    """Prints the ms a command of ``bare`` and of ``brokered`` takes, interleaved round by round, with the medians."""
    bare_ms, broker_ms = [], []
    for _ in range(rounds):
        for run, samples in ((bare, bare_ms), (brokered, broker_ms)):
            started = time.perf_counter()
            for _ in range(commands):
                run()
            samples.append((time.perf_counter() - started) * 1000 / commands)
    bare_median, broker_median = statistics.median(bare_ms), statistics.median(broker_ms)
    print(f"  {name:<13} {bare_label} {bare_median:7.2f} ms   broker {broker_median:7.2f} ms   "
          f"overhead {broker_median - bare_median:+7.2f} ms (x{broker_median / bare_median:.2f})   rounds bare "
          f"{', '.join(f'{v:.2f}' for v in bare_ms)} / broker {', '.join(f'{v:.2f}' for v in broker_ms)}")


def bench_container(commands: int, rounds: int, data: Path) -> None:
    from rlmfamily.bash import in_container
    from rlmfamily.container.engine import find_engine
    from rlmfamily.container.image import build_image
    from rlmfamily.container.sandbox import RunContainer

    built = build_image(find_engine(load_settings(data_dir=data / "image"), check_image=False))
    settings = load_settings(data_dir=data / "container", profile="python-bash", kernel="container",
                             container_image=built.name, bash_max_jobs=1_000_000)
    workspace = data / "container-work"
    workspace.mkdir(parents=True, exist_ok=True)
    with RunContainer.open(settings, run_id="bench", workspace=workspace) as container:
        launcher = in_container.prepare(settings, set(), container, workspace=workspace)
        broker = CommandBroker(settings, launcher, JobStore(settings.jobs_path, output_dir=settings.runs_dir),
                               workspace=workspace, root_id="bench-c", agent_id="bench-c", run_id="bench-c")
        print(f"in the run's container ({container.engine.kind}, image {built.name}): {commands} commands a round, "
              f"{rounds} rounds, bash {launcher.version}")
        for name, command in COMMANDS.items():
            bare_argv = container.exec_argv(["bash", "--noprofile", "--norc", "-c", command], interactive=False)
            compare_per_command(name, "bare engine exec", lambda: subprocess.run(
                bare_argv, env=dict(container.engine.env), stdin=subprocess.DEVNULL, capture_output=True, check=True),
                lambda: broker.run(command), commands, rounds)


# A chattier variant of the same task: the tests run verbosely and the model lists the repository and reads
# a whole file, as a model exploring a repository does.
CHATTY = {"root": [
    {"bash": {"command": "for i in $(seq 1 200); do echo \"collecting tally/test_$i.py ... ok\"; done; "
                         "python3 -m unittest -v 2>&1; exit 0", "read_only": True}},
    {"code": "print(bash.run('ls -laR; cat tally/stats.py tests/test_stats.py', read_only=True).stdout())"},
    {"code": "final_answer('read')"},
]}


def bench_observations(data: Path) -> None:
    for name, script in (("the tally example (6 turns, 5 jobs)", None), ("a chattier exploration (3 turns)", CHATTY)):
        print(f"characters shown to the model, {name}:")
        for strategy in ("transcript", "receipts"):
            repo = data / f"tally-{strategy}-{len(name)}"
            shutil.copytree(EXAMPLES / "tally", repo)
            settings = load_settings(data_dir=data / f"obs-{strategy}-{len(name)}", profile="python-bash",
                                     observation_strategy=strategy)
            provider = (ScriptedProvider.from_file(EXAMPLES / "tally_bash.toml") if script is None
                        else ScriptedProvider(script))
            result = Session(context=Context.from_repository(repo, settings), provider=provider,
                             settings=settings).run("Add median to tally and make the tests pass")
            seen = result.extra["observations"]
            print(f"  {strategy:<10} answer {result.answer!r}: observations shown {seen['chars_shown']:,} of "
                  f"{seen['chars_produced']:,} produced ({seen['chars_shown'] / seen['chars_produced']:.0%}); "
                  f"all root requests {result.root_chars_sent:,} chars")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--container-commands", type=int, default=0, help="also measure jobs in a run's container")
    parser.add_argument("--skip-observations", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="rlm-bash-bench-") as folder:
        bench_overhead(args.commands, args.rounds, Path(folder))
        if args.container_commands:
            bench_container(args.container_commands, args.rounds, Path(folder))
        if not args.skip_observations:
            bench_observations(Path(folder))
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
