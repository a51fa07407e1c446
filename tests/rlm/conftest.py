"""Fixtures for the RLM library tests: settings in a temporary data dir, a real git repository,
script files for the scripted provider, and local HTTP servers that speak the OpenAI
chat-completions and the Anthropic Messages wire formats (a paid model cannot run here).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.settings import RLMSettings, load_settings

from .holds import Hold

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET_SENTENCE = "The vault combination is 31-41-59 and nobody may print it in a prompt."
# Kept from the environment: which container engine the container tests run on (unset: auto, Podman first);
# RLM_CONTAINER_ENGINE=docker with DOCKER_HOST runs them on Docker (docs/RLM.md, "Container engines").
MACHINE_RLM_ENV = frozenset({"RLM_CONTAINER_ENGINE"})


@pytest.fixture(autouse=True)
def _isolated_rlm_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads a developer's RLM_* variables or writes to the real home (a data dir of its own; a test
    that unsets it runs rlm under a temporary HOME, as tests/rlm/test_data_dir.py does)."""
    for name in list(os.environ):
        if name.startswith("RLM_") and name not in MACHINE_RLM_ENV:
            monkeypatch.delenv(name)
    monkeypatch.setenv("RLM_DATA_DIR", str(tmp_path / "rlm-data"))


@pytest.fixture(scope="session")
def container_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The container kernel's image, built once per machine from its Debian packages and reused while they are
    unchanged (rlmfamily/container/image.py). No engine is a failure that says how to get one, never a skip."""
    from rlmfamily.container.engine import ContainerUnavailable, find_engine
    from rlmfamily.container.image import build_image

    settings = load_settings(data_dir=tmp_path_factory.mktemp("container-engine"),
                             container_engine=os.environ.get("RLM_CONTAINER_ENGINE", "auto"))
    try:
        engine = find_engine(settings, check_image=False)
    except ContainerUnavailable as exc:
        pytest.fail(f"the container tests need Podman or Docker: {exc.message} (./dev test installs Podman as root)")
    return build_image(engine).build_tag


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., RLMSettings]:
    def make(**overrides: Any) -> RLMSettings:
        overrides.setdefault("data_dir", tmp_path / "rlm-data")
        return load_settings(**overrides)

    return make


@pytest.fixture
def settings(make_settings: Callable[..., RLMSettings]) -> RLMSettings:
    return make_settings()


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True, capture_output=True,
    )


@pytest.fixture
def fixture_repo(tmp_path: Path) -> Path:
    """A small git repository: tracked text files, a tracked binary, a tracked big file, an untracked file."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "docs").mkdir()
    (repo / "README.md").write_text("# ferry\n\nFerry moves crates between docks.\n")
    (repo / "src" / "limits.py").write_text(
        '"""Limits."""\n\nMAX_CRATES = 40\n# the dock master raised this after the spring audit\nDOCK_TIMEOUT_S = 90\n'
    )
    (repo / "src" / "ferry.py").write_text(
        "from src.limits import MAX_CRATES\n\n\ndef load(crates):\n    return crates[:MAX_CRATES]\n"
    )
    lines = [f"Line {i}: routine crossing, weather fair, {i * 3} crates.\n" for i in range(400)]
    lines[250] = f"Line 250: {SECRET_SENTENCE}\n"
    (repo / "docs" / "log.md").write_text("".join(lines))
    (repo / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200))
    (repo / "big.txt").write_text("x" * 50_000)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")
    (repo / "untracked.md").write_text("not part of the corpus\n")
    return repo


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[..., Path]:
    """Write a scripted-provider file (JSON) from root code strings and sub-call rules."""
    counter = {"n": 0}

    def write(root: list[str | dict[str, Any]], subcall: list[dict[str, Any]] | None = None, **top: Any) -> Path:
        counter["n"] += 1
        entries = [{"code": r} if isinstance(r, str) else r for r in root]
        data = {"root": entries, "subcall": subcall or [], **top}
        path = tmp_path / f"script{counter['n']}.json"
        path.write_text(json.dumps(data))
        return path

    return write


