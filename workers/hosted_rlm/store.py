"""Monty checkpoints in PostgreSQL: the ``rlm`` ``CheckpointStore`` protocol, one job per store, fenced.

Records are the signed bytes ``rlmfamily.kernels.checkpoints`` produces, kept in
``specialist_checkpoints`` (this module is the table's one owner) by job and
sequence number (migration 0070).

Only the snapshots worth their write are kept: a step suspended before a *paid*
host call (``llm_query``, ``llm_query_batched``), and the idle session records the
checkpoint policy asks for. A snapshot before a cheap call (``context.read``,
``context.search``...) is not taken (the hosted kernel names the paid calls in
``record_pending_calls``) and dropped if a kernel offers one, because a resume
from the previous snapshot replays them (they are deterministic reads) and serves
the paid calls in between from the journal. A step that reads 200 files
then writes 2 records, not 200.

The checkpoint policy (``CheckpointPolicy``: ``SPECIALISTS_SPECIALIST_CHECKPOINT_EVERY_STEPS``
and ``_EVERY_S``). The kernel offers a session record after every step; the store
holds them back in memory and writes what it holds, in one statement, when a resume
needs it:

- the run's first record (so a job can always be resumed);
- a snapshot before a paid host call, which cannot be replayed (its answer comes from
  the journal, at the point the snapshot stands);
- the record after a step that made paid calls (the newest record is never a
  snapshot of a step that has ended);
- once ``every_steps`` records are held, or ``every_s`` seconds have passed since the
  last write.

A resume restores the newest record written and runs the steps that ended after it
again from their code (``workers.hosted_rlm.hosted``): their cheap calls are
deterministic reads, their paid calls are answered from the journal, and the model
is shown what it was shown the first time. A prune the kernel asks for while the
record it keeps is held waits for that record's write (same statement).

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
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError

from core import db
from core.settings import CheckpointSync, HostedSettings
from rlmfamily.kernels.checkpoints import MAGIC, CheckpointConflict, CheckpointNotFound, check_session_id
from taskstate import claims

PAID_HOST_CALLS = frozenset({"_llm_query", "_llm_query_batched"})
# The condition of every fenced write of a hosted run, here and in its journal (``claims.fence_cte``): the claim held.
HELD = "EXISTS (SELECT 1 FROM fence)"
# A column that makes the statement's own commit skip waiting for its WAL flush: set_config(..., true) lasts until the
# transaction ends, its commit included (``CheckpointSync`` ``with_journal``, the journal's module opening).
RELAXED_COMMIT = ", set_config('synchronous_commit', 'off', true) AS relaxed"


@dataclass(frozen=True)
class CheckpointPolicy:
    """When held session records are written (see the module's opening). The default writes every record."""

    every_steps: int = 1
    every_s: float = 0.0

    def __post_init__(self) -> None:
        assert self.every_steps >= 1 and self.every_s >= 0, self

    @classmethod
    def of(cls, hosted: HostedSettings) -> CheckpointPolicy:
        """The policy the settings name (SPECIALISTS_SPECIALIST_CHECKPOINT_EVERY_STEPS and _EVERY_S): what a worker
        runs, and what a test or benchmark of the worker's run uses."""
        return cls(hosted.checkpoint_every_steps, hosted.checkpoint_every_s)


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
                 sync: CheckpointSync = "with_journal", policy: CheckpointPolicy = CheckpointPolicy(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.job_id = job_id
        self.fencing_token = fencing_token
        self.session_id = check_session_id(session_id)
        self.sync = sync
        self.policy = policy
        self._clock = clock  # the policy's every_s is measured on it
        self.last_seq: int | None = None
        self.last_pending = False  # the newest record written is a snapshot before a paid call
        self.writes = 0  # statements that wrote records (one per write, whatever it holds)
        self._held: list[tuple[int, bytes]] = []  # session records not written yet, oldest first
        self._prune_before: int | None = None  # a prune waiting for the write of the record it keeps
        self._written_at = self._clock()

    def _same_session(self, session_id: str) -> None:
        if session_id != self.session_id:
            raise CheckpointNotFound(f"this store holds session {self.session_id} of job {self.job_id}, not {session_id}")

    def put(self, session_id: str, seq: int, data: bytes) -> None:
        self._same_session(session_id)
        pending = pending_call_of(data)
        if pending is not None and pending not in PAID_HOST_CALLS:
            return  # a cheap, deterministic call: a resume replays it from the snapshot before
        self._held.append((seq, data))
        if pending is None and not self._due():
            return
        self._write(pending=pending is not None)

    def _due(self) -> bool:
        """Whether the session records held are to be written now (the policy, the module's opening)."""
        return (self.last_seq is None or self.last_pending or len(self._held) >= self.policy.every_steps
                or self._clock() - self._written_at >= self.policy.every_s)

    def _write(self, *, pending: bool) -> None:
        """The records held, oldest first, and the prune waiting for them: one statement, fenced. Under
        ``with_journal`` its commit does not wait for its flush (the module's opening)."""
        records, self._held = self._held, []
        prune, self._prune_before = self._prune_before, None
        params = {"j": self.job_id, "t": self.fencing_token, "sid": self.session_id, "prune": prune,
                  "seqs": [seq for seq, _ in records], "data": [data for _, data in records]}
        try:  # one statement in autocommit, on the driver: one round trip (it was BEGIN, the write, COMMIT)
            with self._autocommit.connect() as conn:
                [row] = db.hot_rows(conn, _WRITE_RELAXED if self.sync == "with_journal" else _WRITE, params)
        except IntegrityError:
            raise CheckpointConflict(
                f"checkpoint seq {records[0][0]} of job {self.job_id} was written by another writer; this kernel must "
                "stop"
            ) from None
        if not row["held"]:
            raise claim_lost(self.job_id, self.fencing_token)
        if row["written"] != len(records):
            raise CheckpointConflict(
                f"checkpoint seq {records[0][0]} of job {self.job_id} is not above the newest ({row['newest']}): "
                "another writer is ahead; this kernel must stop"
            )
        self.last_seq, self.last_pending = records[-1][0], pending
        self.writes += 1
        self._written_at = self._clock()

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
        self.last_seq, self.last_pending = int(row.seq), pending_call_of(bytes(row.data)) is not None
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
        if any(held == seq for held, _ in self._held):
            # The record kept is not written yet: the prune goes with its write, and the records held before it
            # (which it no longer needs) are not written at all.
            self._held = [(held, data) for held, data in self._held if held >= seq]
            self._prune_before = seq
            return
        with self.engine.begin() as conn:
            check_fence(conn, self.job_id, self.fencing_token)
            if self.sync == "with_journal":  # a prune lost in a crash leaves old records, nothing worse
                conn.execute(text("SET LOCAL synchronous_commit = off"))
            conn.execute(
                text("DELETE FROM specialist_checkpoints WHERE job_id = :j AND seq < :s"), {"j": self.job_id, "s": seq}
            )


# A write of the records held (``PgCheckpointStore._write``): the claim's share lock, the newest record, the new
# ones if every one is above it, and the prune that waited for them; what it tells: whether the claim held, the
# newest record before, and how many rows it wrote (fewer than given: another writer is ahead).
_WRITE_SQL = (
    f"WITH {claims.fence_cte()}, "
    "newest AS (SELECT max(seq) AS seq FROM specialist_checkpoints WHERE job_id = :j), "
    "written AS (INSERT INTO specialist_checkpoints (job_id, seq, session_id, fencing_token, data) "
    "SELECT :j, r.seq, :sid, :t, r.data FROM unnest(CAST(:seqs AS bigint[]), CAST(:data AS bytea[])) AS r(seq, data) "
    f"WHERE {HELD} AND NOT EXISTS (SELECT 1 FROM newest n, unnest(CAST(:seqs AS bigint[])) AS s(seq) "
    "WHERE s.seq <= n.seq) RETURNING seq), "
    "pruned AS (DELETE FROM specialist_checkpoints WHERE job_id = :j AND seq < CAST(:prune AS bigint) "
    f"AND {HELD} AND EXISTS (SELECT 1 FROM written)) "
    f"SELECT {HELD} AS held, (SELECT seq FROM newest) AS newest, (SELECT count(*) FROM written) AS written"
)
_WRITE = text(_WRITE_SQL)
_WRITE_RELAXED = text(_WRITE_SQL + RELAXED_COMMIT)


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
