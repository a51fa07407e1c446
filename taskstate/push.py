"""The owner of ``push_configs`` and ``push_deliveries``: customers' webhook configurations and their notifications.

A configuration belongs to a task and its owner (``<customer>:<specialist>``): every read and write here is
scoped by owner, so another customer's task or configuration reads as absent. ``insert_config`` holds the
customer's advisory lock while it counts, so the per-customer cap holds under concurrent registrations; it
counts the configurations of the customer's tasks that have not ended.

A delivery row is written by the trigger on ``task_events`` (migration 0240), in the statement that writes the
event: one row per configuration of the task, with a copy of the event. The dispatcher (``claim``) leases due
rows; a row is due only when no earlier row of the same webhook (task and configuration) is still pending, so
one webhook receives a task's events in order, whichever dispatcher sends them. The lease is the fencing token
(``leased_by`` with the attempt number): an outcome is recorded only by the holder of the current lease, so a
dispatcher that lost its lease (it stalled past ``lease_s``) records nothing. A dispatcher killed mid-delivery
leaves its row pending; after its lease it is delivered again, with the same event id: delivery is at least
once, and the event id (``X-A2A-Notification-Event-Id``, the event's sequence number) is how a receiver keeps
it exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from core.db import compact_sql
from taskstate import outbox, rows

MAX_CONFIG_ID_CHARS = 64
MAX_ERROR_CHARS = 500  # push_deliveries.last_error's CHECK
MAX_DISABLE_REASON_CHARS = 1000  # push_disabled.reason's CHECK (migration 0280)
DISABLED_ERROR = "push_disabled: an operator disabled the customer's webhooks (`specialists push enable`)"


@dataclass(frozen=True)
class Config:
    task_id: str
    config_id: str
    url: str
    token: str | None = None
    auth_scheme: str | None = None
    auth_credentials: str | None = None


@dataclass(frozen=True)
class Claimed:
    """A notification leased for one attempt, with its webhook."""

    delivery_id: int
    task_id: str
    config_id: str
    customer_id: str
    event_seq: int
    event_data: bytes
    attempts: int  # including this one
    created_at: datetime
    lease: str  # the fencing token of this attempt
    config: Config
    trace_parent: str | None = None  # the task's trace (its first job's), which the delivery's span continues


@dataclass(frozen=True)
class FailedDelivery:
    delivery_id: int
    customer_id: str
    task_id: str
    config_id: str
    event_seq: int
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: datetime
    finished_at: datetime
    url: str | None  # None when the configuration was deleted since

    def to_dict(self) -> dict[str, Any]:
        return {"delivery_id": self.delivery_id, "customer_id": self.customer_id, "task_id": self.task_id,
                "config_id": self.config_id, "event_id": str(self.event_seq), "attempts": self.attempts,
                "last_status": self.last_status, "last_error": self.last_error,
                "created_at": self.created_at.isoformat(), "finished_at": self.finished_at.isoformat(),
                "url": self.url}


class TooManyConfigs(Exception):
    def __init__(self, held: int) -> None:
        super().__init__(held)
        self.held = held


_LOCK_CUSTOMER = text("SELECT pg_advisory_xact_lock(hashtext('push_configs:' || :customer_id))")
_COUNT_LIVE = text(compact_sql(f"""
    SELECT count(*) FROM push_configs c
     WHERE c.customer_id = :customer_id AND NOT {rows.ended_task_sql('c.task_id')}
       AND NOT (c.task_id = :task_id AND c.config_id = :config_id)
"""))
_UPSERT = text(compact_sql("""
    INSERT INTO push_configs (task_id, config_id, owner, customer_id, url, token, auth_scheme, auth_credentials)
    VALUES (:task_id, :config_id, :owner, :customer_id, :url, :token, :auth_scheme, :auth_credentials)
    ON CONFLICT (task_id, config_id) DO UPDATE
       SET url = EXCLUDED.url, token = EXCLUDED.token, auth_scheme = EXCLUDED.auth_scheme,
           auth_credentials = EXCLUDED.auth_credentials
     WHERE push_configs.owner = EXCLUDED.owner
    RETURNING 1
