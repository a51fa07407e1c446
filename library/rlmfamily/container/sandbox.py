"""``RunContainer``: the one container a run (root or child) executes in, from the run's start to its end.

Its main process is the keeper (``agent/keeper.py``), started by the engine's
``run --rm -i`` with its stdin a pipe whose write end only the run's process holds.
When the run ends the write end is closed; when the run's process dies, even by
SIGKILL, the kernel closes it. Either way the keeper reads end of file and exits,
and the engine removes the container. The engine's client is started in a session
of its own, so a terminal's Ctrl-C or a signal to the run's process group does not
reach it (a client killed with the run closes the keeper's stdin all the same). A
client that cannot pass the end of file on (hung, stopped, lost by its engine)
leaves the container running: it carries labels (the owner's pid and start time,
the host, the run), and ``sweep_orphans`` removes those whose owner is gone when the
next container starts.

What the container gets, and nothing else:
- the workspace (a host folder) read-write at ``WORKSPACE_PATH``, the agent folder
  read-only at ``AGENT_PATH``, the host kernel's child read-only at ``KERNEL_CHILD_PATH``;
- the invoking user's uid:gid (rootless Podman keeps it with ``--userns keep-id``; Docker
  with ``--userns host``, so a daemon's ``--userns-remap`` does not move it),
  no capabilities, no new privileges, a read-only root and a tmpfs ``/tmp``;
- ``RLM_CONTAINER_NETWORK`` (default ``none``: no interface but loopback);
- the environment ``CONTAINER_ENV`` sets, never the host's: no key reaches it;
- ``RLM_CONTAINER_MEMORY_BYTES`` (memory and swap together), ``RLM_CONTAINER_CPUS``,
  ``RLM_CONTAINER_MAX_PIDS``, ``RLM_CONTAINER_MAX_OPEN_FILES`` per process;
- an image that is never pulled (``--pull never``).
"""

from __future__ import annotations

import json
import os
import re
import resource
import secrets
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from rlmfamily.container.engine import PROBE_TIMEOUT_S, STDERR_SHOWN_CHARS, ContainerUnavailable, Engine, find_engine
from rlmfamily.family import procs

if TYPE_CHECKING:
    from rlmfamily.settings import RLMSettings

AGENT_PATH: Final = "/rlm"
WORKSPACE_PATH: Final = "/workspace"
KERNEL_CHILD_PATH: Final = "/rlm-kernel/_host_child.py"
AGENT_DIR: Final = Path(__file__).with_name("agent")
KERNEL_CHILD_SOURCE: Final = Path(__file__).resolve().parents[1] / "kernels" / "_host_child.py"
CONTAINER_ENV: Final = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",  # the user may have no home in the image; /tmp is the one writable folder besides the workspace
    "LANG": "C.UTF-8",
}
LABEL: Final = "io.rlmfamily"  # present on every container of this package; its value is the run id
LABEL_OWNER_PID: Final = "io.rlmfamily.owner-pid"
LABEL_OWNER_START: Final = "io.rlmfamily.owner-start"  # /proc/<pid>/stat start time: a recycled pid is not the owner
LABEL_HOST: Final = "io.rlmfamily.host"  # a daemon may serve several machines; each sweeps its own
MAX_NAME_CHARS: Final = 63
READY_LINE: Final = b"ready\n"


@dataclass(frozen=True)
class ContainerLimits:
    """The container's bounds, from the settings of the same names (``RLM_CONTAINER_*``)."""

    image: str
    network: str
    memory_bytes: int
    cpus: float
    max_pids: int
    max_open_files: int
    max_user_processes: int
    start_timeout_s: float
    stop_timeout_s: float

    @classmethod
    def from_settings(cls, settings: RLMSettings) -> ContainerLimits:
        return cls(image=settings.container_image, network=settings.container_network,
                   memory_bytes=settings.container_memory_bytes, cpus=settings.container_cpus,
                   max_pids=settings.container_max_pids, max_open_files=settings.container_max_open_files,
                   max_user_processes=settings.container_max_user_processes,
                   start_timeout_s=settings.container_start_timeout_s,
                   stop_timeout_s=settings.container_stop_timeout_s)


