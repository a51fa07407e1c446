"""Monty checkpoints in PostgreSQL: the ``rlm`` ``CheckpointStore`` protocol, one job per store, fenced.

Records are the signed bytes ``rlmfamily.kernels.checkpoints`` produces, kept in
``specialist_checkpoints`` (this module is the table's one owner) by job and
sequence number (migration 0070).

Only the snapshots worth their write are kept: every idle session record, and a
step suspended before a *paid* host call (``llm_query``, ``llm_query_batched``).
The kernel also offers a snapshot before each cheap call (``context.read``,
``context.search``...); those are dropped, because a resume from the previous
snapshot replays them (they are deterministic reads) and serves the paid calls
in between from the journal. A step that reads 200 files then writes 2 records,
not 200.

How durable a record is when ``put`` returns is the setting
``SPECIALISTS_SPECIALIST_CHECKPOINT_SYNC`` (``CheckpointSync``):

- ``each_record``: the record's commit waits for its WAL flush like every other
  commit (as the database's ``synchronous_commit`` says);
- ``with_journal``: the record's transaction commits with ``synchronous_commit``
  off. It is visible at once (a killed worker loses nothing) and reaches disk at
  the latest with the next synchronous commit, because WAL is flushed in order.
  The journal makes that commit before anything relies on the record: after a
  session record, the step's end (``finish_step``); after a pending call's, the
  model call's start (``start_call``), before the call is sent. A PostgreSQL crash
  therefore loses only records no journal entry refers to yet, and a resume goes
  on from the record before them, as if the worker had died before writing them.

Every
write first takes a share lock on the job's claim row and checks that the claim
is this worker's, still running, with a live lease: a worker that lost its claim
(a resume by another worker committed) writes nothing and its kernel stops with
``ClaimLost``; the resumer, which read the newest record after its claim
committed, never finds a record it did not expect.
"""

from __future__ import annotations

import json
import struct

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError

from core.settings import CheckpointSync
from rlmfamily.kernels.checkpoints import MAGIC, CheckpointConflict, CheckpointNotFound, check_session_id
from taskstate import claims

PAID_HOST_CALLS = frozenset({"_llm_query", "_llm_query_batched"})



class ClaimLost(CheckpointConflict):
    """This worker's claim on the job is no longer current: it must stop writing and stop running."""

    code = "claim_lost"


def pending_call_of(data: bytes) -> str | None:
    """The host call a record is suspended at (None for an idle session record). Reads the header only;
    the record is verified when it is loaded."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        return None
    (size,) = struct.unpack(">I", data[len(MAGIC) : len(MAGIC) + 4])
    try:
        pending = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + size]).get("pending")
    except ValueError:
        return None
    return pending.get("function_name") if isinstance(pending, dict) else None


def check_fence(conn: Connection, job_id: str, fencing_token: int) -> None:
    """In the caller's transaction: lock the claim row (share) and require it to be ours and live."""
    if not claims.hold_fence(conn, job_id, fencing_token):
        raise claim_lost(job_id, fencing_token)


def claim_lost(job_id: str, fencing_token: int) -> ClaimLost:
    """What a write under a claim that is no longer current raises."""
    return ClaimLost(
        f"claim {fencing_token} on job {job_id} is no longer current (its lease passed or another worker "
        "resumed the job); this worker stops writing"
    )


