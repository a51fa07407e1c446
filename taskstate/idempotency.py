"""The owner of ``edge_idempotency_keys``: which task an ``Idempotency-Key`` created, for how long.

A key is scoped to the customer and the specialist, and carries the content
fingerprint of the send that first used it (admission's ``fingerprint``): a
resend with the same key and the same fingerprint replays that task, one with
other content is refused. A row lives until ``expires_at`` (the edge's
``SPECIALISTS_IDEMPOTENCY_KEY_RETENTION_S`` after its first use). An expired row
is as good as gone: the next send with its key takes it over (``CLAIM``),
whether or not the dispatchers' prune (``prune_expired``) reached it yet.

Admission writes the key in its one statement (the fragments ``CLAIM`` and ``HOLDER``, ``core.fragments``);
the slower paths (a concurrent first use, a follow-up message, a resend that
matched an earlier messageId) use the functions below.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, text

from core.fragments import Fragment

# The CHECK constraint of migration 0120 on ``idempotency_key``: the edge's setting stops below it.
SCHEMA_MAX_KEY_CHARS = 1024

# The key's first use (a row when this send claimed the key), written only ``{when}`` the condition holds. A live
# row of the same key is left alone: the send is a resend.
CLAIM = Fragment.of("taskstate.idempotency", """
    INSERT INTO edge_idempotency_keys AS k (customer_key, specialist_id, idempotency_key, fingerprint, task_id,
                                            expires_at)
    SELECT CAST(:customer_key AS text), CAST(:specialist_id AS text), CAST(:idempotency_key AS text),
           CAST(:fingerprint AS bytea), CAST(:task_id AS varchar), now() + make_interval(secs => CAST(:key_retention_s AS double precision))
     WHERE {when}
    ON CONFLICT (customer_key, specialist_id, idempotency_key) DO UPDATE
       SET fingerprint = EXCLUDED.fingerprint, task_id = EXCLUDED.task_id, created_at = now(),
           expires_at = EXCLUDED.expires_at
     WHERE k.expires_at <= now()
    RETURNING 1""", ("customer_key", "specialist_id", "idempotency_key", "fingerprint", "task_id", "key_retention_s"))

# The live record of the key (fingerprint, task_id), for the final SELECT of admission's statement. It sees the
# statement's snapshot: a first use committed while this statement waited on it is not there (``first_use`` reads
# it then).
HOLDER = Fragment.of(
    "taskstate.idempotency",
    "SELECT fingerprint, task_id FROM edge_idempotency_keys WHERE customer_key = :customer_key "
    "AND specialist_id = :specialist_id AND idempotency_key = :idempotency_key AND expires_at > now()",
    ("customer_key", "specialist_id", "idempotency_key"),
)


@dataclass(frozen=True)
class FirstUse:
    """What the first send with a key recorded."""

    fingerprint: bytes
    task_id: str


_FIRST_USE = HOLDER.standalone("idempotency.first_use")


def first_use(conn: Connection, *, customer_key: str, specialist_id: str, key: str) -> FirstUse | None:
    """The live record of ``key``; None when it expired (or never was)."""
    row = _FIRST_USE.execute(
        conn, {"customer_key": customer_key, "specialist_id": specialist_id, "idempotency_key": key}
    ).one_or_none()
    return None if row is None else FirstUse(bytes(row.fingerprint), row.task_id)


_CLAIM = CLAIM.standalone("idempotency.claim")


def claim(conn: Connection, *, customer_key: str, specialist_id: str, key: str, fingerprint: bytes, task_id: str,
          retention_s: float) -> bool:
    """Record ``key`` as ``task_id``'s; False when a live record of it exists (the send is a resend)."""
    return _CLAIM.execute(
        conn,
        {"customer_key": customer_key, "specialist_id": specialist_id, "idempotency_key": key,
         "fingerprint": fingerprint, "task_id": task_id, "key_retention_s": retention_s},
    ).first() is not None


_REPOINT = text(
    "UPDATE edge_idempotency_keys SET task_id = :task_id "
    "WHERE customer_key = :customer_key AND specialist_id = :specialist_id AND idempotency_key = :idempotency_key"
)


def repoint(conn: Connection, *, customer_key: str, specialist_id: str, key: str, task_id: str) -> None:
    """Make ``key`` (claimed by this transaction) name ``task_id``: the send turned out to be a resend of an
    earlier messageId, whose task the key must replay from now on."""
    conn.execute(
        _REPOINT,
        {"customer_key": customer_key, "specialist_id": specialist_id, "idempotency_key": key, "task_id": task_id},
    )


# Oldest first through ix_edge_idempotency_keys_expires_at: each round is an index range of at most :batch rows.
_PRUNE = text(
    """
    DELETE FROM edge_idempotency_keys
     WHERE ctid IN (SELECT ctid FROM edge_idempotency_keys WHERE expires_at < now()
                     ORDER BY expires_at LIMIT :batch FOR UPDATE SKIP LOCKED)
    """
)


def prune_expired(conn: Connection, *, batch: int) -> int:
    """Delete up to ``batch`` expired keys (rows a concurrent send holds are skipped); how many were deleted."""
    return int(conn.execute(_PRUNE, {"batch": batch}).rowcount)