class RunContainer:
    """One run's container. ``start()`` once, then ``exec_argv`` / ``signal``; ``close()`` removes it."""

    def __init__(self, engine: Engine, limits: ContainerLimits, *, run_id: str, workspace: Path) -> None:
        self.engine = engine
        self.limits = limits
        self.run_id = run_id
        self.workspace = workspace.resolve()
        self.name = container_name(run_id)
        self._client: subprocess.Popen[bytes] | None = None
        self._keeper_stdin = -1  # the write end the run's process holds; closing it ends the container
        self._keeper_stdout = -1  # the keeper's answers (``ready``, then one line per request)
        self._keeper_lock = threading.Lock()  # one request at a time: the kernel's and the command jobs' threads
        self._stderr: IO[bytes] | None = None
        # Where every engine client of this container runs: Podman's conmon writes a file named ``oom`` into its
        # client's working directory when the memory limit kills a process, which would land in the user's.
        self.client_dir = Path(tempfile.mkdtemp(prefix="rlm-engine-client-"))

    @classmethod
    def open(cls, settings: RLMSettings, *, run_id: str, workspace: Path, hidden_env: Iterable[str] = ()) -> RunContainer:
        """Find the engine, remove orphans of killed runs, start this run's container."""
        engine = find_engine(settings, hidden_env=hidden_env)
        sweep_orphans(engine)
        container = cls(engine, ContainerLimits.from_settings(settings), run_id=run_id, workspace=workspace)
        container.start()
        return container

    def __enter__(self) -> RunContainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the public surface -------------------------------------------------------------------

    def exec_argv(self, argv: Sequence[str], *, workdir: str = WORKSPACE_PATH, env: Mapping[str, str] | None = None,
                  interactive: bool = True) -> list[str]:
        """The host command that runs ``argv`` in this container (as its user, in ``workdir``, with ``env`` added).

        Start it in ``client_dir`` (the engine may write files into its client's working directory)."""
        if not argv:
            raise ValueError("exec_argv needs a command")
        command = [self.engine.path, "exec"]
        if interactive:
            command.append("-i")
        command += ["-w", workdir]
        for key, value in (env or {}).items():
            if not key or "=" in key:
                raise ValueError(f"{key!r} is not an environment variable name")
            command += ["-e", f"{key}={value}"]  # always NAME=VALUE: a bare -e NAME would copy the host's value
        return [*command, self.name, *argv]

    def signal(self, pid: int, sig: int, *, group: bool = False) -> bool:
        """Send ``sig`` to process ``pid`` (its group with ``group``) inside the container; False if it is gone.

        The keeper sends it: no new process starts in the container, so this works when the pids limit is reached.
        """
        if pid <= 1:
            raise ValueError(f"refusing to signal pid {pid} in the container")
        return self._ask(f"signal {int(pid)} {int(sig)} {1 if group else 0}") == "ok"

    def oom_kills(self) -> int | None:
        """How many processes the container's memory limit has killed so far (its cgroup's count); None if unknown."""
        said = self._ask("oom")
        return int(said) if said is not None and said.isdigit() else None

    def _ask(self, request: str) -> str | None:
        """One request to the keeper and its one-line answer; None if the keeper is gone or silent."""
        with self._keeper_lock:
            if self._keeper_stdin < 0 or self._keeper_stdout < 0:
                return None
            try:
                os.write(self._keeper_stdin, request.encode() + b"\n")
            except OSError:
                return None
            said = _read_line(self._keeper_stdout, time.monotonic() + PROBE_TIMEOUT_S)
            if said is None:
                # Silent past its deadline: an answer that came later would be read as the next request's, so
                # the keeper is not asked again (each later request answers None, as for a keeper that is gone).
                os.close(self._keeper_stdout)
                self._keeper_stdout = -1
        return said.decode("ascii", "replace").strip() if said else None

    @property
    def running(self) -> bool:
        return self._client is not None and self._client.poll() is None

    # ---- start and removal ----------------------------------------------------------------------

    def start(self) -> None:
        if self._client is not None:
            raise RuntimeError("this container was started already")
        self.workspace.mkdir(parents=True, exist_ok=True)
        self._check_limits()
        read_end, self._keeper_stdin = os.pipe()  # both ends close on exec: only the client gets the read end
        out_read, out_write = os.pipe()
        self._stderr = tempfile.TemporaryFile(prefix="rlm-container-")
        try:
            self._client = subprocess.Popen(
                self.run_argv(), stdin=read_end, stdout=out_write, stderr=self._stderr, env=dict(self.engine.env),
                cwd=self.client_dir, start_new_session=True,  # a terminal's Ctrl-C or a kill of the run's group is not the client's
            )
        except OSError as exc:
            os.close(self._keeper_stdin)
            self._keeper_stdin = -1
            raise ContainerUnavailable(f"could not start {self.engine.path}: {exc} (RLM_CONTAINER_ENGINE)",
                                       setting="container_engine") from None
        finally:
            os.close(read_end)
            os.close(out_write)
        self._keeper_stdout = out_read
        said = _read_line(out_read, time.monotonic() + self.limits.start_timeout_s)
        if said != READY_LINE:
            problem = "it did not say ready within" if said is None else "it exited before it was ready, within"
            tail = self._stderr_tail()
            self.close()
            setting = "container_start_timeout_s" if said is None else "container_image"
            if "rlimit" in tail:
                setting = "container_max_user_processes" if "type 6" in tail else "container_max_open_files"
                tail += (" (the engine may not set that limit this high here: lower RLM_CONTAINER_MAX_OPEN_FILES or "
                         "RLM_CONTAINER_MAX_USER_PROCESSES)")
            raise ContainerUnavailable(
                f"the run's container ({self.engine.kind}, image {self.limits.image}) did not start: {problem} "
                f"RLM_CONTAINER_START_TIMEOUT_S={self.limits.start_timeout_s:g}; the engine said: {tail or '(nothing)'}",
                setting=setting,
            )

    def close(self) -> None:
        """End the keeper, wait for the container to go (at most ``stop_timeout_s``), then force it. Idempotent."""
        with self._keeper_lock:
            if self._keeper_stdin >= 0:
                os.close(self._keeper_stdin)
                self._keeper_stdin = -1
        client, self._client = self._client, None
        if client is not None:
            try:
                client.wait(timeout=self.limits.stop_timeout_s)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
            remove(self.engine, [self.name])
        with self._keeper_lock:
            if self._keeper_stdout >= 0:
                os.close(self._keeper_stdout)
                self._keeper_stdout = -1
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        shutil.rmtree(self.client_dir, ignore_errors=True)

    def run_argv(self) -> list[str]:
        """The engine command that creates and starts this container with its keeper."""
        limits = self.limits
        owner = os.getpid()
        argv = [
            self.engine.path, "run", "--rm", "-i", "--name", self.name, "--pull", "never",
            "--label", f"{LABEL}={self.run_id}", "--label", f"{LABEL_OWNER_PID}={owner}",
            "--label", f"{LABEL_OWNER_START}={procs.start_time(owner) or ''}",
            "--label", f"{LABEL_HOST}={socket.gethostname()}",
            "--network", limits.network,
            "--user", f"{os.getuid()}:{os.getgid()}",
            "--cap-drop", "all", "--security-opt", "no-new-privileges",
            "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,mode=1777",
            "--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes),
            "--cpus", f"{limits.cpus:g}", "--pids-limit", str(limits.max_pids),
            "--ulimit", f"nofile={limits.max_open_files}:{limits.max_open_files}",
            "--ulimit", f"nproc={limits.max_user_processes}:{limits.max_user_processes}",
            "--mount", _bind(self.workspace, WORKSPACE_PATH, read_only=False),
            "--mount", _bind(AGENT_DIR, AGENT_PATH, read_only=True),
            "--mount", _bind(KERNEL_CHILD_SOURCE, KERNEL_CHILD_PATH, read_only=True),
            "-w", WORKSPACE_PATH,
        ]
        if self.engine.rootless:
            argv += ["--userns", "keep-id"]  # the user's own id inside, so the workspace's files stay theirs
        elif self.engine.kind == "docker":
            # A daemon started with --userns-remap would map --user's ids onto subordinate ones, which cannot
            # write the workspace; "host" opts this container out of the remap (a no-op on a daemon without it).
            argv += ["--userns", "host"]
        for key, value in CONTAINER_ENV.items():
            argv += ["-e", f"{key}={value}"]
        return [*argv, limits.image, "python3", f"{AGENT_PATH}/keeper.py"]

    def _check_limits(self) -> None:
        cpus = os.cpu_count() or 1
        if self.limits.cpus > cpus:
            raise ContainerUnavailable(
                f"RLM_CONTAINER_CPUS={self.limits.cpus:g} exceeds this machine's {cpus} CPUs; lower it",
                setting="container_cpus")
        if self.engine.kind == "podman":  # Podman runs here, under this process's own hard limits
            for kind, value, setting in ((resource.RLIMIT_NOFILE, self.limits.max_open_files, "container_max_open_files"),
                                         (resource.RLIMIT_NPROC, self.limits.max_user_processes,
                                          "container_max_user_processes")):
                hard = resource.getrlimit(kind)[1]
                if hard != resource.RLIM_INFINITY and value > hard:
                    raise ContainerUnavailable(f"RLM_{setting.upper()}={value} exceeds this machine's hard limit "
                                               f"({hard}); lower it", setting=setting)
        for char in ",\n":
            if char in str(self.workspace):
                raise ContainerUnavailable(f"the workspace path {self.workspace} holds {char!r}, which a bind mount "
                                           "cannot carry; use another folder (RLM_BASH_WORKSPACE)",
                                           setting="bash_workspace")

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - STDERR_SHOWN_CHARS))
        return self._stderr.read().decode("utf-8", "replace").strip().replace("\n", " ")


