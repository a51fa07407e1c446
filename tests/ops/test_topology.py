"""A role is waited for while it makes progress (ops/topology.py; issue 42: a worker that needed over 30 s to start on
a machine at load 15-30 failed serve's first start). Real child processes; progress is CPU time, read from /proc."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from ops.topology import Ready, Role, RoleFailed, StartBounds, cpu_ticks
from tests.app.conftest import free_port
from tests.rlm.holds import wait_until

pytestmark = pytest.mark.timeout(120)

# A child that computes (slowly starting, as under load) until a file appears, then answers /healthz.
SLOW_STARTER = """
import http.server, os, sys
print("importing", flush=True)
flag, port = sys.argv[1], int(sys.argv[2])
n = 0
while not os.path.exists(flag):
    n += 1
class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Healthy).serve_forever()
"""
STALL_S = 1.0
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def slow_starter(flag: Path, port: int) -> Role:
    return Role("worker", [sys.executable, "-c", SLOW_STARTER, str(flag), str(port)], os.environ,
                Ready.http(f"http://127.0.0.1:{port}/healthz"), log_path=flag.with_name("worker.log"),
                stop_grace_s=10).start()


def waiting(child: Role, stall_s: float, max_s: float = 600) -> dict:
    outcome: dict = {}

    def wait() -> None:
        try:
            child.wait_ready(StartBounds(stall_s=stall_s, max_s=max_s))
            outcome["ready"] = True
        except RoleFailed as failed:
            outcome["failed"] = failed.message

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_a_role_that_starts_slowly_but_computes_is_waited_for_past_the_stall_bound(tmp_path):
    port, flag = free_port(), tmp_path / "go"
    child = slow_starter(flag, port)
    try:
        outcome = waiting(child, STALL_S)
        # Until it has computed for two stall bounds (so at least that long has passed): still waited for.
        wait_until(lambda: "failed" in outcome or (cpu_ticks(child.pid) or 0) >= 2 * STALL_S * TICKS_PER_S,
                   "the child to compute for two stall bounds (its CPU time in /proc)", limit_s=90)
        assert "failed" not in outcome, outcome
        flag.touch()
        outcome["thread"].join(60)
        assert outcome.get("ready") is True, outcome
    finally:
        child.kill()


def test_a_role_that_makes_no_progress_fails_the_start_naming_the_setting_and_its_log(tmp_path):
    port = free_port()
    child = slow_starter(tmp_path / "never", port)
    try:
        wait_until(lambda: "importing" in child.log_text(), "the child's first log line ('importing')", limit_s=90)
        child.signal(signal.SIGSTOP)  # stuck: no CPU time, no log, no answer
        outcome = waiting(child, STALL_S)
        outcome["thread"].join(60)
        failed = outcome.get("failed", "")
        assert "made no progress (no CPU time, no log) for 1 s (SPECIALISTS_SERVE_CHILD_START_TIMEOUT_S)" in failed, outcome
        assert "importing" in failed, "the report ends with the role's last log lines"
        # And past the overall bound even while computing.
        child.signal(signal.SIGCONT)
        bounded = waiting(child, stall_s=60, max_s=STALL_S)
        bounded["thread"].join(60)
        assert "within 1 s (SPECIALISTS_SERVE_CHILD_START_MAX_S)" in bounded.get("failed", ""), bounded
    finally:
        child.kill()
