"""The owners' SQL fragments and the statements composed of them (core.fragments): a fragment or a statement used
with other parameters than it declares fails loudly, and every composed statement runs on PostgreSQL as written.

The statements are the ones the service registers when its modules are imported (``COMPOSED``); each has an
example here, so a new composed statement without one fails ``test_every_composed_statement_runs_on_postgresql``."""

from __future__ import annotations

import hashlib
import importlib
import uuid
from typing import Any

import pytest
from a2a.types.a2a_pb2 import Message, Role, Task, TaskState, TaskStatus
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from app import admission
from core.fragments import COMPOSED, Fragment, ParamsMismatch, compose
from core.settings import PROJECT_ROOT
from taskstate import admitted, claims, idempotency, outbox, rows

pytestmark = pytest.mark.timeout(60)


def _task() -> Task:
    task = Task(id=str(uuid.uuid4()), context_id=str(uuid.uuid4()),
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
    rows.stamp(task)
    task.history.append(Message(message_id="m", role=Role.ROLE_USER))
    return task


FINGERPRINT = hashlib.sha256(b"content").digest()  # admission's fingerprint: a SHA-256 digest


def _admit(task: Task, *, at_once: bool, reserved_credits: int = 0) -> dict[str, Any]:
    return {**rows.new_task_params(task, "owner"), "customer_key": "c", "message_id": task.id, "fingerprint": FINGERPRINT,
            "idempotency_key": "k" + task.id, "key_retention_s": 60.0, "by_message_id": True, "customer_id": None,
            "key_id": None, "specialist_id": "drill", "skill_id": "drill", "reserved_credits": reserved_credits,
            "executor": "drill", "message": b"", "trace_parent": None, "fingerprint_hex": FINGERPRINT.hex(), "at_once": at_once}


def _finish(job_id: str) -> dict[str, Any]:
    return claims.finish_params(job_id, fencing_token=1, outcome="completed", detail=None, worker_id="w")


def _outbox_row(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "specialist_id": "drill", "executor": "drill", "owner": "owner",
            "context_id": "x", "message": b"", "trace_parent": None}


def _examples(task: Task, dispatch_id: int) -> dict[str, dict[str, Any]]:
    """One example per composed statement, in the order they run after the admission of ``task``: its job's claim
    (then a resumable claim of it, busy, and a first claim of it, none), reads of it, the job's finish, a finish again (refused), then a
    follow-up's outbox row."""
    job_id = f"{task.id}.{dispatch_id}"
    claim = {"j": job_id, "w": "w", "l": 30.0, "n": None, "message_dispatch_id": dispatch_id,
             "message_task_id": task.id, "task_id": task.id}
    return {
        "claims.job_claim": claim,
        "claims.specialist_claim": {**claim, "m": 1},
        "claims.job_claim_first": claim,
        "rows.insert_new": rows.new_task_params(_task(), "owner"),
        "admitted.hold_of": {"task_id": task.id},
        "idempotency.first_use": {"customer_key": "c", "specialist_id": "drill", "idempotency_key": "k" + task.id},
        "idempotency.claim": {"customer_key": "c", "specialist_id": "drill", "idempotency_key": "k2" + task.id,
                              "fingerprint": FINGERPRINT, "task_id": task.id, "key_retention_s": 60.0},
        "journal.run_record": {"job_id": job_id},
        "settlement.finish_job": {**_finish(job_id), "dispatch_id": dispatch_id, "task_id": task.id, "owner": "owner"},
        "claims.finish": _finish(job_id),
        "outbox.enqueue": _outbox_row(task.id),
    }


def _example_of(examples: dict[str, dict[str, Any]], name: str) -> str:
    """The example a statement runs with: its own, or its family's (``settlement.finish_job.<executor>``: the
    finish with an executor's record joined in, composed when a worker is assembled)."""
    family = name
    while family not in examples and "." in family:
        family = family.rsplit(".", 1)[0]
    assert family in examples, f"the composed statement {name} has no example here"
    return family


def _import_every_composing_module() -> None:
    """Every module of the service whose source composes a statement: importing it registers the statement."""
    for room in ("core", "ledger", "taskstate", "app", "workers", "ops"):
        for path in (PROJECT_ROOT / room).rglob("*.py"):
            source = path.read_text()
            if "compose(" in source or ".standalone(" in source or "finish_statement(" in source:
                importlib.import_module(".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts))


def test_every_composed_statement_runs_on_postgresql(engine: Engine):
    _import_every_composing_module()
    task = _task()
    with engine.connect() as conn, conn.begin() as transaction:
        admitted_row = COMPOSED["admission.admit"].execute(conn, _admit(task, at_once=False)).one()
        assert admitted_row.fallback is None
        dispatch_id = outbox.open_dispatch_ids(conn, task.id, "owner")[0]
        examples = _examples(task, dispatch_id)
        assert set(examples) <= set(COMPOSED), "an example of a statement no module composes"
        families = {name: _example_of(examples, name) for name in COMPOSED if name != "admission.admit"}
        results: dict[str, list[Any]] = {}
        for family in examples:  # in the examples' order; a family's members one after the other
            for name in sorted(n for n, f in families.items() if f == family):
                result = COMPOSED[name].execute(conn, examples[family])
                results[name] = result.all() if result.returns_rows else []
        claimed = results["claims.job_claim"][0]
        assert (claimed.outcome, claimed.message is not None, claimed.reserved_credits) == ("claimed", True, 0)
        assert results["claims.specialist_claim"][0].outcome == "busy"
        assert results["claims.job_claim_first"] == []  # claimed before: the first claim gives way
        assert results["admitted.hold_of"][0].reserved_credits == 0
        assert [tuple(row)[:2] for row in results["settlement.finish_job"]] == [("finished", "finished")]
        # the accepted finish read its task, locked, in the same statement (version 1: admitted, not yet written)
        assert [(row.task_row_id, row.task_version) for row in results["settlement.finish_job"]] == [(task.id, 1)]
        assert results["claims.finish"][0].outcome != "finished"  # a claim finishes once
        transaction.rollback()


def test_admission_writes_a_new_task_once_and_names_a_resend_as_its_reason(engine: Engine):
    task = _task()
    with engine.connect() as conn, conn.begin() as transaction:
        first = admission._ADMIT.execute(conn, _admit(task, at_once=False)).one()
        assert first.fallback is None and first.key_claimed
        assert admitted.hold_of(conn, task.id) == admitted.Hold(None, 0)
        assert rows.load(conn, task.id, "owner")[1] == 1
        again = admission._ADMIT.execute(conn, _admit(task, at_once=False)).one()
        assert again.fallback == admission.RESEND and not again.key_claimed
        transaction.rollback()


def test_admission_at_once_turns_back_whole_when_the_reservation_is_refused(engine: Engine):
    """At once, a reason is raised (SQLSTATE SPADM): nothing of the new task stays for the transaction to redo."""
    task = _task()
    params = {**_admit(task, at_once=True, reserved_credits=5), "customer_id": "nobody-" + task.id}
    with engine.connect() as conn, conn.begin() as transaction:
        with pytest.raises(DBAPIError) as raised, conn.begin_nested():
            admission._ADMIT.execute(conn, params)
        assert raised.value.orig.sqlstate == admission.FALLBACK_SQLSTATE
        assert "the reservation" in str(raised.value.orig)
        assert admitted.hold_of(conn, task.id) is None
        assert idempotency.first_use(conn, customer_key="c", specialist_id="drill", key="k" + task.id) is None
        transaction.rollback()


def test_an_owners_fragment_given_a_missing_or_an_extra_parameter_fails_before_anything_is_sent(engine: Engine):
    params = _outbox_row(str(uuid.uuid4()))
    with engine.connect() as conn:
        with pytest.raises(ParamsMismatch, match=r"miss \['trace_parent'\] and add \[\]"):
            outbox._ENQUEUE.execute(conn, {k: v for k, v in params.items() if k != "trace_parent"})
        with pytest.raises(ParamsMismatch, match=r"miss \[\] and add \['tariff'\]"):
            admission._ADMIT.execute(conn, {**_admit(_task(), at_once=False), "tariff": 5})
        assert not conn.in_transaction(), "a refused statement reached the database"


def test_a_fragment_whose_sql_and_parameters_disagree_fails_where_it_is_written():
    with pytest.raises(ParamsMismatch, match=r"binds \['customer_id'\] that are not declared"):
        Fragment.of("here", "SELECT :task_id, :customer_id WHERE {when}", ("task_id",))
    with pytest.raises(ParamsMismatch, match=r"does not bind \['spare'\]"):
        Fragment.of("here", "SELECT :task_id", ("task_id", "spare"))


def test_a_statement_that_binds_a_parameter_no_fragment_declares_fails_where_it_is_composed():
    """The condition a statement hands a fragment binds the statement's own parameters: they must be declared."""
    with pytest.raises(ParamsMismatch, match=r"binds \['by_message_id'\] that are not declared"):
        compose("test.undeclared", "WITH {row} SELECT 1",
                row=outbox.NEW_ROW.cte("row", when="CAST(:by_message_id AS boolean)"))
    with pytest.raises(ParamsMismatch, match="slots"):
        compose("test.unfilled", "WITH {row}, {hold} SELECT 1", row=outbox.NEW_ROW.cte("row"))
    assert "test.undeclared" not in COMPOSED and "test.unfilled" not in COMPOSED
