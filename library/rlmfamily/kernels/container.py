"""The ``container`` kernel: the host kernel's own child process, run inside the run's container.

The child (``kernels/_host_child.py``, mounted read-only) is started with the
engine's ``exec -i`` through ``container/agent/kernel.py``, which moves the frame
channel off the process's stdin and stdout. Everything else is the host kernel's:
the frames, the bridges answered here in the parent (``llm_query``, ``rlm.*``,
``a2a.*``, history: the same admission, budget and journal), the capped output,
the checkpoint after each successful step and the restore after a crash. What
differs is where the signals go: a step past ``step_timeout_s`` gets SIGINT inside
the container (``RunContainer.signal``), and one that ignores it for
``interrupt_grace_s`` has its process group killed inside; a new child starts in
the same container from the last checkpoint and the run goes on. A child killed by
the container's memory limit ends its step with ``error_code="memory"``.

The container is the boundary (see rlmfamily/container/sandbox.py for what it
gets); this kernel does not open or remove it: the session does, around the run.
"""

from __future__ import annotations

import signal
import subprocess
from typing import IO, TYPE_CHECKING

from rlmfamily.kernels.base import Bridge, ErrorCode, KernelLimits
from rlmfamily.kernels.host import HostKernel

if TYPE_CHECKING:
    from rlmfamily.container.sandbox import RunContainer

KERNEL_ENTRY = "/rlm/kernel.py"  # rlmfamily/container/agent/kernel.py, where AGENT_PATH mounts it


class ContainerKernel(HostKernel):
    """The host kernel's child inside ``container``. Use from one thread at a time."""

    name = "container"

    def __init__(self, container: RunContainer, limits: KernelLimits | None = None) -> None:
        super().__init__(limits)
        self.container = container
        self._oom_kills: int | None = None

    def start(self, bridge: Bridge, prelude: str) -> None:
        self._oom_kills = self.container.oom_kills()
        super().start(bridge, prelude)

    def _launch(self, child_in: int, child_out: int, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.container.exec_argv(["python3", KERNEL_ENTRY], interactive=True),
            stdin=child_in, stdout=child_out, stderr=stderr, env=dict(self.container.engine.env),
            cwd=self.container.client_dir, start_new_session=True,  # a terminal's Ctrl-C is the run's, not the engine client's
        )

    def _interrupt(self) -> None:
        if self._child_pid is not None:
            self.container.signal(self._child_pid, signal.SIGINT)

    def _kill(self) -> None:
        # Killing the engine's client would leave the child running inside: its process group goes first.
        pid, self._child_pid = self._child_pid, None
        if pid is not None and self._proc is not None and self._proc.poll() is None and self.container.running:
            self.container.signal(pid, signal.SIGKILL, group=True)
        super()._kill()

    def _death(self, exc: BaseException) -> tuple[ErrorCode, str]:
        count = self.container.oom_kills()
        if count is not None and self._oom_kills is not None and count > self._oom_kills:
            self._oom_kills = count
            return "memory", ("the kernel process was killed by the container's memory limit (RLM_CONTAINER_MEMORY_BYTES="
                              f"{self.container.limits.memory_bytes})")
        return super()._death(exc)
