"""The job's process alone (issue 44 §1): the CPU one no-op job's one-use process costs, beside a bare fork.

    .venv/bin/python bench/job_process.py [--jobs 100] [--warmup 5] [--rlm] [--profile] [--top 25]

Starts its own database (as bench/dispatch.py: a fresh database on DATABASE_URL's server, otherwise an embedded
PostgreSQL). No HTTP, dispatcher or claim: ``workers.isolation.ProcessJobs`` is built exactly as a worker builds
it (``workers.assembly``'s recipe and runner build) and given ``--jobs`` no-op jobs of the scripted specialist,
one after the other, each waited for to its end (its process has exited).

  job       CPU per job of the job processes (the forkserver waits for each, so their CPU is its children's,
            read from /proc), and of this process (the worker's side: the start, the watching thread, the
            spare's fork request). A no-op job of the scripted specialist sends no statement.
  baseline  a process forked from the same forkserver and launched as a job's is, that runs nothing (``os.getpid``,
            of a module every process has: a target of this file would make the child import it) and exits: the
            fork, the child's multiprocessing bootstrap and its exit, the same number of times.
  floor     the kernel's part alone: ``os.fork()`` and ``os._exit(0)`` of an interpreter that imported the same
            ``PRELOAD`` and froze its collector as the forkserver does (a process of its own, started for it),
            the parent's and the child's CPU. Copying the page tables of a heap this size, and tearing them down
            at the exit, is what one process per job costs at the least.

``--rlm`` serves the project's rlm specs too (the checkpoint key set, the demo's scripted model routes), as
``specialists serve`` does on one machine: the runner build then includes the RlmRunner. ``--profile``
runs cProfile (CPU clock) inside each job process, from its body's first line to its end, and prints the
functions that took the most CPU, summed over the jobs, per job.

A benchmark is not a test: it prints figures and never fails on speed.
Target (issue 44): platform CPU per no-op job (dispatcher + worker + job process) <= 15 ms.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import resource
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import database  # noqa: E402
from bench.dispatch import tree_cpu_s  # noqa: E402
from workers import isolation  # noqa: E402

PROFILE_DIR_VARIABLE = "BENCH_JOB_PROCESS_PROFILE_DIR"  # read in the job process: where its profile goes
CHECKPOINT_KEY = "bench-checkpoint-key-" + "k" * 40
_job_process = isolation._job_process  # the body, as imported here (in the parent, before it is wrapped)


def profiled_job_process(*args) -> None:  # type: ignore[no-untyped-def]
    """A job process's body under cProfile (CPU time), its profile written where the variable says."""
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        _job_process(*args)
    finally:
        profile.disable()
        profile.dump_stats(Path(os.environ[PROFILE_DIR_VARIABLE]) / f"job-{os.getpid()}.prof")


def _settings(url: str, specs: Path, rlm: bool):  # type: ignore[no-untyped-def]
    from core.settings import Settings

    hosted: dict = {"specs_dir": specs}
    if rlm:
        hosted.update(checkpoint_key=CHECKPOINT_KEY, model_routes_allow_scripted=True)
    return Settings(database={"url": url}, hosted=hosted,
                    worker={"job_secrets": ["bench-" + "w" * 40], "oidc_verify": False, "job_isolation": "process"})


def _job(index: int):  # type: ignore[no-untyped-def]
    from workers.auth import VerifiedJob

    return VerifiedJob(job_id=f"bench-{index}", specialist_id="scripted", deadline_s=60.0, payload={"script": {}},
                       signed_at=datetime.now(timezone.utc), secret_id="bench")


