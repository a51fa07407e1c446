"""Checkpoint retention: a job that can no longer resume loses its checkpoints; one that may resume keeps them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine

from core.settings import Settings
from taskstate import claims
from tests.workers.hosted_rlm import support
from tests.workers.system import drop_database, fresh_database
from workers.dispatch.pruner import Pruner
from workers.hosted_rlm import store
from workers.hosted_rlm.hosted import session_id_for
from workers.hosted_rlm.store import PgCheckpointStore

pytestmark = pytest.mark.timeout(60)


def _job_with_checkpoints(engine, records: int = 2) -> tuple[str, int, PgCheckpointStore]:
    job_id = support.new_job_id()
    token = support.claim(engine, job_id)
    checkpoints = PgCheckpointStore(engine, job_id=job_id, fencing_token=token, session_id=session_id_for(job_id))
    for seq in range(records):
        checkpoints.put(checkpoints.session_id, seq, f"record {seq}".encode())
    return job_id, token, checkpoints


def _prune(engine, *, retention_s: float, batch: int = 100) -> int:
    with engine.begin() as conn:
        return store.prune_ended(conn, retention_s=retention_s, batch=batch)


def test_only_jobs_that_can_no_longer_resume_lose_their_checkpoints(engine):
    finished, token, finished_store = _job_with_checkpoints(engine)
    with engine.begin() as conn:
        assert claims.finish(conn, finished, fencing_token=token, outcome="completed", detail=None,
                             worker_id="test-worker").accepted
    unknown, _, unknown_store = _job_with_checkpoints(engine)
    with engine.begin() as conn:  # its worker died: the sweeper, as of after the lease, records it unknown
        assert claims.expire_lease(conn, unknown, now=datetime.now(timezone.utc) + timedelta(hours=1))[0]
    running, _, running_store = _job_with_checkpoints(engine)
    released, token, released_store = _job_with_checkpoints(engine)
    with engine.begin() as conn:  # given back for another delivery, which may resume it
        assert claims.release(conn, released, fencing_token=token)

    assert _prune(engine, retention_s=3600) == 0, "checkpoints younger than the retention are kept"
    while _prune(engine, retention_s=0, batch=1):  # bounded rounds converge
        pass
    assert finished_store.list(finished_store.session_id) == []
    assert unknown_store.list(unknown_store.session_id) == []
    assert running_store.list(running_store.session_id) == [0, 1]
    assert released_store.list(released_store.session_id) == [0, 1]


def test_a_prune_round_deletes_at_most_its_batch(engine):
    job_id, token, checkpoints = _job_with_checkpoints(engine, records=3)
    with engine.begin() as conn:
        claims.finish(conn, job_id, fencing_token=token, outcome="failed", detail=None, worker_id="test-worker")
    assert _prune(engine, retention_s=0, batch=2) == 2
    assert len(checkpoints.list(checkpoints.session_id)) == 1


def test_the_dispatchers_pruner_round_deletes_ended_jobs_checkpoints_with_the_settings(server_url):
    url = fresh_database(server_url)  # a database of its own: the round prunes every table
    own = create_engine(url)
    try:
        ended, token, ended_store = _job_with_checkpoints(own)
        with own.begin() as conn:
            claims.finish(conn, ended, fencing_token=token, outcome="completed", detail=None, worker_id="test-worker")
        running, _, running_store = _job_with_checkpoints(own)
        kept = Pruner(own, Settings(hosted={"checkpoint_retention_s": 3600}))
        assert kept.round()["checkpoints"] == 0
        pruner = Pruner(own, Settings(hosted={"checkpoint_retention_s": 0, "checkpoints_prune_batch": 10}))
        while pruner.round()["checkpoints"]:
            pass
        assert ended_store.list(ended_store.session_id) == []
        assert running_store.list(running_store.session_id) == [0, 1]
    finally:
        own.dispose()
        drop_database(server_url, url)
