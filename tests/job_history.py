"""A database grown with the history jobs leave: tasks, their events, outbox rows and claims, in their real shape.

``grow(conn, tasks=N)`` writes N tasks as the service leaves them over 60 days (one customer holding a tenth of
them): most completed long ago, each with four events, its outbox row closed and its claim finished; some
waiting for input, some whose outcome is unknown (their rows closed, as the transaction that finds them unknown
leaves them), and the newest 200 in flight (rows ``pending`` or ``sent``, claims running, a tenth of their leases
expired for the sweeper). Everything is one
``generate_series`` statement per table, then ANALYZE, so that ``tests.query_plans`` sees the planner's real
choices: the dispatcher's, sweeper's and pruners' queries are planned on it (tests/workers/dispatch/
test_query_plans.py) and measured by hand (docs/BENCHMARKS.md). Tariff 0 throughout: the ledger is not grown here.

``one_job`` writes one task and its job in a chosen state, ended a chosen while ago: what the pruners' tests
prune, or keep.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Connection, text

DAYS_OF_HISTORY = 60

# Per task i (1..N): its id, owner, state and times. The newest IN_FLIGHT are in flight, admitted a second apart
# in the last minutes (what runs at once is bounded by the workers, not by the history); the rest are spread over
# the days of history, and i % 100 picks 0: waiting for input, 1: unknown (its worker died, not yet reconciled),
# 2: failed, 3: canceled before any claim, else completed.
IN_FLIGHT = 200
_TASKS = """
    CREATE TEMP TABLE grown AS
    SELECT i,
           CAST(md5('task' || i || :salt) AS uuid)::text AS task_id,
           CASE WHEN i % 10 = 0 THEN 'owner-big' ELSE 'owner-' || (i % 997) END AS owner,
           (now() AT TIME ZONE 'UTC') - CASE WHEN i > :n - :in_flight THEN make_interval(secs => :n - i)
                                             ELSE make_interval(secs => 3600 + (:n - i) * :span_s / :n) END AS at,
           CASE WHEN i > :n - :in_flight THEN (CASE WHEN i % 2 = 0 THEN 'pending' ELSE 'running' END)
                WHEN i % 100 = 0 THEN 'input_required'
                WHEN i % 100 = 1 THEN 'unknown'
                WHEN i % 100 = 2 THEN 'failed'
                WHEN i % 100 = 3 THEN 'canceled'
                ELSE 'completed' END AS kind
      FROM generate_series(1, :n) AS i
