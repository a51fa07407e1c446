"""Waiting in tests without trusting the scheduler to be prompt.

A test that needs "a call is still running" holds that call open until it lets
it go: ``Hold`` in one process (threading events), ``Gate`` across processes (a
directory the held party writes into and the test opens). A test that needs "the
other party got there" waits for an observable fact with ``wait_until``. A
deadline that is product behaviour is checked against its setting plus
``DEADLINE_SLACK_S``, never against a bare constant: the real proof is that the
call returned at all while the other side was still held.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlmfamily.kernels.checkpoints import FileCheckpointStore

# A held party lets go by itself after this, so a deadline that is ignored fails an assertion
# instead of hanging until pytest-timeout. Longer than any setting a test holds a call against.
HOLD_LIMIT_S = 10.0
# What a wall-clock check of a deadline allows on top of the setting: the time a loaded 2-core
# machine (load average 8-11) may take to schedule the waiting thread. 1.05 s was seen against a
# 1.0 s bound. Still well below HOLD_LIMIT_S and the defaults (RLM_SUBCALL_TIMEOUT_S=120,
# step_timeout_s=60), so a setting that is ignored still fails the check.
DEADLINE_SLACK_S = 5.0
# How long wait_until waits for an observable fact before it fails, and how often it looks.
POLL_LIMIT_S = 30.0
POLL_S = 0.02


def wait_until(condition: Callable[[], Any], what: str, *, limit_s: float = POLL_LIMIT_S) -> None:
    """Poll ``condition`` until it is true; fail naming ``what`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {limit_s:g} s for: {what}"
        time.sleep(POLL_S)


class Hold:
    """Holds every call to it open until the test calls ``release()`` (or ``limit_s`` passes).

    ``entered`` is set when the first call arrives; ``let_go`` counts the calls that
    have left the hold. "It returned while ``let_go == 0``" proves a deadline cut the
    call without waiting for its answer.
    """

    def __init__(self, limit_s: float = HOLD_LIMIT_S) -> None:
        self.limit_s = limit_s
        self.entered = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.let_go = 0

    def __call__(self) -> bool:
        """The held side: True when the test released it, False when the limit passed."""
        self.entered.set()
        try:
            return self._released.wait(self.limit_s)
        finally:
            with self._lock:
                self.let_go += 1

    def release(self) -> None:
        self._released.set()


class Gate:
    """A hold across processes: the held party writes ``entered-<pid>`` and waits for ``open``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def pass_through(self, limit_s: float) -> bool:
        """The held side: True once the gate is open, False if it stayed shut for ``limit_s``."""
        (self.directory / f"entered-{os.getpid()}").touch()
        deadline = time.monotonic() + limit_s
        while not self.is_open():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def entered(self) -> int:
        return len(list(self.directory.glob("entered-*")))

    def is_open(self) -> bool:
        return (self.directory / "open").exists()

    def open(self) -> None:
        (self.directory / "open").touch()

    def open_when(self, condition: Callable[[], Any], what: str) -> GateOpener:
        """Open the gate from a thread once ``condition`` holds (or after POLL_LIMIT_S, noting the failure)."""
        return GateOpener(self, condition, what)


class GateOpener(threading.Thread):
    """Opens a gate when a condition holds; ``check()`` fails the test if it never did."""

    def __init__(self, gate: Gate, condition: Callable[[], Any], what: str) -> None:
        super().__init__(name="gate-opener", daemon=True)
        self.gate = gate
        self.condition = condition
        self.what = what
        self.failure: str | None = None
        self.start()

    def run(self) -> None:
        try:
            wait_until(self.condition, self.what)
        except AssertionError as exc:
            self.failure = str(exc)
        finally:
            self.gate.open()  # also on failure: the held party must not outlive the test

    def check(self) -> None:
        self.join(POLL_LIMIT_S)
        assert self.failure is None, self.failure


class HeldStore(FileCheckpointStore):
    """A real file store (no fsync) whose ``put`` of record ``held_seq`` waits in ``hold`` until the test lets it
    go: a Monty kernel's checkpoint that is certainly still being written (``checkpoint_in_background``)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.hold = Hold()
        self.held_seq: int | None = None
        self.put_seqs: list[int] = []

    def put(self, session_id: str, seq: int, data: bytes) -> None:
        if seq == self.held_seq:
            self.hold()
        super().put(session_id, seq, data)
        self.put_seqs.append(seq)


class GatedStore(FileCheckpointStore):
    """A real file store (fsync'd, as the library's) whose ``put`` of record ``held_seq`` first passes through a
    ``Gate`` in ``gate_dir`` (``after``: once it is stored and the kernel pruned after it, which a kernel whose
    every record is whole does after every put): in a run's own process, a Monty checkpoint that is certainly not
    stored yet (or certainly stored), for a test in another process that kills the run there."""

    def __init__(self, root: Path, gate_dir: str | Path, held_seq: int, *, after: bool = False) -> None:
        super().__init__(root)
        self.gate = Gate(gate_dir)
        self.held_seq = held_seq
        self.after = after  # hold once the record is stored and the kernel has pruned after it, not before

    def put(self, session_id: str, seq: int, data: bytes) -> None:
        if seq == self.held_seq and not self.after:
            self.gate.pass_through(HOLD_LIMIT_S)
        super().put(session_id, seq, data)

    def delete_before(self, session_id: str, seq: int) -> None:
        super().delete_before(session_id, seq)
        if self.after and self.list(session_id)[-1] == self.held_seq:
            self.gate.pass_through(HOLD_LIMIT_S)
