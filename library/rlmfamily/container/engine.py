"""Container engines: the CLI that runs the run's container (Podman or Docker), found and checked before use.

``RLM_CONTAINER_ENGINE`` names one (``podman``, ``docker``) or ``auto``: each engine
found on PATH is asked whether it answers (Docker needs its daemon; Podman has
none) and whether it holds ``RLM_CONTAINER_IMAGE``; the first that does is used,
Podman first. Nothing here falls back to the host: an engine that is missing, a
daemon that is down and an image that is absent are each a ``ContainerUnavailable``
naming the setting to change and the command that fixes it.

The CLI runs with the user's environment less anything that looks like a credential
and the variables the caller names (the model key, A2A keys): the engine passes no
variable of its own environment into a container unless asked (``-e NAME`` without
a value), and this package never asks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from rlmfamily.errors import KernelUnavailable
from rlmfamily.settings import CREDENTIAL_WORDS

if TYPE_CHECKING:
    from rlmfamily.settings import RLMSettings

EngineKind = Literal["podman", "docker"]
ENGINE_KINDS: Final[tuple[EngineKind, ...]] = ("podman", "docker")  # auto-detection's order
PROBE_TIMEOUT_S: Final = 30.0  # one CLI call that asks (version, inspect, ps, rm); a hung daemon ends here
STDERR_SHOWN_CHARS: Final = 400  # of an engine's error, in our message
INSTALL_HINT: Final = ("install Podman (Debian/Ubuntu, as root: apt-get install podman runc) or start Docker's "
                       "daemon, or set RLM_CONTAINER_ENGINE to the engine to use")


class ContainerUnavailable(KernelUnavailable):
    """The container kernel was selected but cannot run: no engine, its daemon down, or the image missing.

    Never a reason to run the model's code on the host instead; the message names the setting.
    """

    code = "container_unavailable"


@dataclass(frozen=True)
class Engine:
    """One container CLI: where it is, which kind, and the environment it runs with."""

    path: str
    kind: EngineKind
    env: Mapping[str, str] = field(repr=False)

    def command(self, *args: str) -> list[str]:
        return [self.path, *args]

    def call(self, *args: str, timeout_s: float = PROBE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """Run the CLI once and return what it said; a hang past ``timeout_s`` is an exit code of -1."""
        try:
            return subprocess.run(self.command(*args), env=dict(self.env), capture_output=True, text=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(self.command(*args), -1, "", f"no answer within {timeout_s:g} s")
        except OSError as exc:
            return subprocess.CompletedProcess(self.command(*args), -1, "", str(exc))

    @property
    def rootless(self) -> bool:
        """Podman run by a user other than root maps ids through a user namespace of its own."""
        return self.kind == "podman" and os.geteuid() != 0


def engine_env(hidden: Iterable[str] = ()) -> dict[str, str]:
    """The user's environment for the CLI, without credentials: ``hidden`` names and credential-looking names."""
    hidden_names = set(hidden)
    return {k: v for k, v in os.environ.items()
            if k not in hidden_names and not any(word in k.upper() for word in CREDENTIAL_WORDS)}


def find_engine(settings: RLMSettings, *, hidden_env: Iterable[str] = (), check_image: bool = True) -> Engine:
    """The engine ``RLM_CONTAINER_ENGINE`` names (or the first that answers), checked to hold the image."""
    env = engine_env(hidden_env)
    wanted = settings.container_engine
    kinds: tuple[EngineKind, ...] = ENGINE_KINDS if wanted == "auto" else (wanted,)
    tried: list[str] = []
    answering: list[Engine] = []
    for kind in kinds:
        path = shutil.which(kind, path=env.get("PATH"))
        if path is None:
            tried.append(f"{kind}: not found on PATH")
            continue
        engine = Engine(path=path, kind=kind, env=env)
        problem = _engine_problem(engine)
        if problem is not None:
            tried.append(f"{kind} ({path}): {problem}")
            continue
        if not check_image:
            return engine
        if image_present(engine, settings.container_image):
            return engine
        answering.append(engine)
        tried.append(f"{kind} ({path}): has no image {settings.container_image}")
    if not answering:
        raise ContainerUnavailable(
            f"the container kernel needs a container engine and none answers (RLM_CONTAINER_ENGINE={wanted}): "
            f"{'; '.join(tried)}. To fix it, {INSTALL_HINT}.",
            setting="container_engine",
        )
    raise ContainerUnavailable(
        f"the container image {settings.container_image!r} is not in {' or '.join(e.kind for e in answering)} "
        f"(RLM_CONTAINER_IMAGE). Build the local image with `rlm container image`, or set RLM_CONTAINER_IMAGE "
        "to an image that provides python3 and bash (it is never pulled from a registry).",
        setting="container_image",
    )


def image_present(engine: Engine, image: str) -> bool:
    return engine.call("image", "inspect", "--format", "{{.Id}}", image).returncode == 0


def _engine_problem(engine: Engine) -> str | None:
    """None when the engine answers; else what it said (Docker's client answers even with its daemon down)."""
    if engine.kind == "docker":
        done = engine.call("version", "--format", "{{.Server.Version}}")
    else:
        done = engine.call("version", "--format", "{{.Client.Version}}")
    if done.returncode == 0 and done.stdout.strip():
        return None
    said = (done.stderr or done.stdout).strip().replace("\n", " ")[:STDERR_SHOWN_CHARS]
    return f"does not answer (exit {done.returncode}: {said or 'no output'})"
