"""Monty checkpoints: the record format, its verification, and where records are kept.

A ``Checkpoint`` is a Monty dump (idle session, or a step suspended at a host call)
plus what is needed to refuse a wrong restore: the dump's sha256, a digest over
the whole record (keyed with HMAC-SHA256 when a ``checkpoint_key`` is configured),
the Monty version, the sha256 of the ``monty`` worker binary and the resource
limits baked into the dump (a loaded dump keeps *its own* limits, so a restore
under other limits would silently run with the old ones). Monty does not
authenticate dumps; these checks are the only thing between a bad file and the
worker.

A record holds its dump whole, or as a *delta* against an earlier session record
of the same session (``base_seq``): the spans it copies from the base's dump and
the bytes that are new. Its size follows what the step changed, not the size of
the state (a Monty dump moves little between steps: ~2 KB new in 1.2 MB after a
small step, measured with pydantic-monty 1.4). A stored record's ``dump_sha256`` is
always the sha256 of the whole dump, so a dump rebuilt from a chain is checked end
to end.

``CheckpointStore`` is deliberately small and bytes-based (put / get / latest /
list / delete_before, by session id and sequence number) so the service can keep
records in PostgreSQL; ``FileCheckpointStore`` keeps them in a directory, one
file each, written atomically and never overwritten. The kernel decides what to
prune (it knows which records are still needed), the store only obeys.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import struct
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal, Protocol, runtime_checkable

from rlmfamily.errors import KernelError

MAGIC: Final = b"RLMCKPT\x01"
FORMAT_VERSION: Final = 2  # 2: a record may be a delta against a base record; 1 (whole dumps) is still read
READABLE_FORMATS: Final = (1, 2)
DELTA_BLOCK_BYTES: Final = 1024  # the unit a delta copies from its base; a change costs at most two of them more
DELTA_SEARCH_BYTES: Final = 1 << 16  # how far past the expected place a moved block of the base is looked for
DELTA_FAR_SEARCHES: Final = 8  # blocks per delta looked for in the whole rest of the dump (after a large insert)
DELTA_MISSES_BEFORE_SKIPPING: Final = 16  # blocks not found in a row before searches thin out (a rewritten region)
DELTA_MAX_SKIP_BLOCKS: Final = 64  # ... to one search per this many blocks at most
_COPY: Final = b"C"
_LITERAL: Final = b"L"
MAX_HEADER_BYTES: Final = 1 << 20
SESSION_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DIGEST_PREFIX_CHARS: Final = 16  # of a sha256 shown in a refusal: enough to tell two binaries apart

CheckpointKind = Literal["session", "pending_call"]


class CheckpointError(KernelError):
    code = "checkpoint_error"


class CheckpointTampered(CheckpointError):
    """The bytes are not what was written: bad format, digest or dump sha256."""

    code = "checkpoint_tampered"


class CheckpointVersionMismatch(CheckpointError):
    code = "checkpoint_version_mismatch"


class CheckpointRuntimeMismatch(CheckpointError):
    code = "checkpoint_runtime_mismatch"


class CheckpointLimitsMismatch(CheckpointError):
    code = "checkpoint_limits_mismatch"


class CheckpointNotFound(CheckpointError):
    code = "checkpoint_not_found"


class CheckpointConflict(CheckpointError):
    """A record with this or a later sequence number exists: another writer is ahead."""

    code = "checkpoint_conflict"


class SessionIdInvalid(CheckpointError):
    code = "checkpoint_session_id_invalid"


@dataclass(frozen=True)
class RuntimeIdentity:
    """What must match between the process that wrote a dump and the one loading it."""

    monty_version: str
    runtime_sha256: str  # sha256 of the `monty` worker binary


@dataclass(frozen=True)
class PendingCall:
    """A step suspended at a host call: enough to resume it in another process."""

    function_name: str  # the bridge name, as the model code called it
    call_id: int
    base_seq: int  # the session checkpoint the step started from (the rollback target)
    stdout: str  # printed before the call (the first max_output_bytes)
    stdout_bytes: int
    stdout_truncated: bool


@dataclass(frozen=True)
class Checkpoint:
    session_id: str
    seq: int
    kind: CheckpointKind
    dump: bytes = field(repr=False)
    dump_sha256: str
    identity: RuntimeIdentity
    limits: dict[str, Any]  # the Monty ResourceLimits baked into the dump
    created_at_unix_s: float
    pending: PendingCall | None = None
    base_seq: int | None = None  # a delta record: the session record its dump is rebuilt from
    delta: bytes | None = field(default=None, repr=False)  # as read back, until ``rebuilt`` (dump is b"")
    delta_dump_bytes: int = 0  # a delta record: the size of the dump it rebuilds (a bound while rebuilding)

    @classmethod
    def create(
        cls,
        *,
        session_id: str,
        seq: int,
        kind: CheckpointKind,
        dump: bytes,
        identity: RuntimeIdentity,
        limits: dict[str, Any],
        pending: PendingCall | None = None,
        hashed: bool = True,
    ) -> Checkpoint:
        """A record of ``dump``. ``hashed=False``: for a record kept only in memory (a rollback target no one
        reads back), whose ``dump_sha256`` stays "" until ``encode`` needs it."""
        return cls(
            session_id=session_id,
            seq=seq,
            kind=kind,
            dump=dump,
            dump_sha256=hashlib.sha256(dump).hexdigest() if hashed else "",
            identity=identity,
            limits=dict(limits),
            created_at_unix_s=time.time(),
            pending=pending,
        )

    def _header(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "session_id": self.session_id,
            "seq": self.seq,
            "kind": self.kind,
            "dump_sha256": self.dump_sha256 or hashlib.sha256(self.dump).hexdigest(),
            "dump_bytes": len(self.dump),
            "monty_version": self.identity.monty_version,
            "runtime_sha256": self.identity.runtime_sha256,
            "limits": self.limits,
            "created_at_unix_s": self.created_at_unix_s,
            "base_seq": self.base_seq,
            "pending": None
            if self.pending is None
            else {
                "function_name": self.pending.function_name,
                "call_id": self.pending.call_id,
                "base_seq": self.pending.base_seq,
                "stdout": self.pending.stdout,
                "stdout_bytes": self.pending.stdout_bytes,
                "stdout_truncated": self.pending.stdout_truncated,
            },
        }

    def encode(self, *, key: bytes | None = None, base: Checkpoint | None = None) -> bytes:
        """The record; with ``base`` (an earlier session record of this session), as a delta against its dump."""
        payload = self.dump
        header_of = self
        if base is not None:
            if base.kind != "session" or base.session_id != self.session_id or base.seq >= self.seq or base.delta is not None:
                raise CheckpointError("a delta's base must be an earlier, rebuilt session record of the same session")
            payload = dump_delta(base.dump, self.dump)
            header_of = replace(self, base_seq=base.seq)
        header = header_of._header()
        header["digest_kind"] = "hmac-sha256" if key else "sha256"
        header["payload_bytes"] = len(payload)
        body = _canonical(header)
        header["digest"] = _digest(body, payload, key)
        raw = _canonical(header)
        return MAGIC + struct.pack(">I", len(raw)) + raw + payload

    @classmethod
    def decode(cls, data: bytes, *, key: bytes | None = None) -> Checkpoint:
        """Parse and check integrity (format, digest, dump sha256). Raises CheckpointTampered.

        A delta record comes back with ``base_seq`` and ``delta`` set and an empty ``dump``:
        ``rebuilt(base)`` gives the whole record.
        """
        if len(data) < len(MAGIC) + 4 or not data.startswith(MAGIC):
            raise CheckpointTampered("checkpoint refused: not a checkpoint record (bad magic)")
        (size,) = struct.unpack(">I", data[len(MAGIC) : len(MAGIC) + 4])
        start = len(MAGIC) + 4
        if size > MAX_HEADER_BYTES or start + size > len(data):
            raise CheckpointTampered("checkpoint refused: header length is out of range")
        try:
            header = json.loads(data[start : start + size])
            payload = data[start + size :]
            digest = header.pop("digest")
            digest_kind = header["digest_kind"]
            pending = header["pending"]
            base_seq = header.get("base_seq")
            checkpoint = cls(
                session_id=str(header["session_id"]),
                seq=int(header["seq"]),
                kind=header["kind"],
                dump=payload if base_seq is None else b"",
                dump_sha256=str(header["dump_sha256"]),
                identity=RuntimeIdentity(str(header["monty_version"]), str(header["runtime_sha256"])),
                limits=dict(header["limits"]),
                created_at_unix_s=float(header["created_at_unix_s"]),
                pending=None if pending is None else PendingCall(**pending),
                base_seq=None if base_seq is None else int(base_seq),
                delta=None if base_seq is None else payload,
                delta_dump_bytes=0 if base_seq is None else int(header["dump_bytes"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointTampered(f"checkpoint refused: header is malformed ({exc})") from None
        if header.get("format") not in READABLE_FORMATS or checkpoint.kind not in ("session", "pending_call"):
            raise CheckpointTampered("checkpoint refused: unknown record format or kind")
        if digest_kind == "hmac-sha256" and key is None:
            raise CheckpointTampered(
                "checkpoint refused: it is signed (hmac-sha256) but no checkpoint_key is configured to verify it"
            )
        if key is not None and digest_kind != "hmac-sha256":
            raise CheckpointTampered("checkpoint refused: it is unsigned but a checkpoint_key is configured")
        if not hmac.compare_digest(str(digest), _digest(_canonical(header), payload, key)):
            raise CheckpointTampered(
                f"checkpoint refused: digest mismatch for session {checkpoint.session_id} seq {checkpoint.seq} "
                "(the record was modified or truncated)"
            )
        if checkpoint.base_seq is not None:
            if checkpoint.base_seq >= checkpoint.seq:
                raise CheckpointTampered(f"checkpoint refused: seq {checkpoint.seq} names a base that is not earlier")
            return checkpoint
        if hashlib.sha256(payload).hexdigest() != checkpoint.dump_sha256 or len(payload) != header.get("dump_bytes"):
            raise CheckpointTampered(f"checkpoint refused: dump sha256 mismatch for seq {checkpoint.seq}")
        return checkpoint

    def rebuilt(self, base: Checkpoint) -> Checkpoint:
        """A delta record with its whole dump, rebuilt from ``base`` (the record ``base_seq``, itself rebuilt)."""
        if self.delta is None:
            return self
        if base.seq != self.base_seq or base.session_id != self.session_id or base.kind != "session" or base.delta is not None:
            raise CheckpointTampered(
                f"checkpoint refused: seq {self.seq} is a delta against seq {self.base_seq}, not against seq {base.seq}"
            )
        try:
            dump = apply_delta(base.dump, self.delta, max_bytes=self.delta_dump_bytes)
        except ValueError as exc:
            raise CheckpointTampered(f"checkpoint refused: the delta of seq {self.seq} is malformed ({exc})") from None
        if hashlib.sha256(dump).hexdigest() != self.dump_sha256:
            raise CheckpointTampered(
                f"checkpoint refused: the dump rebuilt for seq {self.seq} from seq {base.seq} does not match its sha256"
            )
        return replace(self, dump=dump, delta=None, delta_dump_bytes=0)

    def verify(self, *, identity: RuntimeIdentity, limits: dict[str, Any]) -> None:
        """Refuse a record this process must not load, with the reason as the error code."""
        if self.identity.monty_version != identity.monty_version:
            raise CheckpointVersionMismatch(
                f"checkpoint refused: written by pydantic-monty {self.identity.monty_version}, "
                f"this process runs {identity.monty_version}; dumps are version-specific"
            )
        if self.identity.runtime_sha256 != identity.runtime_sha256:
            raise CheckpointRuntimeMismatch(
                "checkpoint refused: written by a different monty worker binary "
                f"(sha256 {self.identity.runtime_sha256[:DIGEST_PREFIX_CHARS]}..., "
                f"this process has {identity.runtime_sha256[:DIGEST_PREFIX_CHARS]}...)"
            )
        if _canonical(self.limits) != _canonical(limits):
            changed = sorted(k for k in set(self.limits) | set(limits) if self.limits.get(k) != limits.get(k))
            raise CheckpointLimitsMismatch(
                "checkpoint refused: it was written under other sandbox limits "
                f"({', '.join(f'{k}: {self.limits.get(k)!r} -> {limits.get(k)!r}' for k in changed)}); "
                "a loaded dump would keep its old limits. Restore with the original kernel limits.",
                changed=changed,
            )


def dump_delta(base: bytes, dump: bytes) -> bytes:
    """``dump`` as spans copied from ``base`` and new bytes: blocks of ``base`` found in ``dump`` in order.

    Each block is tried where the previous one put it, then searched for within
    DELTA_SEARCH_BYTES, and, DELTA_FAR_SEARCHES times per delta, in the whole rest of
    the dump (new state inserted before most of the heap moves it further). A dump
    that only moved costs a few searches, one that changed everywhere a bounded search
    per block, thinned out after DELTA_MISSES_BEFORE_SKIPPING misses in a row (a
    rewritten region costs a few searches, and resyncs within about its own length).
    Correct whatever it finds: what no block covers is copied as is.
    """
    ops: list[bytes] = []
    written = 0  # bytes of ``dump`` already described
    copy_from = copy_len = 0  # the copy being extended
    shift = 0
    far_searches = DELTA_FAR_SEARCHES
    misses = skip = 0
    block = DELTA_BLOCK_BYTES
    for offset in range(0, len(base) - block + 1, block):
        piece = base[offset : offset + block]
        where = offset + shift
        if not (where >= written and dump[where : where + block] == piece):
            if skip:
                skip -= 1
                continue
            where = dump.find(piece, written, written + DELTA_SEARCH_BYTES + block)
            if where < 0 and far_searches:
                far_searches -= 1
                where = dump.find(piece, written)
            if where < 0:
                misses += 1
                if misses >= DELTA_MISSES_BEFORE_SKIPPING:
                    skip = min(1 << (misses - DELTA_MISSES_BEFORE_SKIPPING), DELTA_MAX_SKIP_BLOCKS)
                continue
        misses = skip = 0
        if where > written or (copy_len and copy_from + copy_len != offset):
            if copy_len:
                ops.append(_COPY + struct.pack(">QQ", copy_from, copy_len))
                copy_len = 0
            if where > written:
                ops.append(_LITERAL + struct.pack(">Q", where - written) + dump[written:where])
        if not copy_len:
            copy_from = offset
        copy_len += block
        written = where + block
        shift = where - offset
    if copy_len:
        ops.append(_COPY + struct.pack(">QQ", copy_from, copy_len))
    if written < len(dump):
        ops.append(_LITERAL + struct.pack(">Q", len(dump) - written) + dump[written:])
    return b"".join(ops)


def apply_delta(base: bytes, delta: bytes, *, max_bytes: int | None = None) -> bytes:
    """The dump ``dump_delta`` described. Raises ValueError on a malformed delta, or one that would build
    more than ``max_bytes`` (copies may repeat: a small delta must not build a huge dump)."""
    out: list[bytes] = []
    built = 0
    at = 0
    while at < len(delta):
        tag = delta[at : at + 1]
        if tag == _COPY and at + 17 <= len(delta):
            start, length = struct.unpack(">QQ", delta[at + 1 : at + 17])
            if start + length > len(base):
                raise ValueError(f"a copy of {length} bytes at {start} runs past the base ({len(base)} bytes)")
            out.append(base[start : start + length])
            built += length
            at += 17
        elif tag == _LITERAL and at + 9 <= len(delta):
            (length,) = struct.unpack(">Q", delta[at + 1 : at + 9])
            if at + 9 + length > len(delta):
                raise ValueError("new bytes run past the end of the delta")
            out.append(delta[at + 9 : at + 9 + length])
            built += length
            at += 9 + length
        else:
            raise ValueError(f"unknown operation at byte {at}")
        if max_bytes is not None and built > max_bytes:
            raise ValueError(f"it builds more than the {max_bytes} bytes its header states")
    return b"".join(out)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest(header: bytes, dump: bytes, key: bytes | None) -> str:
    if key:
        mac = hmac.new(key, digestmod=hashlib.sha256)
        mac.update(struct.pack(">Q", len(header)))
        mac.update(header)
        mac.update(dump)
        return mac.hexdigest()
    h = hashlib.sha256()
    h.update(struct.pack(">Q", len(header)))
    h.update(header)
    h.update(dump)
    return h.hexdigest()


@runtime_checkable
class CheckpointStore(Protocol):
    """Where checkpoint records live, by session id and increasing sequence number."""

    def put(self, session_id: str, seq: int, data: bytes) -> None:
        """Keep ``data``; refuse (CheckpointConflict) a seq not above the latest one."""

    def get(self, session_id: str, seq: int) -> bytes:
        """The record, or CheckpointNotFound."""

    def latest(self, session_id: str) -> tuple[int, bytes] | None:
        """The highest-seq record, or None if the session has none."""

    def list(self, session_id: str) -> list[int]:
        """Sequence numbers kept, ascending."""

    def delete_before(self, session_id: str, seq: int) -> None:
        """Drop every record with a sequence number below ``seq``."""


def check_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not SESSION_ID_PATTERN.match(session_id):
        raise SessionIdInvalid(
            f"session id {session_id!r} is invalid: use 1-128 characters from A-Z a-z 0-9 . _ - (no leading dot)"
        )
    return session_id


class FileCheckpointStore:
    """One directory per session, one file per record, never overwritten.

    ``fsync`` makes each put durable (file and directory) before it returns.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync

    def _dir(self, session_id: str) -> Path:
        return self.root / check_session_id(session_id)

    def put(self, session_id: str, seq: int, data: bytes) -> None:
        if not isinstance(seq, int) or seq < 0:
            raise CheckpointError(f"checkpoint seq must be a non-negative integer; got {seq!r}")
        folder = self._dir(session_id)
        folder.mkdir(parents=True, exist_ok=True)
        kept = self.list(session_id)
        if kept and seq <= kept[-1]:
            raise CheckpointConflict(
                f"checkpoint seq {seq} for session {session_id} is not above the latest ({kept[-1]}): "
                "another writer is ahead; this kernel must stop"
            )
        final = folder / f"{seq:016d}.ckpt"
        tmp = folder / f".{seq:016d}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, final)  # fails if the name exists: records are never overwritten
        except FileExistsError:
            raise CheckpointConflict(f"checkpoint seq {seq} for session {session_id} already exists") from None
        finally:
            os.unlink(tmp)
        if self.fsync:
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def get(self, session_id: str, seq: int) -> bytes:
        path = self._dir(session_id) / f"{seq:016d}.ckpt"
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise CheckpointNotFound(f"no checkpoint seq {seq} for session {session_id}") from None

    def latest(self, session_id: str) -> tuple[int, bytes] | None:
        for seq in reversed(self.list(session_id)):
            try:
                return seq, self.get(session_id, seq)
            except CheckpointNotFound:
                continue  # pruned concurrently
        return None

    def list(self, session_id: str) -> list[int]:
        folder = self._dir(session_id)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        return sorted(int(n.removesuffix(".ckpt")) for n in names if n.endswith(".ckpt") and n.removesuffix(".ckpt").isdigit())

    def delete_before(self, session_id: str, seq: int) -> None:
        folder = self._dir(session_id)
        for old in self.list(session_id):
            if old < seq:
                (folder / f"{old:016d}.ckpt").unlink(missing_ok=True)

    def delete_after(self, session_id: str, seq: int) -> None:
        """Drop every record above ``seq``, newest first (durably, with ``fsync``): what ``MontyKernel.recover``
        asked to go on from an older record discards, so that the steps after it are recorded again."""
        folder = self._dir(session_id)
        for newer in reversed(self.list(session_id)):
            if newer > seq:
                (folder / f"{newer:016d}.ckpt").unlink(missing_ok=True)
        if self.fsync and folder.is_dir():
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
