"""Helpers of the specialist tests: specs and routes on disk, A2A messages, claims, a run context.

Everything real: PostgreSQL (the test run's database), Monty, the scripted provider
speaking the provider interface. Worker modules are imported where they are used, so
the spec tests need nothing but ``core``. A spec is the shipped reviewer's with overrides,
written to a temporary folder and loaded like any spec; its route is a scripted
route whose script lives in ``tests/workers/hosted_rlm/scripts``.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from a2a.types.a2a_pb2 import Message, Part, Role
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value
from sqlalchemy import Engine

from core.settings import PROJECT_ROOT, CheckpointSync
from core.specs import LoadedSpec, load_spec

if TYPE_CHECKING:
    from workers.runs import RunContext
    from workers.hosted_rlm.routes import ModelRoutes
    from workers.hosted_rlm.runner import RlmRunner
    from workers.hosted_rlm.store import CheckpointPolicy

SCRIPTS = Path(__file__).parent / "scripts"
CHECKPOINT_KEY = b"test-checkpoint-key-" + b"z" * 40


def write_spec(folder: Path, spec_id: str = "reviewer", base: str = "reviewer", **overrides: Any) -> LoadedSpec:
    """The shipped spec ``base`` renamed ``spec_id``, with ``overrides`` (``limits`` merged key by key)."""
    document = yaml.safe_load((PROJECT_ROOT / "specs" / f"{base}.yaml").read_text())
    document["id"] = spec_id
    document["model_route"] = "test"
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            merged = dict(document[key])
            for inner_key, inner in value.items():
                if isinstance(inner, dict) and isinstance(merged.get(inner_key), dict):
                    merged[inner_key] = {**merged[inner_key], **inner}
                else:
                    merged[inner_key] = inner
            document[key] = merged
        else:
            document[key] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{spec_id}.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_spec(path)


def routes_for(script: str | Path) -> ModelRoutes:
    from workers.hosted_rlm.routes import ModelRoutes, ScriptedRoute

    path = SCRIPTS / script if isinstance(script, str) else script
    return ModelRoutes({"test": ScriptedRoute(kind="scripted", script=path)})


def message(text: str, *, files: dict[str, str] | None = None, items: list[dict[str, Any]] | None = None) -> Message:
    parts = [Part(text=text)]
    for name, content in (files or {}).items():
        parts.append(Part(raw=content.encode(), filename=name, media_type="text/x-python"))
    if items is not None:
        parts.append(Part(data=ParseDict(items, Value())))
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts)


def held_script(folder: Path) -> tuple[Path, Path]:
    """A copy of scripts/review_held.toml in ``folder``, and the file whose creation lets its held calls go."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "review_held.toml"
    shutil.copy(SCRIPTS / "review_held.toml", script)
    return script, folder / "release"


def new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


def claim(engine: Engine, job_id: str, *, lease_s: float = 60.0) -> int:
    from taskstate import claims

    with engine.begin() as conn:
        result = claims.claim(conn, job_id, worker_id="test-worker", lease_s=lease_s)
    assert result.outcome == "claimed", result
    return result.fencing_token


@dataclass
class Events:
    """An EventSink that keeps what a runner reported."""

    items: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, job: Any, fencing_token: int, kind: str, data: dict[str, Any]) -> None:
        with self.lock:
            self.items.append((kind, dict(data)))

    def texts(self) -> list[str]:
        return [data.get("text", "") for kind, data in self.items if kind == "progress"]


RESERVED_CREDITS = 20  # what admission reserves for a reviewer task (specs/reviewer.yaml's tariff)


def context(job_id: str, spec_id: str, token: int, *, deadline_s: float = 120.0,
            events: Events | None = None, cancel: threading.Event | None = None,
            reserved_credits: int = RESERVED_CREDITS) -> RunContext:
    """A run's context as the worker hands it over: the job, as its claim read it (with the task's reservation)."""
    from workers.auth import VerifiedJob
    from workers.runs import RunContext

    job = VerifiedJob(job_id=job_id, specialist_id=spec_id, deadline_s=deadline_s, payload={},
                      signed_at=None, secret_id="test", reserved_credits=reserved_credits)  # type: ignore[arg-type]
    return RunContext(job, token, time.monotonic() + deadline_s, cancel or threading.Event(), events or Events())


def runner(engine: Engine, spec: LoadedSpec, routes: ModelRoutes, msg: Message, *,
           environ: dict[str, str] | None = None, checkpoint_sync: CheckpointSync = "with_journal",
           checkpoint_policy: CheckpointPolicy | None = None) -> RlmRunner:
    """A runner of ``spec``; ``checkpoint_policy``: by default the settings' defaults (not the environment's), as a
    worker runs it."""
    from core.settings import HostedSettings
    from workers.hosted_rlm.runner import RlmRunner
    from workers.hosted_rlm.store import CheckpointPolicy

    return RlmRunner(
        engine=engine, specs={spec.spec.id: spec}, routes=routes, checkpoint_key=CHECKPOINT_KEY,
        message_of=lambda job: msg, environ=environ or {}, checkpoint_sync=checkpoint_sync,
        checkpoint_policy=checkpoint_policy or CheckpointPolicy.of(HostedSettings.model_construct()),
    )


def artifact(outcome: Any, name: str) -> dict[str, Any]:
    found = [a for a in outcome.artifacts if a["name"] == name]
    assert found, f"no {name} artifact in {outcome}"
    return found[0]


def artifact_of(outcome: dict[str, Any], name: str) -> Any:
    """The content of artifact ``name`` of an outcome read back from JSON."""
    found = [a for a in outcome["artifacts"] if a["name"] == name]
    assert found, f"no {name} artifact in {outcome}"
    return found[0].get("data", found[0].get("text"))


def dump(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
