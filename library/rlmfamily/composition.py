"""What a run is assembled from when its caller does not say: the extensions and the real kernels.

The seams (rlmfamily/extensions.py for extensions, ``KernelFactory`` here for kernels)
know no implementation; this module is the one place that names them. A
``Session`` given ``extensions=None`` gets ``default_extensions()``, and one given
no ``kernel_factory`` gets ``default_kernel_factory``. The hosted service and the
tests pass their own. Implementations are imported when first used, so a
session that names its own extensions and kernel never loads these.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from rlmfamily.errors import KernelUnavailable
from rlmfamily.extensions import ExtensionFactory
from rlmfamily.kernels.base import Kernel
from rlmfamily.settings import RLMSettings

KERNEL_NAMES = ("host", "monty")


class KernelFactory(Protocol):
    """Builds the kernel ``name`` ("host" | "monty") for the run ``run_id`` whose files are under ``run_dir``."""

    def __call__(self, name: str, settings: RLMSettings, run_dir: Path, run_id: str) -> Kernel: ...


def default_extensions() -> list[ExtensionFactory]:
    """The extensions every session gets unless it is given its own list: the family, A2A delegation, command jobs."""
    from rlmfamily.a2a.run import A2AExtension
    from rlmfamily.bash.extension import BashExtension
    from rlmfamily.family.extension import FamilyExtension

    return [FamilyExtension, A2AExtension, BashExtension]  # BashExtension is inert outside RLM_PROFILE=python-bash


def default_kernel_factory(name: str, settings: RLMSettings, run_dir: Path, run_id: str) -> Kernel:
    """A real kernel: ``host`` (the user's Python in a child process) or ``monty`` (the sandbox)."""
    limits = settings.kernel_limits()
    try:
        if name == "host":
            from rlmfamily.a2a.run import secret_env_names
            from rlmfamily.kernels.host import HostKernel

            # The model's code never gets the model key nor an A2A peer's key: the child inherits the
            # environment without them.
            hidden = {settings.key_env} | secret_env_names(settings)
            env = {k: v for k, v in os.environ.items() if k not in hidden}
            return HostKernel(limits=limits, env=env)
        from rlmfamily.kernels.checkpoints import FileCheckpointStore
        from rlmfamily.kernels.monty import MontyKernel

        # Step checkpoints are kept; snapshots before every host call are for a replacement worker
        # resuming a step (the service), which a local run never does: they would cost ~2 ms per call.
        return MontyKernel(limits=limits, store=FileCheckpointStore(run_dir / "checkpoints"), session_id=run_id,
                           record_pending_calls=False)
    except ImportError as exc:
        raise KernelUnavailable(f"the {name} kernel cannot be loaded: {exc}") from None
