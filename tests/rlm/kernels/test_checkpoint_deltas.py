"""Incremental Monty checkpoints: a record's bytes follow what its step changed, and a chain restores exactly.

Bytes are counted, never timed (bench/rlm_kernels.py times them).
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmfamily.kernels.base import KernelLimits
from rlmfamily.kernels import checkpoints
from rlmfamily.kernels.checkpoints import Checkpoint, CheckpointTampered, FileCheckpointStore
from rlmfamily.kernels.monty import MAX_DELTA_CHAIN, MontyKernel, monty_resource_limits, runtime_identity

pytestmark = pytest.mark.timeout(120)

LIMITS = KernelLimits(max_memory_bytes=128 * 1024 * 1024)
SESSION = "deltas"
BIG_STATE = "state = ['line %d of some retained text ' % i * 3 for i in range(10000)]"  # ~1.2 MB dump
SMALL_STEP_BYTES = 32 * 1024  # what a one-line step may cost, whatever the state: a few blocks and a header


def stored(kernel: MontyKernel, code: str) -> int:
    before = kernel.stored_bytes
    result = kernel.execute(code)
    assert result.ok, result.error
    return kernel.stored_bytes - before


def test_a_small_step_writes_what_it_changed_not_the_whole_state(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, fsync=False)
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as k:
        k.start({"ask": lambda: 7}, "")
        assert stored(k, BIG_STATE) > 1_000_000  # a new chain: the whole dump
        assert k.last_checkpoint is not None and len(k.last_checkpoint.dump) > 1_000_000
        for code in ("x = 1", "state[5000] = 'changed'", "state.append('more')", "answer = ask()"):
            assert stored(k, code) < SMALL_STEP_BYTES, code
        grown = stored(k, "more = 'y' * 200000")
        assert 200_000 <= grown < 200_000 + SMALL_STEP_BYTES  # new state costs its own size, once


def test_a_chain_is_rebuilt_in_another_kernel_with_every_step_in_it(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, fsync=False)
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as k:
        k.start({}, "")
        assert k.execute(BIG_STATE).ok
        for i in range(5):
            assert k.execute(f"state[{i}] = 'step {i}'").ok
    deltas = [Checkpoint.decode(store.get(SESSION, seq)).base_seq for seq in store.list(SESSION)]
    assert deltas[0] is None and all(base is not None for base in deltas[1:]), deltas
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as again:
        again.recover({}, "")
        result = again.execute("print(state[:5], len(state))")
        assert result.ok and result.stdout == "['step 0', 'step 1', 'step 2', 'step 3', 'step 4'] 10000\n"


def test_a_chain_is_bounded_and_pruning_keeps_what_the_newest_record_needs(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, fsync=False)
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as k:
        k.start({}, "")
        for i in range(2 * MAX_DELTA_CHAIN + 3):
            assert k.execute(f"n = {i}").ok
            kept = store.list(SESSION)
            assert len(kept) <= MAX_DELTA_CHAIN
            first = Checkpoint.decode(store.get(SESSION, kept[0]))
            assert first.base_seq is None, "the oldest record kept is the whole one the chain starts from"
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as again:
        again.recover({}, "")
        assert again.execute("print(n)").stdout == f"{2 * MAX_DELTA_CHAIN + 2}\n"


def test_a_delta_over_a_changed_or_missing_base_is_refused(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, fsync=False)
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as k:
        k.start({}, "")
        assert k.execute(BIG_STATE).ok
        assert k.execute("b = 2").ok
    base_seq = Checkpoint.decode(store.latest(SESSION)[1]).base_seq  # type: ignore[index]
    assert base_seq is not None
    path = store.root / SESSION / f"{base_seq:016d}.ckpt"
    path.unlink()
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as again, pytest.raises(Exception) as missing:
        again.recover({}, "")
    assert getattr(missing.value, "code", None) == "checkpoint_not_found"

    # A base replaced by another valid record of the same seq: its dump is not the one the delta was made from.
    other = Checkpoint.create(session_id=SESSION, seq=base_seq, kind="session", dump=b"another dump",
                              identity=runtime_identity(), limits=monty_resource_limits(LIMITS))
    path.write_bytes(other.encode())
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as again, pytest.raises(CheckpointTampered):
        again.recover({}, "")


def test_a_delta_that_would_build_more_than_its_header_states_is_refused() -> None:
    base = b"x" * 1024
    copies = b"".join(b"C" + struct.pack(">QQ", 0, len(base)) for _ in range(1000))  # 17 KB -> 1 MB
    with pytest.raises(ValueError, match="builds more"):
        checkpoints.apply_delta(base, copies, max_bytes=4096)
    assert len(checkpoints.apply_delta(base, copies)) == 1024 * 1000


def test_a_record_of_format_1_is_still_read(tmp_path: Path) -> None:
    """Records written before deltas existed (whole dumps, no base) are read back as they were."""
    store = FileCheckpointStore(tmp_path, fsync=False)
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as k:
        k.start({}, "")
        assert k.execute("kept = 'from format 1'").ok
        dump = k.last_checkpoint.dump  # type: ignore[union-attr]
    seq = store.list(SESSION)[-1] + 1
    identity = runtime_identity()
    header = {
        "format": 1, "session_id": SESSION, "seq": seq, "kind": "session",
        "dump_sha256": hashlib.sha256(dump).hexdigest(), "dump_bytes": len(dump),
        "monty_version": identity.monty_version, "runtime_sha256": identity.runtime_sha256,
        "limits": monty_resource_limits(LIMITS), "created_at_unix_s": time.time(), "pending": None,
        "digest_kind": "sha256",
    }
    canonical = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    digest = hashlib.sha256(struct.pack(">Q", len(canonical)) + canonical + dump).hexdigest()
    raw = json.dumps({**header, "digest": digest}, sort_keys=True, separators=(",", ":")).encode()
    store.put(SESSION, seq, checkpoints.MAGIC + struct.pack(">I", len(raw)) + raw + dump)
    with MontyKernel(LIMITS, store=store, session_id=SESSION) as again:
        assert again.recover({}, "").seq == seq
        assert again.execute("print(kept)").stdout == "from format 1\n"


edits = st.lists(
    st.tuples(st.sampled_from(["insert", "delete", "overwrite"]), st.integers(0, 1 << 16), st.binary(max_size=3000)),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(base=st.binary(max_size=20_000), changes=edits, seed=st.binary(min_size=1, max_size=64))
def test_a_delta_always_rebuilds_the_dump_it_describes(base: bytes, changes: list, seed: bytes) -> None:
    # A base with repeats (like a dump) and without: blocks may match in several places or none.
    base = base + seed * (len(base) // len(seed))
    dump = bytearray(base)
    for kind, at, data in changes:
        at = at % (len(dump) + 1)
        if kind == "insert":
            dump[at:at] = data
        elif kind == "delete":
            del dump[at : at + len(data)]
        else:
            dump[at : at + len(data)] = data
    assert checkpoints.apply_delta(base, checkpoints.dump_delta(base, bytes(dump))) == bytes(dump)
