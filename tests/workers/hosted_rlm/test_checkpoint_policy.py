"""The checkpoint policy (SPECIALISTS_SPECIALIST_CHECKPOINT_EVERY_STEPS / _EVERY_S, workers/hosted_rlm/store.py):
which session records are written and when, counted, never timed; and what a resume does with the steps that
ended after the newest record written."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from core.settings import HostedSettings
from rlmfamily.kernels.checkpoints import Checkpoint, PendingCall, RuntimeIdentity
from taskstate import claims
from tests.workers.hosted_rlm import support
from tests.workers.hosted_rlm.test_runner import FILES, RULE
from workers.hosted_rlm.hosted import session_id_for
from workers.hosted_rlm.journal import Journal
from workers.hosted_rlm.store import CheckpointPolicy, PgCheckpointStore

pytestmark = pytest.mark.timeout(120)

EVERY_THREE = CheckpointPolicy(every_steps=3, every_s=3600)  # no test waits an hour: counts decide
NEVER_BY_COUNT = CheckpointPolicy(every_steps=1000, every_s=3600)


def record(session_id: str, seq: int, call: str | None = None) -> bytes:
    pending = None if call is None else PendingCall(call, 1, 0, "", 0, False)
    return Checkpoint.create(session_id=session_id, seq=seq, kind="session" if call is None else "pending_call",
                             dump=b"dump", limits={}, identity=RuntimeIdentity("1", "x"),
                             pending=pending).encode(key=support.CHECKPOINT_KEY)


def test_records_are_held_until_the_policy_or_a_paid_call_needs_them_and_written_together(engine):
    job_id = support.new_job_id()
    store = PgCheckpointStore(engine, job_id=job_id, fencing_token=support.claim(engine, job_id),
                              session_id=session_id_for(job_id), policy=EVERY_THREE)
    sid = store.session_id
    store.put(sid, 0, record(sid, 0))
    assert (store.list(sid), store.writes) == ([0], 1)  # the first record: a job can always be resumed
    store.put(sid, 1, record(sid, 1))
    store.put(sid, 2, record(sid, 2))
    assert (store.list(sid), store.writes) == ([0], 1)  # two steps held
    store.put(sid, 3, record(sid, 3))
    assert (store.list(sid), store.writes) == ([0, 1, 2, 3], 2)  # the third: all three in one write
    store.put(sid, 4, record(sid, 4))
    store.put(sid, 5, record(sid, 5, "_context_read"))  # a cheap call: never written
    store.put(sid, 6, record(sid, 6, "_llm_query_batched"))  # a paid call: written now, with what is held
    assert (store.list(sid), store.writes, store.last_seq) == ([0, 1, 2, 3, 4, 6], 3, 6)
    store.put(sid, 7, record(sid, 7))  # the step that made the paid call ended: its record is written too
    assert (store.list(sid), store.writes) == ([0, 1, 2, 3, 4, 6, 7], 4)
    store.put(sid, 8, record(sid, 8))
    store.delete_before(sid, 8)  # the kernel's prune for a record still held: it waits for that record's write
    assert store.list(sid) == [0, 1, 2, 3, 4, 6, 7]
    store.put(sid, 9, record(sid, 9))
    store.put(sid, 10, record(sid, 10))
    assert (store.list(sid), store.writes) == ([8, 9, 10], 5)


def test_records_held_are_written_once_every_s_has_passed_since_the_last_write(engine):
    """The time half of the policy, on the store's clock (the test's, so nothing waits): a record offered before
    ``every_s`` is held, the first one offered at or after it is written with everything held."""
    now = [1000.0]
    job_id = support.new_job_id()
    store = PgCheckpointStore(engine, job_id=job_id, fencing_token=support.claim(engine, job_id),
                              session_id=session_id_for(job_id), policy=CheckpointPolicy(every_steps=1000, every_s=10),
                              clock=lambda: now[0])
    sid = store.session_id
    store.put(sid, 0, record(sid, 0))
    now[0] += 9.9
    store.put(sid, 1, record(sid, 1))
    assert (store.list(sid), store.writes) == ([0], 1)  # 9.9 s after the last write: held
    now[0] += 0.1
    store.put(sid, 2, record(sid, 2))
    assert (store.list(sid), store.writes) == ([0, 1, 2], 2)  # 10 s: written, with the one held
    now[0] += 5
    store.put(sid, 3, record(sid, 3))
    assert (store.list(sid), store.writes) == ([0, 1, 2], 2)  # the clock restarts at each write


def test_a_paid_call_is_sent_only_after_the_snapshot_it_resumes_from_is_written(engine, tmp_path, monkeypatch):
    """Whatever the count, every semantic call's row names a snapshot before its host call that was written before
    the call's row (so before the call was sent); the run wrote 3 times: its first record, the snapshot (with the
    first step's record), and the record after that step."""
    order: list[tuple[str, Any]] = []
    write, start_call = PgCheckpointStore._write, Journal.start_call

    def spy_write(self: PgCheckpointStore, *, pending: bool) -> None:
        seqs = [seq for seq, _ in self._held]
        write(self, pending=pending)
        order.append(("write", (seqs, pending)))

    def spy_start_call(self: Journal, **kwargs: Any) -> int:
        order.append((kwargs["purpose"], kwargs["after_seq"]))
        return start_call(self, **kwargs)

    monkeypatch.setattr(PgCheckpointStore, "_write", spy_write)
    monkeypatch.setattr(Journal, "start_call", spy_start_call)
    spec = support.write_spec(tmp_path / "specs")
    job_id = support.new_job_id()
    outcome = support.runner(engine, spec, support.routes_for("review_sql.toml"), support.message(RULE, files=FILES),
                             checkpoint_policy=NEVER_BY_COUNT).run(
        support.context(job_id, "reviewer", support.claim(engine, job_id)))
    assert outcome.state == "completed", outcome
    writes = [what for kind, what in order if kind == "write"]
    assert [pending for _, pending in writes] == [False, True, False]
    subcalls = [(index, after) for index, (kind, after) in enumerate(order) if kind == "subcall"]
    assert len(subcalls) == 2
    snapshot_at = next(index for index, (kind, what) in enumerate(order) if kind == "write" and what[1])
    snapshot_seq = order[snapshot_at][1][0][-1]
    assert all(after == snapshot_seq and index > snapshot_at for index, after in subcalls)


