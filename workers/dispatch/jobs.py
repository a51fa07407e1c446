"""The signed job of an outbox row: what a dispatcher hands to a worker, and the deadline it carries.

The row itself is ``taskstate.outbox``'s; a dispatcher signs the job it names
(``build_job``) with the job's deadline (its spec's ``limits.deadline_s``, within
``dispatch_job_deadline_s``). The message stays in the row: the worker reads it
from there.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from core import telemetry
from core.settings import Settings
from core.specs import SpecInvalid, load_specs
from taskstate import ids
from taskstate.outbox import OutboxRow
from workers.auth import JobSigner
from workers.dispatch.base import DispatchJob

log = logging.getLogger(__name__)

# The signed payload's key for the W3C traceparent the worker continues (core/telemetry.py): signed with the rest
# of the body, so neither Cloud Tasks nor anyone on the way can attach a job to another trace.
TRACE_PAYLOAD_KEY = "tp"


@functools.lru_cache(maxsize=4)
def _spec_deadlines(specs_dir: str) -> dict[str, float]:
    try:
        return {sid: loaded.spec.limits.deadline_s for sid, loaded in load_specs(Path(specs_dir)).items()}
    except SpecInvalid as invalid:  # the edge refuses to start on it; here the setting still bounds every job
        log.warning("specs cannot be read for their deadlines (%s); every job gets SPECIALISTS_DISPATCH_JOB_DEADLINE_S",
                    invalid.message)
        return {}


def job_deadline_s(settings: Settings, specialist_id: str) -> float:
    """A job's deadline: its spec's ``limits.deadline_s``, within ``dispatch_job_deadline_s`` (which keeps every
    job inside the dispatch deadline)."""
    spec_deadline = _spec_deadlines(str(settings.hosted.specs_dir)).get(specialist_id)
    if spec_deadline is None:
        return settings.dispatch.job_deadline_s
    return min(settings.dispatch.job_deadline_s, spec_deadline)


def build_job(row: OutboxRow, signer: JobSigner, settings: Settings, worker_url: str) -> DispatchJob:
    """The signed job for a row: its id, its task, the deadline, and the trace it continues (the current span's,
    the dispatcher's: ``TRACE_PAYLOAD_KEY``); the message stays in the row."""
    deadline_s = job_deadline_s(settings, row.specialist_id)
    payload = ids.task_payload(row.task_id, row.dispatch_id, row.owner, row.context_id)
    trace_parent = telemetry.traceparent()
    if trace_parent is not None:
        payload[TRACE_PAYLOAD_KEY] = trace_parent
    body = signer.sign(job_id=row.job_id, specialist_id=row.specialist_id, deadline_s=deadline_s, payload=payload)
    return DispatchJob(
        job_id=row.job_id,
        specialist_id=row.specialist_id,
        body=body,
        worker_url=worker_url,
        deadline_s=deadline_s,
    )