"""))


def insert_config(conn: Connection, config: Config, *, owner: str, customer_id: str, max_per_customer: int) -> bool:
    """Store (or replace, same id) the configuration; False if its id is another owner's (nothing written).
    Raises ``TooManyConfigs`` when the customer already holds ``max_per_customer`` live ones."""
    conn.execute(_LOCK_CUSTOMER, {"customer_id": customer_id})
    held = conn.execute(_COUNT_LIVE, {"customer_id": customer_id, "task_id": config.task_id,
                                      "config_id": config.config_id}).scalar_one()
    if held >= max_per_customer:
        raise TooManyConfigs(held)
    written = conn.execute(_UPSERT, {**config.__dict__, "owner": owner, "customer_id": customer_id}).first()
    return written is not None


_SELECT_CONFIGS = "SELECT task_id, config_id, url, token, auth_scheme, auth_credentials FROM push_configs"


def _config(row: Any) -> Config:
    return Config(task_id=row.task_id, config_id=row.config_id, url=row.url, token=row.token,
                  auth_scheme=row.auth_scheme, auth_credentials=row.auth_credentials)


def get_config(conn: Connection, task_id: str, config_id: str, owner: str) -> Config | None:
    row = conn.execute(text(f"{_SELECT_CONFIGS} WHERE task_id = :t AND config_id = :c AND owner = :o"),
                       {"t": task_id, "c": config_id, "o": owner}).first()
    return _config(row) if row is not None else None


def list_configs(conn: Connection, task_id: str, owner: str, *, limit: int) -> list[Config]:
    found = conn.execute(text(f"{_SELECT_CONFIGS} WHERE task_id = :t AND owner = :o ORDER BY created_at, config_id "
                              "LIMIT :n"), {"t": task_id, "o": owner, "n": limit})
    return [_config(row) for row in found]


_DELETE = text(compact_sql("""
    WITH gone AS (DELETE FROM push_configs WHERE task_id = :t AND config_id = :c AND owner = :o
                  RETURNING task_id, config_id),
    unsent AS (DELETE FROM push_deliveries d USING gone
                WHERE d.task_id = gone.task_id AND d.config_id = gone.config_id AND d.state = 'pending')
    SELECT count(*) FROM gone
"""))


def delete_config(conn: Connection, task_id: str, config_id: str, owner: str) -> bool:
    """Delete the configuration and its notifications not yet sent; False if there was none of this owner's."""
    return conn.execute(_DELETE, {"t": task_id, "c": config_id, "o": owner}).scalar_one() > 0


def delete_task_configs(conn: Connection, task_id: str, owner: str) -> None:
    """A send turned out to be a resend: the configuration it carried for its would-be task goes with it."""
    conn.execute(text("DELETE FROM push_configs WHERE task_id = :t AND owner = :o"), {"t": task_id, "o": owner})


def configured_sql() -> str:
    """The condition ``rows.write_event(pushed_sql=...)`` reads in the event's own statement: the task (``:task_id``,
    ``:owner``) has push configurations, so the trigger of migration 0240 wrote notifications for the event and
    the writer wakes the push deliverers after its commit (``notify.PUSH``). A primary-key probe, no round trip."""
    return "EXISTS (SELECT 1 FROM push_configs c WHERE c.task_id = :task_id AND c.owner = :owner)"


# --- delivery (the dispatcher) ------------------------------------------------------------------------------

_CANDIDATES = text(compact_sql("""
    SELECT delivery_id, customer_id FROM (
        SELECT d.delivery_id, d.customer_id, d.next_attempt_at,
               row_number() OVER (PARTITION BY d.customer_id ORDER BY d.next_attempt_at, d.delivery_id) AS rank
          FROM push_deliveries d
         WHERE d.state = 'pending' AND d.next_attempt_at <= now()
           AND (d.leased_until IS NULL OR d.leased_until <= now())
           AND NOT (d.customer_id = ANY (CAST(:busy AS text[])))
           AND NOT EXISTS (SELECT 1 FROM push_deliveries e
                            WHERE e.task_id = d.task_id AND e.config_id = d.config_id AND e.state = 'pending'
                              AND e.event_seq < d.event_seq)
    ) due WHERE rank <= :per_customer ORDER BY next_attempt_at, delivery_id LIMIT :scan
"""))
# The lease, re-checked row by row under READ COMMITTED: of two dispatchers that saw the same candidate, one
# updates it and the other finds the condition false on the newest version and skips it. A candidate of a customer
# whose webhooks an operator disabled (``push_disabled``: a row the trigger wrote as the disable committed) is
# failed instead, in the same statement: the two updates' rows are disjoint by the same condition.
_LEASE = text(compact_sql(f"""
    WITH stopped AS (
        UPDATE push_deliveries d
           SET state = 'failed', finished_at = now(), leased_until = NULL, last_error = :disabled_error
          FROM push_disabled x
         WHERE d.delivery_id = ANY (CAST(:ids AS bigint[])) AND d.state = 'pending'
           AND (d.leased_until IS NULL OR d.leased_until <= now()) AND x.customer_id = d.customer_id
        RETURNING d.delivery_id)
    UPDATE push_deliveries d
       SET leased_until = now() + make_interval(secs => :lease_s), attempts = d.attempts + 1,
           leased_by = :by || '#' || (d.attempts + 1)
      FROM push_configs c
     WHERE d.delivery_id = ANY (CAST(:ids AS bigint[])) AND d.state = 'pending'
       AND (d.leased_until IS NULL OR d.leased_until <= now())
       AND c.task_id = d.task_id AND c.config_id = d.config_id
       AND NOT EXISTS (SELECT 1 FROM push_disabled x WHERE x.customer_id = d.customer_id)
    RETURNING d.delivery_id, d.task_id, d.config_id, d.customer_id, d.event_seq, d.event_data, d.attempts,
              d.created_at, d.leased_by, c.url, c.token, c.auth_scheme, c.auth_credentials,
              {outbox.task_trace_sql('d.task_id')} AS trace_parent
"""))


