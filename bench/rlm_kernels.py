"""Benchmark of the RLM execution kernels: per-step overhead, host-call round trip, checkpoints.

Run: .venv/bin/python bench/rlm_kernels.py [--steps 200] [--profile]

Every figure is a median over repeated runs, printed beside baselines measured
in the same run (plain ``exec()`` in this process, a bare pydantic-monty
``feed_run``), so the ratios say what the kernels' guarantees cost. Two more
baselines are Monty's own floors for what a kernel row does: ``feed_run`` then
``dump()`` (a step that keeps a rollback target, as every Monty kernel step does),
and a bare host call (``feed_start`` and one ``resume`` per call, no deadline):
the last column is a row's ratio against the floor it names. The last line measures
a bare ``feed_run``, the feed+dump floor and the kernel's trivial step in turn, round by
round, so that their ratios hold whatever state the machine is in: back to back, and as the
RLM loop sees a step, ``execute``'s latency after a short model turn (``--turn-ms`` of sleep,
the same before each bare ``feed_run``), for the kernel that checkpoints in ``execute`` and
the one that checkpoints in the background (``checkpoint_in_background``; "n/a" on a
library without it). The line before it is the CPU a trivial step costs (this process, all
its threads, and its Monty worker) in the loop, for both: moving the dump off the step's
path moves when it is paid, not what. ``--profile`` also prints where a kernel's trivial
step spends its time (cProfile, own time).
A benchmark, not a test: it never fails on speed.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic_monty import Monty, MontyComplete  # noqa: E402

from rlmfamily.kernels.base import KernelLimits  # noqa: E402
from rlmfamily.kernels.checkpoints import Checkpoint, FileCheckpointStore  # noqa: E402
from rlmfamily.kernels.host import HostKernel  # noqa: E402
from rlmfamily.kernels.monty import MontyKernel, monty_resource_limits, runtime_identity  # noqa: E402
from rlmfamily.namespace import PRELUDE  # noqa: E402

TRIVIAL = "x = 1"
TURN_MS = 2.0  # the model turn between two steps in the loop's view: short, so that the rounds stay quick
# Whether the library measured has background checkpoints (the bench also runs against a library from before).
BACKGROUND = "checkpoint_in_background" in inspect.signature(MontyKernel).parameters
CALLS_PER_STEP = 100
STATE_CODE = "state = ['line %d of some retained text ' % i * 3 for i in range(10000)]"  # ~1 MB
# The host functions the library's prelude calls (rlmfamily/namespace.py); here they answer nothing.
LIBRARY_BRIDGE = ("_context_files", "_context_size", "_context_stats", "_context_describe", "_context_read",
                  "_context_search", "_context_chunk", "_context_text", "_llm_query", "_llm_query_batched",
                  "_final_answer", "_history_search", "_history_read", "_history_stats")


def median_s(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def ok(result: object) -> object:
    assert getattr(result, "ok", True), result
    return result


def bare_host_calls(session: object, code: str) -> None:
    """Drive ``code`` answering every host call with 1: Monty's own cost of a call, no deadline, no thread."""
    snapshot = session.feed_start(code)  # type: ignore[attr-defined]
    while not isinstance(snapshot, MontyComplete):
        snapshot = snapshot.resume({"return_value": 1})


def monty_kernel(limits: KernelLimits, *, background: bool, **kwargs: object) -> MontyKernel:
    """A Monty kernel that checkpoints in ``execute`` or, where the library has it, in the background."""
    if background:
        kwargs["checkpoint_in_background"] = True
    return MontyKernel(limits, **kwargs)  # type: ignore[arg-type]


