"""A hosted run's progress reports: written by a thread of their own, in order, all of them before the run returns
its outcome (its artifacts with it), without holding the run (workers.hosted_rlm.progress)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from sqlalchemy import text

from tests.rlm.holds import Hold, wait_until
from tests.workers.hosted_rlm import support
from tests.workers.hosted_rlm.test_runner import FILES, RULE
from workers.hosted_rlm.progress import MAX_PENDING_REPORTS, ProgressWriter

pytestmark = pytest.mark.timeout(60)


def test_reports_are_written_in_order_on_one_thread_and_close_waits_for_the_last():
    written: list[tuple[int, str]] = []
    hold = Hold()
    writer = ProgressWriter(lambda data: (hold(), written.append((data["n"], threading.current_thread().name))),
                            name="progress-test")
    for n in range(5):
        writer({"n": n})  # none of these waits for its write: the first is held
    assert written == []
    releasing = threading.Timer(0, hold.release)
    releasing.start()
    writer.close()
    releasing.join()
    assert written == [(n, "progress-test") for n in range(5)]
    with pytest.raises(RuntimeError, match="closed"):
        writer({"n": 5})


def test_a_report_that_cannot_be_written_is_dropped_and_the_next_ones_are_written(caplog):
    written: list[int] = []

    def write(data: dict[str, Any]) -> None:
        if data["n"] == 1:
            raise ConnectionError("the database went away")
        written.append(data["n"])

    with caplog.at_level(logging.WARNING, logger="workers.hosted_rlm.progress"), ProgressWriter(write) as writer:
        for n in range(3):
            writer({"n": n})
    assert written == [0, 2]
    assert (writer.written, writer.dropped) == (2, 1)
    assert "ConnectionError: the database went away" in caplog.text


def test_a_run_that_reports_faster_than_the_database_writes_waits_for_room():
    hold = Hold()
    writer = ProgressWriter(lambda data: hold())
    handed: list[int] = []

    def report_all() -> None:
        for n in range(MAX_PENDING_REPORTS + 3):
            writer({"n": n})
            handed.append(n)

    reporting = threading.Thread(target=report_all)
    reporting.start()
    # One report is being written (held), MAX_PENDING_REPORTS wait; the next one waits for room.
    wait_until(lambda: len(handed) == MAX_PENDING_REPORTS + 1, "the queue to fill")
    assert reporting.is_alive() and len(handed) == MAX_PENDING_REPORTS + 1
    hold.release()
    reporting.join()
    writer.close()
    assert writer.written == MAX_PENDING_REPORTS + 3


def test_a_writer_given_no_report_starts_no_thread():
    before = threading.active_count()
    with ProgressWriter(lambda data: None) as writer:
        assert threading.active_count() == before
    assert writer.written == 0


class HeldProgress(support.Events):
    """Holds the run's first progress report until the run has gone on to its later model calls without it."""

    def __init__(self, engine: Any, job_id: str) -> None:
        super().__init__()
        self.engine, self.job_id = engine, job_id
        self.first_held = False
        self.threads: set[str] = set()

    def calls(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM specialist_calls WHERE job_id = :j"),
                                {"j": self.job_id}).scalar_one()

    def emit(self, job: Any, fencing_token: int, kind: str, data: dict[str, Any]) -> None:
        if kind == "progress":
            self.threads.add(threading.current_thread().name)
            if not self.first_held:
                self.first_held = True
                # The review's script makes 5 model calls; the first report comes at its first turn.
                wait_until(lambda: self.calls() >= 3, "the run's later model calls while its first report is held")
        super().emit(job, fencing_token, kind, data)


def test_a_run_goes_on_while_its_progress_is_written_and_returns_its_artifacts_for_the_finish(engine, tmp_path):
    spec = support.write_spec(tmp_path / "specs")
    job_id = support.new_job_id()
    token = support.claim(engine, job_id)
    events = HeldProgress(engine, job_id)
    runner = support.runner(engine, spec, support.routes_for("review_sql.toml"), support.message(RULE, files=FILES))

    outcome = runner.run(support.context(job_id, "reviewer", token, events=events))

    assert outcome.state == "completed", outcome
    assert events.threads == {f"progress-{job_id}"}
    # Every report was written by the time the run returned; its artifacts travel in the outcome, for the finish.
    assert {kind for kind, _ in events.items} == {"progress"}
    turns = [data["turn"] for _, data in events.items]
    assert turns == sorted(turns) and turns[0] == 1
    assert [(type(event).__name__, event.artifact.name) for event in outcome.events] == [
        ("TaskArtifactUpdateEvent", "report"), ("TaskArtifactUpdateEvent", "findings")]
