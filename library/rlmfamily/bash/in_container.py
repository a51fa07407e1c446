"""Command jobs in the run's container (the container kernel): Bash of the image, started by the job runner.

A job is ``<engine> exec -i -w /workspace/CWD -e ... CONTAINER python3 /rlm/jobrun.py``
(``RunContainer.exec_argv``); the runner (``rlmfamily/container/agent/jobrun.py``)
reads the command from its stdin, starts ``bash --noprofile --norc -c COMMAND`` in
its own process group there, enforces the deadline inside the container (SIGTERM
to the group, SIGKILL after ``bash_kill_grace_s``), kills the group's leftovers
when its main process ends, and reports how it ended as the last line of stderr.
The broker keeps doing the rest as for a host job: the receipt, the bounded
captures, the lease, and the supervision of the process it started (the engine
client), which it stops ``bash_container_margin_s`` after the deadline and grace
if the runner has not ended by then. Stopping the client ends the runner's stdin:
the runner then kills the command's group at once (a cancel).

The command sees the variables of ``RLM_BASH_ENV_ALLOW`` as the host broker
gives them, less the host's ``PATH``, ``HOME`` and ``TMPDIR`` (the container's
own apply), and never a credential's. Bash must be in the image and answer
``$BASH_VERSION``, proven once when the run starts, through the runner itself;
otherwise the profile refuses, naming ``RLM_CONTAINER_IMAGE``. ``RLM_BASH_PATH``
names a file of this machine and is not used here.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlmfamily.bash.errors import BashUnavailable
from rlmfamily.bash.host import Launch, allowed_environment
from rlmfamily.container.sandbox import AGENT_PATH, WORKSPACE_PATH, RunContainer
from rlmfamily.settings import RLMSettings

JOBRUN = "jobrun.py"
CONTAINER_OWN_ENV = ("PATH", "HOME", "TMPDIR")  # the container's, never the host's
VERSION_CHECK_TIMEOUT_S = 30.0  # one engine exec; a cold engine may take seconds
VERSION_CHECK_DEADLINE_S = 10.0  # of the check's command inside
SHOWN_STDERR_CHARS = 500  # of the check's stderr, in the refusal
MARKER_PREFIX = b"\x00rlm-jobrun-report:"  # then a random token per job: no output is taken for it


@dataclass(frozen=True)
class BashInContainer:
    """Bash of the run's container: each job is the job runner, started through the engine."""

    container: RunContainer
    version: str
    env: dict[str, str]
    grace_s: float
    margin_s: float
    where: str = "container"

    def launch(self, command: str, cwd: Path, *, workspace: Path, deadline_s: float) -> Launch:
        relative = cwd.relative_to(workspace).as_posix()
        workdir = WORKSPACE_PATH if relative == "." else f"{WORKSPACE_PATH}/{relative}"
        marker = MARKER_PREFIX + secrets.token_hex(16).encode() + b":"
        source = command.encode("utf-8", "surrogateescape")  # as a host Popen passes it
        request = f"{deadline_s!r} {self.grace_s!r} {marker.hex()} {len(source)}\n".encode() + source
        argv = self.container.exec_argv(["python3", "-I", f"{AGENT_PATH}/{JOBRUN}"], workdir=workdir, env=self.env,
                                        interactive=True)
        return Launch(argv, cwd=self.container.client_dir, env=dict(self.container.engine.env), request=request, marker=marker,
                      supervise_s=deadline_s + self.grace_s + self.margin_s)

    def seen_as(self, workspace: Path) -> str:
        return f"{WORKSPACE_PATH} (in the run's container; {workspace} on the host)"


def container_environment(settings: RLMSettings, hidden: set[str]) -> dict[str, str]:
    """What a command in the container inherits: the host's allow-list less the container's own variables."""
    return {name: value for name, value in allowed_environment(settings, hidden).items()
            if name not in CONTAINER_OWN_ENV}


def prepare(settings: RLMSettings, hidden: set[str], container: RunContainer, *,
            workspace: Path) -> BashInContainer:
    """Bash in the run's container, proven by the job runner; BashUnavailable naming RLM_CONTAINER_IMAGE if not."""
    if Path(container.workspace).resolve() != workspace.resolve():
        raise BashUnavailable(f"the run's container mounts {container.workspace}, not the workspace {workspace}; "
                              "RLM_BASH_WORKSPACE must be the run's repository with the container kernel",
                              setting="bash_workspace")
    launcher = BashInContainer(container=container, version="", env=container_environment(settings, hidden),
                               grace_s=settings.bash_kill_grace_s, margin_s=settings.bash_container_margin_s)
    launch = launcher.launch('printf %s "$BASH_VERSION"', workspace, workspace=workspace,
                             deadline_s=VERSION_CHECK_DEADLINE_S)
    image = f"RLM_CONTAINER_IMAGE={settings.container_image}"
    try:
        code, stdout, stderr = _run_held(launch, VERSION_CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BashUnavailable(f"the run's container did not answer a Bash check: {exc} ({image})",
                              setting="container_image") from None
    stderr, report = split_report(stderr, launch.marker)
    version = stdout.decode(errors="replace").strip()
    if report is None or report.get("exit_code") != 0 or not version:
        said = stderr.decode(errors="replace").strip()[-SHOWN_STDERR_CHARS:] or f"exit {code}"
        raise BashUnavailable(f"the container image has no Bash that answers $BASH_VERSION ({said}); {image} must "
                              "name an image with bash and python3 (`rlm container image` builds one)",
                              setting="container_image")
    return replace(launcher, version=version)


def _run_held(launch: Launch, timeout_s: float) -> tuple[int, bytes, bytes]:
    """Run a short job to its end with its stdin held open (closing it first would cancel it)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(launch.argv, cwd=launch.cwd, env=launch.env, stdin=subprocess.PIPE, stdout=out,
                                   stderr=err)
        try:
            assert process.stdin is not None and launch.request is not None
            process.stdin.write(launch.request)
            process.stdin.flush()
            process.wait(timeout_s)
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            try:
                process.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        out.seek(0)
        err.seek(0)
        return process.returncode, out.read(), err.read()


def split_report(stderr: bytes, marker: bytes | None) -> tuple[bytes, dict[str, Any] | None]:
    """The command's stderr and the job runner's report after its last ``marker`` (None: there is none)."""
    at = stderr.rfind(marker) if marker else -1
    if at < 0:
        return stderr, None
    try:
        report = json.loads(stderr[at + len(marker):])
    except ValueError:
        return stderr, None
    return stderr[:at], report if isinstance(report, dict) else None
