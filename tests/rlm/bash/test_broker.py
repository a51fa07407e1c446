"""The command broker with real Bash and real process groups: environment, replay, deadlines, output bounds."""

from __future__ import annotations

import os
import stat
import tracemalloc
import types
from pathlib import Path

import pytest

from rlmfamily.bash.errors import BashUnavailable, JobRefused, JobRequestConflict
from rlmfamily.bash.host import find_bash, missing_process_groups, prepare
from rlmfamily.family import procs
from rlmfamily.settings import load_settings

from ..holds import wait_until
from .support import broker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    (folder / "src").mkdir(parents=True)
    return folder


def test_no_credential_variable_is_visible_to_a_command(make_settings, workspace: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"OPENAI_API_KEY": "sk-model", "DOCK_PASS": "peer-secret", "GITHUB_TOKEN": "ghp",
                        "AWS_SECRET_ACCESS_KEY": "aws", "LANG": "C.UTF-8"}.items():
        monkeypatch.setenv(name, value)
    # A user who allow-lists the peer's key variable by its innocent name still does not pass it on.
    settings = make_settings(profile="python-bash", bash_env_allow=["PATH", "LANG", "DOCK_PASS"])
    job, _ = broker(settings, workspace, hidden={"DOCK_PASS"}).run("env", read_only=True)
    seen = dict(line.split("=", 1) for line in Path(job.stdout_path).read_text().splitlines() if "=" in line)
    assert job.exit_code == 0 and seen["LANG"] == "C.UTF-8"
    assert not {"OPENAI_API_KEY", "DOCK_PASS", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"} & set(seen)
    assert not {"sk-model", "peer-secret", "ghp", "aws"} & set(seen.values())
    with pytest.raises(Exception, match="looks like a credential"):
        load_settings(bash_env_allow=["PATH", "GITHUB_TOKEN"])


def test_each_command_is_a_fresh_process_in_an_explicit_folder_and_only_files_persist(make_settings,
                                                                                     workspace: Path) -> None:
    jobs = broker(make_settings(profile="python-bash"), workspace)
    first, _ = jobs.run("cd src && export KEPT=no && echo made > note.txt && pwd")
    second, _ = jobs.run('pwd; echo "KEPT=${KEPT:-unset}"; cat src/note.txt')
    in_src, _ = jobs.run("pwd", cwd="src", read_only=True)
    assert Path(first.stdout_path).read_text().strip() == str(workspace.resolve() / "src")
    assert Path(second.stdout_path).read_text().splitlines() == [str(workspace.resolve()), "KEPT=unset", "made"]
    assert Path(in_src.stdout_path).read_text().strip() == str(workspace.resolve() / "src") and in_src.cwd == "src"
    for outside in ("..", "/tmp", "src/../.."):
        with pytest.raises(JobRefused, match="outside the workspace"):
            jobs.run("true", cwd=outside)


def test_a_replayed_request_id_returns_the_same_receipt_and_runs_nothing(make_settings, workspace: Path) -> None:
    jobs = broker(make_settings(profile="python-bash"), workspace)
    first, replayed_first = jobs.run("echo ran >> runs.log; echo once", request_id="req-1")
    again, replayed_again = jobs.run("echo ran >> runs.log; echo once", request_id="req-1")
    assert (replayed_first, replayed_again) == (False, True)
    assert again == first and again.stdout_preview == "once\n"
    assert (workspace / "runs.log").read_text() == "ran\n"
    with pytest.raises(JobRequestConflict, match="req-1"):
        jobs.run("echo other", request_id="req-1")
    assert (workspace / "runs.log").read_text() == "ran\n"


def test_a_deadline_kills_the_whole_process_group_grandchildren_included(make_settings, workspace: Path) -> None:
    jobs = broker(make_settings(profile="python-bash", bash_kill_grace_s=0.5), workspace)
    # Two grandchildren (one ignoring SIGTERM) report their pids, then everyone waits far past the deadline.
    command = ("for i in 1 2; do bash -c 'trap \"\" TERM; echo $$ >> pids; exec sleep 300' & done; "
               "while [ $(wc -l < pids 2>/dev/null || echo 0) -lt 2 ]; do sleep 0.01; done; echo ready; sleep 300")
    job, _ = jobs.run(command, deadline_s=1.0)
    assert job.state == "killed" and job.stopped_by == "deadline" and job.stdout_preview == "ready\n"
    pids = [int(p) for p in (workspace / "pids").read_text().split()]
    assert len(pids) == 2
    wait_until(lambda: not any(procs.alive(p) for p in pids), "the grandchildren are gone")
    assert "killed at its 1 s deadline" in jobs_receipt(job)


def jobs_receipt(job) -> str:
    from rlmfamily.bash.extension import receipt_text

    return receipt_text(job)


def test_a_background_process_does_not_outlive_its_job(make_settings, workspace: Path) -> None:
    jobs = broker(make_settings(profile="python-bash"), workspace)
    job, _ = jobs.run("sleep 300 & echo $! > bg; echo started")
    assert job.state == "exited" and job.exit_code == 0
    pid = int((workspace / "bg").read_text())
    wait_until(lambda: not procs.alive(pid), "the background sleep ended with its job")


def test_fifty_megabytes_of_output_stay_bounded_in_memory_and_on_disk(make_settings, workspace: Path) -> None:
    settings = make_settings(profile="python-bash", bash_max_stored_bytes=1 << 20, bash_preview_bytes=2000)
    jobs = broker(settings, workspace)
    tracemalloc.start()
    try:
        job, _ = jobs.run("head -c 52428800 /dev/zero | tr '\\0' 'a'; echo; echo the-end")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert job.exit_code == 0 and job.stdout_bytes == 50 * (1 << 20) + len("\nthe-end\n")
    assert job.stdout_stored == 1 << 20 and os.path.getsize(job.stdout_path) == 1 << 20
    assert peak < 4 << 20, f"the broker held {peak:,} bytes at its peak"
    assert len(job.stdout_preview) < 2100 and job.stdout_preview.endswith("the-end\n")
    assert jobs.read(job.id, "stdout", 0, 10) == "a" * 10
    with pytest.raises(JobRefused, match="RLM_BASH_MAX_READ_BYTES"):
        jobs.read(job.id, "stdout", 0, settings.bash_max_read_bytes + 1)


def test_without_posix_process_groups_the_profile_refuses(make_settings) -> None:
    windows = types.SimpleNamespace(name="nt")
    assert "POSIX process groups" in missing_process_groups(windows)
    no_killpg = types.SimpleNamespace(name="posix", setsid=os.setsid, getpgid=os.getpgid, waitid=os.waitid)
    assert "os.killpg is missing" in missing_process_groups(no_killpg)
    assert missing_process_groups(os) is None


def test_a_shell_that_is_not_bash_is_refused_never_used_in_its_place(make_settings, tmp_path: Path) -> None:
    impostor = tmp_path / "bash"
    impostor.write_text("#!/bin/sh\nexit 0\n")
    impostor.chmod(impostor.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(BashUnavailable, match="is not Bash"):
        find_bash(make_settings(profile="python-bash", bash_path=impostor), {"PATH": "/usr/bin:/bin"})
    with pytest.raises(BashUnavailable, match="no `bash` on the PATH"):
        find_bash(make_settings(profile="python-bash"), {"PATH": str(tmp_path / "empty")})
    host = prepare(make_settings(profile="python-bash"), set())
    assert Path(host.path).name == "bash" and host.version[0].isdigit()


def test_a_mutating_command_waits_for_the_lease_at_most_its_setting_and_says_who_holds_it(make_settings,
                                                                                         workspace: Path) -> None:
    import threading

    from rlmfamily.bash.errors import WorkspaceBusy

    holder = broker(make_settings(profile="python-bash"), workspace, root_id="holder")
    held = threading.Thread(target=holder.run, args=("touch held; while [ ! -e done ]; do sleep 0.01; done",),
                            daemon=True)
    held.start()
    wait_until(lambda: (workspace / "held").exists(), "the first command holds the lease")
    impatient = broker(make_settings(profile="python-bash", bash_lease_wait_s=0), workspace, root_id="other")
    with pytest.raises(WorkspaceBusy, match=r"held by job j1.*RLM_BASH_LEASE_WAIT_S"):
        impatient.run("echo never >> log")
    reader, _ = impatient.run("ls held", read_only=True)  # a read-only command takes no lease
    assert reader.exit_code == 0 and not (workspace / "log").exists()
    assert impatient.store.job("j2").state == "failed"
    (workspace / "done").touch()
    held.join(10)
    assert impatient.store.leases() == {}
