"""Rate limits counted across instances: fixed windows in PostgreSQL, one statement per request or per batch.

Each A2A request increments two counters in one upsert: its own bucket (the
key, or the client address for an anonymous caller) and the global one. The
window is aligned on the database clock, so every instance counts in the same
window. Over either limit: 429 with ``Retry-After`` (seconds to the window's
end). The counters live in an UNLOGGED table and the statement runs in
autocommit (on the edge's autocommit engine, ``app.assembly``), so the hot global row is held for
microseconds.

Counts are grouped as commits are, with no timer (``RateLimiter.check``): with no count in flight, a request's
count is sent at once, alone (``_COUNT``); while one is in flight, the requests that come wait, and when it returns
they all go in one statement (``_COUNT_BATCH``, at most ``MAX_BATCH``): each bucket incremented by its number of
requests, the global one by the batch's size, and each request given the count it would have had in sequence (the
bucket's value after the statement less the batch's requests after it), so the decisions are those of one
statement a request.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque

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
# The counts of requests that waited while another count was in flight, in one statement: each bucket once, with
# its number of requests, the requests' own buckets sorted and the global one last (as in ``_COUNT``: any two
# statements of any instances lock their rows in one order, so they never deadlock).
_COUNT_BATCH = text(
    """
    WITH w AS (SELECT to_timestamp(floor(extract(epoch FROM now()) / :window_s) * :window_s) AS start)
    INSERT INTO edge_rate_windows AS r (bucket, window_start, requests)
    SELECT b.bucket, w.start, b.requests FROM w,
        unnest(CAST(:buckets AS text[]), CAST(:counts AS bigint[])) WITH ORDINALITY AS b(bucket, requests, n)
    ORDER BY b.n
    ON CONFLICT (bucket, window_start) DO UPDATE SET requests = r.requests + excluded.requests
    RETURNING bucket, requests,
              extract(epoch FROM (window_start + make_interval(secs => :window_s) - now())) AS remaining_s
    """
)
_COUNT_BATCH_SQL = db.compiled_for_psycopg(_COUNT_BATCH)
# At most this many waiting requests' counts in one statement (the others wait for the next): two arrays of
# parameters, and the rows each bucket of the batch returns.
MAX_BATCH = 256
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
        # The grouping's state, the running loop's (the edge has one; a limiter used from another loop starts again).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight = False  # a count's statement is running: the requests that come wait for it to return
        self._waiting: deque[tuple[str, asyncio.Future[tuple[int, int, float]]]] = deque()
        self._batches: set[asyncio.Task[None]] = set()  # the batches' statements running (held until they end)

    async def check(self, identity: Identity) -> None:
        s = self.settings
        if identity.anonymous:
            bucket, limit, setting = f"addr:{identity.client_address}", s.edge.rate_limit_anonymous_per_address, (
                "SPECIALISTS_RATE_LIMIT_ANONYMOUS_PER_ADDRESS"
            )
        else:
            bucket, limit, setting = f"key:{identity.key_id}", s.edge.rate_limit_per_key, "SPECIALISTS_RATE_LIMIT_PER_KEY"
        own, total, remaining_s = await self._count(bucket)
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

    async def _count(self, bucket: str) -> tuple[int, int, float]:
        """This request's count in its bucket and the global one, and the seconds left in the window: its own
        statement when no count is in flight, else a place in the batch sent when the one in flight returns."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._in_flight, self._waiting = loop, False, deque()
        if self._in_flight:
            counted: asyncio.Future[tuple[int, int, float]] = loop.create_future()
            self._waiting.append((bucket, counted))
            return await counted
        self._in_flight = True
        try:
            # On the driver, on a connection kept for single statements (core.db.autocommit_rows); the two buckets as
            # two text parameters (a list is dumped by psycopg in Python, at every request).
            rows = await db.autocommit_rows(self.engine, _COUNT_SQL, {"window_s": self.settings.edge.rate_limit_window_s,
                                                                       "bucket": bucket, "global_bucket": GLOBAL})
        finally:
            self._send_waiting()  # returned, failed or cancelled: the requests that came meanwhile go now
        counts = {name: (int(requests), float(remaining_s)) for name, requests, remaining_s in rows}
        own, remaining_s = counts[bucket]
        total, _ = counts[GLOBAL]
        return own, total, remaining_s

    def _send_waiting(self) -> None:
        """The count in flight ended: the requests waiting (up to ``MAX_BATCH``, those cancelled left out) go in one
        statement, in a task of its own (a waiter cancelled cannot cancel it); with none waiting, none is in flight."""
        waiting, batch = self._waiting, []
        while waiting and len(batch) < MAX_BATCH:
            bucket, counted = waiting.popleft()
            if not counted.done():
                batch.append((bucket, counted))
        if not batch:
            self._in_flight = False
            return
        assert self._loop is not None
        sent = self._loop.create_task(self._count_batch(batch))
        self._batches.add(sent)
        sent.add_done_callback(self._batches.discard)

    async def _count_batch(self, batch: list[tuple[str, asyncio.Future[tuple[int, int, float]]]]) -> None:
        """One statement for the batch's counts; each request's future gets the counts it would have had had the
        batch's requests been counted one after another in its order, or the statement's failure."""
        try:
            per_bucket: dict[str, int] = {}
            for bucket, _ in batch:
                per_bucket[bucket] = per_bucket.get(bucket, 0) + 1
            buckets = sorted(per_bucket)
            requests = [per_bucket[bucket] for bucket in buckets]
            buckets.append(GLOBAL)
            requests.append(len(batch))
            try:
                rows = await db.autocommit_rows(self.engine, _COUNT_BATCH_SQL, {
                    "window_s": self.settings.edge.rate_limit_window_s, "buckets": buckets, "counts": requests})
            except Exception as failed:  # each request's failure, as its own statement's would have been
                for _, counted in batch:
                    if not counted.done():
                        counted.set_exception(failed)
                return
            except BaseException:
                for _, counted in batch:
                    counted.cancel()
                raise
            after = {name: (int(value), float(remaining_s)) for name, value, remaining_s in rows}
            total, _ = after[GLOBAL]
            behind: dict[str, int] = {}  # the batch's requests after this one, per bucket
            for position in range(len(batch) - 1, -1, -1):
                bucket, counted = batch[position]
                later = behind.get(bucket, 0)
                behind[bucket] = later + 1
                value, remaining_s = after[bucket]
                if not counted.done():
                    counted.set_result((value - later, total - (len(batch) - 1 - position), remaining_s))
        finally:
            self._send_waiting()

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
