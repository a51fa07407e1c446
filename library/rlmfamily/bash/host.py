"""What host execution needs: Bash itself, POSIX process groups, and an allow-listed environment.

It also defines the launcher's seam: ``Launch``, how the broker starts one job.
``BashHost.launch`` runs Bash here; ``rlmfamily/bash/in_container.py`` runs it
in the run's container (the container kernel). The broker knows no other
difference between the two; a run's launcher is chosen in one place,
``command_broker`` (rlmfamily/bash/extension.py).

Bash is found (``RLM_BASH_PATH``, else ``bash`` on the allowed ``PATH``) and proven
to be Bash by asking it for ``$BASH_VERSION``; ``/bin/sh`` is never assumed to be
Bash, and no other shell is ever substituted. Every job runs in its own process
group so that a deadline or a cancel can stop the command and everything it
started; where the platform has no process groups the profile refuses.

The command inherits only the variables named in ``RLM_BASH_ENV_ALLOW`` (the
settings refuse a name that looks like a credential), never the model key's
variable nor an A2A peer's key variable, even if a user allow-listed it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from rlmfamily.bash.errors import BashUnavailable
from rlmfamily.settings import RLMSettings

VERSION_CHECK_TIMEOUT_S = 10.0
PROCESS_GROUP_CALLS = ("setsid", "killpg", "getpgid", "waitid")


@dataclass(frozen=True)
class Launch:
    """How the broker starts one job: a process on this machine, what it is told, how long it may take."""

    argv: list[str]
    cwd: Path | None
    env: dict[str, str] | None  # None: the engine client's own (a container job's variables are in argv)
    supervise_s: float  # the broker stops the process's group this long after it started
    request: bytes | None = None  # written to its stdin, which then stays open until the job ends; None: /dev/null
    marker: bytes | None = None  # the job runner's report follows this, last on stderr (not the command's output)


class Launcher(Protocol):
    """Where a run's jobs run: ``BashHost`` (this machine) or ``BashInContainer`` (the run's container)."""

    where: str
    version: str

    def launch(self, command: str, cwd: Path, *, workspace: Path, deadline_s: float) -> Launch: ...

    def seen_as(self, workspace: Path) -> str:
        """The workspace as a command sees it (for the model's notes)."""
        ...


@dataclass(frozen=True)
class BashHost:
    """Bash on this machine: the broker starts ``bash --noprofile --norc -c COMMAND`` itself."""

    path: str
    version: str
    env: dict[str, str]
    where: str = "host"

    def launch(self, command: str, cwd: Path, *, workspace: Path, deadline_s: float) -> Launch:
        return Launch([self.path, "--noprofile", "--norc", "-c", command], cwd=cwd, env=self.env,
                      supervise_s=deadline_s)

    def seen_as(self, workspace: Path) -> str:
        return str(workspace)


def missing_process_groups(os_module: ModuleType | Any = os) -> str | None:
    """Why host execution cannot run here (no POSIX process groups), or None when it can."""
    if getattr(os_module, "name", "") != "posix":
        return f"host execution needs POSIX process groups; this platform is {getattr(os_module, 'name', '?')!r}"
    missing = [name for name in PROCESS_GROUP_CALLS if not hasattr(os_module, name)]
    if missing:
        return f"host execution needs POSIX process groups; os.{', os.'.join(missing)} is missing here"
    return None


def allowed_environment(settings: RLMSettings, hidden: set[str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a command inherits: the allow-list, less every credential name the run knows."""
    source = os.environ if environ is None else environ
    never = hidden | {settings.key_env}
    return {name: source[name] for name in settings.bash_env_allow if name in source and name not in never}


def find_bash(settings: RLMSettings, env: dict[str, str]) -> tuple[str, str]:
    """The Bash executable and its version; BashUnavailable naming RLM_BASH_PATH when there is none."""
    if settings.bash_path is not None:
        candidate: str | None = str(settings.bash_path)
        if not Path(candidate).is_file():
            raise BashUnavailable(f"RLM_BASH_PATH={candidate} is not a file", setting="bash_path")
    else:
        candidate = shutil.which("bash", path=env.get("PATH", ""))
        if candidate is None:
            raise BashUnavailable("no `bash` on the PATH a command gets; install Bash or set RLM_BASH_PATH "
                                  "(no other shell is used in its place)", setting="bash_path")
    try:
        done = subprocess.run([candidate, "--noprofile", "--norc", "-c", 'printf %s "$BASH_VERSION"'],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=VERSION_CHECK_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BashUnavailable(f"{candidate} cannot be run: {exc} (RLM_BASH_PATH)", setting="bash_path") from None
    version = done.stdout.decode(errors="replace").strip()
    if done.returncode != 0 or not version:
        raise BashUnavailable(f"{candidate} is not Bash (it has no $BASH_VERSION); set RLM_BASH_PATH to a Bash",
                              setting="bash_path")
    return candidate, version


def prepare(settings: RLMSettings, hidden: set[str]) -> BashHost:
    """Everything host execution needs, checked once when a run starts; refused with a reason otherwise."""
    reason = missing_process_groups()
    if reason is not None:
        raise BashUnavailable(reason + "; use the python profile (RLM_PROFILE=python)", setting="profile")
    env = allowed_environment(settings, hidden)
    path, version = find_bash(settings, env)
    return BashHost(path=path, version=version, env=env)
