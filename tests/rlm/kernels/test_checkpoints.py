"""Monty checkpoints: what a restore refuses, and the file store's guarantees."""

from __future__ import annotations

import json
import stat
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rlmfamily.errors import RLMError
from rlmfamily.kernels.base import KernelLimits
from rlmfamily.kernels.checkpoints import (
    MAGIC,
    Checkpoint,
    CheckpointConflict,
    CheckpointLimitsMismatch,
    CheckpointNotFound,
    CheckpointRuntimeMismatch,
    CheckpointTampered,
    CheckpointVersionMismatch,
    FileCheckpointStore,
    RuntimeIdentity,
    SessionIdInvalid,
)
from rlmfamily.kernels.monty import MontyKernel, runtime_identity

pytestmark = pytest.mark.timeout(60)

LIMITS = KernelLimits(max_memory_bytes=64 * 1024 * 1024)
SESSION = "sess-1"


@pytest.fixture
def store(tmp_path: Path) -> FileCheckpointStore:
    return FileCheckpointStore(tmp_path / "checkpoints")


@pytest.fixture
def written(store: FileCheckpointStore) -> Iterator[FileCheckpointStore]:
    """A session with two steps checkpointed, its kernel closed."""
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as k:
        k.start({}, "")
        assert k.execute("secret_plan = 'kept'").ok
        assert k.execute("steps = 2").ok
    yield store


def recover(store: FileCheckpointStore, limits: KernelLimits = LIMITS, key: bytes | None = None) -> MontyKernel:
    kernel = MontyKernel(limits, store=store, session_id=SESSION, checkpoint_key=key)
    try:
        kernel.recover({}, "")
    except BaseException:
        kernel.close()
        raise
    return kernel


def latest(store: FileCheckpointStore) -> tuple[int, bytes]:
    found = store.latest(SESSION)
    assert found is not None
    return found


def rewrite_latest(store: FileCheckpointStore, data: bytes) -> None:
    seq, _ = latest(store)
    path = store.root / SESSION / f"{seq:016d}.ckpt"
    path.chmod(0o600)
    path.write_bytes(data)


def test_an_untouched_checkpoint_restores_the_session(written: FileCheckpointStore) -> None:
    kernel = recover(written)
    try:
        result = kernel.execute("print(secret_plan, steps)")
        assert result.ok and result.stdout == "kept 2\n"
    finally:
        kernel.close()


def test_a_checkpoint_records_the_dump_digest_version_runtime_and_limits(written: FileCheckpointStore) -> None:
    checkpoint = Checkpoint.decode(latest(written)[1])
    identity = runtime_identity()
    assert checkpoint.kind == "session" and checkpoint.session_id == SESSION
    assert len(checkpoint.dump_sha256) == 64
    assert checkpoint.identity == identity and len(identity.runtime_sha256) == 64
    assert checkpoint.limits["max_memory"] == LIMITS.max_memory_bytes
    assert checkpoint.limits["max_feed_duration_secs"] == LIMITS.step_timeout_s


def test_a_tampered_dump_is_refused(written: FileCheckpointStore) -> None:
    data = bytearray(latest(written)[1])
    data[-10] ^= 0xFF
    rewrite_latest(written, bytes(data))
    with pytest.raises(CheckpointTampered) as refused:
        recover(written)
    assert refused.value.code == "checkpoint_tampered"


def test_a_tampered_header_is_refused_even_with_a_recomputed_dump_hash(written: FileCheckpointStore) -> None:
    data = latest(written)[1]
    (size,) = struct.unpack(">I", data[len(MAGIC) : len(MAGIC) + 4])
    header = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + size])
    header["limits"]["max_memory"] = 1 << 30  # claim other limits than the dump carries
    raw = json.dumps(header).encode()
    rewrite_latest(written, MAGIC + struct.pack(">I", len(raw)) + raw + data[len(MAGIC) + 4 + size :])
    with pytest.raises(CheckpointTampered):
        recover(written)


def test_a_truncated_or_foreign_file_is_refused(written: FileCheckpointStore) -> None:
    rewrite_latest(written, latest(written)[1][:50])
    with pytest.raises(CheckpointTampered):
        recover(written)
    rewrite_latest(written, b"not a checkpoint at all")
    with pytest.raises(CheckpointTampered):
        recover(written)


def test_a_checkpoint_written_under_other_limits_is_refused_with_what_changed(written: FileCheckpointStore) -> None:
    with pytest.raises(CheckpointLimitsMismatch) as refused:
        recover(written, limits=replace(LIMITS, max_memory_bytes=128 * 1024 * 1024))
    assert refused.value.code == "checkpoint_limits_mismatch"
    assert "max_memory" in refused.value.message


