"""Delivering push notifications: the dispatcher's loop over ``push_deliveries`` (taskstate/push.py).

It runs in a thread of the dispatcher process with an event loop of its own, so a webhook never holds up the
outbox loop (a task's own jobs), and every delivery is a coroutine with hard bounds:
  - the address: the host is resolved and every answer checked at each attempt (``core.webhooks``), and the
    request goes to the checked address (``Host`` and TLS SNI keep the name), so DNS rebinding cannot redirect
    it; redirects are never followed (a 3xx is a final failure);
  - time: ``request_timeout_s`` from connect to the last byte read; bytes: at most ``max_response_bytes`` of
    the answer are read;
  - concurrency: ``max_in_flight`` at once, at most ``max_in_flight_per_customer`` to one customer's
    webhooks, so a customer whose webhook hangs holds that many slots, never another customer's;
  - retries: a timeout, a transport error, 408, 429 or 5xx is tried again after ``backoff_base_s * 2^(n-1)``
    (at most ``backoff_max_s``), up to ``max_attempts`` and while younger than ``max_age_s``; then it is recorded
    as failed, with the reason, for the operator (`specialists push failures`). Other answers are final.

Each request carries: the event as an A2A ``StreamResponse`` (JSON), ``X-A2A-Notification-Token`` (the client's
token, echoed), ``X-A2A-Notification-Event-Id`` (the event's sequence number: the same on every attempt, the
receiver's de-duplication key) and a JWT signed by the service (``core.push_signing``) in ``Authorization:
Bearer``, or, when the configuration asked for its own credentials (``authentication``), those in
``Authorization`` and the JWT in ``X-A2A-Notification-JWT``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import threading
from collections import Counter
from datetime import datetime, timezone

import certifi
import httpx
from a2a.types.a2a_pb2 import StreamResponse
from google.protobuf.json_format import MessageToJson
from sqlalchemy import Engine

from core import telemetry
from core.push_signing import PushSigner
from core.settings import PushSettings, Settings
from core.webhooks import Resolver, WebhookRefused, check_url, resolve_checked, system_resolver
from taskstate import push
from taskstate.push import Claimed

log = logging.getLogger(__name__)

EVENT_ID_HEADER = "X-A2A-Notification-Event-Id"
TOKEN_HEADER = "X-A2A-Notification-Token"
JWT_HEADER = "X-A2A-Notification-JWT"
RETRIED_STATUSES = frozenset({408, 429})


def signer_of(settings: Settings) -> PushSigner:
    return PushSigner(settings.push.signing_secrets, issuer=settings.edge.url, lifetime_s=settings.push.jwt_lifetime_s)


class PushDeliverer:
    """Claims due notifications and delivers them until ``stop`` is set (``run``, on a thread of its own)."""

    def __init__(self, engine: Engine, settings: Settings, *, name: str, wake: threading.Event | None = None,
                 resolver: Resolver = system_resolver) -> None:
        self.engine = engine
        self.settings = settings
        self.limits = settings.push
        self.name = name
        self.wake = wake or threading.Event()
        self.resolver = resolver
        self.signer = signer_of(settings)
        self.in_flight: Counter[str] = Counter()

    def run(self, stop: threading.Event) -> None:
        asyncio.run(self._loop(stop))

    async def _loop(self, stop: threading.Event) -> None:
        limits = self.limits
        timeout = httpx.Timeout(limits.request_timeout_s)
        running: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(follow_redirects=False, timeout=timeout, trust_env=False, verify=tls_context(limits),
                                     limits=httpx.Limits(max_connections=limits.max_in_flight)) as client:
            while not stop.is_set():
                self.wake.clear()
                try:
                    claimed = await asyncio.to_thread(self._claim, limits.max_in_flight - len(running),
                                                      dict(self.in_flight))
                except Exception as exc:  # the database restarting: the next round tries again
                    log.warning("push claim failed (%s: %s); retrying", type(exc).__name__, exc)
                    claimed = []
                for one in claimed:
                    self.in_flight[one.customer_id] += 1
                    task = asyncio.create_task(self._deliver(client, one))
                    running.add(task)
                    task.add_done_callback(running.discard)
                    task.add_done_callback(lambda _t, c=one.customer_id: self._release(c))
                await self._wait(running, limits.poll_interval_s if not claimed else 0.0, stop)
            for task in running:
                task.cancel()  # leases stay: another dispatcher delivers them after lease_s

    def _release(self, customer_id: str) -> None:
        self.in_flight[customer_id] -= 1
        if self.in_flight[customer_id] <= 0:
            del self.in_flight[customer_id]
        self.wake.set()  # a slot is free, and the webhook's next event may be due now

    async def _wait(self, running: set[asyncio.Task[None]], timeout_s: float, stop: threading.Event) -> None:
        """Until the wake event (an event was written, a delivery ended), ``stop`` (the dispatcher stopping: it
        waits for this thread, and must not wait out a poll interval) or ``timeout_s``."""
        if timeout_s <= 0 and not running:
            return
        deadline = asyncio.get_running_loop().time() + max(timeout_s, 0.02)
        while not (self.wake.is_set() or stop.is_set()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)  # the wake event is a threading.Event set by the listener thread

    def _claim(self, free: int, in_flight: dict[str, int]) -> list[Claimed]:
        with self.engine.begin() as conn:
            return push.claim(conn, by=self.name, lease_s=self.limits.lease_s, free=free,
                              per_customer=in_flight,
                              per_customer_max=self.limits.max_in_flight_per_customer)

    async def _deliver(self, client: httpx.AsyncClient, claimed: Claimed) -> None:
        # A span in its task's trace (the task's first job's traceparent, from the lease), so a webhook's POST
        # (httpx's span, a child) is part of the task it tells about, not a trace of its own; a task admitted
        # with telemetry off has no trace, and its deliveries start their own.
        with telemetry.span("push.deliver", parent=telemetry.context_of(claimed.trace_parent),
                            attributes={"specialists.task_id": claimed.task_id,
                                        "specialists.event_id": str(claimed.event_seq),
                                        "specialists.attempt": claimed.attempts}) as span:
            try:
                outcome = await self._attempt(client, claimed)
            except Exception as exc:  # a bug must not lose the row: it stays leased, and comes due again
                log.exception("push delivery %s failed unexpectedly", claimed.delivery_id)
                outcome = ("retry", None, f"internal: {type(exc).__name__}")
            recorded = await asyncio.to_thread(self._record, claimed, *outcome)
            telemetry.annotate(span, **{"specialists.outcome": recorded or "lease_lost",
                                        "http.response.status_code": outcome[1]})

    async def _attempt(self, client: httpx.AsyncClient, claimed: Claimed) -> tuple[str, int | None, str]:
        limits = self.limits
        age_s = (datetime.now(timezone.utc) - claimed.created_at).total_seconds()
        if age_s > limits.max_age_s:
            return ("failed", None, f"older than SPECIALISTS_PUSH_MAX_AGE_S ({limits.max_age_s:g} s)")
        try:
            target = check_url(claimed.config.url, allow_loopback=limits.allow_loopback, max_chars=limits.max_url_chars)
            address = await asyncio.to_thread(resolve_checked, target, allow_loopback=limits.allow_loopback,
                                              timeout_s=limits.resolve_timeout_s, resolver=self.resolver)
        except WebhookRefused as refused:
            return ("failed", None, f"{refused.code}: {refused.message}")
        body = _body(claimed.event_data)
        headers = self._headers(claimed, body, target.host if target.port in (80, 443) else f"{target.host}:{target.port}")
        host = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
        url = f"{target.scheme}://{host}:{target.port}{target.path_and_query}"
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        try:
            async with asyncio.timeout(limits.request_timeout_s):
                async with client.stream("POST", url, content=body, headers=headers, extensions=extensions) as answer:
                    read = 0
                    async for chunk in answer.aiter_raw():
                        read += len(chunk)
                        if read >= limits.max_response_bytes:
                            break  # the status decides; the rest is never read
                    status = answer.status_code
        except TimeoutError:
            return ("retry", None, f"no answer within SPECIALISTS_PUSH_REQUEST_TIMEOUT_S ({limits.request_timeout_s:g} s)")
        except httpx.HTTPError as exc:
            return ("retry", None, transport_reason(exc))
        if 200 <= status < 300:
            return ("delivered", status, "")
        if 300 <= status < 400:
            return ("failed", status, "redirect_refused: webhooks must answer without a redirect")
        if status in RETRIED_STATUSES or status >= 500:
            return ("retry", status, f"http_{status}")
        return ("failed", status, f"http_{status}: the webhook refused the notification")

    def _headers(self, claimed: Claimed, body: bytes, host_header: str) -> dict[str, str]:
        config = claimed.config
        jwt = self.signer.sign(audience=config.url, task_id=claimed.task_id, event_id=str(claimed.event_seq), body=body)
        headers = {"Content-Type": "application/json", "Host": host_header, EVENT_ID_HEADER: str(claimed.event_seq),
                   "User-Agent": "specialists-push/1"}
        if config.token:
            headers[TOKEN_HEADER] = config.token
        if config.auth_scheme and config.auth_credentials:
            headers["Authorization"] = f"{config.auth_scheme} {config.auth_credentials}"
            headers[JWT_HEADER] = jwt
        else:
            headers["Authorization"] = f"Bearer {jwt}"
        return headers

    def _record(self, claimed: Claimed, verdict: str, status: int | None, error: str) -> str | None:
        """The attempt recorded: ``delivered``, ``retried`` or ``failed``, counted; None when the lease was lost."""
        outcome = self._write_outcome(claimed, verdict, status, error)
        if outcome is not None:  # committed, and this dispatcher's lease still held: counted once
            telemetry.meters.push_attempts.add(1, {"outcome": outcome})
        return outcome

    def _write_outcome(self, claimed: Claimed, verdict: str, status: int | None, error: str) -> str | None:
        """Record the attempt: ``delivered``, ``retried`` or ``failed``, or None when the lease was lost."""
        limits = self.limits
        with self.engine.begin() as conn:
            if verdict == "delivered":
                return "delivered" if push.record_delivered(conn, claimed, status or 0) else None
            if verdict == "retry":
                wait_s = min(limits.backoff_max_s, limits.backoff_base_s * 2 ** (claimed.attempts - 1))
                age_s = (datetime.now(timezone.utc) - claimed.created_at).total_seconds()
                if claimed.attempts >= limits.max_attempts:
                    verdict, error = "failed", f"{error} (after {claimed.attempts} attempts, SPECIALISTS_PUSH_MAX_ATTEMPTS)"
                elif age_s + wait_s > limits.max_age_s:
                    verdict, error = "failed", f"{error} (the next attempt would pass SPECIALISTS_PUSH_MAX_AGE_S)"
                else:
                    return "retried" if push.record_retry(conn, claimed, wait_s, status, error) else None
            recorded = push.record_failed(conn, claimed, status, error)
        if not recorded:
            return None  # the lease was lost: whoever holds it now records (and says) what came of it
        log.warning("push notification %s of task %s to config %s failed: %s", claimed.event_seq,
                    claimed.task_id, claimed.config_id, error)
        return "failed"


def tls_context(limits: PushSettings) -> ssl.SSLContext:
    """The public CAs (certifi's, as httpx's default), and ``SPECIALISTS_PUSH_CA_BUNDLE``'s when set."""
    context = ssl.create_default_context(cafile=certifi.where())
    if limits.ca_bundle is not None:
        context.load_verify_locations(cafile=str(limits.ca_bundle))
    return context


def transport_reason(exc: BaseException) -> str:
    """What an operator can act on: ``tls: certificate verify failed: <OpenSSL's reason>`` for a refused
    certificate (httpx wraps it in a bare ConnectError), else the transport error and its innermost OS error."""
    cause: BaseException | None = exc
    innermost: BaseException = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"tls: certificate verify failed: {cause.verify_message} (SPECIALISTS_PUSH_CA_BUNDLE adds a CA)"
        if isinstance(cause, ssl.SSLError):
            return f"tls: {cause.reason or cause.strerror or type(cause).__name__}"
        innermost = cause
        cause = cause.__cause__ or cause.__context__
    detail = str(innermost) if innermost is not exc or str(exc) else ""
    return f"transport: {type(exc).__name__}" + (f": {detail}" if detail else "")


def _body(event_data: bytes) -> bytes:
    event = StreamResponse()
    event.ParseFromString(event_data)
    return MessageToJson(event, indent=None).encode()