def container_name(run_id: str) -> str:
    """``rlm-<run id>-<random>``: the engine's name rules, unique even for two containers of one run id."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", run_id).strip(".-") or "run"
    suffix = secrets.token_hex(4)
    return f"rlm-{safe[: MAX_NAME_CHARS - len(suffix) - 5]}-{suffix}"


def sweep_orphans(engine: Engine) -> list[str]:
    """Remove this machine's containers whose owning run's process is gone; the names removed."""
    listed = engine.call("ps", "-a", "--filter", f"label={LABEL_HOST}={socket.gethostname()}",
                         "--format", "{{.Names}}")
    names = [n for n in listed.stdout.split() if n] if listed.returncode == 0 else []
    if not names:
        return []
    inspected = engine.call("container", "inspect", "--format", "{{.Name}} {{json .Config.Labels}}", *names)
    orphans = []
    for line in inspected.stdout.splitlines():
        name, _, raw = line.strip().partition(" ")
        try:
            labels = json.loads(raw) or {}
            pid = int(labels[LABEL_OWNER_PID])
        except (ValueError, KeyError, TypeError):
            continue
        if not procs.alive(pid, labels.get(LABEL_OWNER_START) or None):
            orphans.append(name.lstrip("/"))
    remove(engine, orphans)
    return orphans


def remove(engine: Engine, names: Sequence[str]) -> None:
    """Remove containers at once (no stop grace: nothing in them is worth keeping); missing ones are fine."""
    if names:
        engine.call("rm", "-f", *names)


def labelled_containers(engine: Engine, run_id: str | None = None) -> list[str]:
    """Names of this package's containers (of one run, given ``run_id``), running or not."""
    selector = f"label={LABEL}={run_id}" if run_id is not None else f"label={LABEL}"
    listed = engine.call("ps", "-a", "--filter", selector, "--format", "{{.Names}}")
    return [n for n in listed.stdout.split() if n] if listed.returncode == 0 else []


def _bind(source: Path, target: str, *, read_only: bool) -> str:
    return f"type=bind,source={source},target={target}" + (",readonly" if read_only else "")


def _read_line(fd: int, deadline: float) -> bytes | None:
    """The first line written to ``fd`` (b"" at end of file), or None when ``deadline`` passes first."""
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(fd, 256)
        if not chunk:
            return data
        data += chunk
    return data

