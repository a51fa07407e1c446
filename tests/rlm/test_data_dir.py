"""Where a user's runs go: --data-dir > RLM_DATA_DIR > a project's .rlm/ > the platform's data folder,
and the legacy ~/.rlm keeps working (with a notice) until it is moved.

Each rule is shown with real runs of ``python -m rlmfamily`` under a temporary HOME, never the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.data_location import find_project_dir, locate, platform_data_dir

from .conftest import git

pytestmark = pytest.mark.timeout(120)

PLATFORM_VARS = ("XDG_DATA_HOME", "LOCALAPPDATA")


def rlm(cwd: Path, *args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rlmfamily`` as the user of ``home`` runs it in ``cwd``: no RLM_* or platform variables but ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_") and k not in PLATFORM_VARS}
    full_env.update({"HOME": str(home), "COLUMNS": "200", **(env or {})})
    return subprocess.run([sys.executable, "-m", "rlmfamily", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=100)


def demo(cwd: Path, home: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    """Run the offline demo; its run id."""
    done = rlm(cwd, *flags, "demo", "--quiet", "--json", home=home, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["run_id"]


def last_run(cwd: Path, home: Path, env: dict[str, str] | None = None) -> str:
    shown = rlm(cwd, "show", "last", "--json", home=home, env=env)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)[0]["run_id"]


def where(cwd: Path, home: Path, *flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = rlm(cwd, *flags, "where", "--json", home=home, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_with_nothing_set_runs_go_to_the_xdg_data_folder_in_home(home: Path) -> None:
    work = folder(home / "work")
    run_id = demo(work, home)
    data = home / ".local" / "share" / "rlmfamily"
    assert (data / "runs" / run_id / "trajectory.jsonl").is_file() and (data / "budget.sqlite3").is_file()
    assert not (home / ".rlm").exists()
    assert last_run(work, home) == run_id
    assert last_run(home, home) == run_id  # the same folder from anywhere outside a project
    found = where(work, home)
    assert found["data_dir"] == str(data) and found["rule"] == "platform"
    assert found["files"]["budget"] == str(data / "budget.sqlite3")


def test_xdg_data_home_moves_the_platform_folder_and_a_relative_one_is_ignored(tmp_path: Path, home: Path) -> None:
    work = folder(home / "work")
    run_id = demo(work, home, env={"XDG_DATA_HOME": str(tmp_path / "xdg")})
    assert (tmp_path / "xdg" / "rlmfamily" / "runs" / run_id).is_dir()
    relative = where(work, home, env={"XDG_DATA_HOME": "relative/share"})  # invalid by the XDG spec
    assert relative["data_dir"] == str(home / ".local" / "share" / "rlmfamily")


def test_two_projects_with_their_own_rlm_folders_do_not_see_each_others_last_run(home: Path) -> None:
    alpha, beta = folder(home / "alpha"), folder(home / "beta")
    assert rlm(alpha, "init", home=home).returncode == 0
    (beta / ".rlm").mkdir()  # the documented alternative to rlm init
    in_alpha, in_beta = demo(alpha, home), demo(beta, home)
    deep = folder(alpha / "src" / "deep")
    assert last_run(alpha, home) == in_alpha and last_run(deep, home) == in_alpha
    assert last_run(beta, home) == in_beta
    assert sorted(p.name for p in (alpha / ".rlm" / "runs").iterdir()) == [in_alpha]
    assert sorted(p.name for p in (beta / ".rlm" / "runs").iterdir()) == [in_beta]
    assert not (home / ".local").exists()  # no run went to the platform folder
    found = where(deep, home)
    assert found["rule"] == "project" and found["data_dir"] == str(alpha / ".rlm")
    outside = rlm(home, "show", "last", home=home)
    assert outside.returncode == 2 and "run_not_found" in outside.stderr


def test_the_environment_wins_over_a_project_folder_and_the_flag_wins_over_both(tmp_path: Path, home: Path) -> None:
    project = folder(home / "project")
    (project / ".rlm").mkdir()
    env = {"RLM_DATA_DIR": str(tmp_path / "from-env")}
    by_env = demo(project, home, env=env)
    assert (tmp_path / "from-env" / "runs" / by_env).is_dir()
    assert where(project, home, env=env)["rule"] == "env"
    flag = ["--data-dir", str(tmp_path / "from-flag")]
    by_flag = demo(project, home, *flag, env=env)
    assert (tmp_path / "from-flag" / "runs" / by_flag).is_dir()
    found = where(project, home, *flag, env=env)
    assert found["rule"] == "flag" and found["data_dir"] == str(tmp_path / "from-flag")
    assert {r["rule"]: r["folder"] for r in found["rules"]}["env"] == str(tmp_path / "from-env")
    assert not (project / ".rlm" / "runs").exists()


def test_the_search_for_a_project_folder_stops_at_home(tmp_path: Path, home: Path) -> None:
    (tmp_path / ".rlm").mkdir()  # above home: not this user's project
    work = folder(home / "work" / "src")
    assert where(work, home)["rule"] == "platform"
    outside = folder(tmp_path / "elsewhere" / "src")  # outside home the search goes up to the root
    (tmp_path / "elsewhere" / ".rlm").mkdir()
    found = where(outside, home)
    assert found["rule"] == "project" and found["data_dir"] == str(tmp_path / "elsewhere" / ".rlm")


def test_a_legacy_home_folder_keeps_working_with_a_notice_until_it_is_moved(home: Path) -> None:
    legacy, new = home / ".rlm", home / ".local" / "share" / "rlmfamily"
    work = folder(home / "work")
    old_run = demo(work, home, env={"RLM_DATA_DIR": str(legacy)})  # as the old default wrote it

    shown = rlm(work, "show", "last", "--json", home=home)
    assert shown.returncode == 0 and json.loads(shown.stdout)[0]["run_id"] == old_run
    notice = shown.stderr.strip().splitlines()
    assert len(notice) == 1 and str(legacy) in notice[0] and str(new) in notice[0] and "RLM_DATA_DIR" in notice[0]
    assert where(work, home)["rule"] == "legacy" and not new.exists()
    kept = rlm(work, "show", "last", home=home, env={"RLM_DATA_DIR": str(legacy)})
    assert kept.returncode == 0 and kept.stderr == ""

    new.parent.mkdir(parents=True)
    legacy.rename(new)  # what the notice says to do
    moved = rlm(work, "show", "last", "--json", home=home)
    assert moved.returncode == 0 and moved.stderr == "" and json.loads(moved.stdout)[0]["run_id"] == old_run
    legacy.mkdir()  # both exist: the new folder wins
    assert where(work, home)["rule"] == "platform"


def test_init_makes_a_project_folder_that_git_ignores(tmp_path: Path, home: Path) -> None:
    project = folder(home / "project")
    git(project, "init", "-q")
    made = rlm(project, "init", home=home)
    assert made.returncode == 0 and str(project / ".rlm") in made.stdout
    demo(project, home)
    status = subprocess.run(["git", "-C", str(project), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True)
    assert status.stdout == ""
    again = json.loads(rlm(project, "init", "--json", home=home).stdout)
    assert again == {"project_dir": str(project / ".rlm"), "created": False, "data_dir": str(project / ".rlm"),
                     "rule": "project"}
    overridden = rlm(project, "init", home=home, env={"RLM_DATA_DIR": str(tmp_path / "d")})
    assert overridden.returncode == 0
    assert "RLM_DATA_DIR" in overridden.stdout and str(tmp_path / "d") in overridden.stdout
    in_home = rlm(home, "init", home=home)
    assert in_home.returncode == 2 and "settings_invalid" in in_home.stderr and "RLM_DATA_DIR" in in_home.stderr
    assert not (home / ".rlm").exists()


def test_where_shows_every_rule_in_order_and_marks_the_one_that_chose(home: Path) -> None:
    project = folder(home / "project")
    (project / ".rlm").mkdir()
    table = rlm(project, "where", home=home)
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if line.startswith("│")]
    order = [next(i for i, line in enumerate(rows) if name in line)
             for name in ("--data-dir", "RLM_DATA_DIR", "project", "legacy", "platform")]
    assert order == sorted(order)
    chosen = [line for line in rows if "chosen" in line]
    assert len(chosen) == 1 and "project" in chosen[0]
    assert str(project / ".rlm") in table.stdout
    rules = where(project, home)["rules"]
    assert [r["rule"] for r in rules] == ["flag", "env", "project", "legacy", "platform"]
    assert [r["chosen"] for r in rules] == [False, False, True, False, False]


def test_the_platform_folders_of_macos_and_windows(tmp_path: Path) -> None:
    home = tmp_path / "u"
    assert platform_data_dir(home, {}, "darwin") == home / "Library" / "Application Support" / "rlmfamily"
    assert platform_data_dir(home, {"LOCALAPPDATA": str(tmp_path / "lad")}, "win32") == tmp_path / "lad" / "rlmfamily"
    assert platform_data_dir(home, {}, "win32") == home / "AppData" / "Local" / "rlmfamily"
    assert platform_data_dir(home, {"XDG_DATA_HOME": "/x/share"}, "linux") == Path("/x/share/rlmfamily")
    assert find_project_dir(home, home) is None
    chosen = locate(None, cwd=home, home=home, environ={}, platform="darwin")
    assert chosen.rule == "platform" and chosen.path == home / "Library" / "Application Support" / "rlmfamily"