def alternating(limits: KernelLimits, steps: int, turn_s: float = 0.0) -> dict[str, float]:
    """Medians (seconds) of a bare ``feed_run``, a bare ``feed_run`` + ``dump()`` and the kernels' trivial step,
    measured in turn within each of ``steps`` rounds: one machine state for all (a feed's round trip to its
    worker process moves by up to 2x between runs here, with the CPUs the two processes land on), so their ratios
    hold within a run. Each session grows by its own feeds, as in a session of that many steps.

    Back to back (``turn_s`` 0): ``feed``, ``floor``, ``step``, and ``step_bg``, the background kernel's step with
    the wait for its checkpoint (what the next step would wait for). As the loop sees them (``turn_s`` > 0): the
    bare ``feed``, ``step`` and ``step_bg`` (``execute`` alone), each after ``turn_s`` of sleep, the model's
    turn, during which a background checkpoint is taken. The two are separate passes: sleeps between calls slow
    the calls that follow them, so a back-to-back figure measured beside them is not one."""
    in_loop = turn_s > 0
    names = ["feed", "step"] if in_loop else ["feed", "floor", "step"]
    names += ["step_bg"] if BACKGROUND else []
    samples: dict[str, list[float]] = {name: [] for name in names}
    with Monty() as pool, pool.checkout(limits=monty_resource_limits(limits)) as session, \
            monty_kernel(limits, background=False) as kernel, \
            monty_kernel(limits, background=BACKGROUND) as in_background:  # type: ignore[arg-type]
        kernel.start({"ping": lambda: 1}, "")
        in_background.start({"ping": lambda: 1}, "")
        measured: dict[str, Callable[[], object]] = {
            "feed": lambda: session.feed_run(TRIVIAL),
            "floor": lambda: (session.feed_run(TRIVIAL), session.dump()),
            "step": lambda: ok(kernel.execute(TRIVIAL)),
            "step_bg": (lambda: ok(in_background.execute(TRIVIAL))) if in_loop
            else (lambda: (ok(in_background.execute(TRIVIAL)), in_background.flush())),
        }
        for _ in range(steps):
            for name in names:
                if in_loop:
                    time.sleep(turn_s)
                started = time.perf_counter()
                measured[name]()
                samples[name].append(time.perf_counter() - started)
            if in_loop and BACKGROUND:
                # The model's turn after the round's last step, its checkpoint taken meanwhile: nothing of it may
                # run while the next round measures the others.
                time.sleep(turn_s)
                in_background.flush()
    return {name: statistics.median(values) for name, values in samples.items()}


def worker_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a Monty worker process so far (Linux /proc; clock ticks, so summed over many
    steps, never per step)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_step(limits: KernelLimits, steps: int, turn_s: float) -> dict[str, float]:
    """CPU seconds per trivial step in the loop, for the kernel that checkpoints in ``execute`` (``step``) and the
    one that checkpoints in the background (``step_bg``), in turn round by round: each step and the turn after it
    (its checkpoint waited for at the end), this process's every thread and the kernel's own Monty worker."""
    kernels = {"step": monty_kernel(limits, background=False)}
    if BACKGROUND:
        kernels["step_bg"] = monty_kernel(limits, background=True)
    spent = dict.fromkeys(kernels, 0.0)
    try:
        for kernel in kernels.values():
            kernel.start({"ping": lambda: 1}, "")
            for _ in range(20):
                ok(kernel.execute(TRIVIAL))
        pids = {name: kernel.worker_pid for name, kernel in kernels.items()}
        for _ in range(steps):
            for name, kernel in kernels.items():
                before = time.process_time() + worker_cpu_s(pids[name])
                ok(kernel.execute(TRIVIAL))
                time.sleep(turn_s)
                if name == "step_bg":
                    kernel.flush()
                spent[name] += time.process_time() + worker_cpu_s(pids[name]) - before
        assert pids == {name: kernel.worker_pid for name, kernel in kernels.items()}, "a worker was replaced"
    finally:
        for kernel in kernels.values():
            kernel.close()
    return {name: total / steps for name, total in spent.items()}