def claim(conn: Connection, *, by: str, lease_s: float, free: int, per_customer: dict[str, int],
          per_customer_max: int) -> list[Claimed]:
    """Lease up to ``free`` due notifications, at most ``per_customer_max - per_customer[c]`` of customer c's."""
    if free <= 0:
        return []
    busy = [customer for customer, n in per_customer.items() if n >= per_customer_max]
    found = conn.execute(_CANDIDATES, {"busy": busy, "per_customer": per_customer_max, "scan": free * 4}).all()
    chosen: list[int] = []
    taken: dict[str, int] = {}
    for row in found:
        held = per_customer.get(row.customer_id, 0) + taken.get(row.customer_id, 0)
        if held < per_customer_max and len(chosen) < free:
            chosen.append(row.delivery_id)
            taken[row.customer_id] = taken.get(row.customer_id, 0) + 1
    if not chosen:
        return []
    leased = conn.execute(_LEASE, {"ids": chosen, "by": by, "lease_s": lease_s, "disabled_error": DISABLED_ERROR}).all()
    return [
        Claimed(delivery_id=row.delivery_id, task_id=row.task_id, config_id=row.config_id,
                customer_id=row.customer_id, event_seq=row.event_seq, event_data=bytes(row.event_data),
                attempts=row.attempts, created_at=row.created_at, lease=row.leased_by,
                config=Config(task_id=row.task_id, config_id=row.config_id, url=row.url, token=row.token,
                              auth_scheme=row.auth_scheme, auth_credentials=row.auth_credentials),
                trace_parent=row.trace_parent)
        for row in sorted(leased, key=lambda r: r.delivery_id)
    ]


_FINISH = text(compact_sql("""
    UPDATE push_deliveries SET state = :state, finished_at = now(), leased_until = NULL,
           last_status = :status, last_error = :error
     WHERE delivery_id = :id AND leased_by = :lease AND state = 'pending'
"""))
_RETRY = text(compact_sql("""
    UPDATE push_deliveries SET next_attempt_at = now() + make_interval(secs => :wait_s), leased_until = NULL,
           last_status = :status, last_error = :error
     WHERE delivery_id = :id AND leased_by = :lease AND state = 'pending'
"""))


def _clip(error: str | None) -> str | None:
    return error[:MAX_ERROR_CHARS] if error is not None else None  # clipped to the column's named bound


def record_delivered(conn: Connection, claimed: Claimed, status: int) -> bool:
    return conn.execute(_FINISH, {"state": "delivered", "status": status, "error": None, "id": claimed.delivery_id,
                                  "lease": claimed.lease}).rowcount == 1


def record_failed(conn: Connection, claimed: Claimed, status: int | None, error: str) -> bool:
    return conn.execute(_FINISH, {"state": "failed", "status": status, "error": _clip(error),
                                  "id": claimed.delivery_id, "lease": claimed.lease}).rowcount == 1


def record_retry(conn: Connection, claimed: Claimed, wait_s: float, status: int | None, error: str) -> bool:
    return conn.execute(_RETRY, {"wait_s": wait_s, "status": status, "error": _clip(error),
                                 "id": claimed.delivery_id, "lease": claimed.lease}).rowcount == 1


