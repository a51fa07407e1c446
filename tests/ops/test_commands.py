"""The commands that run the service: `specialists serve` (the whole system), `worker`, `dispatcher`; local secrets."""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from core import db
from core.settings import PROJECT_ROOT, Settings
from ledger import keys
from ops import local_secrets
from ops.topology import Ready, Role, StartClock, ops_cli
from tests import http_calls
from tests.app.conftest import edge_env, free_port
from tests.conftest import TEST_SECRET
from tests.rlm.holds import wait_until
from tests.workers.conftest import WORKER_SECRET
from tests.workers.system import START_BOUNDS, drop_database, fresh_database

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def specs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("specs")
    shutil.copy(PROJECT_ROOT / "specs" / "conformance.yaml", folder / "conformance.yaml")
    return folder


def specialists(env: dict[str, str], *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
        timeout=timeout_s,
    )


def test_a_worker_without_a_job_secret_refuses_to_start_naming_the_setting(database_url, specs_dir):
    done = specialists(edge_env(database_url, specs_dir), "worker", "--port", str(free_port()))
    assert done.returncode == 3
    assert "SPECIALISTS_WORKER_JOB_SECRETS" in done.stderr


def test_a_worker_stopped_while_it_starts_exits_instead_of_serving_on(database_url, specs_dir, tmp_path):
    # A supervisor that restarts a worker may stop it again before it listens (the drill's target-mode test did,
    # at its end): the stop signal once came between the worker's own handlers and uvicorn's, was swallowed, and
    # the worker served on until SIGKILL past the grace.
    env = edge_env(database_url, specs_dir, worker_job_secrets=WORKER_SECRET, worker_oidc_verify="false")
    worker = Role("worker", ops_cli("worker", "--port", str(free_port())), env, log_path=tmp_path / "worker.log",
                  stop_grace_s=30)
    worker.start()
    try:
        # Logged as its settings are checked: its handlers are set, its schema check and uvicorn still to come.
        wait_until(lambda: "OIDC tokens are NOT checked" in worker.log_text() or not worker.alive,
                   "the worker to check its settings", limit_s=60)
        worker.signal(signal.SIGTERM)
        worker.popen.wait(30)
        assert worker.returncode == 0, worker.log_tail()
    finally:
        worker.kill()


def test_a_dispatcher_without_a_job_secret_or_with_half_a_cloud_tasks_setup_refuses_to_start(database_url, specs_dir):
    no_secret = specialists(edge_env(database_url, specs_dir), "dispatcher")
    assert no_secret.returncode == 3 and "SPECIALISTS_WORKER_JOB_SECRETS" in no_secret.stderr
    half = specialists(
        edge_env(database_url, specs_dir, worker_job_secrets=WORKER_SECRET, dispatch_backend="cloud_tasks",
                 cloud_tasks_project="p"),
        "dispatcher",
    )
    assert half.returncode == 3 and "SPECIALISTS_CLOUD_TASKS_LOCATION" in half.stderr


def test_serve_in_production_never_generates_secrets_and_names_the_missing_one(database_url, specs_dir):
    env = edge_env(database_url, specs_dir, serve_worker="true", serve_dispatcher="true")
    without_keys = dict(env)
    del without_keys["SPECIALISTS_KEY_SIGNING_SECRETS"]
    done = specialists(without_keys, "serve", "--port", str(free_port()))
    assert done.returncode == 3 and "SPECIALISTS_KEY_SIGNING_SECRETS" in done.stderr
    done = specialists(env, "serve", "--port", str(free_port()))  # a worker and a dispatcher need the job secret
    assert done.returncode == 3 and "SPECIALISTS_WORKER_JOB_SECRETS" in done.stderr
    assert "never generated" in done.stderr


def test_serve_in_production_names_every_missing_secret_in_one_message(database_url):
    env = edge_env(database_url, PROJECT_ROOT / "specs", serve_worker="true", serve_dispatcher="true")
    del env["SPECIALISTS_KEY_SIGNING_SECRETS"]  # and no job secret, no checkpoint key: the shipped rlm specs need it
    done = specialists(env, "serve", "--port", str(free_port()))
    assert done.returncode == 3
    [line] = [line for line in done.stderr.splitlines() if "secret_missing" in line]  # one message, not three runs
    # With DATABASE_URL set, serve starts no console unless asked (production runs it as a service of its own).
    console = ("console_operator_secret", "console_session_secrets")
    required = [v for name, v in local_secrets.GENERATED.items() if name not in local_secrets.OPTIONAL and name not in console]
    assert all(variable in line for variable in required), line
    assert not any(local_secrets.GENERATED[name] in line for name in console)
    assert "never generated" in line
    with_console = specialists(env | {"SPECIALISTS_SERVE_CONSOLE": "true"}, "serve", "--port", str(free_port()))
    [line] = [line for line in with_console.stderr.splitlines() if "secret_missing" in line]
    assert all(local_secrets.GENERATED[name] in line for name in console), line


