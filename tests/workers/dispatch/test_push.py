"""Push notification delivery (workers/dispatch/push.py) against real PostgreSQL and a real webhook on 127.0.0.1.

Tasks and configurations are written through their owners (``taskstate.rows``, ``taskstate.push``); the
trigger of migration 0240 writes the notifications in the events' statements. The deliverer runs as the
dispatcher runs it, on a thread with its own event loop; the crash test runs `specialists dispatcher` itself
and SIGKILLs it. Tests wait on what the webhook received and what the rows say, never on time.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from contextlib import contextmanager

import psycopg
import pytest
from a2a.types.a2a_pb2 import Task, TaskState, TaskStatus
from pydantic import SecretStr, ValidationError
from sqlalchemy import Engine, text

from core import db
from core.push_signing import verify
from core.settings import Settings
from ops.topology import READY_FD, Ready, Role, ops_cli
from taskstate import push, rows
from taskstate.ids import TaskRef
from taskstate.notify import PUSH, TASK_EVENTS, libpq_url
from taskstate.updates import TaskEvents
from tests import commands
from tests.rlm.holds import wait_until
from tests.task_moves import move
from tests.webhook import Webhook, private_ca, running_webhook
from tests.workers.system import START_BOUNDS, STOP_GRACE_S, drop_database, fresh_database
from workers.dispatch.process import OutboxListener
from workers.dispatch.push import PushDeliverer, signer_of

pytestmark = pytest.mark.timeout(120)

SECRET = "push-tests-signing-secret-" + "s" * 40
FAST = dict(signing_secrets=[SecretStr(SECRET)], allow_loopback=True, backoff_base_s=0.05, backoff_max_s=0.2,
            resolve_timeout_s=1.0, request_timeout_s=1.0, lease_s=3.0, poll_interval_s=0.1, max_attempts=3)
STATES = [TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_COMPLETED]


@pytest.fixture(scope="module")
def push_database(server_url: str) -> Iterator[str]:
    """A database of this module's own: the session's is shared with tests/app's edges, whose dispatcher would
    deliver these tests' notifications with its own settings and resolver."""
    url = fresh_database(server_url)
    yield url
    drop_database(server_url, url)


@pytest.fixture(scope="module")
def engine(push_database: str) -> Iterator[Engine]:
    eng = db.make_engine(push_database, Settings(database={"url": push_database}))
    yield eng
    eng.dispose()