def profile_trivial_step(limits: KernelLimits, steps: int) -> None:
    """Where a kernel's trivial step spends its time: own time per function over ``steps`` steps."""
    with MontyKernel(limits) as kernel:
        kernel.start({"ping": lambda: 1}, "")
        for _ in range(20):
            ok(kernel.execute(TRIVIAL))
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            kernel.execute(TRIVIAL)
        profiler.disable()
    print(f"\nwhere a trivial step's time goes (cProfile, own time, {steps} steps, memory checkpoint):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per median (default 200)")
    parser.add_argument("--profile", action="store_true", help="also profile the kernel's trivial step")
    parser.add_argument("--turn-ms", type=float, default=TURN_MS,
                        help=f"the model turn (sleep) before each step in the loop's view (default {TURN_MS:g})")
    args = parser.parse_args()
    steps = args.steps
    turn_s = args.turn_ms / 1e3
    # (what, seconds, note, floor): floor is the baseline row of Monty's own cost it is compared with
    rows: list[tuple[str, float, str, str]] = []
    limits = KernelLimits()
    bridge = {"ping": lambda: 1}

    namespace: dict[str, object] = {}
    code = compile(TRIVIAL, "<bench>", "exec")
    baseline = median_s(lambda: exec(code, namespace), steps)
    rows.append(("baseline: exec() in-process, trivial step", baseline, "", ""))

    loop = f"for _ in range({CALLS_PER_STEP}):\n    ping()"
    with Monty() as pool, pool.checkout(limits=monty_resource_limits(limits)) as session:  # type: ignore[arg-type]
        bare = median_s(lambda: session.feed_run(TRIVIAL), steps)
        bare_kept = median_s(lambda: (session.feed_run(TRIVIAL), session.dump()), steps)
        bare_start = median_s(lambda: bare_host_calls(session, TRIVIAL), steps)
        bare_calls = median_s(lambda: bare_host_calls(session, loop), max(steps // 10, 5))
        bare_dump = len(session.dump())
        bare_feeds = 3 * (steps + 1) + max(steps // 10, 5) + 1
    floors = {"feed+dump": bare_kept, "call": (bare_calls - bare_start) / CALLS_PER_STEP}
    rows.append(("baseline: bare Monty feed_run, trivial", bare, "", ""))
    rows.append(("baseline: bare Monty feed_run + dump() (floor)", bare_kept,
                 f"a step with a rollback target; dump {bare_dump / 1e3:.0f} KB after {bare_feeds} feeds", ""))
    rows.append(("baseline: bare Monty host call (resume) (floor)", floors["call"], "per call", ""))

    with HostKernel(limits) as host:
        host.start(bridge, "")
        host_step = median_s(lambda: ok(host.execute(TRIVIAL)), steps)
        host_calls = median_s(lambda: ok(host.execute(loop)), max(steps // 10, 5))
        ok(host.execute(STATE_CODE))
        host_state_step = median_s(lambda: ok(host.execute(TRIVIAL)), max(steps // 10, 5))
    rows.append(("host kernel: trivial step", host_step, "", ""))
    rows.append(("host kernel: host-call round trip", (host_calls - host_step) / CALLS_PER_STEP, "per call", ""))
    rows.append(("host kernel: trivial step with ~1 MB state", host_state_step, "pickles the namespace", ""))

    with MontyKernel(limits) as monty:
        monty.start(bridge, "")
        monty_step = median_s(lambda: ok(monty.execute(TRIVIAL)), steps)
        monty_calls = median_s(lambda: ok(monty.execute(loop)), max(steps // 10, 5))
        assert monty.last_checkpoint is not None
        monty_dump = len(monty.last_checkpoint.dump)
    rows.append(("monty kernel: trivial step (memory checkpoint)", monty_step,
                 f"dump {monty_dump / 1e3:.0f} KB after {steps + max(steps // 10, 5) + 2} steps", "feed+dump"))
    rows.append(("monty kernel: host-call round trip", (monty_calls - monty_step) / CALLS_PER_STEP, "per call", "call"))

    with MontyKernel(limits) as library:
        library.start({name: (lambda *a: None) for name in LIBRARY_BRIDGE}, PRELUDE)
        library_step = median_s(lambda: ok(library.execute(TRIVIAL)), steps)
        assert library.last_checkpoint is not None
        library_dump = len(library.last_checkpoint.dump)
    rows.append(("monty kernel + library prelude: trivial step", library_step,
                 f"dump {library_dump / 1e3:.0f} KB after {steps + 1} steps", "feed+dump"))

    with tempfile.TemporaryDirectory() as folder:
        for fsync in (False, True):
            store = FileCheckpointStore(Path(folder) / f"fsync-{fsync}", fsync=fsync)
            with MontyKernel(limits, store=store, session_id="bench") as stored:
                stored.start(bridge, "")
                n = steps if not fsync else max(steps // 4, 5)
                stored_step = median_s(lambda: ok(stored.execute(TRIVIAL)), n)
                stored_calls = median_s(lambda: ok(stored.execute(loop)), max(steps // 20, 3))
                label = "fsync" if fsync else "no fsync"
                rows.append((f"monty kernel + file store ({label}): trivial step", stored_step, "", "feed+dump"))
                rows.append(
                    (f"monty kernel + file store ({label}): host call + snapshot",
                     (stored_calls - stored_step) / CALLS_PER_STEP, "per call, dumped first", "call")
                )
            # The hosted worker's case: only the paid calls are snapshotted; a cheap one (ping here) is not.
            store = FileCheckpointStore(Path(folder) / f"named-{fsync}", fsync=fsync)
            with MontyKernel(limits, store=store, session_id="bench", record_pending_calls={"_llm_query"}) as named:
                named.start({**bridge, "_llm_query": lambda *args: None}, "")  # the named call, never made here
                named_step = median_s(lambda: ok(named.execute(TRIVIAL)), max(steps // 4, 5) if fsync else steps)
                named_calls = median_s(lambda: ok(named.execute(loop)), max(steps // 20, 3))
                rows.append((f"monty kernel + file store ({label}): host call, not snapshotted",
                             (named_calls - named_step) / CALLS_PER_STEP, "record_pending_calls={'_llm_query'}", "call"))

        store = FileCheckpointStore(Path(folder) / "sized-steps")
        with MontyKernel(limits, store=store, session_id="sized") as stored_sized:
            stored_sized.start({}, "")
            ok(stored_sized.execute(STATE_CODE))
            before = stored_sized.stored_bytes
            n = max(steps // 10, 5)
            stored_state_step = median_s(lambda: ok(stored_sized.execute(TRIVIAL)), n)
            per_step = (stored_sized.stored_bytes - before) / (n + 1)
        rows.append(("monty kernel + file store (fsync): trivial step, ~1 MB state", stored_state_step,
                     f"{per_step / 1e3:.1f} KB stored per step, amortized", ""))

        with MontyKernel(limits) as sized:
            sized.start({}, "")
            ok(sized.execute(STATE_CODE))
            state_step = median_s(lambda: ok(sized.execute(TRIVIAL)), max(steps // 10, 5))
            session = sized._session  # the bench looks inside: dump cost alone
            assert session is not None
            dump_s = median_s(session.dump, 20)
            dump = session.dump()
            checkpoint = Checkpoint.create(
                session_id="bench", seq=1, kind="session", dump=dump, identity=runtime_identity(),
                limits=monty_resource_limits(limits),
            )
            encode_s = median_s(checkpoint.encode, 20)
            record = checkpoint.encode()
            ok(sized.execute(TRIVIAL))
            after = Checkpoint.create(
                session_id="bench", seq=2, kind="session", dump=session.dump(), identity=runtime_identity(),
                limits=monty_resource_limits(limits),
            )
            delta_s = median_s(lambda: after.encode(base=checkpoint), 20)
            delta_record = after.encode(base=checkpoint)
            decode_s = median_s(lambda: Checkpoint.decode(record).verify(
                identity=runtime_identity(), limits=monty_resource_limits(limits)), 20)
            store = FileCheckpointStore(Path(folder) / "sized")
            counter = iter(range(10**9))
            put_s = median_s(lambda: store.put("sized", next(counter), record), 20)
        rows.append(("monty kernel: trivial step with ~1 MB state", state_step, "", ""))
        rows.append(("checkpoint of ~1 MB state: session.dump()", dump_s, f"{len(dump) / 1e6:.2f} MB dump", ""))
        rows.append(("checkpoint of ~1 MB state: encode (sha256)", encode_s, f"{len(record) / 1e6:.2f} MB record", ""))
        rows.append(("checkpoint of ~1 MB state: encode as a delta", delta_s,
                     f"{len(delta_record) / 1e3:.1f} KB record after a trivial step", ""))
        rows.append(("checkpoint of ~1 MB state: decode + verify", decode_s, "", ""))
        rows.append(("checkpoint of ~1 MB state: file put (fsync)", put_s, "", ""))

    empty = MontyKernel(limits)
    empty.start({}, "")
    empty_size = len(empty.last_checkpoint.encode()) if empty.last_checkpoint else 0
    empty.close()

    print(f"RLM kernels, median of {steps} steps (fewer for slow rows)")
    print("ratios: row / exec() in-process, row / bare Monty feed_run, and row / its floor (feed+dump: a bare")
    print("feed_run then dump(); call: a bare host call)")
    print(f"{'what':64} {'median':>11} {'/exec':>8} {'/feed':>7} {'/floor':>14}  note")
    for what, seconds, note, floor in rows:
        against = f"{seconds / floors[floor]:>5.2f}x {floor:<8}" if floor else ""
        print(f"{what:64} {seconds * 1e6:>9.1f}us {seconds / baseline:>7.0f}x {seconds / bare:>6.1f}x {against:>14}  {note}")
    print(f"empty Monty session checkpoint record: {empty_size} bytes")
    cpu = cpu_per_step(limits, steps, turn_s)
    print(f"CPU per trivial step in the loop ({args.turn_ms:g} ms turn; this process and its Monty worker, in turn): "
          f"checkpoint in execute {cpu['step'] * 1e6:.1f}us, in the background "
          + (f"{cpu['step_bg'] * 1e6:.1f}us" if "step_bg" in cpu else "n/a"))
    b2b = alternating(limits, steps)
    loop = alternating(limits, steps, turn_s)

    def step_of(m: dict[str, float], name: str) -> str:
        return f"{m[name] * 1e6:.1f}us ({m[name] / m['feed']:.2f}x feed)" if name in m else "n/a"

    print(f"alternating, {steps} rounds (one state of the machine for all): bare feed_run {b2b['feed'] * 1e6:.1f}us, "
          f"feed_run + dump() {b2b['floor'] * 1e6:.1f}us ({b2b['floor'] / b2b['feed']:.2f}x feed), the kernel's "
          f"trivial step {step_of(b2b, 'step')}, {b2b['step'] / b2b['floor']:.2f}x feed+dump; in the background, its "
          f"checkpoint waited for {step_of(b2b, 'step_bg')} | in the loop ({args.turn_ms:g} ms turn before each): "
          f"bare feed_run {loop['feed'] * 1e6:.1f}us, the kernel's step {step_of(loop, 'step')}, in the background "
          f"{step_of(loop, 'step_bg')}")
    if args.profile:
        profile_trivial_step(limits, max(steps * 5, 100))


if __name__ == "__main__":
    main()