def test_serve_gives_up_on_a_worker_that_does_not_answer_in_time_and_names_the_setting(database_url, specs_dir):
    # The overall bound: a worker that computes is waited for past SPECIALISTS_SERVE_CHILD_START_TIMEOUT_S
    # (tests/ops/test_serve_start.py), never past SPECIALISTS_SERVE_CHILD_START_MAX_S.
    env = edge_env(database_url, specs_dir, serve_worker="true", worker_job_secrets=WORKER_SECRET,
                   worker_port=str(free_port()), serve_child_start_max_s="0.001", worker_drain_s="1")
    done = specialists(env, "serve", "--port", str(free_port()))
    assert done.returncode == 1, done.stderr
    assert "role_failed" in done.stderr and "SPECIALISTS_SERVE_CHILD_START_MAX_S" in done.stderr
    assert "service starting" in done.stdout  # it got as far as starting its worker


def test_local_secrets_are_generated_once_on_one_machine_only(tmp_path: Path, database_url: str, monkeypatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)  # the run's own server may be given that way
    embedded = Settings(database={"data_dir": tmp_path})  # no DATABASE_URL: the embedded database's machine
    filled, generated = local_secrets.with_local_secrets(embedded, generate=True)
    assert sorted(generated) == ["console_operator_secret", "console_session_secrets", "key_signing_secrets",
                                 "push_signing_secrets", "specialist_checkpoint_key", "worker_job_secrets"]
    path = local_secrets.secrets_path(embedded)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, generated_again = local_secrets.with_local_secrets(Settings(database={"data_dir": tmp_path}), generate=True)
    assert generated_again == []  # the next command reuses them
    assert again.keys.signing_secrets[0].get_secret_value() == filled.keys.signing_secrets[0].get_secret_value()
    assert again.worker.job_secrets[0].get_secret_value() == filled.worker.job_secrets[0].get_secret_value()
    assert again.hosted.checkpoint_key.get_secret_value() == filled.hosted.checkpoint_key.get_secret_value()
    assert again.push.signing_secrets[0].get_secret_value() == filled.push.signing_secrets[0].get_secret_value()
    assert again.console.operator_secret.get_secret_value() == filled.console.operator_secret.get_secret_value()
    assert again.console.session_secrets[0].get_secret_value() == filled.console.session_secrets[0].get_secret_value()
    production = Settings(database={"data_dir": tmp_path / "prod", "url": database_url})
    assert local_secrets.with_local_secrets(production, generate=True) == (production, [])
    assert not (tmp_path / "prod").exists()


def test_serve_runs_the_whole_system_in_one_command_and_ctrl_c_stops_every_part(serve_database, specs_dir, tmp_path):
    url = serve_database
    log_path = tmp_path / "serve.log"
    serve, base = _start_serve(url, specs_dir, log_path)
    try:
        serve.wait_ready()  # /readyz answers 200
        assert serve.pid is not None
        children = _children(serve.pid)
        assert len(children) == 2  # the worker and the dispatcher
        own = db.make_engine(url, Settings(database={"url": url}))
        try:
            issued = keys.issue_key(own, keys.KeySigner([TEST_SECRET], "test"), customer_id=f"c-{uuid.uuid4().hex[:8]}",
                                    ttl=timedelta(days=1))
        finally:
            own.dispose()
        answer = http_calls.post(
            f"{base}/specialists/conformance/message:send",
            json={"message": {"messageId": f"tck-complete-task-{uuid.uuid4()}", "role": "ROLE_USER",
                              "parts": [{"text": "hi"}]}},
            headers={"Authorization": f"Bearer {issued.token}", "A2A-Version": "1.0"},
            timeout=30,
        )
        assert answer.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"  # edge -> dispatcher -> worker

        serve.stop(30)  # Ctrl-C in the terminal: the whole group gets SIGINT (SIGKILL past 30 s)
        assert serve.returncode == 0, log_path.read_text()
        for child in children:
            assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text()
    finally:
        serve.stop()
    log = log_path.read_text()  # the children write to the same terminal
    assert "service starting" in log and "embedded to http://127.0.0.1:" in log
    assert "Traceback" not in log  # every part stopped cleanly, not by an interrupt's stack trace


