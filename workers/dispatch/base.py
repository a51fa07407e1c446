"""The dispatch interface: what an admitted job carries to a worker, and the deterministic task name.

Every dispatcher derives the task name from the job id alone, so enqueueing the
same job again (a relay that crashed after enqueue and before marking the outbox
row sent) names the same task; the queue answers "already exists", which counts
as success. Delivery is still at least once: the worker's claim row, not the
task name, is what makes execution at most once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Protocol

from core.errors import ServiceError

# Cloud Tasks task ids allow [A-Za-z0-9_-], at most 500 characters. Hashing the job id
# keeps any job id legal and spreads names evenly, as Google advises for throughput.
TASK_ID_PREFIX = "job-v1-"
# Matched whole (``fullmatch``): ``$`` would also match before a trailing newline, which the database's CHECK refuses.
JOB_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
SPECIALIST_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


class DispatchError(ServiceError):
    """The job could not be handed to the queue; the outbox row stays unsent and is retried."""

    code = "dispatch_failed"


class DispatchRefused(ServiceError):
    """The job itself is not dispatchable (retrying will not help)."""

    code = "dispatch_refused"


@dataclass(frozen=True)
class DispatchJob:
    """One admitted job on its way to a worker."""

    job_id: str
    specialist_id: str
    body: bytes  # the signed job body (workers.auth.JobSigner); workers trust nothing else
    worker_url: str
    deadline_s: float  # the specialist's deadline for this job

    def check(self, *, max_body_bytes: int) -> None:
        if not JOB_ID_RE.fullmatch(self.job_id):
            raise DispatchRefused(
                f"job id {self.job_id!r} is not valid: use 1-200 of A-Z a-z 0-9 _ . : -", code="job_id_invalid"
            )
        if not SPECIALIST_ID_RE.fullmatch(self.specialist_id):
            raise DispatchRefused(f"specialist id {self.specialist_id!r} is not valid", code="specialist_id_invalid")
        if len(self.body) > max_body_bytes:
            raise DispatchRefused(
                f"the signed job body is {len(self.body)} bytes; at most {max_body_bytes} are dispatched "
                "(SPECIALISTS_DISPATCH_MAX_BODY_BYTES)",
                code="job_body_too_large",
            )
        if not self.worker_url.startswith(("https://", "http://")):
            raise DispatchRefused(
                f"worker URL {self.worker_url!r} is not an http(s) URL (SPECIALISTS_DISPATCH_WORKER_URL)",
                code="worker_url_invalid",
            )
        if not self.deadline_s > 0:
            raise DispatchRefused(f"job deadline {self.deadline_s} s must be positive", code="job_deadline_invalid")


@dataclass(frozen=True)
class EnqueueResult:
    task_name: str
    created: bool  # False: the queue already had this task (a repeated enqueue), which is success


class Dispatcher(Protocol):
    def enqueue(self, job: DispatchJob) -> EnqueueResult:
        """Hand the job to the queue, or raise DispatchError. Safe to call again for the same job."""
        ...


def task_id_for(job_id: str) -> str:
    """The queue's task id for a job: deterministic, legal for Cloud Tasks, evenly spread."""
    return TASK_ID_PREFIX + hashlib.sha256(job_id.encode()).hexdigest()


def check_dispatch_deadline(dispatch_deadline_s: float, job_deadline_s: float, cancel_grace_s: float) -> None:
    """A delivery must outlive the job: the specialist's deadline, then the grace to stop and finish.

    Otherwise Cloud Tasks abandons the request while the worker still runs and
    delivers again, and that second delivery can only find a live lease.
    """
    needed_s = job_deadline_s + cancel_grace_s
    if dispatch_deadline_s <= needed_s:
        raise DispatchRefused(
            f"the dispatch deadline is {dispatch_deadline_s:g} s but this job needs more than {needed_s:g} s "
            f"(its deadline {job_deadline_s:g} s plus worker_cancel_grace_s {cancel_grace_s:g} s); raise "
            "SPECIALISTS_DISPATCH_DEADLINE_S (at most 1800) or lower the specialist's deadline",
            code="dispatch_deadline_too_short",
        )
