"""One customer's bodies cannot stall an edge instance for the others (issue 15, item 2).

Seen before the fix: 100,000 ``{"text":"a"}`` parts (1.3 MB) answered -41301 after 2.2 s on an idle
machine (9.1 s in the review, on a loaded one), and ``/healthz`` on the same instance waited as long; 150,000
metadata keys took 2.6 s. The a2a-sdk parsed the body with protobuf's pure-Python reader on the event loop
before the edge counted anything. Now the guard counts the body's values on the raw bytes
(``SPECIALISTS_MAX_BODY_ELEMENTS``, app/bodies.py) and refuses such a body before anything parses it.

The test runs its own edge process (no worker, no other test's traffic), so that what it measures is
one customer's flood and nothing else: first the unloaded latencies, then the same while the flood runs.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.conftest import PAID, Customer, EdgeProcess, start_edge, stop_edge

pytestmark = pytest.mark.timeout(240, func_only=True)

ROUNDS = 5  # unloaded and flooded measurements alternate, so the machine's own load weighs on both alike
SAMPLES = 40  # per round and measurement: 200 of each in all, whose p99 is the second-worst
FLOOD_REQUESTS = 4_000  # the flood lasts as long as the measurements, bounded in count ...
FLOOD_MAX_S = 120.0  # ... and in time
# What the edge promises under one customer's flood, on a 2-core machine it shares with the flooder, PostgreSQL,
# the measuring client and (in the suite) another test: no stall. Before the guard a flooded /healthz waited
# 2.2 s (9.1 s loaded). The edge does its share of work for every flood request on its one event loop, so the
# others' latencies grow by that share; measured (2026-12-04): alone, healthz p99 1.5-6.1 -> 7.1-9.8 ms and
# SendMessage p99 7.2-14.5 -> 15.9-31.1 ms (2.1-3.3x: the earlier 2x bound failed 4 runs of 4 alone); in the
# suite beside a browser test, healthz 13 -> 154 ms and SendMessage 38 -> 127 ms.
# /healthz p99 while flooded: within half the liveness probe's 2 s timeout (infra/run.tf), whatever the machine's
# load (a fresh-clone run at load 15-20 measured 156 ms unloaded, 296 ms flooded: 250 ms was a bound on the machine,
# not a promise), and no more than FLOODED_P99_RATIO over its own unloaded p99: a stall (2.2 s before the guard)
# fails both.
HEALTH_P99_S = 1.0
FLOODED_P99_RATIO = 3.0  # another customer's SendMessage (and /healthz) p99 while flooded, against its unloaded p99 ...
FLOODED_P99_SLACK_S = 0.050  # ... plus the edge's share of the flood's work on a shared 2-core machine


@pytest.fixture(scope="module")
def lone_edge(database_url: str, edge_specs_dir: Path, edge_logs: Path) -> Iterator[EdgeProcess]:
    # A rate limit the flood does not reach: what is measured is the cost of the bodies, not 429s.
    # The revocation cache at its production default (the other test edges check every key in the database).
    edge = start_edge(database_url, edge_specs_dir, edge_logs, "isolation", rate_limit_per_key="100000",
                      rate_limit_global="1000000", revocation_cache_s="5")
    yield edge
    stop_edge(edge)


def many_parts(parts: int) -> bytes:
    message = {"messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER", "parts": [{"text": "a"}] * parts}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}).encode()


def many_metadata_keys(keys: int) -> bytes:
    message = {"messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER", "parts": [{"text": "a"}],
               "metadata": {f"k{i}": 1 for i in range(keys)}}
    return json.dumps({"message": message}).encode()


def flood(floods: list[tuple[str, bytes]], headers: dict[str, str], active: Any, done: Any, said: Any) -> None:
    """The attacker: its bodies in a loop while ``active`` is set, bounded in count and time; says what it did."""
    # In production the attacker's client runs on its own machine; here it shares two cores with the edge, the
    # database and the measurement. At the lowest priority it still floods (the edge does its share of work for
    # every request), but its own client's CPU does not count as the edge's latency.
    os.nice(19)
    answers: list[tuple[int, str]] = []
    deadline = time.monotonic() + FLOOD_MAX_S
    flooding = False
    with httpx.Client(timeout=60) as client:
        while not done.is_set() and len(answers) < FLOOD_REQUESTS and time.monotonic() < deadline:
            if not active.is_set():
                if flooding:
                    flooding = False
                    said.put("paused")
                active.wait(1.0)
                continue
            url, body = floods[len(answers) % len(floods)]
            try:
                answer = client.post(url, content=body, headers=headers)
            except httpx.TransportError:  # refused mid-upload and the connection closed (as the byte cap does)
                answers.append((0, ""))
            else:
                answers.append((answer.status_code, answer.text))
            if not flooding:
                flooding = True
                said.put("under way")
    said.put(answers)


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def headers(customer: Customer) -> dict[str, str]:
    return {**customer.headers, "Content-Type": "application/json"}


def measure(client: httpx.Client, edge: EdgeProcess, victim: Customer) -> tuple[list[float], list[float]]:
    """SAMPLES of /healthz and of the victim's SendMessage (returnImmediately, on the paid specialist), interleaved."""
    health, sends = [], []
    url = f"{edge.specialist(PAID)}/message:send"
    for _ in range(SAMPLES):
        started = time.perf_counter()
        assert client.get(f"{edge.url}/healthz").status_code == 200
        health.append(time.perf_counter() - started)
        body = {"message": {"messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
                "configuration": {"returnImmediately": True}}
        started = time.perf_counter()
        answer = client.post(url, json=body, headers=victim.headers)
        sends.append(time.perf_counter() - started)
        assert answer.status_code == 200, answer.text
    return health, sends


def test_a_flood_of_many_element_bodies_stalls_neither_health_nor_another_customers_sends(
    lone_edge, make_customer, ledger
):
    attacker = make_customer()
    victim = make_customer(credits=5 * (2 * ROUNDS + 1) * SAMPLES, max_parallel=(2 * ROUNDS + 1) * SAMPLES)  # its tasks wait: nothing serves them
    floods = [
        (f"{lone_edge.specialist('conformance')}/jsonrpc", many_parts(100_000)),
        (f"{lone_edge.specialist(PAID)}/message:send", many_metadata_keys(150_000)),
    ]
    health_unloaded: list[float] = []
    sends_unloaded: list[float] = []
    health_loaded: list[float] = []
    sends_loaded: list[float] = []
    # The flood runs in a process of its own: its uploads must not share this process's GIL with the measurement.
    context = multiprocessing.get_context("spawn")
    active, done, said = context.Event(), context.Event(), context.Queue()
    flooder = context.Process(target=flood, args=(floods, headers(attacker), active, done, said), name="flood")
    flooder.start()
    try:
        with httpx.Client(timeout=60) as client:
            measure(client, lone_edge, victim)  # warm: the first requests of a process pay for imports and pools
            for _ in range(ROUNDS):
                health, sends = measure(client, lone_edge, victim)
                health_unloaded += health
                sends_unloaded += sends
                active.set()
                assert said.get(timeout=FLOOD_MAX_S) == "under way"
                health, sends = measure(client, lone_edge, victim)
                health_loaded += health
                sends_loaded += sends
                active.clear()
                assert said.get(timeout=FLOOD_MAX_S) == "paused"
    finally:
        done.set()
        active.set()
        answers = said.get(timeout=FLOOD_MAX_S)
        flooder.join(timeout=60)
    figures = (f"healthz p99 {p99(health_unloaded) * 1000:.1f} -> {p99(health_loaded) * 1000:.1f} ms, "
               f"SendMessage p99 {p99(sends_unloaded) * 1000:.1f} -> {p99(sends_loaded) * 1000:.1f} ms, "
               f"{len(answers)} flood requests")
    print(figures)
    assert sum(1 for status, _ in answers if status == 413) >= 4, figures  # the flood overlapped the measurement
    for status, text in answers:
        if status == 0:
            continue  # the connection closed under the upload: refused too
        assert status == 413, text[:300]
        assert json.loads(text)["error"]["message"].startswith("the request body holds"), text[:300]
    assert p99(health_loaded) < HEALTH_P99_S, figures
    assert p99(health_loaded) <= FLOODED_P99_RATIO * p99(health_unloaded) + FLOODED_P99_SLACK_S, figures
    assert p99(sends_loaded) <= FLOODED_P99_RATIO * p99(sends_unloaded) + FLOODED_P99_SLACK_S, figures
    # Per customer: the session's database also holds the violations other tests plant on purpose.
    assert ledger.verify(attacker.customer_id) == [] and ledger.verify(victim.customer_id) == []


@pytest.mark.parametrize("body, code", [
    (many_parts(100_000), "body_elements_over_limit"),
    (b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"v":' + b"9" * 5000 + b"}}", "number_too_long"),
    (b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"v":1e999}}', "number_not_finite"),
    (b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"v":NaN}}', "number_not_finite"),
    (b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"v":-Infinity}}', "number_not_finite"),
], ids=["100k-parts", "5000-digits", "1e999", "NaN", "-Infinity"])
def test_a_body_the_sdk_would_choke_on_is_refused_before_it_parses_anything(lone_edge, make_customer, body, code):
    customer = make_customer()
    answer = httpx.post(f"{lone_edge.specialist('conformance')}/jsonrpc", content=body, headers=headers(customer),
                        timeout=60)
    error = answer.json()["error"]
    assert error["data"][0]["metadata"]["code"] == code, error
    assert error["code"] == (-41301 if code.startswith("body") else -32602), error
    assert "Traceback" not in lone_edge.log_text()
