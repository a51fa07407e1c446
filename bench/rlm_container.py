"""Benchmark of the container kernel (issue 39): its start cost and its per-step overhead beside the host kernel's.

Run: .venv/bin/python bench/rlm_container.py [--starts 10] [--steps 200] [--engine auto|podman|docker]

Both kernels run the same child process (kernels/_host_child.py) and frames; the
container kernel starts it with the engine's ``exec -i`` inside the run's container.
Printed side by side, each a median over rounds measured in this same process:

- start: host kernel start + close, against the container's whole life for a run
  (engine found and checked, orphans swept, container started until its keeper is
  ready, kernel child started in it, then closed and removed), with that life
  split into its parts;
- a trivial step, a step that prints 64 KiB, and a host-call round trip (``ping()``
  answered by the parent), on each kernel;
- a whole scripted run (``Session.run``: 3 steps and the answer) on each kernel.

The image is the local one (``rlm container image``), built or reused first. A
benchmark, not a test: it never fails on speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "library"))

from rlmfamily.container.engine import find_engine  # noqa: E402
from rlmfamily.container.image import build_image  # noqa: E402
from rlmfamily.container.sandbox import RunContainer  # noqa: E402
from rlmfamily.context import Context  # noqa: E402
from rlmfamily.kernels.container import ContainerKernel  # noqa: E402
from rlmfamily.kernels.host import HostKernel  # noqa: E402
from rlmfamily.providers import ScriptedProvider  # noqa: E402
from rlmfamily.session import Session  # noqa: E402
from rlmfamily.settings import RLMSettings, load_settings  # noqa: E402
from rlm_kernels import median_s  # noqa: E402  (bench/ is the script's folder, first on sys.path)

CALLS_PER_STEP = 100
STEPS = {"trivial step": "x = 1", "step printing 64 KiB": "print('x' * 65536)"}
RUN_SCRIPT = {"root": [{"code": "x = 41"}, {"code": "x += 1\nprint(x)"}, {"code": "print(len(context.files()))"},
                       {"code": "final_answer(str(x))"}]}


def ok(result: object) -> object:
    assert getattr(result, "ok", True), result
    return result


def container_life(settings: RLMSettings, workspace: Path, parts: dict[str, list[float]]) -> None:
    """One run's container from nothing to removed, its parts timed."""
    t0 = time.perf_counter()
    engine = find_engine(settings)
    t1 = time.perf_counter()
    from rlmfamily.container.sandbox import ContainerLimits, sweep_orphans

    sweep_orphans(engine)
    t2 = time.perf_counter()
    box = RunContainer(engine, ContainerLimits.from_settings(settings), run_id="bench", workspace=workspace)
    box.start()
    t3 = time.perf_counter()
    kernel = ContainerKernel(box, settings.kernel_limits())
    kernel.start({"ping": lambda: 1}, "")
    t4 = time.perf_counter()
    kernel.close()
    box.close()
    t5 = time.perf_counter()
    for name, seconds in (("engine found and image checked", t1 - t0), ("orphans swept", t2 - t1),
                          ("container started (keeper ready)", t3 - t2), ("kernel child started in it", t4 - t3),
                          ("kernel closed, container removed", t5 - t4), ("whole life", t5 - t0)):
        parts.setdefault(name, []).append(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10, help="kernel starts per median (default 10)")
    parser.add_argument("--steps", type=int, default=200, help="steps per median (default 200)")
    parser.add_argument("--runs", type=int, default=5, help="whole scripted runs per median (default 5)")
    parser.add_argument("--engine", default="auto", choices=("auto", "podman", "docker"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlm-container-bench-") as tmp:
        folder = Path(tmp)
        probe = load_settings(data_dir=folder / "data", container_engine=args.engine)
        engine = find_engine(probe, check_image=False)
        built = build_image(engine)
        settings = load_settings(data_dir=folder / "data", container_engine=engine.kind, container_image=built.name)
        workspace = folder / "workspace"
        workspace.mkdir()
        (workspace / "a.txt").write_text("a file\n")
        limits = settings.kernel_limits()
        print(f"RLM container kernel against the host kernel: {engine.kind} ({engine.path}), image {built.build_tag} "
              f"({'reused' if built.reused else 'built'}), load average {' '.join(f'{v:.2f}' for v in __import__('os').getloadavg())}")

        def host_life() -> None:
            kernel = HostKernel(limits)
            kernel.start({"ping": lambda: 1}, "")
            kernel.close()

        host_start = median_s(host_life, args.starts)
        parts: dict[str, list[float]] = {}
        for _ in range(args.starts + 1):
            container_life(settings, workspace, parts)
        container_start = statistics.median(parts["whole life"][1:])
        print(f"\nstart (median of {args.starts}):")
        print(f"  {'host kernel: start + close':48} {host_start * 1e3:9.1f} ms")
        print(f"  {'container: whole life for a run':48} {container_start * 1e3:9.1f} ms   "
              f"x{container_start / host_start:.1f}, +{(container_start - host_start) * 1e3:.0f} ms")
        for name, samples in parts.items():
            if name != "whole life":
                print(f"    {name:46} {statistics.median(samples[1:]) * 1e3:9.1f} ms")

        print(f"\nper step (median of {args.steps}; host calls: {CALLS_PER_STEP} in a step, per call):")
        print(f"  {'what':34} {'host kernel':>12} {'container':>12} {'overhead':>11}")
        box = RunContainer.open(settings, run_id="bench", workspace=workspace)
        try:
            with HostKernel(limits) as host, ContainerKernel(box, limits) as inside:
                host.start({"ping": lambda: 1}, "")
                inside.start({"ping": lambda: 1}, "")
                for name, code in STEPS.items():
                    on_host = median_s(lambda: ok(host.execute(code)), args.steps)
                    in_box = median_s(lambda: ok(inside.execute(code)), args.steps)
                    print(f"  {name:34} {on_host * 1e3:9.3f} ms {in_box * 1e3:9.3f} ms "
                          f"{(in_box - on_host) * 1e3:+8.3f} ms")
                loop = f"for _ in range({CALLS_PER_STEP}):\n    ping()"
                calls = max(args.steps // 10, 5)
                host_loop = median_s(lambda: ok(host.execute(loop)), calls)
                box_loop = median_s(lambda: ok(inside.execute(loop)), calls)
                host_call = host_loop / CALLS_PER_STEP
                box_call = box_loop / CALLS_PER_STEP
                print(f"  {'host-call round trip':34} {host_call * 1e6:9.1f} us {box_call * 1e6:9.1f} us "
                      f"{(box_call - host_call) * 1e6:+8.1f} us")
        finally:
            box.close()

        def whole_run(kernel: str) -> None:
            result = Session(context=Context.from_repository(workspace, settings), settings=settings, kernel=kernel,
                             provider=ScriptedProvider(RUN_SCRIPT)).run("bench")
            assert result.answer == "42", result.error

        on_host = median_s(lambda: whole_run("host"), args.runs)
        in_box = median_s(lambda: whole_run("container"), args.runs)
        print(f"\nwhole scripted run, 4 steps (median of {args.runs}):")
        print(f"  {'host kernel':34} {on_host * 1e3:9.1f} ms")
        print(f"  {'container kernel':34} {in_box * 1e3:9.1f} ms   x{in_box / on_host:.1f}, "
              f"+{(in_box - on_host) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
