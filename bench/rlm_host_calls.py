"""Benchmark of the host side of the sandbox's calls: what adversarial arguments cost (issue 15).

Run: .venv/bin/python bench/rlm_host_calls.py [--items 20000] [--with-python-re]

Prints, each next to its baseline in the same run:
- ``Context.from_bundle`` with ``--items`` evidence items (unique paths, and every
  path quoted twice), against building the same number of plain ``Document``s;
- ``context.search`` of the patterns that froze a worker (``(a+)+$`` on 29 ``a`` and
  ``!``, ``(\\w+\\s?)+$``), and of a pattern that defeats RE2's DFA on a 2 MB file,
  against a literal search of the same text. With ``--with-python-re`` it also
  times Python's ``re`` on the first two in a child process cut off at 30 s (what
  the search used before), so a reader sees the before beside the after.

A benchmark, not a test: it never fails on speed.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlmfamily.context import Context, Document  # noqa: E402
from rlmfamily.settings import load_settings  # noqa: E402

PYTHON_RE_CUTOFF_S = 30


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_bundle(items: int) -> None:
    settings = load_settings(data_dir="/tmp/rlm-bench", max_bundle_items=max(items, 1), max_files=max(items, 1))
    unique = [{"path": f"src/file_{i}.py", "start": 0, "end": 5, "text": "hello"} for i in range(items)]
    twice = [{"path": f"src/file_{i // 2}.py", "start": 10 * (i % 2), "end": 10 * (i % 2) + 5, "text": "hello"}
             for i in range(items)]
    baseline = _timed(lambda: [Document(d["path"], 5, 0, None, d["text"]) for d in unique])
    for name, bundle in (("unique paths", unique), ("each path twice", twice)):
        took = _timed(lambda: Context.from_bundle(bundle, settings))  # noqa: B023 - called at once
        print(f"from_bundle {items:>7,} items, {name:<15} {took:8.3f} s   (plain Documents: {baseline:.3f} s, "
              f"x{took / baseline:,.0f})")


def _python_re(pattern: str, text: str) -> str:
    program = f"import re\nre.compile({pattern!r}, re.MULTILINE).search({text!r})\n"
    started = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-c", program], timeout=PYTHON_RE_CUTOFF_S, check=True)
    except subprocess.TimeoutExpired:
        return f"> {PYTHON_RE_CUTOFF_S} s (cut off)"
    return f"{time.perf_counter() - started:.2f} s"


def bench_search(with_python_re: bool) -> None:
    settings = load_settings(data_dir="/tmp/rlm-bench", search_timeout_s=120, host_call_timeout_s=300)
    rng = random.Random(15)
    cases = [
        ("(a+)+$", "a" * 29 + "!"),
        (r"(\w+\s?)+$", "word " * 40 + "!"),
        (r"[ab]*a[ab]{300}c", "".join(rng.choice("ab") for _ in range(2_000_000))),
    ]
    for pattern, text in cases:
        ctx = Context.from_bundle([{"path": "e.txt", "start": 0, "end": len(text), "text": text}], settings)
        literal = _timed(lambda: ctx.search("needle"))  # noqa: B023
        took = _timed(lambda: ctx.search(pattern))  # noqa: B023
        before = f", Python re: {_python_re(pattern, text)}" if with_python_re and len(text) < 1000 else ""
        print(f"search {pattern!r:<22} on {len(text):>9,} chars: {took:8.4f} s   (literal: {literal:.4f} s{before})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--with-python-re", action="store_true")
    args = parser.parse_args()
    bench_bundle(args.items)
    bench_search(args.with_python_re)


if __name__ == "__main__":
    main()
