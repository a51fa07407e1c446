"""Benchmark of a Monty step as a real ``rlmfamily.Session`` pays for it: the record on the loop's path or off it.

Run: .venv/bin/python bench/rlm_session_steps.py [--rounds 6] [--turns 30] [--turn-ms 3]

Each run is a real Session (the library's default extensions, its fsync'd file
checkpoint store, its journal, history and budget) with the scripted provider,
whose root calls take ``--turn-ms`` (the model's turn), each asking for one
trivial step (``x = 1``), then the answer. Three kernels, run in turn within each
round (the order rotates), so that their ratios hold whatever the machine does:

- ``sync``: ``MontyKernel`` that takes each step's dump and record in ``execute``;
- ``waited``: the kernel that checkpoints in the background, waited for right after
  ``execute`` (what a Session that waits for the record before the step's trajectory
  line pays: the record overlaps nothing);
- ``background``: the same kernel, not waited for: its record is stored while the
  Session goes on (history, trajectory, budget, the next model call).

Printed per kernel: the loop's path between two model calls (from one root call's
return to the next one's start: the turn's line, the step, its history and
trajectory lines, the next turn's admission), median and 90th percentile over
every gap of every round, the median run's total wall time, and each against
``sync`` measured in the same rounds. A benchmark, not a test: it never fails on speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlmfamily.context import Context  # noqa: E402
from rlmfamily.kernels.checkpoints import FileCheckpointStore  # noqa: E402
from rlmfamily.kernels.monty import MontyKernel  # noqa: E402
from rlmfamily.providers import ScriptedProvider  # noqa: E402
from rlmfamily.session import Session  # noqa: E402
from rlmfamily.settings import RLMSettings, load_settings  # noqa: E402

TRIVIAL = "x = 1"
KERNELS = ("sync", "waited", "background")


class _Waited(MontyKernel):
    """The background kernel, waited for right after each step (the Session of 87ad9fb did it before the step's
    trajectory line): nothing overlaps the record."""

    def execute(self, code: str) -> Any:
        result = super().execute(code)
        self.flush()
        return result


def kernel_factory(kind: str) -> Callable[..., MontyKernel]:
    """As ``composition.default_kernel_factory`` builds the library's Monty kernel, with the checkpoint's place."""
    def build(name: str, settings: RLMSettings, run_dir: Path, run_id: str, **kwargs: Any) -> MontyKernel:
        cls = _Waited if kind == "waited" else MontyKernel
        return cls(limits=settings.kernel_limits(), store=FileCheckpointStore(run_dir / "checkpoints"),
                   session_id=run_id, record_pending_calls=False, checkpoint_in_background=kind != "sync",
                   keep_record_before_newest=True)

    return build


class _Timed:
    """The scripted provider, with the time of every root call's start and return."""

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.default_model = inner.default_model
        self.calls: list[tuple[float, float]] = []

    def complete(self, messages: list[dict[str, Any]], **kw: Any) -> Any:
        began = time.perf_counter()
        completion = self.inner.complete(messages, **kw)
        if kw.get("purpose") == "root":
            self.calls.append((began, time.perf_counter()))
        return completion

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def one_run(kind: str, data_dir: Path, doc: Path, turns: int, turn_s: float) -> tuple[list[float], float]:
    """The gaps between root calls (seconds) and the run's wall time, for one Session on kernel ``kind``."""
    settings = load_settings(data_dir=data_dir, kernel="monty", max_turns=turns + 2)
    script = {"root": [{"code": TRIVIAL, "delay_s": turn_s}] * turns
              + [{"code": "final_answer('done')", "delay_s": turn_s}]}
    provider = _Timed(ScriptedProvider(script))
    session = Session(context=Context.from_document(doc, settings), provider=provider, settings=settings,
                      kernel="monty", kernel_factory=kernel_factory(kind))
    started = time.perf_counter()
    result = session.run("set x")
    total = time.perf_counter() - started
    assert result.answer == "done" and result.stop_reason == "answered", result
    gaps = [nxt[0] - prev[1] for prev, nxt in zip(provider.calls, provider.calls[1:])]
    return gaps, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--turns", type=int, default=30, help="trivial steps per run, one per model turn")
    parser.add_argument("--turn-ms", type=float, default=3.0, help="each root call's model turn")
    args = parser.parse_args()
    gaps: dict[str, list[float]] = {k: [] for k in KERNELS}
    totals: dict[str, list[float]] = {k: [] for k in KERNELS}
    with tempfile.TemporaryDirectory() as tmp:
        doc = Path(tmp) / "notes.txt"
        doc.write_text("the notes say nothing much\n")
        one_run("sync", Path(tmp) / "data", doc, 3, 0.0)  # warm: imports, the pool, the stores' files
        for round_no in range(args.rounds):
            order = KERNELS[round_no % 3:] + KERNELS[:round_no % 3]
            for kind in order:
                run_gaps, total = one_run(kind, Path(tmp) / "data", doc, args.turns, args.turn_ms / 1000)
                gaps[kind] += run_gaps
                totals[kind].append(total)
    base_gap = statistics.median(gaps["sync"])
    base_total = statistics.median(totals["sync"])
    print(f"Session, {args.turns} trivial steps a run, {args.turn_ms:g} ms model turn, {args.rounds} rounds "
          f"(kernels in turn), fsync'd file store")
    print(f"{'kernel':<12}{'loop path median':>18}{'p90':>10}{'x sync':>9}{'run total median':>19}{'x sync':>9}")
    for kind in KERNELS:
        gap = statistics.median(gaps[kind])
        p90 = statistics.quantiles(gaps[kind], n=10)[-1]
        total = statistics.median(totals[kind])
        print(f"{kind:<12}{gap * 1e3:>15.3f} ms{p90 * 1e3:>7.3f} ms{gap / base_gap:>9.2f}"
              f"{total * 1e3:>16.1f} ms{total / base_total:>9.2f}")


if __name__ == "__main__":
    main()
