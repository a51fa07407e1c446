"""One inference allowance per root: atomic across threads and processes, durable, honest about unknown usage."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rlmfamily.budget import Budget, BudgetLedger, BudgetLimits
from rlmfamily.errors import BudgetExhausted, BudgetLimitsMismatch, BudgetUnknownUsage, ReconcileRefused
from rlmfamily.providers.base import Usage

pytestmark = pytest.mark.timeout(60)

RACER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from rlmfamily.budget import Budget, BudgetLimits
    from rlmfamily.errors import BudgetExhausted
    from rlmfamily.providers.base import Usage
    path, root, max_calls, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    budget = Budget(path, root, BudgetLimits(max_calls=max_calls))
    (go.parent / f"ready-{os.getpid()}").touch()
    while not go.exists():
        time.sleep(0.001)
    won = 0
    while True:
        try:
            entry = budget.admit("subcall")
        except BudgetExhausted:
            break
        budget.settle(entry, Usage(10, 5, 0.0))
        won += 1
    print(won)
    """
)


def _racer(path: Path, root: str, max_calls: int, go: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", RACER, str(path), root, str(max_calls), str(go)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_sixteen_threads_and_four_processes_never_admit_more_than_the_allowance(tmp_path: Path) -> None:
    path, root, allowance = tmp_path / "budget.sqlite3", "race-root", 60
    go = tmp_path / "go"
    budget = Budget(path, root, BudgetLimits(max_calls=allowance))
    processes = [_racer(path, root, allowance, go) for _ in range(4)]
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("ready-*"))) < 4:  # every process waits at the start line
        assert time.monotonic() < deadline, "racer processes did not start"
        time.sleep(0.01)
    barrier = threading.Barrier(16)
    won: list[int] = []
    lock = threading.Lock()

    def thread_racer() -> None:
        mine = 0
        barrier.wait()
        while True:
            try:
                entry = budget.admit("subcall")
            except BudgetExhausted:
                break
            budget.settle(entry, Usage(10, 5, 0.0))
            mine += 1
        with lock:
            won.append(mine)

    threads = [threading.Thread(target=thread_racer) for _ in range(16)]
    for t in threads:
        t.start()
    go.touch()
    for t in threads:
        t.join(timeout=50)
    process_wins = []
    for p in processes:
        out, err = p.communicate(timeout=50)
        assert p.returncode == 0, err
        process_wins.append(int(out.strip()))
    assert sum(won) + sum(process_wins) == allowance
    assert sum(process_wins) > 0 and sum(won) > 0, (won, process_wins)  # a real race between both kinds
    assert budget.snapshot().calls == allowance
    assert budget.snapshot().tokens == allowance * 15


def test_the_count_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "budget.sqlite3"
    script = (
        "import sys\nfrom rlmfamily.budget import Budget, BudgetLimits\nfrom rlmfamily.providers.base import Usage\n"
        "b = Budget(sys.argv[1], 'root-r', BudgetLimits(max_calls=5))\n"
        "for _ in range(3):\n    b.settle(b.admit('root'), Usage(7, 3, 0.0))\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=30)
    reopened = Budget(path, "root-r", BudgetLimits(max_calls=5))
    assert reopened.snapshot().calls == 3 and reopened.snapshot().tokens == 30
    reopened.admit("root")
    reopened.admit("root")
    with pytest.raises(BudgetExhausted) as info:
        reopened.admit("root")
    assert info.value.setting == "max_calls" and "RLM_MAX_CALLS" in info.value.message


def test_reopening_with_other_limits_is_refused(tmp_path: Path) -> None:
    Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_calls=5))
    with pytest.raises(BudgetLimitsMismatch):
        Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_calls=500))


def test_unknown_usage_without_an_estimate_blocks_a_token_limit_until_reconciled_with_a_reason(
        tmp_path: Path) -> None:
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_calls=50, max_tokens=10_000))
    budget.settle(budget.admit("subcall"), None)  # the provider did not report usage
    snap = budget.snapshot()
    assert snap.unknown_tokens == 1 and snap.tokens == 0
    with pytest.raises(BudgetUnknownUsage) as info:
        budget.admit("subcall")
    assert "rlm usage --reconcile" in info.value.message
    (entry,) = budget.ledger.entries("root", unresolved_only=True)
    with pytest.raises(ReconcileRefused):
        budget.ledger.reconcile(entry.id, tokens=400, usd=None, reason="  ")
    reconciled = budget.ledger.reconcile(entry.id, tokens=400, usd=None, reason="provider dashboard, request abc")
    assert reconciled.state == "reconciled" and reconciled.reason == "provider dashboard, request abc"
    budget.admit("subcall")
    assert budget.snapshot().tokens == 400


