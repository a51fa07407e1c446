"""Where the library keeps its data (runs, trajectories, history, budgets, families): the rule that picks the folder.

The first rule that applies wins:

1. ``data_dir`` set: ``--data-dir DIR`` (the CLI passes it to the settings), else ``RLM_DATA_DIR``,
   else ``load_settings(data_dir=...)``. The service's hosted runs set it for every run.
2. A project folder: the nearest ``.rlm/`` folder in the current directory or a parent. The search
   stops at the home folder (``~/.rlm`` is the legacy global folder, not a project) or at the root.
3. The legacy ``~/.rlm``, used while it exists and the platform folder does not, with a notice.
4. The platform's data folder: ``$XDG_DATA_HOME/rlmfamily`` (default ``~/.local/share/rlmfamily``)
   on Linux and other Unixes, ``~/Library/Application Support/rlmfamily`` on macOS,
   ``%LOCALAPPDATA%\\rlmfamily`` on Windows.

Everything goes in that one folder, as data: a trajectory, its budget entries, its history and its
family rows refer to each other and move together, and none of them can be rebuilt, so none is a
cache (XDG_CACHE_HOME) or disposable state (XDG_STATE_HOME).

``XDG_DATA_HOME`` and ``LOCALAPPDATA`` are the platform's variables, read here; every RLM setting
is read by rlmfamily/settings.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlmfamily.errors import SettingsInvalid

APP_NAME = "rlmfamily"
PROJECT_DIR_NAME = ".rlm"  # a project's own data folder, and (in the home folder) the legacy global one

# "setting": data_dir was given (the CLI tells --data-dir from RLM_DATA_DIR, the settings cannot).
Rule = Literal["setting", "project", "legacy", "platform"]


@dataclass(frozen=True)
class Survey:
    """What the rules after ``data_dir`` find from one directory."""

    cwd: Path | None  # None: the current directory is gone
    home: Path
    project: Path | None  # the nearest .rlm/ at or above cwd, below home
    legacy: Path  # ~/.rlm
    platform: Path  # the platform's data folder

    @property
    def uses_legacy(self) -> bool:
        # A user of the old default keeps their runs until they move them; once the new folder exists it wins.
        return self.legacy.is_dir() and not self.platform.exists()


@dataclass(frozen=True)
class DataLocation:
    """The chosen data folder, the rule that chose it, and the reason in words."""

    path: Path
    rule: Rule
    reason: str
    notice: str | None = None  # for a person, on stderr: set when the legacy folder is in use

    def to_dict(self) -> dict[str, str | None]:
        return {"data_dir": str(self.path), "rule": self.rule, "reason": self.reason, "notice": self.notice}


def locate(explicit: Path | None, *, cwd: Path | None = None, home: Path | None = None,
           environ: Mapping[str, str] | None = None, platform: str | None = None) -> DataLocation:
    """The data folder by the rules above; ``explicit`` is the ``data_dir`` setting (None: not set)."""
    if explicit is not None:
        return DataLocation(explicit, "setting", "data_dir is set (--data-dir, RLM_DATA_DIR or load_settings)")
    found = survey(cwd=cwd, home=home, environ=environ, platform=platform)
    if found.project is not None:
        return DataLocation(found.project, "project",
                            f"the nearest {PROJECT_DIR_NAME}/ folder at or above {found.cwd} (a project folder)")
    if found.uses_legacy:
        return DataLocation(found.legacy, "legacy", f"the legacy {found.legacy} exists and {found.platform} does not",
                            notice=legacy_notice(found.legacy, found.platform))
    return DataLocation(found.platform, "platform", "no project folder: the platform's data folder")


def survey(*, cwd: Path | None = None, home: Path | None = None, environ: Mapping[str, str] | None = None,
           platform: str | None = None) -> Survey:
    home = home if home is not None else home_folder()
    here = cwd if cwd is not None else _cwd()
    return Survey(
        cwd=here, home=home,
        project=find_project_dir(here, home) if here is not None else None,
        legacy=home / PROJECT_DIR_NAME,
        platform=platform_data_dir(home, os.environ if environ is None else environ,
                                   sys.platform if platform is None else platform),
    )


def find_project_dir(cwd: Path, home: Path) -> Path | None:
    """The nearest ``.rlm/`` folder at or above ``cwd``, stopping at ``home`` (excluded) or at the root."""
    homes = {home, _resolved(home)}
    for folder in (cwd, *cwd.parents):
        if folder in homes:
            return None
        candidate = folder / PROJECT_DIR_NAME
        if candidate.is_dir():
            return candidate
    return None


def platform_data_dir(home: Path, environ: Mapping[str, str], platform: str) -> Path:
    """The platform's per-user data folder for this library."""
    if platform == "win32":
        base = environ.get("LOCALAPPDATA", "")
        return (Path(base) if base else home / "AppData" / "Local") / APP_NAME
    if platform == "darwin":
        return home / "Library" / "Application Support" / APP_NAME
    base = environ.get("XDG_DATA_HOME", "")
    # The XDG base directory spec: a relative path in the variable is invalid and is ignored.
    root = Path(base) if base and Path(base).is_absolute() else home / ".local" / "share"
    return root / APP_NAME


def legacy_notice(legacy: Path, platform: Path) -> str:
    return (f"rlm: using the legacy data folder {legacy}; move it to {platform} "
            f"(mkdir -p '{platform.parent}' && mv '{legacy}' '{platform}'), or keep it and silence this "
            f"with RLM_DATA_DIR={legacy} (rlm where explains)")


def init_project(folder: Path, home: Path | None = None) -> tuple[Path, bool]:
    """Make ``folder/.rlm/`` a project data folder that git ignores; returns it and whether it is new."""
    home = home if home is not None else home_folder()
    if _resolved(folder) == _resolved(home):
        raise SettingsInvalid(f"{home / PROJECT_DIR_NAME} would be the legacy global folder, not a project folder; "
                              "run rlm init in a project's folder (or set RLM_DATA_DIR to choose any folder)",
                              setting="data_dir")
    target = folder / PROJECT_DIR_NAME
    existed = target.is_dir()
    try:
        target.mkdir(parents=True, exist_ok=True)
        ignore = target / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# rlm runs, history and budgets of this project (rlm init): not for the repository\n*\n")
    except OSError as exc:
        raise SettingsInvalid(f"cannot create the project folder {target}: {exc}", setting="data_dir") from None
    return target, not existed


def home_folder() -> Path:
    try:
        return Path.home()
    except (KeyError, RuntimeError):  # no HOME and no password entry (some containers)
        raise SettingsInvalid("cannot find the home folder (HOME is not set) to choose the data folder; "
                              "set RLM_DATA_DIR", setting="data_dir") from None


def _cwd() -> Path | None:
    try:
        return Path.cwd()
    except OSError:  # the current directory was deleted: no project to find
        return None


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path
