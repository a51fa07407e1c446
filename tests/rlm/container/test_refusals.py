"""A container kernel that cannot run is refused, naming the setting to change; nothing runs on the host instead."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlmfamily import Context, ScriptedProvider, Session
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import read_trajectory

pytestmark = pytest.mark.timeout(60)

STEP = "open('ran-somewhere', 'w').close()\nfinal_answer('ran')"


def refused(settings: RLMSettings, repo: Path, monkeypatch: pytest.MonkeyPatch, path: str | None = None) -> str:
    context = Context.from_repository(repo, settings)
    if path is not None:
        monkeypatch.setenv("PATH", path)
    result = Session(context=context, provider=ScriptedProvider({"root": [{"code": STEP}]}), settings=settings,
                     kernel="container").run("anything")
    assert result.stop_reason == "error" and result.answer is None
    assert not [e for e in read_trajectory(result.trajectory_path) if e["event"] == "step"]
    assert not (repo / "ran-somewhere").exists()
    assert result.error is not None and result.error.startswith("container_unavailable: ")
    return result.error


def test_an_engine_that_is_not_installed_is_refused_naming_the_engine_setting(
        make_settings: Callable[..., RLMSettings], fixture_repo: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    error = refused(make_settings(container_engine="podman"), fixture_repo, monkeypatch, path=str(empty))
    assert "podman: not found on PATH" in error and "RLM_CONTAINER_ENGINE" in error
    assert "apt-get install podman runc" in error


def test_a_docker_daemon_that_does_not_answer_is_refused_naming_the_engine_setting(
        make_settings: Callable[..., RLMSettings], fixture_repo: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"  # Docker's client as it answers when its daemon is down
    docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                      "Is the docker daemon running?' >&2\nexit 1\n")
    docker.chmod(0o755)
    error = refused(make_settings(container_engine="docker"), fixture_repo, monkeypatch, path=str(bin_dir))
    assert "Cannot connect to the Docker daemon" in error and "RLM_CONTAINER_ENGINE=docker" in error


def test_a_missing_image_is_refused_naming_the_image_setting_and_never_pulled(
        make_settings: Callable[..., RLMSettings], fixture_repo: Path, container_image: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    error = refused(make_settings(container_image="localhost/rlmfamily-missing:none"), fixture_repo, monkeypatch)
    assert "'localhost/rlmfamily-missing:none' is not in" in error and "RLM_CONTAINER_IMAGE" in error
    assert "rlm container image" in error


def test_a_build_stuck_in_another_process_is_refused_after_the_lock_wait_naming_the_image_setting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from rlmfamily.container import image
    from rlmfamily.errors import RLMError

    monkeypatch.setattr(image.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(image, "LOCK_WAIT_S", 0.5)
    lock = tmp_path / f"rlmfamily-image-{os.getuid()}.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys\n"
        f"h = open({str(lock)!r}, 'a+b'); fcntl.flock(h, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"  # the other build holds it
        with pytest.raises(RLMError) as refused:
            with image._machine_lock():
                pass
        assert refused.value.code == "container_image_build_failed"
        assert "RLM_CONTAINER_IMAGE" in refused.value.message and str(lock) in refused.value.message
    finally:
        holder.communicate("")  # its stdin closed: it exits and lets go
    entered = []
    with image._machine_lock():  # let go: taken at once
        entered.append(True)
    assert entered == [True]
