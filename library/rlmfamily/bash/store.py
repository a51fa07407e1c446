"""The durable command jobs of every family and the workspace leases (``jobs.sqlite3``, SQLite WAL).

This module is the one writer of both tables. A job's row is written before its
process starts and holds its receipt once it ends: command, working directory,
start, end, exit status, byte counts, a bounded preview of each stream, and the
files that keep the full stdout and stderr.

States: ``waiting`` (admitted, waiting for the workspace lease or a read-only
slot), ``running``, then ``exited`` (any exit status), ``killed`` (its deadline
passed: the whole process group was stopped), ``failed`` (it never started:
the lease wait ran out, the process could not be spawned), or ``unknown``.

A job whose owning process (the run that started it) is gone while it was
``running`` becomes ``unknown``: the command may have done all, part or none of
its work. It keeps its workspace lease, so no mutating command runs over
unverified effects, until a person or the model releases it with a reason
(``release``). Nothing about an unknown job is ever retried automatically.

The lease: one row per workspace, held by the mutating job running in it, so
mutating commands are serialised across families and their children. Read-only
jobs take no lease; at most ``bash_max_read_only_jobs`` of a family run at once.
The read-only declaration is trusted, not enforced.

Each writer takes the write lock first (``BEGIN IMMEDIATE``), so a check and the
write it guards are atomic across threads and processes. The same request id of
a family returns the job it names and runs nothing; with another command or
working directory it is refused.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from rlmfamily.bash.errors import JobLimitReached, JobNotFound, JobRequestConflict, ReleaseRefused, WorkspaceLeaseHeld
from rlmfamily.budget import _owner, _owner_alive  # the same live-owner test the inference budget uses
from rlmfamily.family import procs
from rlmfamily.sqlite_file import SQLiteFile

JobState = Literal["waiting", "running", "exited", "killed", "failed", "unknown"]
STATES: tuple[JobState, ...] = ("waiting", "running", "exited", "killed", "failed", "unknown")
# Who asked for a job: bash.run, the bash tool, the rlm command, or a completion gate (rlmfamily/gates).
SURFACES = ("python", "tool", "cli", "gate")
ENDED_STATES = ("exited", "killed", "failed")
MAX_RELEASE_REASON_CHARS = 1000
MAX_ERROR_CHARS = 2000

JOBS_TABLE = f"""
CREATE TABLE IF NOT EXISTS jobs (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT NOT NULL UNIQUE,
    root_id        TEXT NOT NULL,
    agent_id       TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    request_id     TEXT NOT NULL,
    fingerprint    TEXT NOT NULL,
    surface        TEXT NOT NULL CHECK (surface IN ({", ".join(repr(s) for s in SURFACES)})),
    command        TEXT NOT NULL,
    workspace      TEXT NOT NULL,
    cwd            TEXT NOT NULL,
    read_only      INTEGER NOT NULL CHECK (read_only IN (0, 1)),
    deadline_s     REAL NOT NULL CHECK (deadline_s > 0),
    state          TEXT NOT NULL CHECK (state IN ({", ".join(repr(s) for s in STATES)})),
    owner          TEXT NOT NULL,
    pid            INTEGER,
    pid_start      TEXT,
    exit_code      INTEGER,
    stopped_by     TEXT,
    stdout_path    TEXT NOT NULL,
    stderr_path    TEXT NOT NULL,
    stdout_bytes   INTEGER NOT NULL DEFAULT 0 CHECK (stdout_bytes >= 0),
    stderr_bytes   INTEGER NOT NULL DEFAULT 0 CHECK (stderr_bytes >= 0),
    stdout_stored  INTEGER NOT NULL DEFAULT 0 CHECK (stdout_stored >= 0 AND stdout_stored <= stdout_bytes),
    stderr_stored  INTEGER NOT NULL DEFAULT 0 CHECK (stderr_stored >= 0 AND stderr_stored <= stderr_bytes),
    stdout_preview TEXT NOT NULL DEFAULT '',
    stderr_preview TEXT NOT NULL DEFAULT '',
    error          TEXT,
    created_at     REAL NOT NULL,
    started_at     REAL,
    ended_at       REAL,
    released_at    REAL,
    release_reason TEXT,
    UNIQUE (root_id, request_id),
    CHECK (state NOT IN ('exited') OR exit_code IS NOT NULL),
    CHECK (released_at IS NULL OR state = 'unknown')
);
"""
SCHEMA = JOBS_TABLE + """
CREATE INDEX IF NOT EXISTS jobs_by_root ON jobs (root_id, state);
CREATE TABLE IF NOT EXISTS workspace_leases (
    workspace   TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL UNIQUE REFERENCES jobs(id),
    acquired_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class Job:
    """One row of ``jobs``: the job's request and, once it ended, its receipt."""

    seq: int
    id: str
    root_id: str
    agent_id: str
    run_id: str
    request_id: str
    fingerprint: str
    surface: str
    command: str
    workspace: str
    cwd: str
    read_only: bool
    deadline_s: float
    state: str
    owner: str
    pid: int | None
    pid_start: str | None
    exit_code: int | None
    stopped_by: str | None
    stdout_path: str
    stderr_path: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_stored: int
    stderr_stored: int
    stdout_preview: str
    stderr_preview: str
    error: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    released_at: float | None
    release_reason: str | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Job:
        data = {f.name: row[f.name] for f in fields(cls)}
        data["read_only"] = bool(data["read_only"])
        return cls(**data)

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return round(self.ended_at - self.started_at, 4)

    def process_alive(self) -> bool:
        """The command's process (its group's leader) still runs: proven by pid and start time, never by pid."""
        return bool(self.pid and self.pid_start and procs.alive(self.pid, self.pid_start))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["duration_s"] = self.duration_s
        return data


@dataclass(frozen=True)
class Ending:
    """How a started job ended, written with its receipt."""

    state: JobState  # exited | killed | failed
    exit_code: int | None
    stopped_by: str | None  # "deadline" when the deadline stopped its process group
    stdout_bytes: int
    stderr_bytes: int
    stdout_stored: int
    stderr_stored: int
    stdout_preview: str
    stderr_preview: str
    error: str | None = None


class JobStore(SQLiteFile):
    SCHEMA = SCHEMA
    FOREIGN_KEYS = True

    def __init__(self, path: str | Path, *, output_dir: Path | None = None) -> None:
        super().__init__(path)
        self._allow_every_surface()
        self.output_dir = output_dir  # runs/ : a job's files are runs/<run id>/jobs/<job id>.stdout|.stderr
        # Held open, never used: SQLite checkpoints the WAL when the last connection to the file closes, and a
        # job opens and closes five. Without it a job cost 20-60 ms of checkpoints (9 ms a close, measured).
        self._keeper = self._connect()

    def _allow_every_surface(self) -> None:
        """A file written before the ``gate`` surface refuses it (its CHECK is older): rebuild its jobs table once.

        SQLite cannot change a CHECK in place; this is its documented rebuild (a new table, the rows copied, the
        old one dropped, the new one renamed), under the write lock, with foreign keys off for the swap (the
        leases point at jobs) and checked before it commits.
        """
        if self._surfaces_allowed():
            return
        with self.transaction(foreign_keys_off=True) as conn:
            if not self._surfaces_allowed(conn):  # another process may have rebuilt it meanwhile
                conn.execute(JOBS_TABLE.replace("CREATE TABLE IF NOT EXISTS jobs (", "CREATE TABLE jobs_rebuilt ("))
                conn.execute("INSERT INTO jobs_rebuilt SELECT * FROM jobs")
                conn.execute("DROP TABLE jobs")
                conn.execute("ALTER TABLE jobs_rebuilt RENAME TO jobs")
                conn.execute("CREATE INDEX IF NOT EXISTS jobs_by_root ON jobs (root_id, state)")
                if conn.execute("PRAGMA foreign_key_check").fetchall():
                    raise sqlite3.IntegrityError("a workspace lease names a job the rebuilt table lacks")

    def _surfaces_allowed(self, conn: sqlite3.Connection | None = None) -> bool:
        if conn is None:
            with self.reading() as reader:
                return self._surfaces_allowed(reader)
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()[0]
        return all(repr(surface) in sql for surface in SURFACES)

    # ---------- admission ----------

    def admit(self, *, root_id: str, agent_id: str, run_id: str, request_id: str, fingerprint: str, surface: str,
              command: str, workspace: str, cwd: str, read_only: bool, deadline_s: float,
              max_jobs: int) -> tuple[Job, bool]:
        """A new ``waiting`` job, or the job this family's ``request_id`` already names (``True``: replayed)."""
        with self.transaction() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE root_id = ? AND request_id = ?",
                               (root_id, request_id)).fetchone()
            if row is not None:
                job = Job.from_row(row)
                if job.fingerprint != fingerprint:
                    raise JobRequestConflict(
                        f"request id {request_id!r} was used for job {job.id} ({job.command[:80]!r} in {job.cwd}); "
                        "use a new request id for another command")
                return self._settled_owner(conn, job), True
            count = conn.execute("SELECT COUNT(*) FROM jobs WHERE root_id = ?", (root_id,)).fetchone()[0]
            if count >= max_jobs:
                raise JobLimitReached(f"the family has run {count} jobs, its limit (RLM_BASH_MAX_JOBS)",
                                      setting="bash_max_jobs")
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
            job_id = f"j{seq}"
            folder = (self.output_dir or Path(self.path).parent / "runs") / run_id / "jobs"
            conn.execute(
                "INSERT INTO jobs (seq, id, root_id, agent_id, run_id, request_id, fingerprint, surface, command, "
                "workspace, cwd, read_only, deadline_s, state, owner, stdout_path, stderr_path, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'waiting', ?, ?, ?, ?)",
                (seq, job_id, root_id, agent_id, run_id, request_id, fingerprint, surface, command, workspace, cwd,
                 int(read_only), deadline_s, _owner(), str(folder / f"{job_id}.stdout"),
                 str(folder / f"{job_id}.stderr"), time.time()),
            )
            return self._get(conn, job_id), False

    def try_start(self, job_id: str, *, max_read_only: int) -> bool:
        """Move a waiting job to ``running`` if the workspace lease (mutating) or a read-only slot is free.

        False: wait and try again. WorkspaceLeaseHeld: the lease is held by an unknown job, which no wait
        ends. The job's start time is taken here, when its turn came, not when it was admitted.
        """
        with self.transaction() as conn:
            job = self._get(conn, job_id)
            if job.state != "waiting":
                return job.state == "running"
            if job.read_only:
                running = [Job.from_row(r) for r in conn.execute(
                    "SELECT * FROM jobs WHERE root_id = ? AND read_only = 1 AND state = 'running'", (job.root_id,))]
                if sum(self._settled_owner(conn, r).state == "running" for r in running) >= max_read_only:
                    return False
            else:
                lease = conn.execute("SELECT job_id FROM workspace_leases WHERE workspace = ?",
                                     (job.workspace,)).fetchone()
                if lease is not None:
                    holder = self._settled_owner(conn, self._get(conn, lease["job_id"]))
                    if holder.state == "unknown":
                        raise WorkspaceLeaseHeld(
                            f"the workspace {job.workspace} is held by job {holder.id} ({holder.command[:80]!r}), "
                            "whose outcome is unknown (its run ended while it ran). Check what it did, then "
                            f"release it: rlm jobs release {holder.id} --reason '...'")
                    return False
                conn.execute("INSERT INTO workspace_leases (workspace, job_id, acquired_at) VALUES (?, ?, ?)",
                             (job.workspace, job.id, time.time()))
            conn.execute("UPDATE jobs SET state = 'running', started_at = ? WHERE id = ?", (time.time(), job_id))
            return True

    def set_process(self, job_id: str, pid: int, pid_start: str | None) -> None:
        with self.transaction() as conn:
            conn.execute("UPDATE jobs SET pid = ?, pid_start = ? WHERE id = ?", (pid, pid_start, job_id))

    # ---------- ending ----------

    def finish(self, job_id: str, ending: Ending) -> Job:
        """The receipt of a job that started, and the lease it held given back, in one transaction."""
        with self.transaction() as conn:
            conn.execute(
                "UPDATE jobs SET state = ?, exit_code = ?, stopped_by = ?, stdout_bytes = ?, stderr_bytes = ?, "
                "stdout_stored = ?, stderr_stored = ?, stdout_preview = ?, stderr_preview = ?, error = ?, "
                "ended_at = ? WHERE id = ? AND state = 'running'",
                (ending.state, ending.exit_code, ending.stopped_by, ending.stdout_bytes, ending.stderr_bytes,
                 ending.stdout_stored, ending.stderr_stored, ending.stdout_preview, ending.stderr_preview,
                 (ending.error or None) and ending.error[:MAX_ERROR_CHARS], time.time(), job_id),
            )
            conn.execute("DELETE FROM workspace_leases WHERE job_id = ?", (job_id,))
            return self._get(conn, job_id)

    def end_stopped(self, run_ids: list[str], *, by: str) -> list[Job]:
        """Jobs of ``run_ids`` whose process groups the library stopped itself (a cancelled run's tree, killed) and
        now finds gone, no live member left: ``killed``, ``stopped_by`` ``by``, their leases given back. A job whose
        group still has a live member, or that never recorded its pid, is left to become ``unknown``, lease held."""
        if not run_ids:
            return []
        ended = []
        marks = ", ".join("?" * len(run_ids))
        with self.transaction() as conn:
            rows = conn.execute(f"SELECT * FROM jobs WHERE run_id IN ({marks}) AND state IN ('running', 'unknown') "
                                "AND released_at IS NULL", run_ids).fetchall()
            for job in map(Job.from_row, rows):
                if job.pid is None or job.process_alive() or procs.group_members(job.pid):
                    continue
                sizes = [_size(getattr(job, f"{stream}_path")) for stream in ("stdout", "stderr")]
                conn.execute(
                    "UPDATE jobs SET state = 'killed', stopped_by = ?, stdout_bytes = ?, stdout_stored = ?, "
                    "stderr_bytes = ?, stderr_stored = ?, error = ?, ended_at = ? WHERE id = ?",
                    (by, sizes[0], sizes[0], sizes[1], sizes[1],
                     f"its run was stopped ({by}): the library killed its process group and found it gone",
                     time.time(), job.id))
                conn.execute("DELETE FROM workspace_leases WHERE job_id = ?", (job.id,))
                ended.append(self._get(conn, job.id))
        return ended

    def fail(self, job_id: str, error: str) -> Job:
        """A job that never ran its command (the wait ran out, the spawn failed): failed, no lease kept."""
        with self.transaction() as conn:
            conn.execute("UPDATE jobs SET state = 'failed', error = ?, ended_at = ? WHERE id = ? "
                         "AND state IN ('waiting', 'running')", (error[:MAX_ERROR_CHARS], time.time(), job_id))
            conn.execute("DELETE FROM workspace_leases WHERE job_id = ?", (job_id,))
            return self._get(conn, job_id)

    def release(self, job_id: str, reason: str) -> Job:
        """A person (or the model) checked what an unknown job did: its lease is given back, the reason kept.

        Its outcome stays ``unknown``: the release records a verification, it does not invent an exit status.
        """
        reason = reason.strip()
        if not reason:
            raise ReleaseRefused("a release needs --reason: what you checked (the files the command changed)")
        with self.transaction() as conn:
            job = self._settled_owner(conn, self._get(conn, job_id))
            if job.state != "unknown":
                raise ReleaseRefused(f"job {job.id} is {job.state}, not unknown; only an interrupted job is released")
            if job.released_at is not None:
                raise ReleaseRefused(f"job {job.id} was released already: {job.release_reason}")
            if job.process_alive():
                raise ReleaseRefused(
                    f"job {job.id}'s command still runs (process group {job.pid}); wait for it to end, or stop it "
                    f"(kill -TERM -- -{job.pid}), then release it")
            conn.execute("UPDATE jobs SET released_at = ?, release_reason = ? WHERE id = ?",
                         (time.time(), reason[:MAX_RELEASE_REASON_CHARS], job_id))
            conn.execute("DELETE FROM workspace_leases WHERE job_id = ?", (job_id,))
            return self._get(conn, job_id)

    # ---------- reading ----------

    def job(self, job_id: str) -> Job:
        with self.transaction() as conn:
            return self._settled_owner(conn, self._get(conn, job_id))

    def jobs(self, root_id: str | None = None, *, limit: int = 1000) -> list[Job]:
        """Jobs, newest first (one family's, or all); a running job whose run is gone is shown ``unknown``."""
        with self.transaction() as conn:
            where, args = ("WHERE root_id = ?", (root_id,)) if root_id else ("", ())
            rows = conn.execute(f"SELECT * FROM jobs {where} ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
            return [self._settled_owner(conn, Job.from_row(r)) for r in rows]

    def lease_holder(self, workspace: str) -> str | None:
        with self.reading() as conn:
            row = conn.execute("SELECT job_id FROM workspace_leases WHERE workspace = ?", (workspace,)).fetchone()
            return row["job_id"] if row else None

    def leases(self) -> dict[str, str]:
        """Held leases: job id -> workspace."""
        with self.reading() as conn:
            return {r["job_id"]: r["workspace"] for r in conn.execute("SELECT * FROM workspace_leases")}

    # ---------- inside a transaction ----------

    def _get(self, conn: sqlite3.Connection, job_id: str) -> Job:
        row = conn.execute("SELECT * FROM jobs WHERE id = ?", (str(job_id),)).fetchone()
        if row is None:
            raise JobNotFound(f"there is no job {job_id!r}; `rlm jobs` (or bash.jobs()) lists them")
        return Job.from_row(row)

    def _settled_owner(self, conn: sqlite3.Connection, job: Job) -> Job:
        """A waiting or running job whose owner process is gone: ``failed`` if it never started, else ``unknown``."""
        if job.state not in ("waiting", "running") or _owner_alive(job.owner):
            return job
        if job.state == "waiting":
            conn.execute("UPDATE jobs SET state = 'failed', error = ?, ended_at = ? WHERE id = ?",
                         ("its run ended before the job started", time.time(), job.id))
        else:
            conn.execute("UPDATE jobs SET state = 'unknown', error = ? WHERE id = ?",
                         ("its run ended while the command ran: what it did is not known", job.id))
        return self._get(conn, job.id)


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0
