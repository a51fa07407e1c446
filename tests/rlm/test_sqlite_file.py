"""The library's SQLite files opened by sixteen agents at once: none is refused because another opened it first."""

from __future__ import annotations

import threading
from pathlib import Path

from rlmfamily.a2a.store import DelegationStore

AGENTS = 16
ROUNDS = 200  # before the fix, 16 agents were refused in about one round of 50


def test_sixteen_agents_opening_a_new_store_together_all_get_it(tmp_path: Path) -> None:
    refused: list[str] = []
    for round_no in range(ROUNDS):
        path = tmp_path / str(round_no) / "a2a.sqlite3"
        barrier = threading.Barrier(AGENTS)

        def agent() -> None:
            barrier.wait()
            try:
                DelegationStore(path)
            except Exception as exc:  # the assertion shows it
                refused.append(repr(exc))

        threads = [threading.Thread(target=agent) for _ in range(AGENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert refused == []
