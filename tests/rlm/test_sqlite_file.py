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


def test_a_store_in_memory_is_one_store_per_object_shared_by_its_threads_and_writes_no_file(tmp_path: Path,
                                                                                             monkeypatch) -> None:
    """What a hosted run's budget and history are (workers/hosted_rlm/hosted.py): no file, one allowance that
    sixteen threads racing for it never overspend, and a second store of the same path that sees none of it."""
    from rlmfamily.budget import Budget, BudgetLimits
    from rlmfamily.errors import BudgetExhausted
    from rlmfamily.history import History
    from rlmfamily.sqlite_file import MEMORY

    monkeypatch.chdir(tmp_path)
    budget = Budget(MEMORY, "root", BudgetLimits(max_calls=50))
    barrier = threading.Barrier(AGENTS)
    won: list[int] = []

    def racer() -> None:
        barrier.wait()
        while True:
            try:
                budget.admit("subcall")
            except BudgetExhausted:
                return
            won.append(1)

    threads = [threading.Thread(target=racer) for _ in range(AGENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 50 and budget.snapshot().calls == 50
    assert Budget(MEMORY, "root", BudgetLimits(max_calls=50)).snapshot().calls == 0  # another object, another store
    history = History(MEMORY, "run-1")
    entry = history.add("output", "printed by step 1")
    assert history.read(entry) == "printed by step 1"
    assert History(MEMORY, "run-1").search("printed") == []
    assert list(tmp_path.iterdir()) == []  # nothing on disk, not even a file named :memory:
