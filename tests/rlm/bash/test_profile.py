"""The python-bash profile in real runs: the bundled example through a scripted model, receipts against the
transcript, a root killed mid-command, a replayed request, and 50 MB of output."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlmfamily.bash.errors import WorkspaceLeaseHeld
from rlmfamily.bash.store import JobStore
from rlmfamily.cli import main
from rlmfamily.context import Context
from rlmfamily.family import procs
from rlmfamily.providers import ScriptedProvider
from rlmfamily.session import Session
from rlmfamily.trajectory import read_trajectory

from ..conftest import REPO_ROOT
from ..holds import wait_until
from .support import broker, rlm_json

pytestmark = pytest.mark.timeout(90)

EXAMPLES = REPO_ROOT / "library" / "rlmfamily" / "examples"
DOCS = (REPO_ROOT / "docs" / "RLM.md").read_text()


def _docs_example() -> tuple[list[str], str]:
    """The `rlm run --profile python-bash` command docs/RLM.md shows (its continuation line joined)."""
    block = re.search(r"```sh\ncp -r library/rlmfamily/examples/tally /tmp/tally.*?\n```", DOCS, re.DOTALL)
    assert block, "docs/RLM.md shows the python-bash example"
    line = re.search(r"^rlm run --profile python-bash .*?\"$", block[0].replace("\\\n", ""), re.MULTILINE)[0]
    import shlex

    words = shlex.split(line)
    return words[1:-1], words[-1]


def _copy_tally(tmp_path: Path) -> Path:
    target = tmp_path / "tally"
    shutil.copytree(EXAMPLES / "tally", target)
    return target


def _run_example(settings, tmp_path: Path, capsys, *extra: str) -> dict:
    args, question = _docs_example()
    repo = _copy_tally(tmp_path / f"copy{len(extra)}")
    args = [str(repo) if a == "/tmp/tally" else str(REPO_ROOT / a) if a.startswith("library/") else a for a in args]
    capsys.readouterr()
    code = main(["--data-dir", str(settings.data_dir), *args, *extra, "--json", "--quiet", question])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out)
    result["repo"] = repo
    return result


def test_the_bundled_example_is_edited_tested_read_by_handle_fixed_and_tested_again(settings, tmp_path: Path,
                                                                                    capsys) -> None:
    result = _run_example(settings, tmp_path, capsys)
    assert result["answer"] == "median added; the tests pass"
    assert "sorted(values)" in (result["repo"] / "tally" / "stats.py").read_text()
    events = read_trajectory(Path(result["trajectory_path"]))
    jobs = [e for e in events if e["event"] == "job"]
    assert [(j["surface"], j["state"], j["exit_code"]) for j in jobs] == [
        ("python", "exited", 0), ("tool", "exited", 1), ("tool", "exited", 0), ("tool", "exited", 0)]
    steps = [e for e in events if e["event"] == "step"]
    # The failure was read by handle in turn 3, not printed again by the job.
    assert "AssertionError: 1 != 3" in steps[1]["observation"] and "bash.read" in steps[1]["code"]
    tools = [e for e in events if e["event"] == "tool_step"]
    assert [t["call_id"] for t in tools] == [c["id"] for e in events if e["event"] == "turn" for c in e["calls"]
                                             if c["name"] == "bash"]
    listed = rlm_json(capsys, settings, "jobs", "--run", result["run_id"])
    assert [j["state"] for j in listed["jobs"]] == ["exited"] * 4 and listed["leases"] == {}
    capsys.readouterr()
    assert main(["--data-dir", str(settings.data_dir), "show", result["run_id"]]) == 0
    shown = capsys.readouterr().out
    assert "bash$ python3 -m unittest -q" in shown and "[job j2 exit 1 after" in shown
    assert "FAIL: test_median_of_an_odd_count" in shown
    assert re.search(r"observations \(transcript\): [\d,]+ characters shown of [\d,]+ produced", shown)
    assert main(["--data-dir", str(settings.data_dir), "jobs", "j2"]) == 0
    assert capsys.readouterr().out.startswith("[job j2 exit 1 after")


def test_receipts_show_the_model_fewer_characters_and_keep_every_record(make_settings, tmp_path: Path,
                                                                         capsys) -> None:
    settings = make_settings()
    transcript = _run_example(settings, tmp_path, capsys)
    receipts = _run_example(settings, tmp_path, capsys, "--observation-strategy", "receipts")
    seen = {r["extra"]["observations"]["strategy"]: r["extra"]["observations"] for r in (transcript, receipts)}
    assert receipts["answer"] == transcript["answer"] == "median added; the tests pass"
    assert seen["receipts"]["chars_shown"] < seen["transcript"]["chars_shown"]
    assert seen["receipts"]["chars_produced"] == seen["transcript"]["chars_produced"]
    events = read_trajectory(Path(receipts["trajectory_path"]))
    started = events[0]
    assert started["observation_strategy"] == "receipts" and started["tools"] == ["python", "bash"]
    failing = next(e for e in events if e["event"] == "tool_step")
    assert failing["observation"].startswith("[job j") and failing["full_chars"] > failing["observation_chars"]
    # The whole output is still in the history, and searchable.
    from rlmfamily.history import History

    hits = History(settings.history_path, receipts["run_id"]).search("AssertionError", 10)
    assert hits and any(h["id"] == failing["history_id"] for h in hits)


ROOT_SCRIPT = {
    "root": [
        {"code": "r = bash.run('touch started; while [ ! -e release ]; do sleep 0.02; done; echo once >> effects')\n"
                 "print(r)"},
        {"code": "final_answer('resumed')"},
    ],
}


def test_a_root_killed_mid_command_leaves_an_unknown_job_holding_its_lease_until_released(
        settings, tmp_path: Path, capsys) -> None:
    workspace = tmp_path / "work"
    workspace.mkdir()
    script = tmp_path / "root.json"
    script.write_text(json.dumps(ROOT_SCRIPT))
    rlm = [sys.executable, "-m", "rlmfamily", "--data-dir", str(settings.data_dir)]
    root = subprocess.Popen([*rlm, "run", "--profile", "python-bash", "--repo", str(workspace), "--script",
                             str(script), "--quiet", "q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        store = JobStore(settings.jobs_path)

        def started() -> bool:  # the command runs, and its process is on record
            return root.poll() is not None or ((workspace / "started").exists() and store.jobs()[0].pid is not None)

        wait_until(started, "the command started")
        assert root.poll() is None, root.stderr.read().decode()
        root.send_signal(signal.SIGKILL)
        root.wait()
    finally:
        root.kill()
    [job] = rlm_json(capsys, settings, "jobs")["jobs"]
    assert (job["state"], job["holds_lease"], job["process_running"]) == ("unknown", True, True)
    capsys.readouterr()
    assert main(["--data-dir", str(settings.data_dir), "jobs"]) == 0
    table = capsys.readouterr().out
    assert "unknown" in table and "rlm jobs release JOB --reason" in table and "still runs" in table
    # While it is unknown, no mutating command runs in the workspace: it is refused at once, naming the job.
    with pytest.raises(WorkspaceLeaseHeld, match=f"job {job['id']}"):
        broker(settings, workspace, root_id="another-run").run("echo over >> effects")
    assert main(["--data-dir", str(settings.data_dir), "jobs", "release", job["id"], "--reason", "x"]) == 2
    assert "still runs" in capsys.readouterr().err
    (workspace / "release").touch()
    wait_until(lambda: not procs.alive(job["pid"], job["pid_start"]), "the orphaned command ended")
    released = rlm_json(capsys, settings, "jobs", "release", job["id"], "--reason", "effects has one line: it ran")
    assert (released["state"], released["holds_lease"], released["release_reason"]) == (
        "unknown", False, "effects has one line: it ran")
    assert rlm_json(capsys, settings, "jobs")["leases"] == {}
    # Resuming the root runs the interrupted step again: its bash.run gets the same receipt, nothing runs again.
    done = subprocess.run([*rlm, "resume", job["run_id"], "--script", str(script), "--quiet", "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "resumed"
    assert (workspace / "effects").read_text() == "once\n"
    assert [j["id"] for j in rlm_json(capsys, settings, "jobs", "--run", job["run_id"])["jobs"]] == [job["id"]]
    replayed = [e for e in read_trajectory(settings.runs_dir / job["run_id"] / "trajectory.jsonl")
                if e["event"] == "job"]
    assert [(e["state"], e["replayed"]) for e in replayed] == [("unknown", True)]
    after = broker(settings, workspace, root_id="another-run").run("echo after >> effects")[0]
    assert after.exit_code == 0


def test_a_request_id_replayed_in_the_namespace_runs_nothing(make_settings, tmp_path: Path) -> None:
    settings = make_settings(profile="python-bash")
    workspace = tmp_path / "work"
    workspace.mkdir()
    code = ("a = bash.run('echo ran >> log', request_id='step-1')\n"
            "b = bash.run('echo ran >> log', request_id='step-1')\n"
            "print(a.id == b.id, b.receipt.splitlines()[0])\nfinal_answer(open_log := 'ok')")
    provider = ScriptedProvider({"root": [{"code": code.replace("open_log := ", "")}]})
    result = Session(context=Context.from_repository(workspace, settings), provider=provider,
                     settings=settings).run("q")
    assert result.answer == "ok", result.error
    step = next(e for e in read_trajectory(result.trajectory_path) if e["event"] == "step")
    assert "True" in step["observation"] and "replayed request, nothing ran again" in step["observation"]
    assert (workspace / "log").read_text() == "ran\n"


def test_fifty_megabytes_of_output_reach_the_conversation_as_a_preview(make_settings, tmp_path: Path) -> None:
    settings = make_settings(profile="python-bash", bash_max_stored_bytes=1 << 20)
    workspace = tmp_path / "work"
    workspace.mkdir()
    provider = ScriptedProvider({"root": [
        {"bash": "head -c 52428800 /dev/zero | tr '\\0' 'z'; echo; echo last-line"},
        {"code": "j = bash.jobs()[0]\nprint(bash.read(j['id'], 'stdout', 0, 20))\nfinal_answer('read')"},
    ]})
    result = Session(context=Context.from_repository(workspace, settings), provider=provider,
                     settings=settings).run("q")
    assert result.answer == "read", result.error
    assert result.root_chars_last < 20_000, "the conversation carried more than the preview"
    events = read_trajectory(result.trajectory_path)
    [job] = [e for e in events if e["event"] == "job"]
    assert job["stdout_bytes"] == 50 * (1 << 20) + len("\nlast-line\n")
    tool = next(e for e in events if e["event"] == "tool_step")
    assert "last-line" in tool["observation"] and tool["observation_chars"] <= settings.max_observation_chars
    assert "z" * 20 in next(e for e in events if e["event"] == "step")["observation"]


def test_the_bash_tool_is_offered_and_answered_over_the_openai_wire(make_settings, tmp_path: Path,
                                                                    fake_openai, monkeypatch) -> None:
    from rlmfamily.providers.openai_compat import OpenAIProvider

    monkeypatch.setenv("TEST_MODEL_KEY", "sk-test")
    settings = make_settings(profile="python-bash", api_key_env="TEST_MODEL_KEY")
    workspace = tmp_path / "work"
    (workspace / "src").mkdir(parents=True)
    fake_openai.push(bash={"command": "pwd; echo $TEST_MODEL_KEY; exit 4", "cwd": "src", "read_only": True})
    fake_openai.push(code="final_answer('done')")
    provider = OpenAIProvider(base_url=fake_openai.base_url, model="m", api_key_env="TEST_MODEL_KEY")
    result = Session(context=Context.from_repository(workspace, settings), provider=provider,
                     settings=settings).run("q")
    assert result.answer == "done", result.error
    first, second = fake_openai.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["python", "bash"]
    sent_back = second["messages"]
    [call] = sent_back[-2]["tool_calls"]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"])["cwd"] == "src"
    result_message = sent_back[-1]
    assert result_message["role"] == "tool" and result_message["tool_call_id"] == "call_b"
    assert str((workspace / "src").resolve()) in result_message["content"]
    assert "sk-test" not in result_message["content"] and "exit 4" in result_message["content"]


def test_bash_settings_are_checked_at_start_up(make_settings, tmp_path: Path) -> None:
    from rlmfamily.errors import SettingsInvalid

    with pytest.raises(SettingsInvalid, match="host_call_timeout_s"):
        make_settings(profile="python-bash", host_call_timeout_s=150)
    with pytest.raises(SettingsInvalid, match="bash_default_deadline_s"):
        make_settings(bash_default_deadline_s=300, bash_max_deadline_s=100)
    with pytest.raises(SettingsInvalid, match="OPENAI_API_KEY"):
        make_settings(profile="python-bash", bash_env_allow=["PATH", "OPENAI_API_KEY"])
    make_settings(host_call_timeout_s=150)  # the python profile does not care
    document = tmp_path / "notes.txt"
    document.write_text("notes\n")
    settings = make_settings(profile="python-bash")
    result = Session(context=Context.from_document(document, settings),
                     provider=ScriptedProvider({"root": [{"code": "final_answer(1)"}]}), settings=settings).run("q")
    assert result.stop_reason == "error" and "bash_unavailable" in result.error and "RLM_BASH_WORKSPACE" in result.error


def test_the_html_page_shows_each_job_with_its_receipt(settings, tmp_path: Path, capsys) -> None:
    result = _run_example(settings, tmp_path, capsys)
    page = tmp_path / "page.html"
    assert main(["--data-dir", str(settings.data_dir), "show", "--html", result["run_id"], "-o", str(page)]) == 0
    html = page.read_text()
    assert html.count('<div class="job">') == 4 and "bash$ python3 -m unittest -q" in html
    assert "AssertionError: 1 != 3" in html and '<pre class="receipt failed">' in html


HOLDER = """
import sys
from pathlib import Path
from rlmfamily.settings import load_settings
from tests.rlm.bash.support import broker
settings = load_settings(data_dir=sys.argv[1], profile="python-bash")
broker(settings, Path(sys.argv[2]), root_id=sys.argv[3]).run("touch started; while [ ! -e release ]; do sleep 0.02; done")
"""


def test_the_model_may_release_an_unknown_job_of_its_own_family_and_no_other(make_settings, tmp_path: Path) -> None:
    settings = make_settings(profile="python-bash")
    workspace = tmp_path / "work"
    workspace.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(settings.data_dir), str(workspace), "fam-1"],
                              cwd=REPO_ROOT)
    store = JobStore(settings.jobs_path)
    try:
        wait_until(lambda: holder.poll() is not None or ((workspace / "started").exists() and store.jobs()
                                                         and store.jobs()[0].pid is not None), "the job runs")
        assert holder.poll() is None
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    finally:
        holder.kill()
    [job] = store.jobs()
    (workspace / "release").touch()
    wait_until(lambda: not store.job(job.id).process_alive(), "the orphaned command ended")

    def session(run_id: str, code: str):
        provider = ScriptedProvider({"root": [{"code": code}]})
        return Session(context=Context.from_repository(workspace, settings), provider=provider, settings=settings,
                       run_id=run_id).run("q")

    stranger = session("fam-2", f"bash.release({job.id!r}, 'not mine')")
    assert "belongs to another family" in read_trajectory(stranger.trajectory_path)[-2]["observation"]
    own = session("fam-1", f"j = bash.job({job.id!r})\nprint(j.state)\nr = bash.release(j, 'it only waited')\n"
                           "print(r.receipt.splitlines()[0])\nfinal_answer(bash.run('echo after >> log').state)")
    assert own.answer == "exited", own.error
    events = read_trajectory(own.trajectory_path)
    step = next(e for e in events if e["event"] == "step")
    assert step["observation"].splitlines()[1] == "unknown" and "released: it only waited" in step["observation"]
    assert [e["job_id"] for e in events if e["event"] == "job_released"] == [job.id]
    assert store.leases() == {}


def test_without_tool_calling_the_model_reaches_the_same_broker_through_bash_run(make_settings,
                                                                                 tmp_path: Path) -> None:
    settings = make_settings(profile="python-bash", protocol="text")
    workspace = tmp_path / "work"
    workspace.mkdir()
    provider = ScriptedProvider({"root": [{"bash": {"command": "echo via-text", "read_only": True}},
                                          {"code": "final_answer('ok')"}]})
    result = Session(context=Context.from_repository(workspace, settings), provider=provider,
                     settings=settings).run("q")
    assert result.answer == "ok", result.error
    events = read_trajectory(result.trajectory_path)
    assert events[0]["tools"] == ["python"] and "`bash` tool" not in events[0]["system_prompt"]
    assert "bash.run(" in events[0]["system_prompt"]
    [job] = [e for e in events if e["event"] == "job"]
    assert (job["surface"], job["read_only"], job["stdout_preview"]) == ("python", True, "via-text\n")


def test_a_bash_tool_call_cut_off_by_a_kill_is_answered_from_its_receipt_when_the_root_resumes(
        settings, tmp_path: Path, capsys) -> None:
    workspace = tmp_path / "work"
    workspace.mkdir()
    script = tmp_path / "root.json"
    script.write_text(json.dumps({"root": [
        {"bash": "touch started; while [ ! -e release ]; do sleep 0.02; done; echo once >> effects"},
        {"code": "final_answer('resumed')"},
    ]}))
    rlm = [sys.executable, "-m", "rlmfamily", "--data-dir", str(settings.data_dir)]
    root = subprocess.Popen([*rlm, "run", "--profile", "python-bash", "--repo", str(workspace), "--script",
                             str(script), "--quiet", "q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = JobStore(settings.jobs_path)
    try:
        wait_until(lambda: root.poll() is not None or ((workspace / "started").exists() and store.jobs()[0].pid),
                   "the command started")
        assert root.poll() is None
        root.send_signal(signal.SIGKILL)
        root.wait()
    finally:
        root.kill()
    [job] = store.jobs()
    (workspace / "release").touch()
    wait_until(lambda: not store.job(job.id).process_alive(), "the orphaned command ended")
    done = subprocess.run([*rlm, "resume", job.run_id, "--script", str(script), "--quiet", "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "resumed"
    assert (workspace / "effects").read_text() == "once\n" and [j.id for j in store.jobs()] == [job.id]
    [tool] = [e for e in read_trajectory(settings.runs_dir / job.run_id / "trajectory.jsonl")
              if e["event"] == "tool_step"]
    assert "outcome UNKNOWN" in tool["observation"] and "replayed request, nothing ran again" in tool["observation"]