def _reissue(store: FileCheckpointStore, identity: RuntimeIdentity) -> None:
    """Write the latest record again as a newer record from another runtime (a valid digest)."""
    seq, data = latest(store)
    old = Checkpoint.decode(data)
    forged = Checkpoint.create(
        session_id=SESSION, seq=seq + 1, kind="session", dump=old.dump, identity=identity, limits=old.limits
    )
    store.put(SESSION, seq + 1, forged.encode())


def test_a_checkpoint_from_another_monty_version_is_refused(written: FileCheckpointStore) -> None:
    _reissue(written, replace(runtime_identity(), monty_version="0.0.1"))
    with pytest.raises(CheckpointVersionMismatch) as refused:
        recover(written)
    assert refused.value.code == "checkpoint_version_mismatch" and "0.0.1" in refused.value.message


def test_a_checkpoint_from_another_worker_binary_is_refused(written: FileCheckpointStore) -> None:
    _reissue(written, replace(runtime_identity(), runtime_sha256="0" * 64))
    with pytest.raises(CheckpointRuntimeMismatch) as refused:
        recover(written)
    assert refused.value.code == "checkpoint_runtime_mismatch"


def test_a_record_copied_from_another_session_is_refused(written: FileCheckpointStore) -> None:
    seq, data = latest(written)
    written.put("other-session", seq, data)
    kernel = MontyKernel(LIMITS, store=written, session_id="other-session")
    with pytest.raises(CheckpointTampered):
        kernel.recover({}, "")
    kernel.close()


def test_signed_checkpoints_need_the_right_key(store: FileCheckpointStore) -> None:
    key = b"k" * 32
    with MontyKernel(LIMITS, store=store, session_id=SESSION, checkpoint_key=key) as k:
        k.start({}, "")
        assert k.execute("x = 1").ok
    recover(store, key=key).close()
    with pytest.raises(CheckpointTampered):
        recover(store)  # no key: a signed record cannot be verified
    with pytest.raises(CheckpointTampered):
        recover(store, key=b"w" * 32)


def test_an_unsigned_checkpoint_is_refused_when_a_key_is_configured(written: FileCheckpointStore) -> None:
    with pytest.raises(CheckpointTampered):
        recover(written, key=b"k" * 32)


def test_refusals_are_rlm_errors_with_stable_codes() -> None:
    codes = {cls.code for cls in (CheckpointTampered, CheckpointVersionMismatch, CheckpointLimitsMismatch, CheckpointRuntimeMismatch)}
    assert codes == {"checkpoint_tampered", "checkpoint_version_mismatch", "checkpoint_limits_mismatch", "checkpoint_runtime_mismatch"}
    assert issubclass(CheckpointTampered, RLMError)


def test_recover_without_any_checkpoint_says_so(store: FileCheckpointStore) -> None:
    kernel = MontyKernel(LIMITS, store=store, session_id="never-ran")
    with pytest.raises(CheckpointNotFound):
        kernel.recover({}, "")
    kernel.close()


def test_starting_fresh_over_an_existing_session_is_refused(written: FileCheckpointStore) -> None:
    kernel = MontyKernel(LIMITS, store=written, session_id=SESSION)
    with pytest.raises(CheckpointConflict):
        kernel.start({}, "")
    kernel.close()


# ---- the file store ----------------------------------------------------------------------------


def test_the_store_keeps_records_by_increasing_sequence(store: FileCheckpointStore) -> None:
    assert store.latest("s") is None and store.list("s") == []
    store.put("s", 1, b"one")
    store.put("s", 5, b"five")
    assert store.list("s") == [1, 5]
    assert store.latest("s") == (5, b"five")
    assert store.get("s", 1) == b"one"
    with pytest.raises(CheckpointNotFound):
        store.get("s", 2)


def test_the_store_never_overwrites_and_refuses_a_writer_that_is_behind(store: FileCheckpointStore) -> None:
    store.put("s", 3, b"three")
    for seq in (3, 2):
        with pytest.raises(CheckpointConflict):
            store.put("s", seq, b"stale writer")
    assert store.get("s", 3) == b"three"


def test_the_store_prunes_only_what_the_kernel_asks(store: FileCheckpointStore) -> None:
    for seq in range(5):
        store.put("s", seq, b"x")
    store.delete_before("s", 3)
    assert store.list("s") == [3, 4]


def test_the_store_files_are_private_and_left_without_temporaries(store: FileCheckpointStore) -> None:
    store.put("s", 0, b"data")
    files = list((store.root / "s").iterdir())
    assert [f.name for f in files] == ["0000000000000000.ckpt"]
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600


