"""What the model's code cannot reach from the container: the network (a server on the host's loopback, DNS), the
host's files outside the workspace, the host's environment and its keys, more processes than the pids limit (a fork
bomb), more memory than the memory limit (a memory bomb). After each attempt the run goes on."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlmfamily.container.engine import find_engine
from rlmfamily.container.sandbox import labelled_containers
from rlmfamily.settings import RLMSettings

from .support import run_steps, steps_of

pytestmark = pytest.mark.timeout(120)

MODEL_KEY = "sk-model-key-never-inside-51d2"
OPENAI_KEY = "sk-openai-key-never-inside-8c1e"
PEER_KEY = "peer-bearer-never-inside-77a0"
MAX_PIDS = 64  # RLM_CONTAINER_MAX_PIDS here: the fork bomb may never see more processes at once


@pytest.fixture
def host_server() -> Iterator[int]:
    """An HTTP server on the host's 127.0.0.1 that counts the requests it got."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    assert hits == [], "a request from the container reached the host's loopback"


@pytest.fixture
def settings(make_settings: Callable[..., RLMSettings], container_image: str, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> RLMSettings:
    # The keys are set on the host under names the engine's own filter does not catch (no KEY, TOKEN...):
    # only the library's rule (the model's and the peers' key variables) keeps them out.
    monkeypatch.setenv("MODEL_BEARER", MODEL_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("PEER_BEARER", PEER_KEY)
    peers = tmp_path / "peers.toml"
    peers.write_text('[[peers]]\nalias = "review"\nurl = "http://127.0.0.1:9"\ncredential_env = "PEER_BEARER"\n')
    return make_settings(kernel="container", container_image=container_image, api_key_env="MODEL_BEARER",
                         a2a_enabled=True, a2a_peers_file=peers, container_max_pids=MAX_PIDS,
                         container_memory_bytes=256 << 20, step_timeout_s=30.0, max_turns=10)


def test_the_network_the_host_files_and_the_keys_stay_outside(
        settings: RLMSettings, fixture_repo: Path, host_server: int, tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "host-only.txt"
    outside.parent.mkdir()
    outside.write_text("only on the host")
    result = run_steps(settings, fixture_repo, [
        f"""
import json, os, socket
seen = {{}}
try:
    socket.create_connection(("127.0.0.1", {host_server}), timeout=3).close()
    seen["host_loopback"] = "connected"
except OSError as exc:
    seen["host_loopback"] = type(exc).__name__
try:
    socket.getaddrinfo("example.com", 80)
    seen["dns"] = "resolved"
except OSError as exc:
    seen["dns"] = type(exc).__name__
seen["interfaces"] = sorted(os.listdir("/sys/class/net"))
seen["outside_file"] = os.path.exists({str(outside)!r}) or os.path.exists({str(outside.parent)!r})
seen["hostname"] = open("/etc/hostname").read().strip()
environs = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        environs.append(open(f"/proc/{{pid}}/environ", "rb").read().decode())
    except OSError:
        pass
seen["environ_names"] = sorted(os.environ)
seen["environs_read"] = len(environs)
seen["keys_seen"] = [k for k in ({MODEL_KEY!r}, {OPENAI_KEY!r}, {PEER_KEY!r})
                     if any(k in text for text in environs + [json.dumps(dict(os.environ))])]
print(json.dumps(seen))
""",
        "final_answer('done')",
    ])
    assert result.stop_reason == "answered", result.error
    seen = json.loads(steps_of(result)[0]["observation"].split("\n", 1)[1])
    assert seen["host_loopback"] == "ConnectionRefusedError"  # the container's loopback is its own
    assert seen["dns"] == "gaierror" and seen["interfaces"] == ["lo"]
    assert seen["outside_file"] is False
    assert seen["hostname"] != socket.gethostname()
    assert seen["environs_read"] >= 2  # the keeper's (process 1) and the kernel's own
    assert seen["keys_seen"] == []
    assert "OPENAI_API_KEY" not in seen["environ_names"] and "PEER_BEARER" not in seen["environ_names"]


def test_a_fork_bomb_and_a_memory_bomb_are_bounded_and_the_run_goes_on(
        settings: RLMSettings, fixture_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the user ran it: nothing may appear there (Podman's conmon writes a file named "oom" into its client's
    # working directory when the memory limit kills a process).
    where_the_user_is = tmp_path / "cwd"
    where_the_user_is.mkdir()
    monkeypatch.chdir(where_the_user_is)
    result = run_steps(settings, fixture_repo, [
        "x = 41",
        # A classic fork bomb in its own process group, its errors in a file: watched until fork fails (or 20 s),
        # counting the container's processes meanwhile, then its group killed.
        """
import os, signal, subprocess, time
FULL = "Resource temporarily unavailable"
with open("/tmp/bomb.err", "w") as err:
    bomb = subprocess.Popen(["bash", "-c", ":(){ :|:& };:"], stdout=subprocess.DEVNULL, stderr=err,
                            start_new_session=True)
started, most = time.time(), 0
while FULL not in open("/tmp/bomb.err").read() and time.time() - started < 20:
    most = max(most, sum(1 for p in os.listdir("/proc") if p.isdigit()))
    time.sleep(0.02)
os.killpg(bomb.pid, signal.SIGKILL)
bomb.wait()
print("bounded:", FULL in open("/tmp/bomb.err").read(), most <= MAX_PIDS)
""".replace("MAX_PIDS", str(MAX_PIDS)),
        "y = bytearray(1 << 30)",  # 1 GiB touched, in a 256 MiB container
        "x += 1\nprint('after the bombs', x)",
        "final_answer(str(x))",
    ])
    assert result.stop_reason == "answered" and result.answer == "42", result.error
    steps = steps_of(result)
    assert "bounded: True True" in steps[1]["observation"], steps[1]["observation"]
    assert steps[2]["error_code"] == "memory" and steps[2]["restored"]
    assert "RLM_CONTAINER_MEMORY_BYTES" in steps[2]["error"]
    assert steps[3]["ok"] and "after the bombs 42" in steps[3]["observation"]
    assert labelled_containers(find_engine(settings), result.run_id) == []
    assert list(where_the_user_is.iterdir()) == []
