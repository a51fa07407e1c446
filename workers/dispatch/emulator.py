"""A local Cloud Tasks emulator for tests and one-machine trials, in its own virtual environment.

``gcloud-tasks-emulator`` pins protobuf<5 while the service needs protobuf>=5, so it
lives in ``.venv-emulator`` built from ``infra/emulator/requirements.lock`` (the lock
is complete, so it installs with ``--no-deps``) and runs as a separate process bound
to 127.0.0.1. What the emulator does not do (OIDC, name de-duplication, retry
settings, dispatch deadlines) is tested directly against the worker; see
docs/WORKERS.md.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import select
import subprocess
import sys
import time
import venv
from pathlib import Path

from core.errors import ServiceError
from core.settings import PROJECT_ROOT

EMULATOR_LOCK = PROJECT_ROOT / "infra" / "emulator" / "requirements.lock"
EMULATOR_VENV = PROJECT_ROOT / ".venv-emulator"
LAUNCHER = Path(__file__).with_name("_emulator_launcher.py")


class EmulatorError(ServiceError):
    code = "emulator_failed"


def ensure_emulator_venv(venv_dir: Path = EMULATOR_VENV, lock: Path = EMULATOR_LOCK) -> Path:
    """Create or reuse the emulator's environment; return its Python. Rebuilt when the lock changes."""
    python = venv_dir / "bin" / "python"
    stamp = venv_dir / ".installed-from"
    wanted = hashlib.sha256(lock.read_bytes()).hexdigest()
    venv_dir.parent.mkdir(parents=True, exist_ok=True)
    # Two test processes may build at once: serialise on a lock file beside the environment.
    with open(str(venv_dir) + ".lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text().strip() == wanted and python.exists():
            return python
        if not python.exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-r", str(lock)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise EmulatorError(f"installing the emulator from {lock} failed:\n{result.stderr[-2000:]}")
        stamp.write_text(wanted + "\n")
    return python


class CloudTasksEmulator:
    """The emulator as a child process on 127.0.0.1; ``host`` is its ``127.0.0.1:<port>``."""

    def __init__(
        self,
        queue_paths: list[str],
        *,
        max_retries: int = 100,
        start_timeout_s: float = 60.0,
        log_path: Path | None = None,
    ) -> None:
        self.queue_paths = queue_paths
        self.max_retries = max_retries
        self.start_timeout_s = start_timeout_s
        self.log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self.host: str | None = None

    def start(self) -> str:
        python = ensure_emulator_venv()
        stderr = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GOOGLE_", "SPECIALISTS_"))}
        # Not an ops/topology.py role: Cloud Tasks' emulator stands in for GCP (and workers/ does not import ops/).
        self.process = subprocess.Popen(
            [str(python), str(LAUNCHER), str(self.max_retries), *self.queue_paths],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            start_new_session=True,  # a test's Ctrl-C reaches us, and we stop it ourselves
        )
        deadline = time.monotonic() + self.start_timeout_s
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.2)
            if ready:
                line = self.process.stdout.readline()
                if line.startswith("READY "):
                    self.host = f"127.0.0.1:{int(line.split()[1])}"
                    return self.host
                if not line and self.process.poll() is not None:
                    break
            elif self.process.poll() is not None:
                break
        self.stop()
        raise EmulatorError(
            f"the Cloud Tasks emulator did not start within {self.start_timeout_s:g} s"
            + (f"; see {self.log_path}" if self.log_path else "")
        )

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process.stdout:
            self.process.stdout.close()
        self.process = None

    def __enter__(self) -> "CloudTasksEmulator":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # `python -m workers.dispatch.emulator`: build the environment ahead of a test run
    print(ensure_emulator_venv(), file=sys.stderr)