# --- reads for operators, and retention ---------------------------------------------------------------------

_FAILED = compact_sql("""
    SELECT d.delivery_id, d.customer_id, d.task_id, d.config_id, d.event_seq, d.attempts, d.last_status,
           d.last_error, d.created_at, d.finished_at, c.url
      FROM push_deliveries d LEFT JOIN push_configs c ON c.task_id = d.task_id AND c.config_id = d.config_id
     WHERE d.state = 'failed' {customer}
     ORDER BY d.finished_at DESC, d.delivery_id DESC LIMIT :limit
""")


def failed_deliveries(conn: Connection, *, customer_id: str | None = None, limit: int) -> list[FailedDelivery]:
    """Notifications that finally failed, newest first (one customer's, or everyone's): an index range."""
    statement = _FAILED.format(customer="AND d.customer_id = :customer_id" if customer_id is not None else "")
    found = conn.execute(text(statement), {"customer_id": customer_id, "limit": limit})
    return [FailedDelivery(**row._mapping) for row in found]


@dataclass(frozen=True)
class RetryingDelivery:
    """A notification attempted at least once and not finished: waiting for its next attempt, or in one now."""

    delivery_id: int
    customer_id: str
    task_id: str
    config_id: str
    event_seq: int
    attempts: int  # made so far (the one in flight counts)
    last_status: int | None
    last_error: str | None  # the previous attempt's reason (None while the first attempt is in flight)
    created_at: datetime
    next_attempt_at: datetime
    in_flight: bool
    url: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"delivery_id": self.delivery_id, "customer_id": self.customer_id, "task_id": self.task_id,
                "config_id": self.config_id, "event_id": str(self.event_seq), "attempts": self.attempts,
                "last_status": self.last_status, "last_error": self.last_error,
                "created_at": self.created_at.isoformat(), "next_attempt_at": self.next_attempt_at.isoformat(),
                "in_flight": self.in_flight, "url": self.url}


_RETRYING = compact_sql("""
    SELECT d.delivery_id, d.customer_id, d.task_id, d.config_id, d.event_seq, d.attempts, d.last_status,
           d.last_error, d.created_at, d.next_attempt_at, (d.leased_until IS NOT NULL AND d.leased_until > now())
           AS in_flight, c.url
      FROM push_deliveries d LEFT JOIN push_configs c ON c.task_id = d.task_id AND c.config_id = d.config_id
     WHERE d.state = 'pending' AND d.attempts > 0 {customer}
     ORDER BY d.next_attempt_at, d.delivery_id LIMIT :limit
""")


def retrying_deliveries(conn: Connection, *, customer_id: str | None = None, limit: int) -> list[RetryingDelivery]:
    """Notifications attempted and not finished (a retry is due, or an attempt runs), the next due first: the
    pending range of push_deliveries_due, so what `push failures` will list before it gets there."""
    statement = _RETRYING.format(customer="AND d.customer_id = :customer_id" if customer_id is not None else "")
    found = conn.execute(text(statement), {"customer_id": customer_id, "limit": limit})
    return [RetryingDelivery(**row._mapping) for row in found]


@dataclass(frozen=True)
class Disabled:
    customer_id: str
    reason: str
    disabled_by: str
    disabled_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"customer_id": self.customer_id, "reason": self.reason, "disabled_by": self.disabled_by,
                "disabled_at": self.disabled_at.isoformat()}


_DISABLE = text(compact_sql("""
    WITH marked AS (
        INSERT INTO push_disabled (customer_id, reason, disabled_by) VALUES (:customer_id, :reason, :by)
        ON CONFLICT (customer_id) DO UPDATE SET reason = EXCLUDED.reason, disabled_by = EXCLUDED.disabled_by,
                                                disabled_at = now()
        RETURNING 1),
    stopped AS (
        UPDATE push_deliveries SET state = 'failed', finished_at = now(), leased_until = NULL,
               last_error = :disabled_error
         WHERE customer_id = :customer_id AND state = 'pending'
        RETURNING 1)
    SELECT (SELECT count(*) FROM stopped) AS stopped, (SELECT count(*) FROM marked) AS marked
"""))