class FakeModelServer:
    """A model API server on 127.0.0.1. Queue responses; it records every request it saw.

    A response pushed with ``hold=True`` is not sent until the test calls ``hold.release()``.
    Subclasses give the wire format: ``completion`` (a success body) and ``error`` (a failure body).
    """

    def __init__(self) -> None:
        self.hold = Hold()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self._queue: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with fake._lock:
                    fake.requests.append(body)
                    fake.paths.append(self.path)
                    fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                    spec = fake._queue.pop(0) if fake._queue else {"text": "default answer"}
                if spec.get("hold"):
                    fake.hold()
                status = spec.get("status", 200)
                if status != 200:
                    payload = fake.error(spec)
                else:
                    payload = fake.completion(body, spec)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test): nothing to answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def push(self, **spec: Any) -> None:
        with self._lock:
            self._queue.append(spec)

    def close(self) -> None:
        self.hold.release()
        self.server.shutdown()
        self.server.server_close()


class FakeOpenAI(FakeModelServer):
    """OpenAI chat completions: POST {base_url}/chat/completions."""

    @staticmethod
    def error(spec: dict[str, Any]) -> dict[str, Any]:
        return {"error": {"message": spec.get("message", "boom"), "type": "server_error"}}

    @staticmethod
    def completion(request: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": spec.get("text")}
        if "code" in spec:
            message["tool_calls"] = [{
                "id": "call_1", "type": "function",
                "function": {"name": "python", "arguments": json.dumps({"code": spec["code"]})},
            }]
        if "bash" in spec:  # a call of the python-bash profile's bash tool: {"command": ..., ...}
            message["tool_calls"] = [{"id": spec.get("call_id", "call_b"), "type": "function",
                                      "function": {"name": "bash", "arguments": json.dumps(spec["bash"])}}]
        payload: dict[str, Any] = {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": request.get("model", "m"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
        if spec.get("usage", True):
            payload["usage"] = {"prompt_tokens": spec.get("prompt_tokens", 100),
                                "completion_tokens": spec.get("completion_tokens", 20), "total_tokens": 120}
            details = {key: spec[key] for key in ("cached_tokens", "cache_write_tokens") if key in spec}
            if details:
                payload["usage"]["prompt_tokens_details"] = details
        return payload


class FakeAnthropic(FakeModelServer):
    """Anthropic Messages: POST {base_url}/v1/messages, content blocks, tool_use, usage with the cache fields."""

    def __init__(self) -> None:
        super().__init__()
        self._ids = 0

    @property
    def base_url(self) -> str:  # the client adds /v1/messages itself
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @staticmethod
    def error(spec: dict[str, Any]) -> dict[str, Any]:
        kind = {429: "rate_limit_error", 529: "overloaded_error", 400: "invalid_request_error"}.get(
            spec.get("status", 500), "api_error")
        return {"type": "error", "error": {"type": kind, "message": spec.get("message", "boom")}}

    def completion(self, request: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if spec.get("text"):
            content.append({"type": "text", "text": spec["text"]})
        if "code" in spec:
            with self._lock:
                self._ids += 1
                tool_id = f"toolu_{self._ids:04d}"
            content.append({"type": "tool_use", "id": tool_id, "name": "python", "input": {"code": spec["code"]}})
        payload: dict[str, Any] = {
            "id": "msg_1", "type": "message", "role": "assistant", "model": request.get("model", "m"),
            "content": content or [{"type": "text", "text": "default answer"}],
            "stop_reason": "tool_use" if "code" in spec else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": spec.get("input_tokens", 100), "output_tokens": spec.get("output_tokens", 20),
                      "cache_creation_input_tokens": spec.get("cache_creation_input_tokens", 0),
                      "cache_read_input_tokens": spec.get("cache_read_input_tokens", 0)},
        }
        return payload


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()
