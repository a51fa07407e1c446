"""What bounding a body costs the edge's event loop, against what the a2a-sdk's parse of the same body costs.

    .venv/bin/python bench/edge_bodies.py [--rounds 20]

In process, no server: for each body, the median and worst of ``rounds`` runs of
  edge      the guard's pre-scan (app/bodies.py ``count_elements`` and ``check_numbers``, and
            ``check_json_text``), which runs on every A2A body before anything parses it;
  baseline  the SDK's parse of the same params (``json.loads`` then protobuf's ``ParseDict``
            into a ``SendMessageRequest``), what ran on the loop before (issue 15, item 2);
            skipped for a body the pre-scan refuses, which the SDK never sees now.
Bodies: the two of the issue (refused), the largest admissible ones (2 MiB of text; 20,000
values, the SPECIALISTS_MAX_BODY_ELEMENTS default; 2 MiB of commas inside strings, the worst
for the exact count).

A benchmark is not a test: it prints figures and ratios and never fails on speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project, before bench/ (bench/ledger.py)

from a2a.types.a2a_pb2 import SendMessageRequest  # noqa: E402
from google.protobuf.json_format import ParseDict  # noqa: E402

from app.bodies import check_numbers, count_elements  # noqa: E402
from app.errors import EdgeError  # noqa: E402
from app.middleware import check_json_text  # noqa: E402
from core.settings import Settings  # noqa: E402


def envelope(message: dict) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}).encode()


def bodies() -> dict[str, bytes]:
    base = {"messageId": "m-1", "role": "ROLE_USER"}
    return {
        "100k parts (refused)": envelope({**base, "parts": [{"text": "a"}] * 100_000}),
        "150k metadata keys (refused)": envelope(
            {**base, "parts": [{"text": "a"}], "metadata": {f"k{i}": 1 for i in range(150_000)}}),
        "2 MiB of text": envelope({**base, "parts": [{"text": "x" * (2 * 1024 * 1024 - 200)}]}),
        "20,000 values (data)": envelope({**base, "parts": [{"data": {"v": list(range(19_980))}}]}),
        "2 MiB of commas in a string": envelope({**base, "parts": [{"text": ", " * (1024 * 1024 - 200)}]}),
    }


def timed(run: Callable[[], object], rounds: int) -> tuple[float, float]:
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1000, max(seconds) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    rounds = parser.parse_args().rounds
    edge = Settings().edge
    for name, body in bodies().items():
        def prescan(body: bytes = body) -> bool:
            try:
                count_elements(body, edge.max_body_elements)
                check_json_text(body, edge.max_json_depth)
                check_numbers(body, edge)
            except EdgeError:
                return False
            return True

        admitted = prescan()
        scan_ms, scan_worst_ms = timed(prescan, rounds)
        line = f"{name:32} {len(body):>9,} B  edge pre-scan {scan_ms:6.1f} ms (worst {scan_worst_ms:6.1f})"
        if admitted:
            sdk_ms, _ = timed(lambda: ParseDict(json.loads(body)["params"], SendMessageRequest()), max(3, rounds // 4))
            line += f"  baseline SDK parse {sdk_ms:7.1f} ms  ratio {scan_ms / sdk_ms:5.2f}"
        else:
            line += "  refused: the SDK never parses it"
        print(line, flush=True)


if __name__ == "__main__":
    main()