@pytest.mark.parametrize("bad", ["../escape", "", ".hidden", "a/b", "x" * 200])
def test_a_session_id_that_could_leave_the_store_directory_is_refused(store: FileCheckpointStore, bad: str) -> None:
    with pytest.raises(SessionIdInvalid):
        store.put(bad, 0, b"x")


def test_only_the_steps_own_host_calls_are_snapshotted_not_the_preludes(store: FileCheckpointStore) -> None:
    def kinds() -> list[str]:
        return [Checkpoint.decode(store.get(SESSION, seq)).kind for seq in store.list(SESSION)]

    with MontyKernel(LIMITS, store=store, session_id=SESSION, prune_checkpoints=False) as k:
        k.start({"hello": lambda: "hi", "ask": lambda: 1}, "greeting = hello()\n")
        assert k.execute("x = greeting").ok
        assert kinds() == ["session", "session"]
        assert k.execute("y = ask()").ok
        assert kinds() == ["session", "session", "pending_call", "session"]


def pending_calls(store: FileCheckpointStore) -> list[str | None]:
    """The host call each stored record is suspended at, in order (None: an idle session record)."""
    records = [Checkpoint.decode(store.get(SESSION, seq)) for seq in store.list(SESSION)]
    return [None if r.pending is None else r.pending.function_name for r in records]


READS_AND_AN_ASK = "a = [read() for _ in range(3)]\nb = ask('q')\nc = read()"


def test_only_the_named_host_calls_are_snapshotted_before_they_run(store: FileCheckpointStore) -> None:
    bridge = {"ask": lambda q: f"answer to {q}", "read": lambda: "text"}
    with MontyKernel(LIMITS, store=store, session_id=SESSION, prune_checkpoints=False,
                     record_pending_calls={"ask"}) as k:
        k.start(bridge, "")
        assert k.execute(READS_AND_AN_ASK).ok
    assert pending_calls(store) == [None, "ask", None]


def test_every_host_call_is_snapshotted_when_record_pending_calls_is_true(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path / "all", fsync=False)
    with MontyKernel(LIMITS, store=store, session_id=SESSION, prune_checkpoints=False) as k:
        k.start({"ask": lambda q: f"answer to {q}", "read": lambda: "text"}, "")
        assert k.execute(READS_AND_AN_ASK).ok
    assert pending_calls(store) == [None, "read", "read", "read", "ask", "read", None]


def test_a_step_cut_off_in_a_named_call_resumes_there_and_runs_the_unnamed_calls_after_it(
    store: FileCheckpointStore,
) -> None:
    reads: list[int] = []
    with MontyKernel(LIMITS, store=store, session_id=SESSION, prune_checkpoints=False,
                     record_pending_calls=frozenset({"ask"})) as k:
        k.start({"ask": lambda q: "first answer", "read": lambda: "text"}, "")
        assert k.execute(READS_AND_AN_ASK).ok
    # The process died inside ask(): the step's own end was never recorded.
    newest = store.list(SESSION)[-1]
    (store.root / SESSION / f"{newest:016d}.ckpt").unlink()
    resumed = MontyKernel(LIMITS, store=store, session_id=SESSION)
    try:
        recovery = resumed.recover({"ask": lambda q: "never asked again", "read": lambda: reads.append(1) or "again"},
                                   "", result_provider=lambda name, args, kwargs: "journaled answer")
        assert recovery.kind == "pending_call" and recovery.step is not None and recovery.step.ok
        assert reads == [1]  # the read after ask ran again; the three before it are in the snapshot
        assert resumed.execute("print(a, b, c)").stdout == "['text', 'text', 'text'] journaled answer again\n"
    finally:
        resumed.close()


@pytest.mark.parametrize("wrong", ["ask", ["ask", 3], 3])
def test_record_pending_calls_refuses_what_is_not_a_collection_of_bridge_names(
    store: FileCheckpointStore, wrong: object
) -> None:
    with pytest.raises(RLMError) as refused:
        MontyKernel(LIMITS, store=store, session_id=SESSION, record_pending_calls=wrong)  # type: ignore[arg-type]
    assert refused.value.code == "checkpoint_error" and "record_pending_calls" in str(refused.value)


def test_record_pending_calls_refuses_a_name_the_bridge_does_not_have(store: FileCheckpointStore) -> None:
    """A misspelt name (the bridge's is ``ask``) would leave the call it means without a snapshot, silently."""
    with MontyKernel(LIMITS, store=store, session_id=SESSION, record_pending_calls={"asks"}) as k:
        with pytest.raises(RLMError) as refused:
            k.start({"ask": lambda q: q}, "")
    assert refused.value.code == "checkpoint_error"
    assert "record_pending_calls" in str(refused.value) and "'asks'" in str(refused.value)
    assert store.list(SESSION) == []  # refused before anything ran or was written
