"""A run's container lives no longer than its run: gone when the run's process is SIGKILLed, when a child run is
cancelled, and, when its engine client could not take it away (stopped here, as a hung client would be), removed
by label at the next start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmfamily.container.engine import find_engine
from rlmfamily.container.sandbox import labelled_containers
from rlmfamily.family import procs
from rlmfamily.settings import RLMSettings

from ..holds import wait_until
from .support import GONE_WITHIN_S, containers_owned_by, run_steps, steps_of

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(make_settings: Callable[..., RLMSettings], container_image: str) -> RLMSettings:
    return make_settings(kernel="container", container_image=container_image, max_turns=6)


def start_spinning_run(settings: RLMSettings, repo: Path, tmp_path: Path) -> subprocess.Popen[bytes]:
    """``rlm run`` in a process of its own, its one step spinning in the container after writing a marker."""
    script = tmp_path / "spin.json"
    script.write_text(json.dumps({"root": [{"code": "open('spinning', 'w').close()\nwhile True:\n    pass"}]}))
    env = {**os.environ, "RLM_STEP_TIMEOUT_S": "600", "RLM_CONTAINER_IMAGE": settings.container_image}
    run = subprocess.Popen([sys.executable, "-m", "rlmfamily", "--data-dir", str(settings.data_dir), "run", "spin",
                            "--repo", str(repo), "--kernel", "container", "--script", str(script)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: (repo / "spinning").exists() or run.poll() is not None, "the step started", limit_s=GONE_WITHIN_S)
    assert run.poll() is None, "the run ended before its step spun"
    return run


def engine_client_of(pid: int) -> int:
    """The engine client (`podman|docker run ... keeper.py`) the run's process started."""
    for entry in os.listdir("/proc"):
        info = procs.stat(int(entry)) if entry.isdigit() else None
        if info is not None and info.ppid == pid:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"run" in cmdline and any(part.endswith(b"keeper.py") for part in cmdline):
                return int(entry)
    raise AssertionError(f"no engine client under process {pid}")


def test_a_sigkilled_run_takes_its_container_with_it(
        settings: RLMSettings, fixture_repo: Path, tmp_path: Path) -> None:
    engine = find_engine(settings)
    run = start_spinning_run(settings, fixture_repo, tmp_path)
    try:
        assert len(containers_owned_by(engine, run.pid)) == 1
        run.send_signal(signal.SIGKILL)
        run.wait()
        wait_until(lambda: containers_owned_by(engine, run.pid) == [], "the killed run's container is gone",
                   limit_s=GONE_WITHIN_S)
    finally:
        run.kill()
        run.wait()


def test_a_container_left_by_a_killed_run_is_swept_at_the_next_start(
        settings: RLMSettings, fixture_repo: Path, tmp_path: Path) -> None:
    engine = find_engine(settings)
    run = start_spinning_run(settings, fixture_repo, tmp_path)
    client = engine_client_of(run.pid)
    try:
        # A client that cannot pass the end of the keeper's stdin on (stopped, as a hung one would be) keeps the
        # container after its run is SIGKILLed: only its labels (owner pid and start time) can tell it is orphaned.
        (orphan,) = containers_owned_by(engine, run.pid)
        os.kill(client, signal.SIGSTOP)
        # A signal is delivered when the kernel next schedules its process: on a loaded machine it is still "R" a while.
        wait_until(lambda: getattr(procs.stat(client), "state", None) == "T", "the engine client is stopped")
        run.send_signal(signal.SIGKILL)
        run.wait()
        # Its client is alive, stopped: nothing but a sweep removes the container now (another test's run starting
        # meanwhile on the suite's other worker may be the one that does).
        assert procs.alive(client) and procs.stat(client).state == "T"
        result = run_steps(settings, fixture_repo, ["final_answer('next run')"])
        assert result.answer == "next run", result.error
        assert orphan not in find_engine(settings).call("ps", "-a", "--format", "{{.Names}}").stdout.split()
    finally:
        run.kill()
        run.wait()
        try:
            os.kill(client, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_cancelled_child_takes_its_container_with_it(settings: RLMSettings, fixture_repo: Path) -> None:
    result = run_steps(settings, fixture_repo, [
        "import os, time\nchild = rlm.run('spin until cancelled')\nt = time.time()\n"
        "while not os.path.exists('child-spinning') and time.time() - t < 60:\n    time.sleep(0.05)\n"
        "print('spinning:', os.path.exists('child-spinning'))\nprint('cancel:', child.cancel()['state'])",
        "final_answer('cancelled')",
    ], children=[{"pattern": "spin until", "root": [
        {"code": "open('child-spinning', 'w').close()\nwhile True:\n    pass"}]}])
    assert result.answer == "cancelled", result.error
    assert "spinning: True" in steps_of(result)[0]["observation"]
    assert "cancel: cancelled" in steps_of(result)[0]["observation"], steps_of(result)[0]["observation"]
    engine = find_engine(settings)
    wait_until(lambda: labelled_containers(engine, f"{result.run_id}.c1") == [], "the cancelled child's container is gone",
               limit_s=GONE_WITHIN_S)



def test_a_keeper_silent_past_its_deadline_is_not_asked_again_so_a_late_answer_answers_nothing(
        settings: RLMSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlmfamily.container import sandbox

    monkeypatch.setattr(sandbox, "PROBE_TIMEOUT_S", 1.0)
    engine = find_engine(settings)
    with sandbox.RunContainer.open(settings, run_id="silent-keeper", workspace=tmp_path / "ws") as box:
        assert box.oom_kills() == 0  # a keeper that answers
        assert engine.call("pause", box.name).returncode == 0  # frozen: it reads nothing, says nothing
        try:
            assert box.oom_kills() is None  # no answer within the deadline
        finally:
            assert engine.call("unpause", box.name).returncode == 0
        # Thawed, the keeper answers that request late ("0"): read as this request's answer it would pass for one.
        assert box.oom_kills() is None
        assert box.signal(12345, signal.SIGTERM) is False
    wait_until(lambda: labelled_containers(engine, "silent-keeper") == [], "the container is removed",
               limit_s=GONE_WITHIN_S)