class PgCheckpointStore:
    """``CheckpointStore`` for one job. ``last_seq`` is the newest record this process wrote or read."""

    def __init__(self, engine: Engine, *, job_id: str, fencing_token: int, session_id: str,
                 sync: CheckpointSync = "with_journal") -> None:
        self.engine = engine
        self.job_id = job_id
        self.fencing_token = fencing_token
        self.session_id = check_session_id(session_id)
        self.sync = sync
        self.last_seq: int | None = None

    def _newest_seq(self, conn: Connection) -> int | None:
        """The newest record's seq; under ``with_journal`` the same statement lets this transaction commit
        without waiting for its flush (one round trip, not two)."""
        if self.sync == "with_journal":
            return conn.execute(
                text(
                    "SELECT (SELECT max(seq) FROM specialist_checkpoints WHERE job_id = :j) AS newest, "
                    "set_config('synchronous_commit', 'off', true) AS relaxed"
                ),
                {"j": self.job_id},
            ).scalar()
        return conn.execute(
            text("SELECT max(seq) FROM specialist_checkpoints WHERE job_id = :j"), {"j": self.job_id}
        ).scalar()

    def _same_session(self, session_id: str) -> None:
        if session_id != self.session_id:
            raise CheckpointNotFound(f"this store holds session {self.session_id} of job {self.job_id}, not {session_id}")

    def put(self, session_id: str, seq: int, data: bytes) -> None:
        self._same_session(session_id)
        pending = pending_call_of(data)
        if pending is not None and pending not in PAID_HOST_CALLS:
            return  # a cheap, deterministic call: a resume replays it from the snapshot before
        with self.engine.begin() as conn:
            check_fence(conn, self.job_id, self.fencing_token)
            newest = self._newest_seq(conn)
            if newest is not None and seq <= newest:
                raise CheckpointConflict(
                    f"checkpoint seq {seq} of job {self.job_id} is not above the newest ({newest}): "
                    "another writer is ahead; this kernel must stop"
                )
            try:
                conn.execute(
                    text(
                        "INSERT INTO specialist_checkpoints (job_id, seq, session_id, fencing_token, data) "
                        "VALUES (:j, :s, :sid, :t, :d)"
                    ),
                    {"j": self.job_id, "s": seq, "sid": session_id, "t": self.fencing_token, "d": data},
                )
            except IntegrityError:
                raise CheckpointConflict(
                    f"checkpoint seq {seq} of job {self.job_id} was written by another writer; this kernel must stop"
                ) from None
        self.last_seq = seq

    def get(self, session_id: str, seq: int) -> bytes:
        self._same_session(session_id)
        with self.engine.connect() as conn:
            data = conn.execute(
                text("SELECT data FROM specialist_checkpoints WHERE job_id = :j AND seq = :s"),
                {"j": self.job_id, "s": seq},
            ).scalar()
        if data is None:
            raise CheckpointNotFound(f"no checkpoint seq {seq} for job {self.job_id}")
        return bytes(data)

    def latest(self, session_id: str) -> tuple[int, bytes] | None:
        self._same_session(session_id)
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT seq, data FROM specialist_checkpoints WHERE job_id = :j ORDER BY seq DESC LIMIT 1"),
                {"j": self.job_id},
            ).first()
        if row is None:
            return None
        self.last_seq = int(row.seq)
        return int(row.seq), bytes(row.data)

    def list(self, session_id: str) -> list[int]:
        self._same_session(session_id)
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT seq FROM specialist_checkpoints WHERE job_id = :j ORDER BY seq"), {"j": self.job_id}
            )
            return [int(seq) for (seq,) in rows]

    def delete_before(self, session_id: str, seq: int) -> None:
        self._same_session(session_id)
        with self.engine.begin() as conn:
            check_fence(conn, self.job_id, self.fencing_token)
            if self.sync == "with_journal":  # a prune lost in a crash leaves old records, nothing worse
                conn.execute(text("SET LOCAL synchronous_commit = off"))
            conn.execute(
                text("DELETE FROM specialist_checkpoints WHERE job_id = :j AND seq < :s"), {"j": self.job_id, "s": seq}
            )


# A finished or unknown job never resumes, so its checkpoints serve nobody: a reviewer task leaves about 30 KB of
# them, more than all its other rows together (bench/scale.py). Dispatchers delete those older than
# SPECIALISTS_SPECIALIST_CHECKPOINT_RETENTION_S, oldest first through the index on created_at (migration 0210).
# Only a job that may still resume keeps its own: one whose claim is running or released (given back for another
# delivery). Those are at most the jobs in flight, so the rows a round skips stay few.
# (ctid = ANY(ARRAY(...)): the rows chosen are deleted by their address, a TID scan, whatever the table's size.)
_PRUNE_ENDED = text(
    "DELETE FROM specialist_checkpoints WHERE ctid = ANY(ARRAY("
    "SELECT k.ctid FROM specialist_checkpoints k "
    "WHERE k.created_at < now() - make_interval(secs => :retention_s) "
    f"AND NOT EXISTS (SELECT 1 FROM {claims.may_resume_relation()} live WHERE live.job_id = k.job_id) "
    "ORDER BY k.created_at LIMIT :batch FOR UPDATE OF k SKIP LOCKED))"
)


def prune_ended(conn: Connection, *, retention_s: float, batch: int) -> int:
    """Delete up to ``batch`` checkpoints older than ``retention_s`` of jobs that can no longer resume."""
    return conn.execute(_PRUNE_ENDED, {"retention_s": retention_s, "batch": batch}).rowcount
