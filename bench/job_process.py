"""The job's process alone (issue 44 §1): the CPU one no-op job's one-use process costs, beside a bare fork.

    .venv/bin/python bench/job_process.py [--jobs 100] [--warmup 5] [--rlm] [--profile] [--top 25]

Starts its own database (as bench/dispatch.py: a fresh database on DATABASE_URL's server, otherwise an embedded
PostgreSQL). No HTTP, dispatcher or claim: ``workers.isolation.ProcessJobs`` is built exactly as a worker builds
it (``workers.assembly``'s recipe and runner build) and given ``--jobs`` no-op jobs of the scripted specialist,
one after the other, each waited for to its end (its process has exited).

  job       CPU per job of the job processes (the fork server waits for each, so their CPU is its children's,
            read from /proc), and of this process (the worker's side: the start, the watching thread, the
            spare's fork request), and the minor page faults of the job processes and their fork server. A no-op
            job of the scripted specialist sends no statement.
  baseline  a process forked from the same fork server as a job's is (its pipes, its status), that runs nothing
            (``workers.isolation._no_job``) and exits: the fork, the child's start and its exit, the same number of
            times.
            Beside it, the same from multiprocessing's forkserver (same preload, a process of its own started for
            it), launched as a job's process was before: its start's cost above the fork, in the same run.
  floor     the kernel's part alone: ``os.fork()`` and ``os._exit(0)`` of an interpreter that imported the same
            ``PRELOAD``, froze its collector and collapsed its heap into huge pages as the fork server does (a
            process of its own, started for it), the parent's and the child's CPU. Copying the page tables of a
            heap this size, and tearing them down at the exit, is what one process per job costs at the least.
            Beside it, the same heap in small pages (the fork server's before issue 44's ``collapse_heap``).

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
    pid = isolation.forkserver_pid()
    assert pid is not None and str(pid) in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    return pid


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
    server = isolation._SERVER
    client = server.register(isolation._no_job, None, "", b"", 0)  # type: ignore[arg-type]
    try:
        for _ in range(count):
            control, outcome = os.pipe(), os.pipe()
            child = server.spawn(client, control[0], outcome[1], lambda: None)  # forked as a job's process is
            for fd in (*control, *outcome):
                os.close(fd)
            child.join()
            assert child.exitcode == 0
            child.close()
    finally:
        server.unregister(client)


def _mp_process(target):  # type: ignore[no-untyped-def]
    """A started process of multiprocessing's forkserver (its preload ``PRELOAD``), launched as a job's process was
    before issue 44's own fork server (``workers.isolation._JobPopen`` until then): without the main module, so
    that the child does not import this file again, and with a class of multiprocessing's own."""
    import io
    import multiprocessing
    import multiprocessing.context
    import multiprocessing.forkserver
    import multiprocessing.popen_forkserver
    import multiprocessing.reduction
    import multiprocessing.spawn
    import multiprocessing.util

    class Popen(multiprocessing.popen_forkserver.Popen):  # not pickled: only the process object crosses
        def _launch(self, process_obj) -> None:  # type: ignore[no-untyped-def]
            prep_data = multiprocessing.spawn.get_preparation_data(process_obj._name)
            prep_data.pop("init_main_from_name", None)
            prep_data.pop("init_main_from_path", None)
            buf = io.BytesIO()
            multiprocessing.context.set_spawning_popen(self)
            try:
                multiprocessing.reduction.dump(prep_data, buf)
                multiprocessing.reduction.dump(process_obj, buf)
            finally:
                multiprocessing.context.set_spawning_popen(None)
            self.sentinel, w = multiprocessing.forkserver.connect_to_new_process(self._fds)
            parent_w = os.dup(w)
            self.finalizer = multiprocessing.util.Finalize(self, multiprocessing.util.close_fds,
                                                           (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = multiprocessing.forkserver.read_signed(self.sentinel)

    multiprocessing.set_forkserver_preload(list(isolation.PRELOAD))
    process = multiprocessing.context.ForkServerProcess(target=target, daemon=True)
    process._popen = Popen(process)  # what Process.start does, with this launch
    process._sentinel = process._popen.sentinel
    return process


def run_bare_multiprocessing(count: int) -> None:
    for _ in range(count):
        process = _mp_process(os.getpid)
        process.join()
        assert process.exitcode == 0


def _mp_forkserver_pid() -> int:
    from multiprocessing import forkserver

    process = _mp_process(os.getpid)  # starts the server: its imports are not a fork's
    process.join()
    return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


# Run as ``python -c FLOOR_PROBE COUNT HUGE``: the preload imported, the collector frozen, the heap collapsed into
# huge pages as the fork server's is if HUGE is 1 (``isolation.collapse_heap``), then COUNT forks that only exit;
# prints the child's and the parent's CPU ms per fork.
FLOOR_PROBE = """
import gc, importlib, os, resource, sys
from workers import isolation
for name in isolation.PRELOAD[:-1]:  # not job_template: it builds nothing outside a forkserver
    importlib.import_module(name)
gc.collect()
gc.freeze()
if sys.argv[2] == "1" and hasattr(isolation, "collapse_heap"):
    isolation.collapse_heap()
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


def fork_floor(count: int, huge: bool = True) -> dict[str, float]:
    import subprocess

    started = time.perf_counter()
    printed = subprocess.run([sys.executable, "-c", FLOOR_PROBE, str(count), "1" if huge else "0"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    child, parent = (float(value) for value in printed)
    return {"processes": child + parent, "worker": 0.0, "wall": 1000 * (time.perf_counter() - started) / count,
            "child": child, "parent": parent, "faults": float("nan")}


def tree_faults(pid: int) -> int:
    """Minor page faults of a process and of its children it has waited for (the fork server's are each job
    process's, once reaped), and of its live descendants."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(fields[7]) + int(fields[8]) + sum(tree_faults(child) for child in children)  # minflt, cminflt


def heap_mb(pid: int) -> tuple[float, float]:
    """(MB of anonymous memory in huge pages, MB anonymous) of a process (``/proc/<pid>/smaps_rollup``): what of the
    fork server's heap is still collapsed (``isolation.collapse_heap``) after the jobs it forked."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return fields.get("AnonHugePages", 0.0), fields.get("Anonymous", 0.0)


def measure(count: int, work, server: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    before_children, before_faults = tree_cpu_s(server), tree_faults(server)
    before_own, started = _own_cpu_s(), time.perf_counter()
    work(count)
    after_children, after_faults = tree_cpu_s(server), tree_faults(server)
    after_own, ended = _own_cpu_s(), time.perf_counter()
    return {"processes": 1000 * (after_children - before_children) / count,
            "worker": 1000 * (after_own - before_own) / count,
            "wall": 1000 * (ended - started) / count,
            "faults": (after_faults - before_faults) / count}


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
        os.environ[PROFILE_DIR_VARIABLE] = str(profile_dir)  # before the fork server starts: it inherits it
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
            server_huge_mb, server_anon_mb = heap_mb(server)
            mp_bare = measure(args.jobs, run_bare_multiprocessing, _mp_forkserver_pid())
            let_go = jobs.waiting_pid  # the spare forked after the last job: it runs none
        finally:
            jobs.close()
        floor = fork_floor(args.jobs)
        small_floor = fork_floor(args.jobs, huge=False)
        if let_go is not None:  # its profile (written as it exits, at the close) is no job's
            (profile_dir / f"job-{let_go}.prof").unlink(missing_ok=True)
    finally:
        drop()
    print(f"\nJob processes: {args.jobs} no-op jobs one after another{' (rlm specs served)' if args.rlm else ''}, "
          f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} before and {os.getloadavg()[0]:.2f} after")
    print(f"{'run':<34}{'processes ms':>14}{'worker ms':>11}{'wall ms':>9}{'faults':>8}   (per job)")
    for label, figures in (("no-op job (spare, build, run, exit)", job), ("bare fork of the fork server", bare),
                           ("  the same, multiprocessing's", mp_bare), ("floor: fork + _exit, same heap", floor),
                           ("  the same without huge pages", small_floor)):
        print(f"{label:<34}{figures['processes']:>14.1f}{figures['worker']:>11.1f}{figures['wall']:>9.1f}"
              f"{figures['faults']:>8.0f}")
    print(f"the job's process costs {job['processes'] - bare['processes']:.1f} ms of CPU above a bare fork's "
          f"{bare['processes']:.1f} ms; the kernel's fork and exit of this heap alone, {floor['processes']:.1f} ms "
          f"({floor['parent']:.1f} in the parent, {floor['child']:.1f} in the child)")
    print(f"the fork server's heap after {args.warmup + 2 * args.jobs} forks: {server_huge_mb:.0f} of its "
          f"{server_anon_mb:.0f} MB anonymous in huge pages")
    if args.profile:
        print_profile(profile_dir, args.top)


if __name__ == "__main__":
    main()