def _forkserver_pid() -> int:
    from multiprocessing import forkserver

    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    pids = [int(pid) for pid in children if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(pids) == 1, pids
    assert forkserver._forkserver._forkserver_pid == pids[0]
    return pids[0]


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_jobs(jobs, count: int) -> None:  # type: ignore[no-untyped-def]
    for index in range(count):
        done = threading.Event()
        outcomes: list = []

        jobs.start(_job(index), 1, time.monotonic() + 60, outcomes.append, done.set)
        assert done.wait(60), "a job did not finish in 60 s"
        assert outcomes[0].state == "completed", outcomes[0]


def run_bare(count: int) -> None:
    for _ in range(count):
        process = isolation._JobProcess(target=os.getpid, daemon=True)  # launched as a job's process is
        process.start()
        process.join()
        assert process.exitcode == 0


# Run as ``python -c FLOOR_PROBE COUNT``: the preload imported, the collector frozen, then COUNT forks that only exit;
# prints the child's and the parent's CPU ms per fork.
FLOOR_PROBE = """
import gc, importlib, os, resource, sys
from workers import isolation
for name in isolation.PRELOAD[:-1]:  # not job_template: it builds nothing outside a forkserver
    importlib.import_module(name)
gc.collect()
gc.freeze()
count = int(sys.argv[1])
def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
children, own = cpu(resource.RUSAGE_CHILDREN), cpu(resource.RUSAGE_SELF)
for _ in range(count):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
print(1000 * (cpu(resource.RUSAGE_CHILDREN) - children) / count, 1000 * (cpu(resource.RUSAGE_SELF) - own) / count)
"""


def fork_floor(count: int) -> dict[str, float]:
    import subprocess

    started = time.perf_counter()
    printed = subprocess.run([sys.executable, "-c", FLOOR_PROBE, str(count)], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    child, parent = (float(value) for value in printed)
    return {"processes": child + parent, "worker": 0.0, "wall": 1000 * (time.perf_counter() - started) / count,
            "child": child, "parent": parent}


def measure(count: int, work, server: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    before_children, before_own, started = tree_cpu_s(server), _own_cpu_s(), time.perf_counter()
    work(count)
    after_children, after_own, ended = tree_cpu_s(server), _own_cpu_s(), time.perf_counter()
    return {"processes": 1000 * (after_children - before_children) / count,
            "worker": 1000 * (after_own - before_own) / count,
            "wall": 1000 * (ended - started) / count}


def print_profile(folder: Path, top: int) -> None:
    files = sorted(folder.glob("job-*.prof"))
    if not files:
        print("no profiles were written")
        return
    stats = pstats.Stats(str(files[0]))
    for file in files[1:]:
        stats.add(str(file))
    total_ms = 1000 * stats.total_tt / len(files)
    print(f"\ncProfile inside {len(files)} job processes (CPU clock): {total_ms:.1f} ms a job in its body")
    stats.files = []  # not the list of every profile's path in each table's head
    for key, title in (("tottime", "own time"), ("cumulative", "cumulative")):
        out = io.StringIO()
        stats.stream = out
        stats.sort_stats(key).print_stats(top)
        table = out.getvalue().splitlines()
        start = next((i for i, line in enumerate(table) if line.lstrip().startswith("ncalls")), 0)
        print(f"\n-- by {title}, seconds summed over {len(files)} jobs --")
        print("\n".join(line for line in table[start:] if line.strip()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rlm", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    from core.specs import load_specs
    from workers.assembly import JOB_RUNNERS, RunnerRecipe

    load_before = os.getloadavg()
    specs = Path(tempfile.mkdtemp(prefix="bench-job-process-specs-"))
    if args.rlm:
        for spec in (ROOT / "specs").glob("*.yaml"):
            (specs / spec.name).write_text(spec.read_text())
    from bench.dispatch import SPEC, SPEC_ID

    (specs / f"{SPEC_ID}.yaml").write_text(SPEC)
    profile_dir = Path(tempfile.mkdtemp(prefix="bench-job-process-profiles-"))
    if args.profile:
        os.environ[PROFILE_DIR_VARIABLE] = str(profile_dir)  # before the forkserver starts: it inherits it
        from bench.job_process import profiled_job_process as profiled  # by name, as the child imports it

        isolation._job_process = profiled  # type: ignore[assignment]
    url, drop = database(os.environ.get("DATABASE_URL"))
    try:
        settings = _settings(url, specs, args.rlm)
        recipe = RunnerRecipe(settings, url, load_specs(specs))
        jobs = isolation.ProcessJobs(JOB_RUNNERS, recipe, max_memory_bytes=settings.worker.job_max_memory_bytes)
        try:
            server = _forkserver_pid()
            run_jobs(jobs, args.warmup)
            for stale in profile_dir.glob("job-*.prof"):
                stale.unlink()
            job = measure(args.jobs, lambda n: run_jobs(jobs, n), server)
            bare = measure(args.jobs, run_bare, server)
            let_go = jobs.waiting_pid  # the spare forked after the last job: it runs none
        finally:
            jobs.close()
        floor = fork_floor(args.jobs)
        if let_go is not None:  # its profile (written as it exits, at the close) is no job's
            (profile_dir / f"job-{let_go}.prof").unlink(missing_ok=True)
    finally:
        drop()
    print(f"\nJob processes: {args.jobs} no-op jobs one after another{' (rlm specs served)' if args.rlm else ''}, "
          f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} before and {os.getloadavg()[0]:.2f} after")
    print(f"{'run':<34}{'processes ms':>14}{'worker ms':>11}{'wall ms':>9}   (per job)")
    for label, figures in (("no-op job (spare, build, run, exit)", job), ("bare fork of the forkserver", bare),
                           ("floor: fork + _exit, same heap", floor)):
        print(f"{label:<34}{figures['processes']:>14.1f}{figures['worker']:>11.1f}{figures['wall']:>9.1f}")
    print(f"the job's process costs {job['processes'] - bare['processes']:.1f} ms of CPU above a bare fork's "
          f"{bare['processes']:.1f} ms; the kernel's fork and exit of this heap alone, {floor['processes']:.1f} ms "
          f"({floor['parent']:.1f} in the parent, {floor['child']:.1f} in the child)")
    if args.profile:
        print_profile(profile_dir, args.top)


if __name__ == "__main__":
    main()
