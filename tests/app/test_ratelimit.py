"""Rate limits are counted in PostgreSQL, so every instance counts against the same per-key and global limits."""

from __future__ import annotations

import uuid

import pytest

from app.errors import RateLimited
from app.identity import Identity
from app.ratelimit import RateLimiter
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