"""

_STATEMENTS = [
    """
    INSERT INTO tasks (id, context_id, kind, owner, last_updated, status, artifacts, history, metadata,
                       protocol_version)
    SELECT task_id, task_id, 'task', owner, at,
           CAST(json_build_object('state', CASE kind WHEN 'pending' THEN 'TASK_STATE_SUBMITTED'
                                                     WHEN 'running' THEN 'TASK_STATE_WORKING'
                                                     WHEN 'unknown' THEN 'TASK_STATE_WORKING'
                                                     ELSE 'TASK_STATE_' || upper(kind) END,
                                  'timestamp', to_char(at, 'YYYY-MM-DD"T"HH24:MI:SS"Z"')) AS json),
           CAST('[]' AS json), CAST('[]' AS json), NULL, '1.0'
      FROM grown
    """,
    "INSERT INTO task_versions (task_id, owner, version) SELECT task_id, owner, 4 FROM grown",
    """
    INSERT INTO task_events (task_id, owner, task_version, event_data)
    SELECT task_id, owner, v, convert_to(repeat('e', 200), 'UTF8') FROM grown, generate_series(1, 4) AS v
    """,
    """
    INSERT INTO edge_tasks (task_id, customer_id, key_id, specialist_id, skill_id, owner, tariff_credits,
                            reservation_id, admitted_at)
    SELECT task_id, NULL, NULL, 'scripted', 'scripted', owner, 0, NULL, at FROM grown
    """,
    """
    INSERT INTO dispatch_outbox (dispatch_id, task_id, specialist_id, executor, owner, context_id, message, status,
                                 created_at, taken_at, taken_by, finished_at, attempts, available_at, sent_at)
    SELECT :base + i, task_id, 'scripted', 'scripted', owner, task_id, convert_to(repeat('m', 400), 'UTF8'),
           CASE WHEN kind = 'pending' THEN 'pending'
                WHEN kind = 'running' THEN 'sent'
                WHEN kind = 'canceled' THEN 'canceled'
                ELSE 'done' END,
           at, at, 'grown', CASE WHEN kind IN ('pending', 'running') THEN NULL
                                 ELSE at END,
           1, at, CASE WHEN kind = 'running' THEN at END
      FROM grown
    """,
    """
    INSERT INTO job_claims (job_id, state, fencing_token, lease_expires_at, worker_id, claims, deliveries,
                            first_claimed_at, claimed_at, finished_at, outcome, unknown_at, unknown_reason,
                            created_at)
    SELECT task_id || '.' || (:base + i),
           CASE kind WHEN 'running' THEN 'running' WHEN 'unknown' THEN 'unknown' ELSE 'finished' END,
           CASE kind WHEN 'canceled' THEN 0 ELSE 1 END,
           CASE WHEN kind <> 'running' THEN NULL WHEN i % 10 = 1 THEN now() - interval '1 minute'
                ELSE now() + interval '1 hour' END,
           'worker-grown', CASE kind WHEN 'canceled' THEN 0 ELSE 1 END, 1,
           CASE kind WHEN 'canceled' THEN NULL ELSE at END, CASE kind WHEN 'canceled' THEN NULL ELSE at END,
           CASE WHEN kind IN ('running', 'unknown') THEN NULL ELSE at END,
           CASE WHEN kind IN ('running', 'unknown') THEN NULL ELSE kind END,
           CASE kind WHEN 'unknown' THEN at END, CASE kind WHEN 'unknown' THEN 'grown: its worker died' END, at
      FROM grown WHERE kind <> 'pending'
    """,
]


def grow(conn: Connection, *, tasks: int, salt: str = "") -> None:
    """Add ``tasks`` tasks of history (see the module doc) in the caller's transaction, then ANALYZE."""
    base = int(conn.execute(text("SELECT COALESCE(max(dispatch_id), 0) FROM dispatch_outbox")).scalar_one())
    params = {"n": tasks, "span_s": DAYS_OF_HISTORY * 86_400.0, "salt": salt, "base": base,
              "in_flight": min(IN_FLIGHT, tasks // 10)}
    conn.execute(text("DROP TABLE IF EXISTS grown"))
    conn.execute(text(_TASKS), params)
    for statement in _STATEMENTS:
        conn.execute(text(statement), params)
    conn.execute(text("SELECT setval(pg_get_serial_sequence('dispatch_outbox', 'dispatch_id'), "
                      "(SELECT max(dispatch_id) FROM dispatch_outbox))"))
    conn.execute(text("DROP TABLE grown"))
    for table in ("tasks", "task_versions", "task_events", "edge_tasks", "dispatch_outbox", "job_claims"):
        conn.execute(text(f"ANALYZE {table}"))


_ONE_JOB = [
    """
    INSERT INTO tasks (id, context_id, kind, owner, last_updated, status, artifacts, history, protocol_version)
    VALUES (:t, :t, 'task', :o, (now() AT TIME ZONE 'UTC') - make_interval(secs => :days * 86400),
            CAST(json_build_object('state', CAST(:state AS text)) AS json), CAST('[]' AS json), CAST('[]' AS json), '1.0')
    """,
    "INSERT INTO task_versions (task_id, owner, version) VALUES (:t, :o, 1)",
    "INSERT INTO task_events (task_id, owner, task_version, event_data) SELECT :t, :o, v, '\\x00' "
    "FROM generate_series(1, :events) AS v",
    "INSERT INTO edge_tasks (task_id, specialist_id, skill_id, owner, tariff_credits) "
    "VALUES (:t, 'scripted', 'scripted', :o, 0)",
]


def one_job(conn: Connection, *, task_state: str, row_status: str, claim_state: str | None, days_ago: float,
            events: int = 2) -> tuple[str, int]:
    """One task and its one job, ended (or not) ``days_ago``: the task in ``task_state`` (``completed``,
    ``input_required``, ``working``...), its outbox row in ``row_status``, its claim in ``claim_state`` (None: no
    claim). Returns (task id, dispatch id)."""
    task_id = str(uuid.uuid4())
    params = {"t": task_id, "o": "owner-one", "days": days_ago, "events": events,
              "state": f"TASK_STATE_{task_state.upper()}"}
    for statement in _ONE_JOB:
        conn.execute(text(statement), params)
    finished = row_status in ("done", "canceled", "undeliverable")
    dispatch_id = int(conn.execute(text(
        "INSERT INTO dispatch_outbox (task_id, specialist_id, executor, owner, context_id, message, status, "
        "finished_at, sent_at, attempts) VALUES (:t, 'scripted', 'scripted', :o, :t, '\\x0a00', :s, "
        "CASE WHEN CAST(:f AS boolean) THEN now() - make_interval(secs => :days * 86400) END, "
        "CASE WHEN CAST(:s AS text) = 'sent' THEN now() - make_interval(secs => :days * 86400) END, 1) RETURNING dispatch_id"),
        {**params, "s": row_status, "f": finished}).scalar_one())
    if claim_state is not None:
        conn.execute(text(
            "INSERT INTO job_claims (job_id, state, fencing_token, claims, lease_expires_at, finished_at, outcome, "
            "unknown_at, claimed_at, first_claimed_at) "
            "VALUES (:j, :c, 1, 1, CASE WHEN CAST(:c AS text) = 'running' THEN now() + interval '1 hour' END, "
            "CASE WHEN CAST(:c AS text) = 'finished' THEN now() - make_interval(secs => :days * 86400) END, "
            "CASE WHEN CAST(:c AS text) = 'finished' THEN 'completed' END, "
            "CASE WHEN CAST(:c AS text) = 'unknown' THEN now() - make_interval(secs => :days * 86400) END, "
            "now() - make_interval(secs => :days * 86400), now() - make_interval(secs => :days * 86400))"),
            {"j": f"{task_id}.{dispatch_id}", "c": claim_state, "days": days_ago})
    return task_id, dispatch_id
