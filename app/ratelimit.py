"""Rate limits counted across instances: fixed windows in PostgreSQL, one statement per request.

Each A2A request increments two counters in one upsert: its own bucket (the
key, or the client address for an anonymous caller) and the global one. The
window is aligned on the database clock, so every instance counts in the same
window. Over either limit: 429 with ``Retry-After`` (seconds to the window's
end). The counters live in an UNLOGGED table and the statement runs in
autocommit (on the edge's autocommit engine, ``app.assembly``), so the hot global row is held for
microseconds.
"""

from __future__ import annotations

import asyncio
import logging
import math

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import RateLimited
from app.identity import Identity
from core import db
from core.settings import Settings

log = logging.getLogger(__name__)

GLOBAL = "global"

_COUNT = text(
    """
    WITH w AS (SELECT to_timestamp(floor(extract(epoch FROM now()) / :window_s) * :window_s) AS start)
    INSERT INTO edge_rate_windows AS r (bucket, window_start, requests)
    SELECT b.bucket, w.start, 1 FROM w, unnest(ARRAY[CAST(:bucket AS text), CAST(:global_bucket AS text)])
        WITH ORDINALITY AS b(bucket, n)
    ORDER BY b.n
    ON CONFLICT (bucket, window_start) DO UPDATE SET requests = r.requests + 1
    RETURNING bucket, requests,
              extract(epoch FROM (window_start + make_interval(secs => :window_s) - now())) AS remaining_s
    """
)
_COUNT_SQL = db.compiled_for_psycopg(_COUNT)
# On the autocommit pool as every statement of this module (``core.db.autocommit_rows``, which reads rows back: the
# count of windows dropped). Through ``engine.connect()`` it would need a connection of the pool's own, and those
# ``autocommit_rows`` keeps may be all of them (``core.db.StatementPool``).
_PRUNE_SQL = db.compiled_for_psycopg(text(
    "WITH dropped AS (DELETE FROM edge_rate_windows WHERE window_start < now() - make_interval(secs => :keep_s) "
    "RETURNING 1) SELECT count(*) FROM dropped"
))


class RateLimiter:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        assert db.in_autocommit(engine), "the count commits by itself: the edge's autocommit engine"
        self.engine = engine
        self.settings = settings

    async def check(self, identity: Identity) -> None:
        s = self.settings
        if identity.anonymous:
            bucket, limit, setting = f"addr:{identity.client_address}", s.edge.rate_limit_anonymous_per_address, (
                "SPECIALISTS_RATE_LIMIT_ANONYMOUS_PER_ADDRESS"
            )
        else:
            bucket, limit, setting = f"key:{identity.key_id}", s.edge.rate_limit_per_key, "SPECIALISTS_RATE_LIMIT_PER_KEY"
        # Every request's statement: on the driver, checked out for it alone (core.db.autocommit_rows); the two
        # buckets as two text parameters (a list is dumped by psycopg in Python, at every request).
        rows = await db.autocommit_rows(self.engine, _COUNT_SQL, {"window_s": s.edge.rate_limit_window_s,
                                                                   "bucket": bucket, "global_bucket": GLOBAL})
        counts = {name: (int(requests), float(remaining_s)) for name, requests, remaining_s in rows}
        own, remaining_s = counts[bucket]
        total, _ = counts[GLOBAL]
        retry_after_s = max(1, math.ceil(remaining_s))
        if own > limit:
            raise RateLimited(
                f"this {'address' if identity.anonymous else 'key'} made {own} requests in the current "
                f"{s.edge.rate_limit_window_s}-second window; the limit is {limit} ({setting}). "
                f"Retry after {retry_after_s} seconds",
                retry_after_s=retry_after_s,
            )
        if total > s.edge.rate_limit_global:
            raise RateLimited(
                f"the service is at its overall request ceiling for this {s.edge.rate_limit_window_s}-second window; "
                f"retry after {retry_after_s} seconds",
                retry_after_s=retry_after_s,
            )

    async def prune_forever(self) -> None:
        """Drop windows older than two window lengths, once per window (any instance may do it)."""
        window_s = self.settings.edge.rate_limit_window_s
        while True:
            await asyncio.sleep(window_s)
            try:
                await self.prune()
            except Exception as exc:
                log.warning("could not prune rate-limit windows (%s)", type(exc).__name__)

    async def prune(self) -> int:
        """Drop the windows that ended more than a window ago (older than two window lengths); how many."""
        [(dropped,)] = await db.autocommit_rows(self.engine, _PRUNE_SQL,
                                                {"keep_s": 2 * self.settings.edge.rate_limit_window_s})
        return int(dropped)
