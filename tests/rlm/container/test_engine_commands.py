"""What each engine is asked to run, where Docker and Podman differ (docs/RLM.md, "Container engines").

The container tests run on Podman in CI; these keep the Docker-only flags that were proven on a Docker daemon
(RLM_CONTAINER_ENGINE=docker) from being lost while no daemon is here to prove them again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from rlmfamily.container.engine import Engine
from rlmfamily.container.sandbox import ContainerLimits, RunContainer
from rlmfamily.settings import RLMSettings


def run_command(kind: str, make_settings: Callable[..., RLMSettings], tmp_path: Path) -> list[str]:
    engine = Engine(path=f"/usr/bin/{kind}", kind=kind, env={})  # type: ignore[arg-type]
    container = RunContainer(engine, ContainerLimits.from_settings(make_settings()), run_id="r",
                             workspace=tmp_path / "ws")
    return container.run_argv()


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def test_docker_keeps_the_invoking_users_ids_out_of_a_daemons_userns_remap(make_settings, tmp_path: Path) -> None:
    # On a daemon started with --userns-remap, --user's ids become subordinate ones that cannot write the workspace;
    # --userns host (a no-op on other daemons) keeps them the user's. Verified on Docker 20.10 both ways.
    argv = run_command("docker", make_settings, tmp_path)
    assert flag_values(argv, "--userns") == ["host"]
    assert flag_values(argv, "--user") == [f"{os.getuid()}:{os.getgid()}"]
    assert flag_values(argv, "--pull") == ["never"]


def test_podman_maps_ids_only_when_rootless(make_settings, tmp_path: Path) -> None:
    argv = run_command("podman", make_settings, tmp_path)
    assert flag_values(argv, "--userns") == ([] if os.geteuid() == 0 else ["keep-id"])
    assert flag_values(argv, "--user") == [f"{os.getuid()}:{os.getgid()}"]
