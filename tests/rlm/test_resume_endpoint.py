"""``rlm resume`` talks to the endpoint the run started with, never silently to another (issue 45, privacy).

A root run on a local OpenAI-compatible server (fake server A, its key in LOCAL_KEY) is killed while its first
root call is in flight. The user's shell points elsewhere (RLM_BASE_URL at fake server B, OPENAI_API_KEY set):
the resumed conversation must still go to A with A's key. A flag naming another endpoint is refused unless
``--switch-endpoint`` says so, and the switch is recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from rlmfamily.trajectory import FILENAME, read_trajectory

from .conftest import FakeOpenAI
from .holds import Hold, wait_until
from .test_cli import RLM, rlm

pytestmark = pytest.mark.timeout(120)

KEYS = {"LOCAL_KEY": "local-secret", "OPENAI_API_KEY": "hosted-secret", "OTHER_KEY": "other-secret"}


def _killed_while_asking(server: FakeOpenAI, args: list[str], env: dict[str, str]) -> None:
    """Run ``rlm ARGS`` until ``server`` holds one more root call open, then SIGKILL it, as a crash would."""
    server.hold = Hold()
    server.push(code="print('never answered')", hold=True)
    seen = len(server.requests)
    full = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    full.update(env)
    proc = subprocess.Popen([RLM, *args], env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_until(lambda: len(server.requests) > seen or proc.poll() is not None, "the root call reaches the server")
        assert proc.poll() is None, "the run ended before its root call was held"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        server.hold.release()


def test_a_resumed_run_talks_to_its_own_endpoint_and_another_needs_switch_endpoint(tmp_path: Path) -> None:
    local, other = FakeOpenAI(), FakeOpenAI()
    try:
        data = tmp_path / "data"
        doc = tmp_path / "notes.txt"
        doc.write_text("the notes say nothing much\n")
        env = {"RLM_DATA_DIR": str(data), **KEYS}
        _killed_while_asking(local, ["run", "--quiet", "--document", str(doc), "--model", "m", "--base-url",
                                     local.base_url, "--api-key-env", "LOCAL_KEY", "what do the notes say?"], env)
        [path] = (data / "runs").glob(f"*/{FILENAME}")
        assert read_trajectory(path)[0]["endpoint"] == {"provider": "openai", "base_url": local.base_url,
                                                        "api_key_env": "LOCAL_KEY"}

        refused = rlm("resume", "last", "--base-url", other.base_url, data_dir=data, env=KEYS)
        assert refused.returncode != 0
        assert "[resume_endpoint_changed]" in refused.stderr and "--switch-endpoint" in refused.stderr
        assert other.requests == [] and "run_resumed" not in {e["event"] for e in read_trajectory(path)}

        # The shell's RLM_BASE_URL points at the other server: the resume still asks the run's own, with its key.
        _killed_while_asking(local, ["resume", "last", "--quiet"], {**env, "RLM_BASE_URL": other.base_url})
        assert other.requests == []
        assert local.headers[-1]["authorization"] == "Bearer local-secret"
        assert local.requests[-1]["messages"][1] == local.requests[0]["messages"][1]  # the same conversation

        other.push(code="final_answer('answered by the other endpoint')")
        switched = rlm("resume", "last", "--switch-endpoint", "--base-url", other.base_url, "--api-key-env",
                       "OTHER_KEY", data_dir=data, env=KEYS)
        assert switched.returncode == 0, switched.stderr
        assert "endpoint switched (--switch-endpoint)" in switched.stderr
        assert other.headers[-1]["authorization"] == "Bearer other-secret"
        resumed = [e for e in read_trajectory(path) if e["event"] == "run_resumed"]
        assert "endpoint_changed" not in resumed[0]
        assert resumed[-1]["endpoint_changed"] == {
            "from": {"provider": "openai", "base_url": local.base_url, "api_key_env": "LOCAL_KEY"},
            "to": {"provider": "openai", "base_url": other.base_url, "api_key_env": "OTHER_KEY"}}
    finally:
        local.close()
        other.close()