# --- start-up: ready means every part is up, and Ctrl-C at any moment of it is clean (issue 15) ------------------


def _start_serve(url: str, specs_dir: Path, log_path: Path) -> tuple[Role, str]:
    """`specialists serve` as a role (ops/topology.py), started, not waited for: ready once /readyz answers 200;
    in its own process group, as a terminal gives it, and stopped by SIGINT to the group, as Ctrl-C."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = edge_env(url, specs_dir, serve_worker="true", serve_dispatcher="true", worker_job_secrets=WORKER_SECRET,
                   worker_port=str(free_port()), worker_drain_s="1")
    serve = Role("serve", ops_cli("serve", "--port", str(port)), env, Ready.http(f"{base}/readyz"), log_path,
                 bounds=START_BOUNDS, stop_grace_s=30, stop_signal=signal.SIGINT, new_session=True)
    return serve.start(), base


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _wait_until(condition, what: str, serve: Role) -> None:
    """Until ``condition()``, a moment of serve's start-up, while serve makes progress (ops/topology.py's clock)."""
    assert serve.pid is not None
    clock = StartClock(serve.pid, serve.bounds, serve.log_path)
    while not condition():
        assert serve.alive, f"serve exited with {serve.returncode} before {what}:\n{serve.log_text()}"
        expired = clock.expired()
        assert not expired, f"serve did not reach {what} {expired}:\n{serve.log_text()}"
        time.sleep(0.01)


def _ctrl_c_and_wait(serve: Role) -> str:
    serve.stop()  # Ctrl-C in the terminal: the whole group gets SIGINT (SIGKILL past its stop grace)
    assert serve.returncode in (0, 130), serve.log_text()
    return serve.log_text()


@pytest.fixture
def serve_database(server_url, engine):
    engine.dispose()  # the session engine's idle connections back to a server that allows 100
    url = fresh_database(server_url)
    yield url
    drop_database(server_url, url)


def test_serve_is_ready_only_once_its_dispatcher_is_and_ctrl_c_then_is_clean(serve_database, specs_dir, tmp_path):
    log_path = tmp_path / "serve.log"
    serve, base = _start_serve(serve_database, specs_dir, log_path)
    serve.wait_ready()  # /readyz answers 200
    log = log_path.read_text()
    assert "dispatcher" in log and " ready: embedded to " in log, log  # the dispatcher's own ready line, before
    log = _ctrl_c_and_wait(serve)
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log


SIGINT_BIT = 1 << (signal.SIGINT - 1)


def _started(pid: int, command: bytes) -> bool:
    """A child of ``pid`` runs ``specialists <command>`` and Python has taken over SIGINT (caught, or kept
    ignored): it is loading its modules, where an unhandled Ctrl-C ends in a KeyboardInterrupt traceback."""
    for child in _children(pid):
        try:
            if command not in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                continue
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/{child}/status").read_text().splitlines()
                          if ":\t" in line)
        except FileNotFoundError:
            continue
        if (int(status["SigCgt"], 16) | int(status["SigIgn"], 16)) & SIGINT_BIT:
            return True
    return False


@pytest.mark.parametrize("command", ["worker", "dispatcher"])
def test_ctrl_c_while_serve_starts_its_children_ends_cleanly(serve_database, specs_dir, tmp_path, command):
    log_path = tmp_path / "serve.log"
    serve, _ = _start_serve(serve_database, specs_dir, log_path)
    _wait_until(lambda: _started(serve.pid, command.encode()), f"the {command} child runs", serve)
    log = _ctrl_c_and_wait(serve)  # the child is still importing its modules
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert "service starting" in log


def test_ctrl_c_while_serve_itself_starts_ends_cleanly(serve_database, specs_dir, tmp_path):
    log_path = tmp_path / "serve.log"
    serve, _ = _start_serve(serve_database, specs_dir, log_path)
    _wait_until(lambda: "service starting" in log_path.read_text(), "serve says it is starting", serve)
    log = _ctrl_c_and_wait(serve)
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