class WorkerDied(BaseException):
    """Stands for the worker's process dying: nothing in the run catches it."""


def test_a_resume_runs_again_the_steps_that_ended_after_the_newest_record(engine, tmp_path, monkeypatch):
    """Three steps, none with a paid call, and no record written after the first: the worker dies asking for the
    fourth turn. The resume restores the first record, runs the three steps again from their code (the fourth
    needs what they left), asks the model only for the turn in flight, and answers as a run never stopped does."""
    spec = support.write_spec(tmp_path / "specs")
    routes = support.routes_for("review_steps.toml")
    msg = support.message(RULE, files=FILES)
    clean_job = support.new_job_id()
    clean = support.runner(engine, spec, routes, msg).run(
        support.context(clean_job, "reviewer", support.claim(engine, clean_job)))
    assert clean.state == "completed" and len(support.artifact(clean, "findings")["data"]) == 2, clean

    from rlmfamily.providers.scripted import ScriptedProvider

    complete = ScriptedProvider.complete
    asked: list[str] = []

    def dies_at_the_fourth_turn(self: Any, messages: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["purpose"])
        if len(asked) == 4:
            raise WorkerDied()
        return complete(self, messages, **kwargs)

    monkeypatch.setattr(ScriptedProvider, "complete", dies_at_the_fourth_turn)
    job_id = support.new_job_id()
    token = support.claim(engine, job_id, lease_s=60)
    with pytest.raises(WorkerDied):
        support.runner(engine, spec, routes, msg, checkpoint_policy=NEVER_BY_COUNT).run(
            support.context(job_id, "reviewer", token))
    with engine.connect() as conn:
        records = conn.execute(text("SELECT count(*) FROM specialist_checkpoints WHERE job_id = :j"),
                               {"j": job_id}).scalar()
        ended = conn.execute(text("SELECT count(*) FROM specialist_steps WHERE job_id = :j AND result IS NOT NULL"),
                             {"j": job_id}).scalar()
        lease_ends = claims.get(conn, job_id)["lease_expires_at"]
    assert (records, ended) == (1, 3)
    with engine.begin() as conn:
        resumed = claims.claim_resumable(conn, job_id, worker_id="second", lease_s=3600, max_resumes=2,
                                         now=lease_ends + timedelta(seconds=1))
    assert resumed.resumed
    asked.clear()
    again = support.runner(engine, spec, routes, msg).run(
        support.context(job_id, "reviewer", resumed.claim.fencing_token))
    assert again.state == "completed", again
    assert support.artifact(again, "findings") == support.artifact(clean, "findings")
    assert asked == ["root"]  # the turn in flight; the three before it are replayed from the journal


def test_the_policy_settings_are_validated_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECIALISTS_SPECIALIST_CHECKPOINT_EVERY_STEPS", "0")
    with pytest.raises(ValidationError, match="checkpoint_every_steps"):
        HostedSettings()
    monkeypatch.setenv("SPECIALISTS_SPECIALIST_CHECKPOINT_EVERY_STEPS", "4")
    monkeypatch.setenv("SPECIALISTS_SPECIALIST_CHECKPOINT_EVERY_S", "-1")
    with pytest.raises(ValidationError, match="checkpoint_every_s"):
        HostedSettings()
    monkeypatch.setenv("SPECIALISTS_SPECIALIST_CHECKPOINT_EVERY_S", "2.5")
    assert (HostedSettings().checkpoint_every_steps, HostedSettings().checkpoint_every_s) == (4, 2.5)