def test_unknown_usage_counts_at_its_estimate_for_admission_and_stays_unknown_in_the_books(tmp_path: Path) -> None:
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_calls=50, max_tokens=10_000))
    budget.mark_unknown(budget.admit("subcall", tokens_estimate=6_000), "no answer within 120 s")
    budget.admit("root", tokens_estimate=3_000)  # 6,000 estimated + 3,000 fits in 10,000
    with pytest.raises(BudgetExhausted) as info:
        budget.admit("root", tokens_estimate=3_000)  # 6,000 + 3,000 in flight + 3,000 does not
    assert info.value.setting == "max_tokens" and "6,000 estimated for 1 call(s) of unknown usage" in info.value.message
    snap = budget.snapshot()
    assert snap.unknown_tokens == 1 and snap.unknown_tokens_estimate == 6_000 and snap.tokens == 0
    (entry,) = budget.ledger.entries("root", unresolved_only=True)
    assert entry.state == "unknown" and entry.tokens is None
    budget.ledger.reconcile(entry.id, tokens=1_000, usd=None, reason="provider dashboard, request abc")
    budget.admit("root", tokens_estimate=3_000)  # the real 1,000 replaced the estimate
    assert budget.snapshot().unknown_tokens_estimate == 0 and budget.snapshot().tokens == 1_000


def test_other_calls_leave_the_reserve_and_the_final_answer_call_is_always_admitted(tmp_path: Path) -> None:
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_calls=10, max_tokens=10_000))
    budget.settle(budget.admit("root", tokens_estimate=5_000, keep_tokens=2_000), Usage(7_000, 500, 0.0))
    with pytest.raises(BudgetExhausted) as info:
        budget.admit("subcall", tokens_estimate=1_000, keep_tokens=2_000)  # 7,500 + 1,000 + 2,000 > 10,000
    assert "RLM_FINAL_RESERVE_TOKENS" in info.value.message
    budget.mark_unknown(budget.admit("root_final", tokens_estimate=3_000, final=True), "no usage")
    assert budget.snapshot().calls == 2 and budget.snapshot().unknown_tokens == 1


def test_unknown_usage_does_not_block_a_calls_only_allowance(tmp_path: Path) -> None:
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_calls=5))
    budget.mark_unknown(budget.admit("subcall"), "timeout")
    budget.admit("subcall")
    assert budget.snapshot().unknown_tokens == 1


def test_unknown_cost_blocks_a_usd_limit(tmp_path: Path) -> None:
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_usd=1.0))
    budget.settle(budget.admit("root"), Usage(100, 10, None))  # a model without a price
    with pytest.raises(BudgetUnknownUsage) as info:
        budget.admit("root")
    assert info.value.setting == "max_usd"


def test_calls_in_flight_count_at_their_usd_estimates_so_a_batch_cannot_spend_past_the_cap(tmp_path: Path) -> None:
    # Measured by bench/rlm_vs_rlms.py: four sub-calls admitted together under a $0.05 cap spent $0.10.
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_usd=0.05))
    first = budget.admit("subcall", usd_estimate=0.03)
    second = budget.admit("subcall", usd_estimate=0.03)  # $0.03 in flight: under the cap
    with pytest.raises(BudgetExhausted) as refused:
        budget.admit("subcall", usd_estimate=0.03)
    assert refused.value.setting == "max_usd" and "in flight" in refused.value.message
    budget.settle(first, Usage(100, 10, 0.001))
    budget.settle(second, Usage(100, 10, 0.001))  # settled far below their estimates: room again
    budget.admit("subcall", usd_estimate=0.03)
    assert budget.ledger.snapshot("root").usd == pytest.approx(0.002)


