"""Delivering a job to the worker endpoint over HTTP, and what the answer means for the queue.

The embedded dispatcher (one machine: the outbox is the queue) delivers with
``deliver_over_http`` and acts on the verdict; Cloud Tasks reads the same
answers by status code. The worker's answer codes are listed in workers/server.py.

* ``done``: the job finished, was already finished, is unknown (an operator
  reconciles it), or our result was stale; stop delivering.
* ``retry``: busy, at capacity, certificates or database unavailable, the worker
  unreachable or failing; deliver again after ``retry_delay_s``.
* ``refused``: the worker refused the delivery itself (authentication, size,
  a specialist it does not serve). Retrying the same bytes cannot help; this is a
  configuration problem for an operator, and the job has not run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import httpx

from workers.dispatch.base import DispatchJob
from workers.dispatch.cloud_tasks import BODY_CONTENT_TYPE

Verdict = Literal["done", "retry", "refused"]


@dataclass(frozen=True)
class DeliveryResult:
    verdict: Verdict
    status: int | None  # None: no HTTP answer (connection refused, reset, timed out)
    code: str
    retry_after_s: float | None = None


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None


def deliver_over_http(job: DispatchJob, *, client: httpx.Client, timeout_s: float) -> DeliveryResult:
    """POST the signed body to the job's worker URL; ``timeout_s`` plays the dispatch deadline's part."""
    try:
        response = client.post(
            job.worker_url, content=job.body, headers={"Content-Type": BODY_CONTENT_TYPE}, timeout=timeout_s
        )
    except httpx.TimeoutException:
        return DeliveryResult("retry", None, "worker_timed_out")
    except httpx.TransportError:
        return DeliveryResult("retry", None, "worker_unreachable")
    try:
        code = str(response.json().get("code", ""))
    except ValueError:
        code = ""
    code = code or f"http_{response.status_code}"
    if response.status_code == 200:
        return DeliveryResult("done", 200, code)
    if response.status_code in (429, 503) or response.status_code >= 500:
        return DeliveryResult("retry", response.status_code, code, _retry_after(response))
    return DeliveryResult("refused", response.status_code, code)


def retry_delay_s(attempt: int, retry_after_s: float | None, *, base_s: float, max_s: float) -> float:
    """Exponential backoff with full jitter, never sooner than the worker's Retry-After, capped at ``max_s``."""
    backoff_s = random.uniform(0, min(max_s, base_s * 2 ** max(0, attempt)))
    return min(max_s, max(backoff_s, retry_after_s or 0.0))
