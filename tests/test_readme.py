"""The commands the README shows work as shown."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def readme_commands(prefix: str) -> list[list[str]]:
    return [shlex.split(line)[2:] for line in re.findall(rf"^{re.escape(prefix)} .*$", README, flags=re.MULTILINE)]


def test_the_readme_opens_with_the_run_and_test_commands_and_ci_runs_the_test_command():
    first_block = README.split("```")[1]
    lines = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert lines[:2] == ["./dev serve", "./dev test"]
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()


def test_the_offline_rlm_demo_in_the_readme_answers(tmp_path):
    commands = readme_commands("./dev rlm")
    assert [c[0] for c in commands] == ["demo", "show", "usage"]
    env = dict(os.environ, RLM_DATA_DIR=str(tmp_path))
    outputs = []
    for args in commands:
        done = subprocess.run([str(Path(sys.executable).parent / "rlm"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert "tried 5 times" in outputs[0]
    assert "turn 1" in outputs[1]
    assert "calls" in outputs[2]


def _local_operator_block() -> list[str]:
    """The README's block of operator commands for one machine: the one that issues a key."""
    [block] = [b for b in README.split("```")[1::2] if "keys issue" in b]
    return [line for line in block.strip().splitlines() if line.startswith("./dev specialists ")]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_readme_operator_commands_work_as_written_beside_the_local_service(tmp_path):
    """As on a developer's machine: `./dev serve` with DATABASE_URL unset (the embedded database, secrets it
    generates), and the README's commands in another terminal, with nothing exported. The key they issue is
    one the running service accepts; one signed with an exported secret (what the README once showed) is not."""
    from ops.topology import Ready, Role, StartBounds, ops_cli
    from tests import embedded_pg, http_calls
    from tests.app.conftest import free_port

    # `.data` in a checkout; here a folder the embedded server's system user can reach (pytest's are root's
    # alone), laid out as the test run's own server folder, so a run killed mid-test has it swept like that one.
    data_dir = Path(tempfile.mkdtemp(prefix=embedded_pg.PREFIX))
    (data_dir / embedded_pg.OWNER_FILE).write_text(
        json.dumps({"pid": os.getpid(), "token": os.environ.get(embedded_pg.RUN_TOKEN_ENV, "")}))
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("SPECIALISTS_") or k == embedded_pg.RUN_TOKEN_ENV)
           and k not in ("DATABASE_URL", "TEST_DATABASE_URL")}
    env["SPECIALISTS_DATA_DIR"] = str(data_dir)
    env["SPECIALISTS_CONSOLE_PORT"] = str(free_port())  # serve starts the console on one machine (8090 elsewhere)
    port = free_port()
    log_path = tmp_path / "serve.log"
    base = f"http://127.0.0.1:{port}"
    # A role (ops/topology.py) in its own process group, as a terminal gives it, stopped by SIGINT to the group
    # (Ctrl-C); it may start without progress for 240 s (the embedded database's first start), its children too.
    serve = Role("serve", ops_cli("serve", "--port", str(port), "--worker-port", str(free_port())),
                 env | {"SPECIALISTS_SERVE_CHILD_START_TIMEOUT_S": "240"}, Ready.http(f"{base}/readyz"), log_path,
                 bounds=StartBounds(stall_s=240), stop_grace_s=60, stop_signal=signal.SIGINT, new_session=True)

    def specialists(*args: str, stdin: str | None = None, extra: dict[str, str] | None = None):
        return subprocess.run([sys.executable, "-m", "ops.cli", *args], env=env | (extra or {}), cwd=tmp_path,
                              input=stdin, capture_output=True, text=True, timeout=120)

    def accepted(token: str) -> bool:
        answer = http_calls.post(
            f"{base}/specialists/conformance/message:send",
            json={"message": {"messageId": f"tck-complete-task-{uuid.uuid4()}", "role": "ROLE_USER",
                              "parts": [{"text": "hi"}]}},
            headers={"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}, timeout=60)
        return answer.status_code == 200 and answer.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"

    try:
        serve.run()  # until /readyz answers 200; an exit or a stall fails with its log
        # The console it printed, behind the operator secret it generated beside the others.
        console = f"http://127.0.0.1:{env['SPECIALISTS_CONSOLE_PORT']}/"
        assert console in log_path.read_text()
        secret = json.loads((data_dir / "local-secrets.json").read_text())["console_operator_secret"]
        login = http_calls.post(f"{console}login", data={"secret": secret}, headers={"Origin": console.rstrip("/")},
                                follow_redirects=False)
        assert (login.status_code, login.headers["location"]) == (303, "/customers"), login.text
        key_id = None
        for line in _local_operator_block():
            args = shlex.split(line, comments=True)[2:]
            stdin = stdout_file = None
            if "<" in args:  # `... < key.txt`: the file on standard input
                at = args.index("<")
                stdin, args = (tmp_path / args[at + 1]).read_text(), args[:at]
            if ">" in args:  # `... > key.txt`: standard output into the file, as the shell does it
                at = args.index(">")
                stdout_file, args = tmp_path / args[at + 1], args[:at]
            args = [key_id if arg == "KEY_ID" else arg for arg in args]
            done = specialists(*args, stdin=stdin)
            assert done.returncode == 0, (line, done.stdout, done.stderr)
            if stdout_file is not None:
                stdout_file.write_text(done.stdout)
            if args[:2] == ["keys", "issue"]:
                token = (tmp_path / "key.txt").read_text().strip()
                assert re.fullmatch(r"sk_test_\S+", token), f"key.txt holds more than the key: {token!r}"
                key_id = re.search(r"key_[0-9a-f]{16}", done.stderr).group(0)  # the record, for the person
                assert accepted(token), "the running service refused the key the README's command issued"
                exported = specialists(*args, "--json", extra={"SPECIALISTS_KEY_SIGNING_SECRETS": "s" * 48})
                assert not accepted(json.loads(exported.stdout)["key"])  # the old README's way: refused
        serve.stop()  # Ctrl-C
        # The embedded server outlives `serve`, as the README says, until the README's `db stop`.
        [(pid_file, running)] = _postmasters(data_dir)
        assert running, "the embedded PostgreSQL stopped with serve"
        [stop_line] = [b for b in README.split("```")[1::2] if "db stop" in b][0].strip().splitlines()
        stopped = specialists(*shlex.split(stop_line, comments=True)[2:], "--json")
        assert stopped.returncode == 0 and json.loads(stopped.stdout)["stopped"] is True, stopped.stdout + stopped.stderr
        assert not _alive(running) and (data_dir / "postgres" / "PG_VERSION").exists()  # stopped, its data kept
        again = specialists(*shlex.split(stop_line, comments=True)[2:], "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["stopped"] is False
    finally:
        serve.stop()  # Ctrl-C, SIGKILL to the group past 60 s
        # The embedded server outlives `serve` on purpose, not the test. Not clean_up: the folder names this run's
        # token, and clean_up kills every process that carries it (it killed the suite's other pytest worker).
        embedded_pg.stop_server(data_dir)


def _postmasters(data_dir: Path) -> list[tuple[Path, int]]:
    """The embedded server's pid file and the pid in it, when that process is alive."""
    found = []
    for pid_file in data_dir.glob("*/postmaster.pid"):
        pid = int(pid_file.read_text().split("\n", 1)[0])
        if _alive(pid):
            found.append((pid_file, pid))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_readme_names_every_secret_serve_needs():
    from ops import local_secrets

    table = README.split("## Settings", 1)[1]
    assert all(f"| `{variable}` |" in table for variable in local_secrets.GENERATED.values())
