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
from typing import TYPE_CHECKING, Any, Protocol

from rlmfamily.errors import KernelUnavailable
from rlmfamily.extensions import Environment, ExtensionFactory
from rlmfamily.kernels.base import Kernel
from rlmfamily.settings import RLMSettings

if TYPE_CHECKING:
    from rlmfamily.context import Context

KERNEL_NAMES = ("host", "monty", "container")


class KernelFactory(Protocol):
    """Builds the kernel ``name`` for the run ``run_id`` whose files are under ``run_dir``.

    The session passes ``environment=`` (the run's container) only to build the ``container`` kernel.
    """

    def __call__(self, name: str, settings: RLMSettings, run_dir: Path, run_id: str, **kwargs: Any) -> Kernel: ...


def default_extensions() -> list[ExtensionFactory]:
    """The extensions every session gets unless it is given its own list: the family, A2A delegation, command jobs."""
    from rlmfamily.a2a.run import A2AExtension
    from rlmfamily.bash.extension import BashExtension
    from rlmfamily.family.extension import FamilyExtension

    return [FamilyExtension, A2AExtension, BashExtension]  # BashExtension is inert outside RLM_PROFILE=python-bash


def open_environment(kernel: str, settings: RLMSettings, *, run_id: str, context: Context,
                     run_dir: Path) -> Environment | None:
    """The run's container when ``kernel`` is ``container`` (started, its orphaned elders swept), else None.

    Its workspace is ``RLM_BASH_WORKSPACE``, else the run's repository, else ``<run_dir>/workspace``. The model key's
    and the A2A peers' key variables never reach the engine's command line, nor the container.
    """
    if kernel != "container":
        return None
    from rlmfamily.a2a.run import secret_env_names
    from rlmfamily.bash.extension import workspace_of
    from rlmfamily.container.sandbox import RunContainer

    workspace = workspace_of(settings, context, fallback=run_dir / "workspace")
    return RunContainer.open(settings, run_id=run_id, workspace=workspace,
                             hidden_env={settings.key_env} | secret_env_names(settings))


def default_kernel_factory(name: str, settings: RLMSettings, run_dir: Path, run_id: str, *,
                           environment: Environment | None = None) -> Kernel:
    """A real kernel: ``host`` (the user's Python in a child process), ``monty`` (the sandbox) or ``container``
    (the host kernel's child inside ``environment``, the run's container)."""
    limits = settings.kernel_limits()
    try:
        if name == "container":
            from rlmfamily.container.sandbox import RunContainer
            from rlmfamily.kernels.container import ContainerKernel

            if not isinstance(environment, RunContainer):
                raise KernelUnavailable("the container kernel runs in the run's container, which the session opens "
                                        "(Session with kernel='container'); none was given")
            return ContainerKernel(environment, limits)
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
        # Each step's record is taken in the background, while the session goes on to its next model call
        # (bench/rlm_session_steps.py: 0.87-0.95x the loop's path between model calls); a resume whose newest
        # record is one step behind runs that step again, and one whose newest record is one step ahead goes on
        # from the record before it, which pruning keeps (docs/RLM_DESIGN.md, "what a resume may rely on").
        return MontyKernel(limits=limits, store=FileCheckpointStore(run_dir / "checkpoints"), session_id=run_id,
                           record_pending_calls=False, checkpoint_in_background=True, keep_record_before_newest=True)
    except ImportError as exc:
        raise KernelUnavailable(f"the {name} kernel cannot be loaded: {exc}") from None
