"""An rlm run's outcome as A2A events: the artifacts, and the metadata of the task's final state.

The runner returns the artifacts as the outcome's events (``RunOutcome.events``),
which the finish writes in its transaction just before the final status, so every
API instance streams them with it; the final status carries
``specialist`` metadata: semantic calls used and charged, credits charged, the
stop reason, findings kept and dropped, resumes. The credits are what the
finish's settlement posts (``workers.settlement``), written in the same
transaction.
"""

from __future__ import annotations

from typing import Any

from a2a.types.a2a_pb2 import Artifact, Part, TaskArtifactUpdateEvent
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value

METADATA_KEY = "specialist"


def artifact_events(artifacts: tuple[dict[str, Any], ...]) -> list[TaskArtifactUpdateEvent]:
    """The runner's artifacts (``report`` text, ``findings`` data) as A2A artifact events (ids filled by the writer)."""
    events = []
    for artifact in artifacts:
        if "data" in artifact:
            part = Part(data=ParseDict(artifact["data"], Value()), media_type=artifact.get("media_type", "application/json"))
        else:
            part = Part(text=str(artifact.get("text", "")), media_type=artifact.get("media_type", "text/plain"))
        events.append(
            TaskArtifactUpdateEvent(
                artifact=Artifact(artifact_id=artifact["name"], name=artifact["name"], parts=[part]), last_chunk=True
            )
        )
    return events


def final_metadata(detail: dict[str, Any], credits_charged: int | None) -> dict[str, Any]:
    """What the task's final state says about the run (camelCase, like the rest of A2A)."""
    keys = {
        "semantic_calls_used": "semanticCallsUsed",
        "semantic_calls_charged": "semanticCallsCharged",
        "stop_reason": "stopReason",
        "turns": "turns",
        "findings": "findings",
        "findings_dropped": "findingsDropped",
        "resumes": "resumes",
        "pricing": "pricing",
        "code": "code",
        "cpu_seconds": "cpuSeconds",  # the job's processes together (workers.cpu_share)
    }
    data = {camel: detail[key] for key, camel in keys.items() if detail.get(key) is not None}
    if credits_charged is not None:
        data["creditsCharged"] = credits_charged
    return {METADATA_KEY: data}
