"""Monty checkpoints taken in the background (``MontyKernel(checkpoint_in_background=True)``).

A step returns before its dump and record are taken; everything that needs them waits for them, a rollback
still lands on the last good step, and a checkpoint that fails raises at the next call, as it would have
raised from ``execute``. Nothing here is timed: the store's ``put`` is held open where a test needs the
checkpoint to be still under way, and tests wait on what they can observe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic_monty import MontyCrashedError

from rlmfamily.kernels.base import KernelLimits, KernelNotStarted
from rlmfamily.kernels.checkpoints import Checkpoint, CheckpointConflict, CheckpointError, FileCheckpointStore
from rlmfamily.kernels.monty import MontyKernel

from ..holds import HeldStore, wait_until

pytestmark = pytest.mark.timeout(60)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SESSION = "bg-1"
FAST = KernelLimits(step_timeout_s=0.5, max_memory_bytes=32 * 1024 * 1024)
BIG_STATE = "state = ['line %d of some retained text ' % i * 3 for i in range(10000)]"  # ~1.2 MB dump
ENDLESS = "kept = 'damaged'\nwhile True:\n    pass"
MEMORY_HOG = "kept = 'damaged'\nhog = []\nwhile True:\n    hog.append('x' * 100000)"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HeldStore]:
    made = HeldStore(tmp_path / "checkpoints")
    yield made
    made.hold.release()


def background(store: FileCheckpointStore | None = None, limits: KernelLimits = FAST) -> MontyKernel:
    return MontyKernel(limits, store=store, session_id=SESSION if store is not None else None,
                       checkpoint_in_background=True)


def run_ok(kernel: MontyKernel, code: str) -> str:
    result = kernel.execute(code)
    assert result.ok, result.error
    return result.stdout


def test_a_step_returns_before_its_record_is_stored_and_the_next_step_waits_for_it(store: HeldStore) -> None:
    with background(store) as k:
        k.start({}, "")
        store.held_seq = 1
        assert run_ok(k, "x = 41") == ""  # returned while the record of this step is held in the store's put
        assert store.hold.entered.wait(10) and store.list(SESSION) == [0]
        store.hold.release()
        assert run_ok(k, "print(x + 1)") == "42\n"  # after the record it needed
        assert store.put_seqs[:2] == [0, 1]


@pytest.mark.parametrize("failing_step", [ENDLESS, MEMORY_HOG], ids=["timeout", "memory"])
def test_a_rollback_lands_on_the_last_good_step_whose_dump_was_taken_in_the_background(
        store: HeldStore, failing_step: str) -> None:
    with background(store) as k:
        k.start({}, "")
        store.held_seq = 1
        run_ok(k, "kept = 'the last good step'")
        # The dump is taken before the put: the checkpoint thread is in the put, the caller is here.
        assert store.hold.entered.wait(10)
        store.hold.release()
        result = k.execute(failing_step)
        assert result.error_code in ("timeout", "memory") and result.restored_from_checkpoint, result.error
        assert "rolled back to the last good step" in (result.error or "")
        assert run_ok(k, "print(kept)") == "the last good step\n"


@pytest.mark.parametrize("failing_step", [ENDLESS, MEMORY_HOG], ids=["timeout", "memory"])
def test_a_rollback_without_a_store_lands_on_the_last_good_step(failing_step: str) -> None:
    with background() as k:
        k.start({}, "")
        run_ok(k, "kept = 'before'")
        run_ok(k, "kept = kept + ', and after'")
        result = k.execute(failing_step)
        assert result.restored_from_checkpoint, result.error
        assert run_ok(k, "print(kept)") == "before, and after\n"


def another_writer_ahead(store: FileCheckpointStore) -> None:
    """A second writer took the session: the next record this kernel writes is behind it."""
    store.put(SESSION, 99, b"another writer's record")


def test_a_store_refusal_raises_from_execute_in_a_synchronous_kernel(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, fsync=False)
    with MontyKernel(FAST, store=store, session_id=SESSION) as k:
        k.start({}, "")
        another_writer_ahead(store)
        with pytest.raises(CheckpointConflict):
            k.execute("x = 1")


@pytest.mark.parametrize("next_call", ["execute", "flush", "last_checkpoint", "close"])
def test_a_store_refusal_in_the_background_raises_at_the_next_call_as_it_would_from_execute(
        tmp_path: Path, next_call: str) -> None:
    store = FileCheckpointStore(tmp_path, fsync=False)
    k = background(store)
    try:
        k.start({}, "")
        another_writer_ahead(store)
        assert k.execute("x = 1").ok  # the step ran; its record is what fails
        with pytest.raises(CheckpointConflict) as raised:
            if next_call == "execute":
                k.execute("y = 2")
            elif next_call == "flush":
                k.flush()
            elif next_call == "last_checkpoint":
                _ = k.last_checkpoint
            else:
                k.close()
        assert raised.value.code == "checkpoint_conflict"
        k.flush()  # raised once, where it surfaced
    finally:
        k.close()
    assert k.worker_pid is None
    with pytest.raises(KernelNotStarted):
        k.execute("z = 3")


def test_a_worker_killed_under_a_background_dump_is_never_a_silent_loss() -> None:
    """The kill lands in the dump (most runs: a 1.2 MB state) or after it; the next call says which."""
    with background(limits=KernelLimits(max_memory_bytes=128 * 1024 * 1024)) as k:
        k.start({}, "")
        run_ok(k, "kept = 'step 1'")
        run_ok(k, BIG_STATE + "\nkept = 'step 2'")
        pid = k.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        try:
            k.flush()
        except MontyCrashedError:
            # The dump of step 2 died with its worker, and the caller hears it, as a synchronous execute would
            # have raised it. The state kept is step 1's: the next step starts from it and says so.
            result = k.execute("print(kept)")
            assert result.ok and result.stdout == "step 1\n" and result.restored_from_checkpoint
        else:
            wait_until(lambda: _gone(pid), f"the killed worker {pid} is dead")
            assert run_ok(k, "print(kept)") == "step 2\n"  # the dump was taken before the kill
        assert k.worker_pid != pid


def test_close_stores_a_pending_record_before_it_returns(store: HeldStore) -> None:
    k = background(store)
    k.start({}, "")
    run_ok(k, "findings = ['a']")
    store.held_seq = 2
    run_ok(k, "findings.append('b')")
    assert store.hold.entered.wait(10)
    closer = threading.Thread(target=k.close)
    closer.start()
    store.hold.release()
    closer.join(10)
    assert not closer.is_alive()
    assert store.list(SESSION)[-1] == 2
    with MontyKernel(FAST, store=store, session_id=SESSION) as again:
        assert again.recover({}, "").seq == 2
        assert run_ok(again, "print(findings)") == "['a', 'b']\n"


def test_every_step_of_a_long_session_is_recorded_in_order_and_recovered(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, fsync=False)
    calls: list[int] = []
    with background(store) as k:
        k.start({"note": calls.append}, "")
        for n in range(1, 41):
            run_ok(k, f"n = {n}\nnote(n)")
        # Two records a step: the snapshot before note() (on the caller's thread), the step's (on the other).
        assert k.last_checkpoint is not None and k.last_checkpoint.seq == 80
        assert Checkpoint.decode(store.latest(SESSION)[1]).seq == 80  # type: ignore[index]
    assert calls == list(range(1, 41))
    with MontyKernel(FAST, store=store, session_id=SESSION) as again:
        again.recover({"note": calls.append}, "")
        assert run_ok(again, "print(n)") == "40\n"


def test_a_process_killed_after_a_step_resumes_from_that_step_or_the_one_before(tmp_path: Path) -> None:
    """What a resume may rely on: the newest record is the last step's, or (killed before the checkpoint
    thread stored it) the step's before; never older, never a torn one."""
    store_dir = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from rlmfamily.kernels.checkpoints import FileCheckpointStore
            from rlmfamily.kernels.monty import MontyKernel
            k = MontyKernel(store=FileCheckpointStore({str(store_dir)!r}), session_id={SESSION!r},
                            checkpoint_in_background=True)
            k.start({{}}, "")
            for n in range(1, 6):
                assert k.execute(f"n = {{n}}").ok
            print("STEPPED", k.worker_pid, flush=True)
            sys.stdin.read()
            """)],
        cwd=PROJECT_ROOT, env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("STEPPED"), proc.stderr.read() if proc.stderr else line
    os.kill(proc.pid, signal.SIGKILL)
    os.kill(int(line.split()[1]), signal.SIGKILL)
    proc.wait()
    with MontyKernel(store=FileCheckpointStore(store_dir), session_id=SESSION) as again:
        seq = again.recover({}, "").seq
        assert seq in (4, 5)
        assert run_ok(again, "print(n)") == f"{seq}\n"


@pytest.mark.parametrize("value", [1, "yes", None])
def test_checkpoint_in_background_takes_only_true_or_false(value: object) -> None:
    with pytest.raises(CheckpointError) as raised:
        MontyKernel(checkpoint_in_background=value)  # type: ignore[arg-type]
    assert raised.value.setting == "checkpoint_in_background"


def _gone(pid: int) -> bool:
    """The process is dead: reaped, or a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
