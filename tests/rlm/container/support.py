"""Helpers for the container kernel's tests: a scripted run in a container, its steps, and the engine's view.

Every test here uses the real engine (Podman or Docker) and the image built once per
machine by the ``container_image`` fixture (tests/rlm/conftest.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlmfamily import Context, ScriptedProvider, Session
from rlmfamily.container.engine import Engine
from rlmfamily.container.sandbox import LABEL_OWNER_PID
from rlmfamily.session import RunResult
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import read_trajectory

GONE_WITHIN_S = 60.0  # the bound given to holds.wait_until for an engine event (a container removed, a step started)


def run_steps(settings: RLMSettings, repo: Path, steps: list[str], *, subcall: list[dict[str, Any]] | None = None,
              children: list[dict[str, Any]] | None = None) -> RunResult:
    script: dict[str, Any] = {"root": [{"code": code} for code in steps], "subcall": subcall or []}
    if children:
        script["child"] = children
    session = Session(context=Context.from_repository(repo, settings), provider=ScriptedProvider(script),
                      settings=settings, kernel="container")
    return session.run("work in the container")


def steps_of(result: RunResult) -> list[dict[str, Any]]:
    return [e for e in read_trajectory(result.trajectory_path) if e["event"] == "step"]


def containers_owned_by(engine: Engine, pid: int) -> list[str]:
    listed = engine.call("ps", "-a", "--filter", f"label={LABEL_OWNER_PID}={pid}", "--format", "{{.Names}}")
    return [name for name in listed.stdout.split() if name]