@pytest.fixture
def service_env(push_database: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
    env["DATABASE_URL"] = push_database
    return env


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    with running_webhook() as hook:
        yield hook


def push_settings(settings: Settings, **fields: object) -> Settings:
    return settings.model_copy(update={"push": settings.push.model_copy(update={**FAST, **fields})})


@contextmanager
def delivering(engine: Engine, settings: Settings, **kwargs: object) -> Iterator[PushDeliverer]:
    deliverer = PushDeliverer(engine, settings, name=f"test-{uuid.uuid4().hex[:6]}", **kwargs)
    stop = threading.Event()
    thread = threading.Thread(target=deliverer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield deliverer
    finally:
        stop.set()
        deliverer.wake.set()
        thread.join(10)


def new_task(engine: Engine, url: str, *, customer: str | None = None, token: str | None = "client-token") -> tuple[str, str]:
    """A SUBMITTED task with one push configuration (written first, so its first event notifies it)."""
    customer = customer or f"c-{uuid.uuid4().hex[:8]}"
    owner = f"{customer}:conformance"
    task = Task(id=str(uuid.uuid4()), context_id=str(uuid.uuid4()),
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
    rows.stamp(task)
    with engine.begin() as conn:
        push.insert_config(conn, push.Config(task_id=task.id, config_id="hook", url=url, token=token),
                           owner=owner, customer_id=customer, max_per_customer=100)
        rows.insert_new(conn, task, owner)
    return task.id, owner


def deliveries(engine: Engine, task_id: str) -> list[tuple[int, str, int, str | None]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT event_seq, state, attempts, last_error FROM push_deliveries WHERE task_id = :t ORDER BY event_seq"
        ), {"t": task_id})]


def settled(engine: Engine, task_id: str, count: int, timeout_s: float = 60) -> list[tuple[int, str, int, str | None]]:
    """Until the task's ``count`` notifications are no longer pending (only "never" fails)."""
    found: list[tuple[int, str, int, str | None]] = []

    def done() -> bool:
        found[:] = deliveries(engine, task_id)
        return len(found) == count and all(state != "pending" for _, state, _, _ in found)

    try:
        wait_until(done, f"the task's {count} notifications to settle", limit_s=timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {found}") from None
    return found


def test_a_webhook_receives_a_tasks_events_in_order_each_signed_and_bound_to_its_task(engine, settings, webhook):
    settings = push_settings(settings)
    path = f"/ok/{uuid.uuid4().hex}"
    task_id, owner = new_task(engine, webhook.url(path))
    with delivering(engine, settings) as deliverer:
        for state in STATES:
            move(engine, task_id, owner, state)
            deliverer.wake.set()
        received = webhook.wait_for(lambda seen: len([r for r in seen if r.path == path]) == 4)
        # The webhook has the fourth POST before the deliverer records its answer: stopping the deliverer first left
        # that row pending (a loaded run met it).
        recorded = settled(engine, task_id, 4)
    mine = [r for r in received if r.path == path]
    states = [r.event.get("task", {}).get("status", r.event.get("statusUpdate", {}).get("status", {}))["state"]
              for r in mine]
    assert states == ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_COMPLETED"]
    ids = [int(r.event_id) for r in mine]
    assert ids == sorted(ids) and len(set(ids)) == 4
    jwks = signer_of(settings).jwks()
    for r in mine:
        assert r.headers["x-a2a-notification-token"] == "client-token"
        claims = verify(r.headers["authorization"].removeprefix("Bearer "), jwks)
        assert claims["task_id"] == task_id and claims["event_id"] == r.event_id
        assert claims["aud"] == webhook.url(path) and claims["body_sha256"] == hashlib.sha256(r.body).hexdigest()
    assert [state for _, state, _, _ in recorded] == ["delivered"] * 4


def test_a_hanging_webhook_holds_only_its_customers_slots_and_another_customer_is_served(engine, settings, webhook):
    settings = push_settings(settings, request_timeout_s=30.0, lease_s=40.0, max_in_flight_per_customer=1)
    hang, fine = f"/hang/{uuid.uuid4().hex}", f"/ok/{uuid.uuid4().hex}"
    webhook.released.clear()
    with delivering(engine, settings) as deliverer:
        slow_task, _ = new_task(engine, webhook.url(hang))
        deliverer.wake.set()
        webhook.wait_for(lambda seen: any(r.path == hang for r in seen))  # held open now
        other_task, other_owner = new_task(engine, webhook.url(fine))
        move(engine, other_task, other_owner, TaskState.TASK_STATE_COMPLETED)
        deliverer.wake.set()
        webhook.wait_for(lambda seen: len([r for r in seen if r.path == fine]) == 2)
        assert webhook.hanging >= 1, "the other customer was served only after the hanging webhook let go"
        webhook.release()
        settled(engine, slow_task, 1)
    assert [state for _, state, _, _ in deliveries(engine, other_task)] == ["delivered", "delivered"]


def test_a_webhook_that_answers_500_is_retried_to_the_limit_then_listed_as_failed(engine, settings, webhook,
                                                                                   service_env):
    settings = push_settings(settings, max_attempts=3)
    path = f"/fail/{uuid.uuid4().hex}"
    customer = f"c-{uuid.uuid4().hex[:8]}"
    task_id, _ = new_task(engine, webhook.url(path), customer=customer)
    with delivering(engine, settings):
        [(seq, state, attempts, error)] = settled(engine, task_id, 1)
    command = ["push", "failures", "--customer", customer]  # each run in this process (tests/commands.py)
    # A customer the ledger does not know is refused, never listed as "nothing failed".
    unknown = commands.specialists([*command, "--json"], service_env)
    assert unknown.returncode != 0 and json.loads(unknown.stdout)["error"]["code"] == "customer_not_found", unknown
    assert commands.specialists(["customers", "add", "--customer", customer], service_env).returncode == 0
    assert (state, attempts) == ("failed", 3) and "http_500" in error and "SPECIALISTS_PUSH_MAX_ATTEMPTS" in error
    assert len(webhook.at(path)) == 3  # each attempt one request, and no more
    with engine.connect() as conn:
        [failed] = push.failed_deliveries(conn, customer_id=customer, limit=10)
    assert (failed.task_id, failed.event_seq, failed.last_status, failed.url) == (task_id, seq, 500, webhook.url(path))
    listed = commands.specialists([*command, "--json"], service_env)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)["failures"]
    assert (row["task_id"], row["event_id"], row["attempts"], row["last_status"]) == (task_id, str(seq), 3, 500)
    table = commands.specialists(command, service_env)
    assert table.returncode == 0, table.stderr
    assert task_id in table.stdout and "http_500" in table.stdout


def test_a_webhook_that_never_answers_is_abandoned_each_attempt_at_the_request_timeout(engine, settings, webhook):
    settings = push_settings(settings, request_timeout_s=0.3, max_attempts=2)
    path = f"/hang/{uuid.uuid4().hex}"
    webhook.released.clear()
    task_id, _ = new_task(engine, webhook.url(path))
    with delivering(engine, settings):
        [(_, state, attempts, error)] = settled(engine, task_id, 1)
    webhook.release()
    assert (state, attempts) == ("failed", 2) and "SPECIALISTS_PUSH_REQUEST_TIMEOUT_S" in error
    assert len(webhook.at(path)) == 2


def test_a_redirect_is_not_followed_and_fails_the_notification(engine, settings, webhook):
    path = f"/redirect/{uuid.uuid4().hex}"
    task_id, _ = new_task(engine, webhook.url(path))
    with delivering(engine, push_settings(settings)):
        [(_, state, attempts, error)] = settled(engine, task_id, 1)
    assert (state, attempts) == ("failed", 1) and error.startswith("redirect_refused")
    assert len(webhook.at(path)) == 1


def test_a_name_that_resolves_to_a_private_address_at_delivery_is_refused_then_without_a_request(engine, settings):
    # The one fake: DNS. A name that resolved to a public address when it was registered answers a private one now.
    task_id, _ = new_task(engine, "https://rebinding.example/hook")
    asked: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["10.0.0.7"]

    with delivering(engine, push_settings(settings), resolver=rebinding):
        [(_, state, attempts, error)] = settled(engine, task_id, 1)
    assert asked == ["rebinding.example"]
    assert (state, attempts) == ("failed", 1) and error.startswith("webhook_address_refused") and "10.0.0.7" in error


def test_a_name_that_resolves_to_loopback_is_refused_when_loopback_is_not_allowed(engine, settings, webhook):
    path = f"/ok/{uuid.uuid4().hex}"
    task_id, _ = new_task(engine, f"https://localhost:{webhook.port}{path}")
    with delivering(engine, push_settings(settings, allow_loopback=False)):
        [(_, state, _, error)] = settled(engine, task_id, 1)
    assert state == "failed" and "loopback" in error
    assert webhook.at(path) == []


def test_a_webhook_behind_a_private_ca_fails_naming_the_certificate_until_its_bundle_is_trusted(engine, settings,
                                                                                                 tmp_path):
    # Issue 42: a refused certificate was recorded as "transport: ConnectError", the reason lost.
    ca = private_ca(tmp_path)
    with running_webhook(tls=ca) as hook:
        path = f"/ok/{uuid.uuid4().hex}"
        refused_task, _ = new_task(engine, hook.url(path))
        with delivering(engine, push_settings(settings, max_attempts=1)):
            [(_, state, _, error)] = settled(engine, refused_task, 1)
        assert state == "failed" and error.startswith("tls: certificate verify failed: "), error
        assert "certificate" in error.removeprefix("tls: certificate verify failed: ") and hook.at(path) == []
        trusted = push_settings(settings, ca_bundle=ca.ca_pem)
        assert Settings(push={"ca_bundle": str(ca.ca_pem)}).push.ca_bundle == ca.ca_pem  # as start-up reads it
        trusted_task, _ = new_task(engine, hook.url(path))
        with delivering(engine, trusted):
            assert [state for _, state, _, _ in settled(engine, trusted_task, 1)] == ["delivered"]
        assert len(hook.at(path)) == 1
        # The bundle widens whom the service trusts, never where it may connect: loopback is still refused.
        blocked_task, _ = new_task(engine, hook.url(path))
        with delivering(engine, push_settings(settings, ca_bundle=ca.ca_pem, allow_loopback=False)):
            [(_, state, _, error)] = settled(engine, blocked_task, 1)
        assert state == "failed" and "loopback" in error and len(hook.at(path)) == 1


def test_a_ca_bundle_that_cannot_be_read_is_refused_at_start_up_naming_the_setting(tmp_path):
    (tmp_path / "not.pem").write_text("not a certificate")
    for bundle in (tmp_path / "missing.pem", tmp_path / "not.pem"):
        with pytest.raises(ValidationError, match="SPECIALISTS_PUSH_CA_BUNDLE"):
            Settings(push={"ca_bundle": str(bundle)})


# --- a dispatcher killed mid-delivery ------------------------------------------------------------------------


def test_a_dispatcher_killed_mid_delivery_leaves_every_event_delivered_once_per_event_id(push_database, engine,
                                                                                         webhook, tmp_path):
    url = push_database
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
    env.update({"DATABASE_URL": url, "SPECIALISTS_WORKER_JOB_SECRETS": "push-tests-worker-secret-" + "w" * 40,
                "SPECIALISTS_PUSH_SIGNING_SECRETS": SECRET, "SPECIALISTS_PUSH_ALLOW_LOOPBACK": "true",
                "SPECIALISTS_PUSH_LEASE_S": "3", "SPECIALISTS_PUSH_REQUEST_TIMEOUT_S": "1.5",
                "SPECIALISTS_PUSH_RESOLVE_TIMEOUT_S": "1", "SPECIALISTS_PUSH_POLL_INTERVAL_S": "0.1",
                "SPECIALISTS_PUSH_BACKOFF_BASE_S": "0.05"})

    def dispatcher(name: str) -> Role:
        """A `specialists dispatcher` (ops/topology.py), once its loop runs."""
        return _dispatcher_role(name, env, tmp_path).run()

    path = f"/hang/{uuid.uuid4().hex}"
    webhook.released.clear()
    first = dispatcher("first")
    try:
        task_id, owner = new_task(engine, webhook.url(path))
        for state in STATES:
            move(engine, task_id, owner, state)
        webhook.wait_for(lambda seen: any(r.path == path for r in seen))  # the first event's request is open
        first.kill()  # SIGKILL: nothing of its attempt is recorded
        webhook.release()
        second = dispatcher("second")
        try:
            received = webhook.wait_for(lambda seen: len({r.event_id for r in seen if r.path == path}) == 4)
            found = settled(engine, task_id, 4)
        finally:
            second.stop()
    finally:
        first.stop()
    mine = [r for r in received if r.path == path]
    event_ids = [r.event_id for r in mine]
    assert event_ids[0] == event_ids[1], "the killed attempt's event came again, with its event id"
    assert list(dict.fromkeys(event_ids)) == [str(seq) for seq, _, _, _ in found]  # in order, none lost
    assert len(event_ids) == 5  # the one attempt the kill left unrecorded, repeated once; nothing else twice
    assert [(state, attempts) for _, state, attempts, _ in found] == [("delivered", 2)] + [("delivered", 1)] * 3


def _dispatcher_role(name: str, env: dict[str, str], folder: Path) -> Role:
    """A `specialists dispatcher` as a role (ops/topology.py): ready once its loop runs, SIGTERM to stop it."""
    return Role(name, ops_cli("dispatcher", "--ready-fd", READY_FD), env, Ready.pipe(), folder / f"{name}.log",
                bounds=START_BOUNDS, stop_grace_s=STOP_GRACE_S)


def _dispatcher_env(push_database: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
    env.update({"DATABASE_URL": push_database, "SPECIALISTS_WORKER_JOB_SECRETS": "push-tests-worker-secret-" + "w" * 40,
                "SPECIALISTS_PUSH_SIGNING_SECRETS": SECRET, "SPECIALISTS_PUSH_ALLOW_LOOPBACK": "true",
                "SPECIALISTS_PUSH_LEASE_S": "3", "SPECIALISTS_PUSH_REQUEST_TIMEOUT_S": "1.5",
                "SPECIALISTS_PUSH_RESOLVE_TIMEOUT_S": "1", "SPECIALISTS_PUSH_POLL_INTERVAL_S": "0.1",
                "SPECIALISTS_PUSH_BACKOFF_BASE_S": "0.05", **extra})
    return env


def _traced(engine: Engine, task_id: str, owner: str) -> str:
    """Give the task a finished job whose outbox row holds a trace, as admission writes it: the task's trace id."""
    trace_id = uuid.uuid4().hex
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO edge_tasks (task_id, customer_id, key_id, specialist_id, skill_id, owner, tariff_credits, "
            "reservation_id, admitted_at) VALUES (:t, NULL, NULL, 'conformance', 'conformance', :o, 0, NULL, now())"),
            {"t": task_id, "o": owner})
        conn.execute(text(
            "INSERT INTO dispatch_outbox (task_id, specialist_id, executor, owner, context_id, message, status, "
            "finished_at, attempts, trace_parent) VALUES (:t, 'conformance', 'conformance', :o, :t, '\\x0a00', "
            "'done', now(), 1, :tp)"), {"t": task_id, "o": owner, "tp": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"})
    return trace_id


def test_a_dispatchers_attempts_are_counted_and_each_is_a_span_in_its_tasks_trace(push_database, engine, webhook,
                                                                                  tmp_path):
    # Issue 42: every webhook POST was a trace of its own (136 traces for 6 tasks), and nothing counted attempts.
    from tests.otlp import otlp_receiver, telemetry_env

    ok, failing = f"/ok/{uuid.uuid4().hex}", f"/fail/{uuid.uuid4().hex}"
    ok_task, ok_owner = new_task(engine, webhook.url(ok))
    fail_task, fail_owner = new_task(engine, webhook.url(failing))
    ok_trace, fail_trace = _traced(engine, ok_task, ok_owner), _traced(engine, fail_task, fail_owner)
    with otlp_receiver() as receiver:
        env = _dispatcher_env(push_database, SPECIALISTS_PUSH_MAX_ATTEMPTS="2", **telemetry_env(receiver))
        dispatcher = _dispatcher_role("dispatcher", env, tmp_path).run()
        try:
            assert [state for _, state, _, _ in settled(engine, ok_task, 1)] == ["delivered"]
            assert [(state, attempts) for _, state, attempts, _ in settled(engine, fail_task, 1)] == [("failed", 2)]

            def counted() -> dict[str, float] | None:
                totals = {outcome: receiver.total("specialists.push.attempts", outcome=outcome)
                          for outcome in ("delivered", "retried", "failed")}
                return totals if all(totals.values()) else None

            totals = receiver.wait_for("the push attempts' counters", counted, 60)

            def delivered_in(trace_id: str, outcome: str) -> list | None:
                spans = receiver.trace(trace_id)
                mine = [s for s in spans if s.name == "push.deliver" and s.attributes.get("specialists.outcome") == outcome]
                posts = [s for s in spans if s.kind == 3 and any(s.parent_span_id == d.span_id for d in mine)]  # CLIENT
                return spans if mine and posts else None

            ok_spans = receiver.wait_for("the delivery's span in its task's trace", lambda: delivered_in(ok_trace, "delivered"), 60)
            fail_spans = receiver.wait_for("the retried attempt's span", lambda: delivered_in(fail_trace, "failed"), 60)
        finally:
            dispatcher.stop()
    assert totals["delivered"] >= 1 and totals["retried"] >= 1 and totals["failed"] >= 1, totals
    attempts = sorted(s.attributes["specialists.attempt"] for s in fail_spans if s.name == "push.deliver")
    assert attempts == [1, 2]  # both attempts, one trace: the task's
    assert {s.attributes["specialists.task_id"] for s in ok_spans if s.name == "push.deliver"} == {ok_task}
    # No attempt of these tasks started a trace of its own.
    assert not [s for s in receiver.spans if s.name == "push.deliver" and s.attributes.get("specialists.task_id")
                in (ok_task, fail_task) and s.trace_id not in (ok_trace, fail_trace)]


def test_retries_are_listed_before_they_fail_and_an_operator_can_turn_a_customers_webhooks_off(
        engine, settings, webhook, service_env):
    customer = f"c-{uuid.uuid4().hex[:8]}"
    def cli(*args: str) -> dict:
        done = commands.specialists([*args, "--json"], service_env)  # in this process (tests/commands.py)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    cli("customers", "add", "--customer", customer)
    path = f"/fail/{uuid.uuid4().hex}"
    task_id, owner = new_task(engine, webhook.url(path), customer=customer)
    # A long backoff: after its first attempt the notification waits, pending, for its retry.
    with delivering(engine, push_settings(settings, backoff_base_s=600.0, backoff_max_s=600.0, max_attempts=8)):
        wait_until(lambda: [row[1:] for row in deliveries(engine, task_id)] == [("pending", 1, "http_500")],
                   "the first attempt's http_500, its retry pending", limit_s=60)
    [retry] = cli("push", "retries", "--customer", customer)["retries"]
    assert (retry["task_id"], retry["attempts"], retry["last_status"], retry["last_error"], retry["in_flight"]) == (
        task_id, 1, 500, "http_500", False)
    assert cli("push", "failures", "--customer", customer)["failures"] == []  # not failed: waiting
    with engine.connect() as conn:
        assert push.backlog(conn, failed_since=datetime.now(timezone.utc)).retrying >= 1

    disabled = cli("push", "disable", "--customer", customer, "--reason", "their webhook is down for the week")
    assert (disabled["disabled"], disabled["pending_failed"]) == (True, 1)
    assert [row[1:] for row in deliveries(engine, task_id)] == [("failed", 1, push.DISABLED_ERROR)]
    assert cli("push", "retries", "--customer", customer)["retries"] == []
    assert customer in [d["customer_id"] for d in cli("push", "disabled")["disabled"]]
    move(engine, task_id, owner, TaskState.TASK_STATE_WORKING)
    assert len(deliveries(engine, task_id)) == 1  # no notification written while off

    assert cli("push", "enable", "--customer", customer)["was_disabled"] is True
    move(engine, task_id, owner, TaskState.TASK_STATE_COMPLETED)
    assert [state for _, state, _, _ in deliveries(engine, task_id)] == ["failed", "pending"]  # on again
    typo = commands.specialists(["push", "disable", "--customer", customer[:-1] + "z", "--reason", "x", "--json"],
                                service_env)
    assert typo.returncode == 1 and json.loads(typo.stdout)["error"]["code"] == "customer_not_found"
    blank = commands.specialists(["push", "disable", "--customer", customer, "--reason", " ", "--json"], service_env)
    refused = json.loads(blank.stdout)["error"]
    assert blank.returncode == 2 and refused["code"] == "reason_invalid", blank
    assert "not 0" in refused["message"] and "SPECIALISTS_LEDGER_MAX_REASON_CHARS" in refused["message"], refused


def _plain_task(engine: Engine) -> tuple[str, str]:
    """A SUBMITTED task with no push configuration."""
    owner = f"c-{uuid.uuid4().hex[:8]}:conformance"
    task = Task(id=str(uuid.uuid4()), context_id=str(uuid.uuid4()),
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
    rows.stamp(task)
    with engine.begin() as conn:
        rows.insert_new(conn, task, owner)
    return task.id, owner


def _resolve(events: TaskEvents, task_id: str, owner: str) -> None:
    """What an operator's reconcile or a worker's finish does: the final event through the job's writer, then
    the wake-up after the commit."""
    with events.engine.begin() as conn:
        context_id = conn.execute(text("SELECT context_id FROM tasks WHERE id = :t"), {"t": task_id}).scalar_one()
        assert events.resolve(conn, TaskRef(task_id=task_id, dispatch_id=1, owner=owner, context_id=context_id),
                              "completed")
    events.notify(task_id)


def test_only_an_event_of_a_task_with_push_configurations_wakes_the_push_deliverers(engine, push_database, webhook):
    """The write tells its writer whether the event was a notification; only then does the wake-up after the
    commit also go to ``edge_push``, so the dispatchers' deliverers claim per notification, not per event
    (tests/workers/test_statements_per_job.py counts what a job without push costs)."""
    events = TaskEvents(engine)
    plain, plain_owner = _plain_task(engine)
    pushed, pushed_owner = new_task(engine, webhook.url(f"/ok/{uuid.uuid4().hex}"))
    with psycopg.connect(libpq_url(push_database), autocommit=True) as listening:
        listening.execute(f"LISTEN {TASK_EVENTS}")
        listening.execute(f"LISTEN {PUSH}")
        _resolve(events, plain, plain_owner)
        _resolve(events, pushed, pushed_owner)
        heard: list[tuple[str, str]] = []
        for notice in listening.notifies(timeout=30):
            heard.append((notice.channel, notice.payload))
            if (TASK_EVENTS, pushed) in heard and (PUSH, "") in heard:
                break
    # Notifications arrive in commit order, so nothing of the plain task's is still on its way.
    assert heard == [(TASK_EVENTS, plain), (TASK_EVENTS, pushed), (PUSH, "")]


def test_a_notification_is_delivered_on_its_wake_up_not_at_the_next_poll(engine, settings, push_database, webhook):
    """The deliverer as the dispatcher runs it (``_start_push``'s listener on ``edge_push``), polling only
    every 60 s: a task's event is delivered because its writer woke the deliverer. The wait's bound is half the
    poll interval, so a delivery that only the poll made fails it."""
    path = f"/ok/{uuid.uuid4().hex}"
    polled = push_settings(settings, poll_interval_s=60.0)
    wake = threading.Event()
    listener = OutboxListener(push_database, wake, 10, channel=PUSH)
    listener.start()
    first_claim = threading.Event()
    stop = threading.Event()
    with engine.begin() as conn:  # earlier tests' undelivered notifications: delivering them would wake it too
        conn.execute(text("UPDATE push_deliveries SET state = 'failed', finished_at = now(), leased_until = NULL "
                          "WHERE state = 'pending'"))
    try:
        assert wake.wait(30), "the listener never ran LISTEN"  # set once it has: a notification wakes it now
        deliverer = PushDeliverer(engine, polled, name=f"test-{uuid.uuid4().hex[:6]}", wake=wake)
        _signal_claims(deliverer, first_claim)
        thread = threading.Thread(target=deliverer.run, args=(stop,), daemon=True)
        thread.start()
        first_claim.wait(30)  # its first round found nothing: it now waits for a wake-up or 60 s
        assert first_claim.is_set()
        task_id, owner = new_task(engine, webhook.url(path))
        _resolve(TaskEvents(engine), task_id, owner)
        received = webhook.wait_for(lambda seen: sum(r.path == path for r in seen) == 2, timeout_s=30)
        assert len([r for r in received if r.path == path]) == 2  # the SUBMITTED task and its final event
    finally:
        stop.set()
        wake.set()
        listener.stop()


def _signal_claims(deliverer: PushDeliverer, claimed: threading.Event) -> None:
    """Set ``claimed`` each time the deliverer has finished a claim round (its first: it now waits)."""
    claim = deliverer._claim

    def signalled(free: int, in_flight: dict[str, int]) -> list[push.Claimed]:
        try:
            return claim(free, in_flight)
        finally:
            claimed.set()

    deliverer._claim = signalled  # type: ignore[method-assign]


def test_a_deliverer_waiting_out_its_poll_interval_stops_when_asked_without_a_wake_up(engine, settings):
    """The dispatcher stops its push thread by its stop event alone and then joins it: a deliverer that heard
    nothing, polling every 60 s, must not hold the dispatcher's stop for the rest of the interval (the join gave
    up after SPECIALISTS_DATABASE_CONNECT_TIMEOUT_S, and a supervisor's grace ran out first)."""
    deliverer = PushDeliverer(engine, push_settings(settings, poll_interval_s=60.0), name=f"test-{uuid.uuid4().hex[:6]}")
    first_claim = threading.Event()
    _signal_claims(deliverer, first_claim)
    stop = threading.Event()
    thread = threading.Thread(target=deliverer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert first_claim.wait(30)  # its first round is done: it now waits for a wake-up, 60 s or the stop
        stop.set()
        thread.join(30)  # half the poll interval: a stop that only the poll ended fails here
        assert not thread.is_alive(), "the deliverer waited out its poll interval after it was asked to stop"
    finally:
        stop.set()
        deliverer.wake.set()


def test_the_prune_removes_finished_notifications_and_ended_tasks_configurations_past_retention(engine, settings, webhook):
    path = f"/ok/{uuid.uuid4().hex}"
    task_id, owner = new_task(engine, webhook.url(path))
    move(engine, task_id, owner, TaskState.TASK_STATE_COMPLETED)
    with delivering(engine, push_settings(settings)):
        settled(engine, task_id, 2)
    with engine.begin() as conn:
        assert push.prune(conn, retention_s=3600, batch=100) == 0  # within retention: kept
        conn.execute(text("UPDATE push_deliveries SET finished_at = finished_at - interval '2 hours' WHERE task_id = :t"),
                     {"t": task_id})
        conn.execute(text("UPDATE push_configs SET created_at = created_at - interval '2 hours' WHERE task_id = :t"),
                     {"t": task_id})
        assert push.prune(conn, retention_s=3600, batch=100) == 3  # two notifications, one configuration
        assert push.get_config(conn, task_id, "hook", owner) is None


def test_the_per_customer_cap_counts_configurations_of_tasks_that_have_not_ended(engine):
    customer = f"c-{uuid.uuid4().hex[:8]}"
    first, owner = new_task(engine, "https://example.com/a", customer=customer)
    second, _ = new_task(engine, "https://example.com/b", customer=customer)
    with engine.begin() as conn:
        with pytest.raises(push.TooManyConfigs):
            push.insert_config(conn, push.Config(task_id=second, config_id="more", url="https://example.com/c"),
                               owner=owner, customer_id=customer, max_per_customer=2)
    move(engine, first, owner, TaskState.TASK_STATE_COMPLETED)  # an ended task's configuration no longer counts
    with engine.begin() as conn:
        assert push.insert_config(conn, push.Config(task_id=second, config_id="more", url="https://example.com/c"),
                                  owner=owner, customer_id=customer, max_per_customer=2)


def test_the_delivery_loop_and_the_operators_reads_are_served_by_indexes_as_notifications_pile_up(engine):
    """20,000 finished notifications and configurations of one customer's ended tasks: the claim, the failures'
    list (everyone's and one customer's), the cap's count and the prune read index ranges, never the table."""
    from tests.query_plans import large_seq_scans_of_call

    customer = f"c-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(text("""
            INSERT INTO push_deliveries (task_id, config_id, customer_id, event_seq, task_version, event_data, state,
                                         finished_at, last_error)
            SELECT left(md5(n::text), 36), 'hook', :c || (n % 50), n, 1, '\\x00',
                   CASE WHEN n % 10 = 0 THEN 'failed' ELSE 'delivered' END, now(), 'http_500'
              FROM generate_series(1, 20000) AS n"""), {"c": customer})
        conn.execute(text("""
            INSERT INTO push_configs (task_id, config_id, owner, customer_id, url)
            SELECT left(md5(n::text), 36), 'hook', :o, :c, 'https://example.com/'
              FROM generate_series(1, 20000) AS n"""), {"c": customer, "o": f"{customer}:conformance"})
        conn.execute(text("ANALYZE push_deliveries"))
        conn.execute(text("ANALYZE push_configs"))
    calls = {
        "claim": lambda conn: push.claim(conn, by="plans", lease_s=5, free=16, per_customer={}, per_customer_max=2),
        "failures": lambda conn: push.failed_deliveries(conn, limit=50),
        "one customer's failures": lambda conn: push.failed_deliveries(conn, customer_id=customer + "7", limit=50),
        "retries": lambda conn: push.retrying_deliveries(conn, limit=50),
        "one customer's retries": lambda conn: push.retrying_deliveries(conn, customer_id=customer + "7", limit=50),
        "disable": lambda conn: push.disable_customer(conn, customer + "7", reason="plans", by="plans"),
        "prune": lambda conn: push.prune(conn, retention_s=86400, batch=1000),
        "cap": lambda conn: push.insert_config(conn, push.Config(task_id=str(uuid.uuid4()), config_id="x",
                                                                 url="https://example.com/"),
                                               owner="o", customer_id=f"c-{uuid.uuid4().hex[:8]}", max_per_customer=5),
    }
    try:
        for name, call in calls.items():
            sent, scans = large_seq_scans_of_call(engine, call, min_rows=10_000)
            assert sent and not scans, (name, scans)
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM push_deliveries WHERE customer_id LIKE :c"), {"c": f"{customer}%"})
            conn.execute(text("DELETE FROM push_configs WHERE customer_id = :c"), {"c": customer})
            push.enable_customer(conn, customer + "7")