def disable_customer(conn: Connection, customer_id: str, *, reason: str, by: str) -> int:
    """Turn off the customer's webhooks: recorded (the trigger then writes no notification for its events, the
    claim fails any written meanwhile), and its pending notifications failed now, an attempt in flight included
    (its outcome is fenced out). The number failed now."""
    if not 1 <= len(reason) <= MAX_DISABLE_REASON_CHARS:
        raise ValueError(f"a reason has 1 to {MAX_DISABLE_REASON_CHARS} characters")
    return int(conn.execute(_DISABLE, {"customer_id": customer_id, "reason": reason, "by": by,
                                       "disabled_error": DISABLED_ERROR}).one().stopped)


def enable_customer(conn: Connection, customer_id: str) -> bool:
    """Turn the customer's webhooks back on (its next events notify again); False if they were not off."""
    return conn.execute(text("DELETE FROM push_disabled WHERE customer_id = :c"),
                        {"c": customer_id}).rowcount == 1


def disabled_customers(conn: Connection, *, limit: int) -> list[Disabled]:
    found = conn.execute(text("SELECT customer_id, reason, disabled_by, disabled_at FROM push_disabled "
                              "ORDER BY disabled_at DESC, customer_id LIMIT :n"), {"n": limit})
    return [Disabled(**row._mapping) for row in found]


_PRUNE = text(compact_sql(f"""
    WITH old AS (SELECT delivery_id FROM push_deliveries
                  WHERE state <> 'pending' AND finished_at < now() - make_interval(secs => :retention_s)
                  ORDER BY finished_at LIMIT :batch),
    gone AS (DELETE FROM push_deliveries d USING old WHERE d.delivery_id = old.delivery_id RETURNING 1),
    done_configs AS (SELECT c.task_id, c.config_id FROM push_configs c
                      WHERE c.created_at < now() - make_interval(secs => :retention_s)
                        AND {rows.ended_task_sql('c.task_id')}
                        AND NOT EXISTS (SELECT 1 FROM push_deliveries p WHERE p.task_id = c.task_id
                                           AND p.config_id = c.config_id AND p.state = 'pending')
                      ORDER BY c.created_at LIMIT :batch),
    configs_gone AS (DELETE FROM push_configs c USING done_configs x
                      WHERE c.task_id = x.task_id AND c.config_id = x.config_id RETURNING 1)
    SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM configs_gone)
"""))


def prune(conn: Connection, *, retention_s: float, batch: int) -> int:
    """Finished notifications past retention, and configurations of ended tasks with nothing left to send."""
    return conn.execute(_PRUNE, {"retention_s": retention_s, "batch": batch}).scalar_one()


# --- the backlog, for health and its gauges (issue 42) -----------------------------------------------------------

MAX_COUNTED = 100_000  # a count past this reads as this (health says "at least"): each count stays an index range
_BACKLOG = text(compact_sql("""
    SELECT (SELECT count(*) FROM (SELECT 1 FROM push_deliveries WHERE state = 'pending' LIMIT :cap) p) AS pending,
           (SELECT EXTRACT(EPOCH FROM now() - min(next_attempt_at)) FROM push_deliveries
             WHERE state = 'pending' AND next_attempt_at <= now()
               AND (leased_until IS NULL OR leased_until <= now())) AS oldest_due_age_s,
           (SELECT count(*) FROM (SELECT 1 FROM push_deliveries WHERE state = 'failed' AND finished_at >= :since
                                  LIMIT :cap) f) AS failed,
           (SELECT count(*) FROM (SELECT 1 FROM push_deliveries WHERE state = 'pending' AND attempts > 0
                                  LIMIT :cap) r) AS retrying
"""))


@dataclass(frozen=True)
class Backlog:
    pending: int  # notifications not yet delivered or failed (at most MAX_COUNTED)
    oldest_due_age_s: float | None  # how long the oldest one due now (not leased, not waiting for a retry) has waited
    failed: int  # notifications that finally failed since the read's ``since`` (at most MAX_COUNTED)
    retrying: int = 0  # of ``pending``, those attempted at least once: a retry waits (at most MAX_COUNTED)


def backlog(conn: Connection, *, failed_since: datetime) -> Backlog:
    """What waits to be pushed (and of it, what waits for a retry), and what failed since ``failed_since``: four
    index ranges (push_deliveries_due, push_deliveries_failed)."""
    row = conn.execute(_BACKLOG, {"cap": MAX_COUNTED, "since": failed_since}).one()
    age = None if row.oldest_due_age_s is None else max(0.0, float(row.oldest_due_age_s))
    return Backlog(pending=int(row.pending), oldest_due_age_s=age, failed=int(row.failed),
                   retrying=int(row.retrying))