def test_a_call_in_flight_when_its_process_died_becomes_unknown(tmp_path: Path) -> None:
    # Admitted without an estimate, so there is nothing to count it at: it blocks the token limit.
    path = tmp_path / "b.sqlite3"
    script = (
        "import os, sys\nfrom rlmfamily.budget import Budget, BudgetLimits\n"
        "b = Budget(sys.argv[1], 'root', BudgetLimits(max_calls=10, max_tokens=1000))\n"
        "b.admit('subcall')\nos._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=30)
    budget = Budget(path, "root", BudgetLimits(max_calls=10, max_tokens=1000))
    with pytest.raises(BudgetUnknownUsage):
        budget.admit("subcall")
    (entry,) = budget.ledger.entries("root", unresolved_only=True)
    assert entry.state == "unknown" and "process ended" in (entry.note or "")


def test_a_late_answer_settles_a_call_given_up_as_unknown(tmp_path: Path) -> None:
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_tokens=1000))
    entry = budget.admit("subcall")
    budget.mark_unknown(entry, "no answer within 1 s")
    budget.settle(entry, Usage(40, 2, 0.0))
    assert budget.snapshot().unknown_tokens == 0 and budget.snapshot().tokens == 42


def test_calls_can_be_kept_back_for_the_final_answer(tmp_path: Path) -> None:
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_calls=3))
    budget.admit("root", keep_calls=1)
    budget.admit("subcall", keep_calls=1)
    with pytest.raises(BudgetExhausted):
        budget.admit("subcall", keep_calls=1)
    budget.admit("root_final", final=True)
    with pytest.raises(BudgetExhausted):
        budget.admit("root_final", final=True)


def test_each_member_keeps_its_final_call_until_it_uses_it_ends_or_its_process_dies(tmp_path: Path) -> None:
    path, limits = tmp_path / "b.sqlite3", BudgetLimits(max_calls=3, max_tokens=10_000)
    root = Budget(path, "root", limits, member="root", final_reserve_tokens=1_000)
    # Another process keeps a member's final call (as a child's process does), and is killed.
    script = ("import sys\nfrom rlmfamily.budget import Budget, BudgetLimits\n"
              "Budget(sys.argv[1], 'root', BudgetLimits(max_calls=3, max_tokens=10_000), member='root.c1', "
              "final_reserve_tokens=1_000)\nprint('kept', flush=True)\nsys.stdin.read()\n")  # alive until killed
    child = subprocess.Popen([sys.executable, "-c", script, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "kept"
        assert root.ledger.kept_calls("root") == 2
        with pytest.raises(BudgetExhausted) as info:  # 8,500 + the root's 1,000 fit; the child's 1,000 is kept too
            root.admit("root", tokens_estimate=8_500, keep_calls=1, keep_tokens=1_000)
        assert info.value.setting == "max_tokens"
        root.admit("root", keep_calls=1, keep_tokens=1_000)
        with pytest.raises(BudgetExhausted) as info:  # 1 admitted + 1 kept by root + 1 kept by root.c1 = 3
            root.admit("subcall", keep_calls=1, keep_tokens=1_000)
        assert info.value.setting == "max_calls" and "2 kept for final answers" in info.value.message
    finally:
        child.kill()
        child.wait(timeout=30)
    # Its process is gone, so nobody can ask for its answer: its kept call is the family's again.
    assert root.ledger.kept_calls("root") == 1
    root.admit("subcall", keep_calls=1)
    root.admit("root_final", final=True)  # uses the root's own kept call
    assert root.ledger.kept_calls("root") == 0
    other = Budget(path, "root", limits, member="root.c2")
    other.release()
    assert root.ledger.kept_calls("root") == 0 and root.snapshot().calls == 3


def test_a_token_limit_stops_admission_once_spent(tmp_path: Path) -> None:
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_tokens=100))
    budget.settle(budget.admit("root"), Usage(90, 20, 0.0))
    with pytest.raises(BudgetExhausted) as info:
        budget.admit("root")
    assert info.value.setting == "max_tokens"


def test_the_ledger_lists_roots_and_refuses_to_reconcile_known_usage(tmp_path: Path) -> None:
    ledger = BudgetLedger(tmp_path / "b.sqlite3")
    budget = Budget(ledger, "root-a", BudgetLimits(max_calls=4))
    entry = budget.admit("root")
    budget.settle(entry, Usage(1, 1, 0.0))
    assert ledger.roots() == ["root-a"]
    with pytest.raises(ReconcileRefused):
        ledger.reconcile(entry, tokens=5, usd=None, reason="typo")
