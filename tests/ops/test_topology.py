"""`serve` waits for its children while they make progress (issue 42: a worker that needed over 30 s to start on a
machine at load 15-30 failed serve's first start). Real child processes; progress is CPU time, read from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from ops.cli import _ChildFailed, _cpu_ticks, _wait_for_child
from tests.app.conftest import free_port

pytestmark = pytest.mark.timeout(120)

# A child that computes (slowly starting, as under load) until a file appears, then answers /healthz.
SLOW_STARTER = """
import http.server, os, sys
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


def waiting(child: subprocess.Popen, port: int, stall_s: float, max_s: float = 600) -> dict:
    outcome: dict = {}

    def wait() -> None:
        try:
            _wait_for_child(child, "worker", f"http://127.0.0.1:{port}/healthz", SimpleNamespace(signal=None),
                            stall_s, max_s)
            outcome["ready"] = True
        except _ChildFailed as failed:
            outcome["failed"] = failed.message

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_a_child_that_starts_slowly_but_computes_is_waited_for_past_the_stall_bound(tmp_path):
    port, flag = free_port(), tmp_path / "go"
    child = subprocess.Popen([sys.executable, "-c", SLOW_STARTER, str(flag), str(port)])
    try:
        outcome = waiting(child, port, STALL_S)
        # Until it has computed for two stall bounds (so at least that long has passed): still waited for.
        deadline = time.monotonic() + 90
        while (_cpu_ticks(child.pid) or 0) < 2 * STALL_S * TICKS_PER_S:
            assert "failed" not in outcome, outcome
            assert time.monotonic() < deadline, "the child never computed"
            time.sleep(0.05)
        assert "failed" not in outcome, outcome
        flag.touch()
        outcome["thread"].join(60)
        assert outcome.get("ready") is True, outcome
    finally:
        child.kill()
        child.wait()


def test_a_child_that_makes_no_progress_fails_the_start_naming_the_setting(tmp_path):
    port = free_port()
    child = subprocess.Popen([sys.executable, "-c", SLOW_STARTER, str(tmp_path / "never"), str(port)])
    try:
        child.send_signal(signal.SIGSTOP)  # stuck: no CPU time, no answer
        outcome = waiting(child, port, STALL_S)
        outcome["thread"].join(60)
        assert "used no CPU time for 1 s (SPECIALISTS_SERVE_CHILD_START_TIMEOUT_S)" in outcome.get("failed", ""), outcome
        # And past the overall bound even while computing.
        child.send_signal(signal.SIGCONT)
        bounded = waiting(child, port, stall_s=60, max_s=STALL_S)
        bounded["thread"].join(60)
        assert "within 1 s (SPECIALISTS_SERVE_CHILD_START_MAX_S)" in bounded.get("failed", ""), bounded
    finally:
        child.kill()
        child.wait()
