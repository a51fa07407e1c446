"""Command jobs in a run's container, with a real engine: the host's receipts, deadlines, process-group ends,
cancels and lease, inside. What is left running is read with `ps` inside the container, not guessed. The image is
the one the ``container_image`` fixture builds once per machine (tests/rlm/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlmfamily.bash import in_container
from rlmfamily.bash.broker import CommandBroker
from rlmfamily.bash.errors import BashUnavailable
from rlmfamily.bash.extension import receipt_text
from rlmfamily.bash.store import JobStore
from rlmfamily.container.engine import find_engine
from rlmfamily.container.sandbox import RunContainer, labelled_containers
from rlmfamily.context import Context
from rlmfamily.errors import SettingsInvalid
from rlmfamily.providers import ScriptedProvider
from rlmfamily.session import Session
from rlmfamily.settings import RLMSettings, load_settings
from rlmfamily.trajectory import read_trajectory

from ..holds import wait_until
from .support import broker
from .test_family import run_two_children_on_one_lease

pytestmark = pytest.mark.timeout(120)

@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    (folder / "src").mkdir(parents=True)
    return folder


@pytest.fixture
def settings(make_settings, container_image: str) -> RLMSettings:
    return make_settings(profile="python-bash", kernel="container", container_image=container_image, bash_kill_grace_s=0.5)


@pytest.fixture
def container(settings: RLMSettings, workspace: Path) -> Iterator[RunContainer]:
    with RunContainer.open(settings, run_id="jobs-test", workspace=workspace) as run_container:
        yield run_container


def broker_in(settings: RLMSettings, workspace: Path, container: RunContainer, *, root_id: str = "root-1",
                 hidden: set[str] | None = None) -> CommandBroker:
    return CommandBroker(settings, in_container.prepare(settings, hidden or set(), container, workspace=workspace),
                         JobStore(settings.jobs_path, output_dir=settings.runs_dir), workspace=workspace,
                         root_id=root_id, agent_id=root_id, run_id=root_id)


def running_inside(container: RunContainer) -> list[str]:
    """The command lines of what runs in the container, less its keeper and this `ps`."""
    done = container.engine.call("exec", container.name, "ps", "-eo", "args=")
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines()
            if line.strip() and not line.strip().startswith(("ps -eo", "python3 /rlm/keeper.py"))]


def same_shape(receipt: str) -> str:
    """A receipt without what differs between two runs of one command: its job id and duration."""
    return re.sub(r"after \d+\.\d+ s", "after T s", re.sub(r"\bj\d+\b", "jN", receipt))


def test_a_job_in_the_container_writes_the_workspace_as_the_invoking_user_and_reads_as_on_the_host(
        settings: RLMSettings, workspace: Path, container: RunContainer) -> None:
    command = "echo made > src/note.txt; pwd; cat src/note.txt; echo warning >&2; exit 3"
    inside, _ = broker_in(settings, workspace, container).run(command)
    assert (workspace / "src" / "note.txt").read_text() == "made\n"
    made = (workspace / "src" / "note.txt").stat()
    assert (made.st_uid, made.st_gid) == (os.getuid(), os.getgid())
    assert (inside.state, inside.exit_code, inside.stopped_by) == ("exited", 3, None)
    assert inside.stdout_preview == "/workspace\nmade\n" and inside.stderr_preview == "warning\n"
    assert Path(inside.stderr_path).read_bytes() == b"warning\n", "the job runner's report is not stderr"
    here, _ = broker(settings, workspace, root_id="on-the-host").run(command.replace("pwd", "echo /workspace"))
    assert same_shape(receipt_text(inside)) == same_shape(receipt_text(here)).replace(
        "echo /workspace", "pwd")
    in_src, _ = broker_in(settings, workspace, container, root_id="root-2").run("pwd", cwd="src", read_only=True)
    assert in_src.stdout_preview == "/workspace/src\n"


def test_a_deadline_kills_the_jobs_whole_group_inside_the_container(settings: RLMSettings, workspace: Path,
                                                                    container: RunContainer) -> None:
    jobs = broker_in(settings, workspace, container)
    # Two grandchildren ignore SIGTERM; everyone waits far past the deadline.
    command = ("for i in 1 2; do bash -c 'trap \"\" TERM; echo $$ >> pids; exec sleep 301' & done; "
               "while [ $(wc -l < pids 2>/dev/null || echo 0) -lt 2 ]; do sleep 0.01; done; echo ready; sleep 302")
    job, _ = jobs.run(command, deadline_s=1.0)
    assert (job.state, job.stopped_by, job.stdout_preview) == ("killed", "deadline", "ready\n")
    assert job.exit_code in (-signal.SIGTERM, -signal.SIGKILL)
    assert "killed at its 1 s deadline (its whole process group)" in receipt_text(job)
    assert len((workspace / "pids").read_text().split()) == 2
    wait_until(lambda: not running_inside(container), "nothing of the job runs in the container")


def test_a_background_process_does_not_outlive_its_job_in_the_container(settings: RLMSettings, workspace: Path,
                                                                        container: RunContainer) -> None:
    job, _ = broker_in(settings, workspace, container).run("sleep 303 & echo started")
    assert (job.state, job.exit_code, job.stdout_preview) == ("exited", 0, "started\n")
    wait_until(lambda: not running_inside(container), "the background sleep ended with its job")


def test_killing_the_engine_client_cancels_the_job_inside(settings: RLMSettings, workspace: Path,
                                                         container: RunContainer) -> None:
    jobs = broker_in(settings, workspace, container)
    ended = []
    runner = threading.Thread(target=lambda: ended.append(jobs.run("touch started; sleep 304 & sleep 305")[0]),
                              daemon=True)
    runner.start()
    wait_until(lambda: (workspace / "started").exists() and jobs.store.jobs()[0].pid is not None,
               "the job runs and its engine client is on record")
    wait_until(lambda: len([p for p in running_inside(container) if p.startswith("sleep")]) == 2,
               "both sleeps run in the container")
    os.killpg(jobs.store.jobs()[0].pid, signal.SIGKILL)  # the client's own group: a cancel, as a run's end does
    runner.join(30)
    wait_until(lambda: not running_inside(container), "the job's group inside is gone")
    [job] = ended
    assert job.state == "exited" and job.exit_code == -signal.SIGKILL
    assert "gave no report" in job.error


def test_two_mutating_jobs_of_one_family_never_overlap_in_the_container(settings: RLMSettings, workspace: Path,
                                                                        container: RunContainer) -> None:
    jobs = broker_in(settings, workspace, container)
    mutate = "echo start-{0} >> events; while [ ! -e go-{0} ]; do sleep 0.01; done; echo end-{0} >> events"
    runners = [threading.Thread(target=jobs.run, args=(mutate.format(name),), daemon=True) for name in ("a", "b")]
    for runner in runners:
        runner.start()
    events = workspace / "events"
    wait_until(lambda: events.exists() and sorted(j.state for j in jobs.store.jobs()) == ["running", "waiting"],
               "one mutating job running, the other waiting for the lease")
    first = events.read_text().split()[0].removeprefix("start-")
    second = "b" if first == "a" else "a"
    assert events.read_text() == f"start-{first}\n", "the waiting job must not have started"
    (workspace / f"go-{first}").touch()
    wait_until(lambda: f"start-{second}" in events.read_text(), "the second job started once the first ended")
    (workspace / f"go-{second}").touch()
    for runner in runners:
        runner.join(30)
    assert events.read_text().split() == [f"start-{first}", f"end-{first}", f"start-{second}", f"end-{second}"]
    assert jobs.store.leases() == {}


def test_no_host_credential_variable_reaches_a_command_in_the_container(make_settings, container_image: str, workspace: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"OPENAI_API_KEY": "sk-model", "DOCK_PASS": "peer-secret", "GITHUB_TOKEN": "ghp",
                        "AWS_SECRET_ACCESS_KEY": "aws", "LANG": "C.UTF-8", "TZ": "Europe/Oslo",
                        "PATH": "/host/only/bin:" + os.environ["PATH"], "HOME": "/host/home"}.items():
        monkeypatch.setenv(name, value)
    settings = make_settings(profile="python-bash", kernel="container", container_image=container_image,
                             bash_env_allow=["PATH", "HOME", "LANG", "TZ", "DOCK_PASS"])
    with RunContainer.open(settings, run_id="env-test", workspace=workspace, hidden_env={"DOCK_PASS"}) as container:
        job, _ = broker_in(settings, workspace, container, hidden={"DOCK_PASS"}).run("env", read_only=True)
    seen = dict(line.split("=", 1) for line in Path(job.stdout_path).read_text().splitlines() if "=" in line)
    assert job.exit_code == 0 and seen["TZ"] == "Europe/Oslo" and seen["LANG"] == "C.UTF-8"
    assert "/host/only/bin" not in seen["PATH"] and seen["HOME"] != "/host/home", "the container's own apply"
    assert not {"OPENAI_API_KEY", "DOCK_PASS", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"} & set(seen)
    assert not {"sk-model", "peer-secret", "ghp", "aws"} & set(seen.values())


def test_an_image_without_bash_is_refused_naming_the_image_setting(make_settings, container_image: str, workspace: Path,
                                                                   tmp_path: Path) -> None:
    settings = make_settings(profile="python-bash", kernel="container", container_image=container_image)
    engine = find_engine(settings)
    # The test image less its Bash (an exec-form RUN needs no shell); python3 and the engine still work.
    (tmp_path / "Containerfile").write_text(
        f"FROM {container_image}\nRUN [\"python3\", \"-c\", \"import os; os.remove('/usr/bin/bash')\"]\n")
    no_bash = f"localhost/rlm-test-no-bash:{os.getpid()}"
    built = engine.call("build", "-q", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
                        "-f", str(tmp_path / "Containerfile"),  # Docker reads only a Dockerfile unasked
                        "-t", no_bash, str(tmp_path), timeout_s=120)
    assert built.returncode == 0, built.stderr
    try:
        settings = make_settings(profile="python-bash", kernel="container", container_image=no_bash)
        with RunContainer.open(settings, run_id="no-bash", workspace=workspace) as container:
            with pytest.raises(BashUnavailable, match=f"no Bash.*RLM_CONTAINER_IMAGE={re.escape(no_bash)}") as refused:
                in_container.prepare(settings, set(), container, workspace=workspace)
        assert refused.value.setting == "container_image"
    finally:
        engine.call("rmi", "-f", no_bash)


def test_a_container_run_reaches_the_broker_in_its_container_through_bash_run_and_the_bash_tool(
        settings: RLMSettings, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-only")
    script = {"root": [
        {"code": "r = bash.run('echo made > src/note.txt; pwd; echo $OPENAI_API_KEY')\nprint(r)"},
        {"bash": {"command": "cat note.txt; exit 4", "cwd": "src"}},
        {"code": "final_answer('done')"},
    ]}
    result = Session(context=Context.from_repository(workspace, settings), provider=ScriptedProvider(script),
                     settings=settings).run("q")
    assert result.answer == "done", result.error
    made = workspace / "src" / "note.txt"
    assert made.read_text() == "made\n" and made.stat().st_uid == os.getuid()
    events = read_trajectory(result.trajectory_path)
    assert events[0]["kernel"] == "container" and events[0]["tools"] == ["python", "bash"]
    jobs = [e for e in events if e["event"] == "job"]
    assert [(j["surface"], j["state"], j["exit_code"], j["cwd"]) for j in jobs] == [
        ("python", "exited", 0, "."), ("tool", "exited", 4, "src")]
    assert jobs[0]["stdout_preview"] == "/workspace\n\n" and jobs[1]["stdout_preview"] == "made\n"
    tool = next(e for e in events if e["event"] == "tool_step")
    assert tool["observation"].startswith(f"[job {jobs[1]['job_id']} exit 4 after ")
    assert "/workspace (in the run's container" in events[0]["system_prompt"], "the model is told where commands run"
    assert labelled_containers(find_engine(settings), result.run_id) == [], "the run's container is gone"


def test_a_root_killed_mid_command_leaves_its_job_unknown_and_nothing_running_in_a_container(
        settings: RLMSettings, workspace: Path, tmp_path: Path) -> None:
    script = tmp_path / "root.json"
    script.write_text(json.dumps({"root": [{"code": "bash.run('touch started; sleep 306 & sleep 307')"}]}))
    rlm = [sys.executable, "-m", "rlmfamily", "--data-dir", str(settings.data_dir)]
    root = subprocess.Popen([*rlm, "run", "--profile", "python-bash", "--kernel", "container", "--repo",
                             str(workspace), "--script", str(script), "--quiet", "q"],
                            env={**os.environ, "RLM_CONTAINER_IMAGE": settings.container_image},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store = JobStore(settings.jobs_path)
    try:
        wait_until(lambda: root.poll() is not None or ((workspace / "started").exists() and store.jobs()[0].pid),
                   "the command started in the container")
        assert root.poll() is None, root.stderr.read().decode()
        [job] = store.jobs()
        root.send_signal(signal.SIGKILL)
        root.wait()
    finally:
        root.kill()
    engine = find_engine(settings)
    wait_until(lambda: not labelled_containers(engine, job.run_id), "the root's container is removed")
    wait_until(lambda: not store.job(job.id).process_alive(), "the job's engine client ended with it")
    assert store.job(job.id).state == "unknown"


def test_mutating_commands_of_two_children_in_their_own_containers_serialise_on_the_familys_lease(
        make_settings, container_image: str, workspace: Path) -> None:
    settings = make_settings(profile="python-bash", kernel="container", container_image=container_image, bash_lease_wait_s=60,
                             step_timeout_s=120, host_call_timeout_s=400)
    _, store = run_two_children_on_one_lease(settings, workspace, join_s=90)
    # The read-only commands overlapped across two containers: each child ran in a container of its own.
    children = {j.run_id for j in store.jobs()}
    assert len(children) == 2 and all(
        read_trajectory(settings.runs_dir / run_id / "trajectory.jsonl")[0]["kernel"] == "container"
        for run_id in children)


def test_a_completion_gate_of_a_container_run_runs_in_its_container(make_settings, container_image: str,
                                                                    workspace: Path) -> None:
    gate = {"name": "made", "command": "pwd > gate-saw; test -f src/note.txt"}
    settings = make_settings(profile="python-bash", kernel="container", container_image=container_image, gates=[gate])
    script = {"root": [{"code": "final_answer('made')"},
                       {"code": "bash.run('echo made > src/note.txt')\nfinal_answer('made now')"}]}
    result = Session(context=Context.from_repository(workspace, settings), provider=ScriptedProvider(script),
                     settings=settings).run("q")
    assert (result.answer, result.verdict) == ("made now", "accepted"), result.error
    assert [(r["passed"], r["exit_code"]) for r in result.extra["gates"]] == [(False, 1), (True, 0)]
    assert (workspace / "gate-saw").read_text() == "/workspace\n"


def test_the_container_margin_counts_toward_the_host_calls_deadline_only_with_the_container_kernel() -> None:
    fits = {"profile": "python-bash", "bash_max_deadline_s": 240, "bash_kill_grace_s": 2, "bash_lease_wait_s": 30,
            "host_call_timeout_s": 280, "bash_container_margin_s": 10}
    assert load_settings(**fits, kernel="host").bash_container_margin_s == 10
    with pytest.raises(SettingsInvalid, match="bash_container_margin_s must fit in host_call_timeout_s"):
        load_settings(**fits, kernel="container")
    assert load_settings(**{**fits, "bash_container_margin_s": 8}, kernel="container").kernel == "container"


def test_a_command_bash_cannot_be_given_fails_unstarted_as_on_the_host(make_settings, container_image: str,
                                                                       workspace: Path) -> None:
    settings = make_settings(profile="python-bash", kernel="container", container_image=container_image,
                             bash_max_command_chars=300_000)
    command = "true # " + "x" * 200_000  # over the kernel's 128 KiB for one argument, here as in the container
    here, _ = broker(settings, workspace, root_id="on-the-host").run(command, read_only=True)
    with RunContainer.open(settings, run_id="too-long", workspace=workspace) as container:
        inside, _ = broker_in(settings, workspace, container).run(command, read_only=True)
    assert (here.state, inside.state) == ("failed", "failed")
    assert "bash could not be started (host): [Errno 7] Argument list too long" in here.error
    assert "bash could not be started (container): [Errno 7] Argument list too long" in inside.error
