"""Rate limits are counted in PostgreSQL, so every instance counts against the same per-key and global limits."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy.exc import OperationalError

from app import ratelimit
from app.errors import RateLimited
from app.identity import Identity
from app.ratelimit import _COUNT_BATCH_SQL, _COUNT_SQL, GLOBAL, RateLimiter
from core import db

pytestmark = [pytest.mark.timeout(30), pytest.mark.anyio]


@pytest.fixture
async def async_engine(database_url, settings):
    engine = db.make_async_engine(database_url, settings, autocommit=True)  # as the edge's (app.assembly)
    yield engine
    await engine.dispose()


def caller(key_id: str | None = None, address: str = "10.0.0.1") -> Identity:
    if key_id is None:
        return Identity(customer_id=None, key_id=None, tier=None, client_address=address)
    return Identity(customer_id="c-rate", key_id=key_id, tier="standard", client_address=address)


def private_window_s() -> int:
    """An unusual window length aligns its windows on their own starts: counters no other test shares."""
    return 7 * 86400 + uuid.uuid4().int % 100_000


async def test_two_instances_count_one_keys_requests_together(async_engine, settings):
    strict = settings.model_copy(update={"edge": settings.edge.model_copy(update={"rate_limit_per_key": 3, "rate_limit_window_s": private_window_s()})})
    instance_a, instance_b = RateLimiter(async_engine, strict), RateLimiter(async_engine, strict)
    key = f"key_{uuid.uuid4().hex[:8]}"
    await instance_a.check(caller(key))
    await instance_b.check(caller(key))
    await instance_a.check(caller(key))
    with pytest.raises(RateLimited) as refused:
        await instance_b.check(caller(key))
    assert refused.value.code == "rate_limited"
    assert 1 <= int(refused.value.data["retry_after_s"])
    assert "SPECIALISTS_RATE_LIMIT_PER_KEY" in refused.value.message
    await instance_a.check(caller(f"key_{uuid.uuid4().hex[:8]}"))  # another key is not affected


async def test_the_global_ceiling_refuses_once_all_callers_together_reach_it(async_engine, settings):
    ceiling = settings.model_copy(update={"edge": settings.edge.model_copy(update={"rate_limit_window_s": private_window_s(), "rate_limit_global": 2})})
    instance_a, instance_b = RateLimiter(async_engine, ceiling), RateLimiter(async_engine, ceiling)
    await instance_a.check(caller(f"key_{uuid.uuid4().hex[:8]}"))
    await instance_b.check(caller(f"key_{uuid.uuid4().hex[:8]}"))
    with pytest.raises(RateLimited, match="overall request ceiling"):
        await instance_a.check(caller(f"key_{uuid.uuid4().hex[:8]}"))


async def test_anonymous_callers_are_counted_per_address(async_engine, settings):
    strict = settings.model_copy(
        update={"edge": settings.edge.model_copy(update={"rate_limit_anonymous_per_address": 2, "rate_limit_window_s": private_window_s()})}
    )
    limiter = RateLimiter(async_engine, strict)
    await limiter.check(caller(address="10.0.0.9"))
    await limiter.check(caller(address="10.0.0.9"))
    with pytest.raises(RateLimited, match="SPECIALISTS_RATE_LIMIT_ANONYMOUS_PER_ADDRESS"):
        await limiter.check(caller(address="10.0.0.9"))
    await limiter.check(caller(address="192.0.2.77"))  # another address is not affected


async def test_windows_are_pruned_on_the_pool_of_single_statements_even_when_it_keeps_every_connection(
    database_url, settings
):
    """The pruner's statement is a single statement like the count's (``core.db.autocommit_rows``): with a pool of one
    connection and no overflow, kept by the count, it still runs, and drops the windows that ended a window ago."""
    one = settings.model_copy(update={
        "database": settings.database.model_copy(update={"pool_size": 1, "max_overflow": 0}),
        "edge": settings.edge.model_copy(update={"rate_limit_window_s": private_window_s()}),
    })
    engine = db.make_async_engine(database_url, one, autocommit=True)
    try:
        limiter = RateLimiter(engine, one)
        await limiter.check(caller(f"key_{uuid.uuid4().hex[:8]}"))
        assert len(engine.sync_engine.pool.kept) == 1  # the pool's only connection, kept by the count
        old = f"key:old_{uuid.uuid4().hex[:8]}"
        await db.autocommit_rows(engine, "INSERT INTO edge_rate_windows (bucket, window_start, requests) "
                                 "VALUES (%(b)s, now() - make_interval(secs => %(age)s), 1) RETURNING 1",
                                 {"b": old, "age": 3 * one.edge.rate_limit_window_s})
        assert await limiter.prune() >= 1
        [(left,)] = await db.autocommit_rows(engine, "SELECT count(*) FROM edge_rate_windows WHERE bucket = %(b)s",
                                             {"b": old})
        assert left == 0
    finally:
        await engine.dispose()


class GatedStatements:
    """``core.db.autocommit_rows`` as the limiter calls it, recorded; the first statement held until ``release``."""

    def __init__(self, monkeypatch, fail_batches: bool = False) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.release = asyncio.Event()
        self.fail_batches = fail_batches
        real = db.autocommit_rows

        async def recorded(engine, sql, params):
            self.sent.append((sql, dict(params)))
            if len(self.sent) == 1:
                await self.release.wait()
            if fail_batches and sql == _COUNT_BATCH_SQL:
                raise OperationalError(sql, params, Exception("the server went away"))
            return await real(engine, sql, params)

        monkeypatch.setattr(db, "autocommit_rows", recorded)


UNTIL_YIELDS = 100_000  # far more turns of the loop than any of these states needs: a state that never comes fails


async def until(condition) -> None:
    """Wait for an observable state of the limiter, by yielding to the loop (no timer); fail, saying so, if it has not
    come after ``UNTIL_YIELDS`` turns."""
    for _ in range(UNTIL_YIELDS):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the limiter never reached the state awaited ({UNTIL_YIELDS} turns of the loop)")


def limited(settings, **edge):
    return settings.model_copy(update={"edge": settings.edge.model_copy(
        update={"rate_limit_window_s": private_window_s(), **edge})})


async def outcome(limiter: RateLimiter, identity: Identity) -> str:
    try:
        await limiter.check(identity)
    except RateLimited as refused:
        return "global" if "overall request ceiling" in refused.message else refused.message.split(" requests")[0]
    return "ok"


async def test_a_lone_request_is_counted_in_one_statement_of_its_own(async_engine, settings, monkeypatch):
    statements = GatedStatements(monkeypatch)
    statements.release.set()
    limiter = RateLimiter(async_engine, limited(settings))
    await limiter.check(caller(f"key_{uuid.uuid4().hex[:8]}"))
    await limiter.check(caller(f"key_{uuid.uuid4().hex[:8]}"))  # after the first returned: alone again
    assert [sql for sql, _ in statements.sent] == [_COUNT_SQL, _COUNT_SQL]


async def test_fifty_concurrent_requests_of_one_key_over_its_limit_of_30_are_refused_exactly_20_times(
    async_engine, settings
):
    limiter = RateLimiter(async_engine, limited(settings, rate_limit_per_key=30))
    key = f"key_{uuid.uuid4().hex[:8]}"
    outcomes = await asyncio.gather(*(outcome(limiter, caller(key)) for _ in range(50)))
    assert outcomes.count("ok") == 30
    assert sorted(o for o in outcomes if o != "ok") == sorted(f"this key made {n}" for n in range(31, 51))


async def test_the_requests_that_wait_go_in_one_statement_each_counted_as_in_sequence(
    async_engine, settings, monkeypatch
):
    """A lone count in flight, eight requests of two keys wait; they go in one statement, and each is decided as if
    the nine had been counted one after another: per key (limit 3) and globally (limit 6), in their order."""
    statements = GatedStatements(monkeypatch)
    limiter = RateLimiter(async_engine, limited(settings, rate_limit_per_key=3, rate_limit_global=6))
    a, b = f"key_a{uuid.uuid4().hex[:8]}", f"key_b{uuid.uuid4().hex[:8]}"
    first = asyncio.create_task(outcome(limiter, caller(a)))
    await until(lambda: len(statements.sent) == 1)
    waiting = [asyncio.create_task(outcome(limiter, caller(key))) for key in (a, b) * 4]
    await until(lambda: len(limiter._waiting) == 8)
    statements.release.set()
    assert [await first] + [await w for w in waiting] == [
        "ok", "ok", "ok", "ok", "ok", "this key made 4", "global", "this key made 5", "this key made 4"]
    assert [sql for sql, _ in statements.sent] == [_COUNT_SQL, _COUNT_BATCH_SQL]
    batch = statements.sent[1][1]
    # Each bucket once with its requests, the keys' sorted and the global one last (one lock order everywhere).
    assert batch["buckets"] == [f"key:{a}", f"key:{b}", GLOBAL] and batch["counts"] == [4, 4, 8]


async def test_a_batch_holds_at_most_max_batch_requests(async_engine, settings, monkeypatch):
    monkeypatch.setattr(ratelimit, "MAX_BATCH", 3)
    statements = GatedStatements(monkeypatch)
    limiter = RateLimiter(async_engine, limited(settings, rate_limit_per_key=5))
    key = f"key_{uuid.uuid4().hex[:8]}"
    first = asyncio.create_task(outcome(limiter, caller(key)))
    await until(lambda: len(statements.sent) == 1)
    waiting = [asyncio.create_task(outcome(limiter, caller(key))) for _ in range(7)]
    await until(lambda: len(limiter._waiting) == 7)
    statements.release.set()
    assert [await first] + [await w for w in waiting] == ["ok"] * 5 + ["this key made 6", "this key made 7",
                                                                       "this key made 8"]
    assert [params.get("counts") for _, params in statements.sent] == [None, [3, 3], [3, 3], [1, 1]]


async def test_a_batchs_failure_is_raised_to_every_request_in_it_and_the_next_request_is_counted(
    async_engine, settings, monkeypatch
):
    statements = GatedStatements(monkeypatch, fail_batches=True)
    limiter = RateLimiter(async_engine, limited(settings))
    first = asyncio.create_task(limiter.check(caller(f"key_{uuid.uuid4().hex[:8]}")))
    await until(lambda: len(statements.sent) == 1)
    waiting = [asyncio.create_task(limiter.check(caller(f"key_{uuid.uuid4().hex[:8]}"))) for _ in range(5)]
    await until(lambda: len(limiter._waiting) == 5)
    statements.release.set()
    await first
    for w in waiting:
        with pytest.raises(OperationalError, match="the server went away"):
            await w
    await limiter.check(caller(f"key_{uuid.uuid4().hex[:8]}"))  # nothing in flight any more: alone, and counted
    assert [sql for sql, _ in statements.sent] == [_COUNT_SQL, _COUNT_BATCH_SQL, _COUNT_SQL]


async def test_a_request_cancelled_while_it_waits_is_left_out_of_the_batch_and_the_others_are_counted(
    async_engine, settings, monkeypatch
):
    statements = GatedStatements(monkeypatch)
    limiter = RateLimiter(async_engine, limited(settings, rate_limit_per_key=3))
    key = f"key_{uuid.uuid4().hex[:8]}"
    first = asyncio.create_task(outcome(limiter, caller(key)))
    await until(lambda: len(statements.sent) == 1)
    waiting = [asyncio.create_task(outcome(limiter, caller(key))) for _ in range(4)]
    await until(lambda: len(limiter._waiting) == 4)
    waiting[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting[1]
    statements.release.set()
    assert [await first] + [await w for i, w in enumerate(waiting) if i != 1] == ["ok", "ok", "ok", "this key made 4"]
    assert statements.sent[1][1]["counts"] == [3, 3]


async def test_the_request_in_flight_cancelled_sends_the_waiting_ones(async_engine, settings, monkeypatch):
    statements = GatedStatements(monkeypatch)
    limiter = RateLimiter(async_engine, limited(settings))
    first = asyncio.create_task(limiter.check(caller(f"key_{uuid.uuid4().hex[:8]}")))
    await until(lambda: len(statements.sent) == 1)
    waiting = [asyncio.create_task(outcome(limiter, caller(f"key_{uuid.uuid4().hex[:8]}"))) for _ in range(3)]
    await until(lambda: len(limiter._waiting) == 3)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert [await w for w in waiting] == ["ok"] * 3
    assert [sql for sql, _ in statements.sent] == [_COUNT_SQL, _COUNT_BATCH_SQL]


def test_the_batchs_statement_fits_psycopgs_cache_of_prepared_statements():
    assert len(_COUNT_BATCH_SQL) <= db.PSYCOPG_CACHED_QUERY_CHARS
