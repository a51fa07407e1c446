"""The Cloud Tasks dispatcher: one HTTP task per job, to the private worker URL, with an OIDC token.

The task id is derived from the job id (``task_id_for``), so a repeated enqueue
is answered ALREADY_EXISTS and counts as success. The request carries the signed
job body; Cloud Tasks adds an OIDC token for the configured service account and
audience, which the worker checks (workers.auth.OidcVerifier) on top of Cloud
Run's own invoker check.

``make_client`` connects to Google's API in production, or to a local emulator
over an insecure gRPC channel when ``cloud_tasks_emulator_host`` is set (the
client's ``api_endpoint`` alone would try TLS).
"""

from __future__ import annotations

import logging

from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from google.cloud import tasks_v2
from google.protobuf import duration_pb2

from core.settings import Settings
from workers.dispatch.base import (
    DispatchError,
    DispatchJob,
    DispatchRefused,
    EnqueueResult,
    check_dispatch_deadline,
    task_id_for,
)

log = logging.getLogger(__name__)

BODY_CONTENT_TYPE = "application/vnd.specialists.job"  # ASCII: v1.<secret id>.<signed token>


def make_client(settings: Settings) -> tasks_v2.CloudTasksClient:
    if settings.dispatch.cloud_tasks_emulator_host:
        import grpc
        from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

        channel = grpc.insecure_channel(settings.dispatch.cloud_tasks_emulator_host)
        return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
    return tasks_v2.CloudTasksClient()  # application default credentials (the service's own account)


class CloudTasksDispatcher:
    """Enqueue jobs as Cloud Tasks HTTP tasks."""

    def __init__(
        self,
        client: tasks_v2.CloudTasksClient,
        *,
        queue_path: str,
        service_account_email: str,
        audience: str,
        dispatch_deadline_s: int,
        cancel_grace_s: float,
        max_body_bytes: int,
        enqueue_timeout_s: float,
    ) -> None:
        self.client = client
        self.queue_path = queue_path
        self.service_account_email = service_account_email
        self.audience = audience
        self.dispatch_deadline_s = dispatch_deadline_s
        self.cancel_grace_s = cancel_grace_s
        self.max_body_bytes = max_body_bytes
        # Retrying CreateTask is safe only because the task name is deterministic: a retry
        # after a lost answer finds ALREADY_EXISTS. Bounded by the enqueue timeout.
        self._retry = gretry.Retry(
            initial=0.1,
            maximum=2.0,
            multiplier=2.0,
            timeout=enqueue_timeout_s,
            predicate=gretry.if_exception_type(gexc.ServiceUnavailable, gexc.DeadlineExceeded),
        )
        self._timeout_s = enqueue_timeout_s

    @classmethod
    def from_settings(cls, settings: Settings, client: tasks_v2.CloudTasksClient | None = None) -> "CloudTasksDispatcher":
        if not (settings.dispatch.cloud_tasks_project and settings.dispatch.cloud_tasks_location and settings.dispatch.cloud_tasks_queue):
            raise DispatchRefused(
                "Cloud Tasks needs SPECIALISTS_CLOUD_TASKS_PROJECT, _LOCATION and _QUEUE", code="dispatch_not_configured"
            )
        if not settings.dispatch.service_account:
            raise DispatchRefused(
                "Cloud Tasks needs SPECIALISTS_DISPATCH_SERVICE_ACCOUNT for the OIDC token", code="dispatch_not_configured"
            )
        return cls(
            client or make_client(settings),
            queue_path=tasks_v2.CloudTasksClient.queue_path(
                settings.dispatch.cloud_tasks_project, settings.dispatch.cloud_tasks_location, settings.dispatch.cloud_tasks_queue
            ),
            service_account_email=settings.dispatch.service_account,
            audience=settings.worker.audience,
            dispatch_deadline_s=settings.dispatch.deadline_s,
            cancel_grace_s=settings.worker.cancel_grace_s,
            max_body_bytes=settings.dispatch.max_body_bytes,
            enqueue_timeout_s=settings.dispatch.enqueue_timeout_s,
        )

    def build_task(self, job: DispatchJob) -> tasks_v2.Task:
        job.check(max_body_bytes=self.max_body_bytes)
        check_dispatch_deadline(self.dispatch_deadline_s, job.deadline_s, self.cancel_grace_s)
        return tasks_v2.Task(
            name=f"{self.queue_path}/tasks/{task_id_for(job.job_id)}",
            http_request=tasks_v2.HttpRequest(
                http_method=tasks_v2.HttpMethod.POST,
                url=job.worker_url,
                # No job id header on purpose: the worker takes it from the verified body only.
                headers={"Content-Type": BODY_CONTENT_TYPE},
                body=job.body,
                oidc_token=tasks_v2.OidcToken(
                    service_account_email=self.service_account_email, audience=self.audience
                ),
            ),
            dispatch_deadline=duration_pb2.Duration(seconds=self.dispatch_deadline_s),
        )

    def enqueue(self, job: DispatchJob) -> EnqueueResult:
        task = self.build_task(job)
        try:
            created = self.client.create_task(
                parent=self.queue_path, task=task, retry=self._retry, timeout=self._timeout_s
            )
        except gexc.AlreadyExists:
            log.info("task for job %s already enqueued", job.job_id)
            return EnqueueResult(task_name=task.name, created=False)
        except gexc.GoogleAPICallError as exc:
            raise DispatchError(
                f"Cloud Tasks refused job {job.job_id}: {type(exc).__name__}: {exc.message}; "
                "the outbox keeps it and the relay retries"
            ) from exc
        except gexc.RetryError as exc:
            raise DispatchError(
                f"Cloud Tasks did not answer for job {job.job_id} within SPECIALISTS_DISPATCH_ENQUEUE_TIMEOUT_S "
                f"({self._timeout_s:g} s); the outbox keeps it and the relay retries"
            ) from exc
        return EnqueueResult(task_name=created.name or task.name, created=True)
