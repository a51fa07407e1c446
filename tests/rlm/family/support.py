"""Helpers for the family tests: a root run over a small document with a scripted family, and store lookups.

``GatedScript`` holds chosen children in their model turn until the test opens a
``Gate``, so a test that needs "the child is still running" never races a sleep.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rlmfamily.context import Context
from rlmfamily.errors import ProviderError
from rlmfamily.family.store import FamilyStore, RunRecord
from rlmfamily.providers import ScriptedProvider
from rlmfamily.providers.base import Completion
from rlmfamily.session import RunResult, Session
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import FILENAME, read_trajectory

from ..holds import Gate

DOCUMENT = "Ferry log.\nMAX_CRATES = 40\nDOCK_TIMEOUT_S = 90\n"

# A child whose code waits (in its sandbox) for a message from its parent, so the parent decides
# when it may finish. Children inherit RLM_MAX_SLEEP_S_PER_STEP; run it with MESSAGE_WAIT_SETTINGS.
WAIT_FOR_PARENT = """
import time
t = time.time()
while not rlm.inbox() and time.time() - t < 20:
    time.sleep(0.05)
released = "released" if rlm.inbox() else "never released"
"""
MESSAGE_WAIT_SETTINGS = {"max_sleep_s_per_step": 30.0}  # above the 20 s the loop above may sleep


class GatedScript:
    """A scripted family whose children, picked by prompt, hold their first model turn at a gate.

    Children run in their own processes: each rebuilds this provider through
    ``child_spec()`` (rlmfamily/family/spec.py) and waits at a ``Gate`` directory. A held
    turn waits until the test opens the gate, at most the call's ``timeout_s``
    (RLM_ROOT_TIMEOUT_S), and then fails as a provider error.
    """

    name = "scripted"

    def __init__(self, script: dict[str, Any], gates: dict[str, str | Path], *, source: str = "family-test",
                 prompt: str | None = None) -> None:
        self.script = script
        self.gates = {pattern: str(directory) for pattern, directory in gates.items()}
        self.source = source
        base = ScriptedProvider(script, source=source)
        self.inner = base if prompt is None else base.for_child(prompt)
        self.default_model = self.inner.default_model
        self.prices = self.inner.prices
        held = [d for pattern, d in self.gates.items() if prompt is not None and re.search(pattern, prompt)]
        self._gate = Gate(held[0]) if held else None

    def complete(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None, model: str | None,
                 timeout_s: float, purpose: str) -> Completion:
        if purpose == "root" and self._gate is not None:
            gate, self._gate = self._gate, None
            if not gate.pass_through(timeout_s):
                raise ProviderError(f"{self.source}: the test never opened the gate {gate.directory}", billed=False)
        return self.inner.complete(messages, tools=tools, model=model, timeout_s=timeout_s, purpose=purpose)

    def child_spec(self) -> dict[str, Any]:
        return {"factory": f"{__name__}:gated_child",
                "kwargs": {"script": self.script, "gates": self.gates, "source": self.source}}


def gated_child(*, settings: RLMSettings, prompt: str, script: dict[str, Any], gates: dict[str, str],
                source: str) -> GatedScript:
    """The provider of a child process (``child_spec``'s factory)."""
    return GatedScript(script, gates, source=source, prompt=prompt)


def child(pattern: str, *turns: str | dict[str, Any], subcall: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ``[[child]]`` entry of a script: the turns a child whose prompt matches ``pattern`` plays."""
    entry: dict[str, Any] = {"pattern": pattern, "root": [{"code": t} if isinstance(t, str) else t for t in turns]}
    if subcall:
        entry["subcall"] = subcall
    return entry


def script(root: list[str | dict[str, Any]], children: list[dict[str, Any]] = (), **top: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"root": [{"code": r} if isinstance(r, str) else r for r in root],
                            "child": list(children), **top}
    data.setdefault("default_answer", "NONE")
    return data


def run_root(settings: RLMSettings, tmp_path: Path, data: dict[str, Any], *, kernel: str = "monty",
             run_id: str | None = None, question: str = "question",
             gates: dict[str, Gate] | None = None) -> RunResult:
    """Run a root session; children whose prompt matches a pattern of ``gates`` hold at that gate."""
    document = tmp_path / "ferry.txt"
    if not document.exists():
        document.write_text(DOCUMENT)
    script = json.loads(json.dumps(data))
    provider: Any = ScriptedProvider(script, source="family-test")
    if gates:
        provider = GatedScript(script, {pattern: gate.directory for pattern, gate in gates.items()})
    session = Session(context=Context.from_document(document, settings), provider=provider, settings=settings,
                      kernel=kernel, run_id=run_id)
    return session.run(question)


def trajectory_has(settings: RLMSettings, run_id: str, event: str) -> bool:
    """The run's trajectory has recorded ``event`` (read while the run is still writing it)."""
    path = settings.runs_dir / run_id / FILENAME
    return path.exists() and f'"event": "{event}"' in path.read_text()


def runs_of(settings: RLMSettings, root_id: str) -> list[RunRecord]:
    return FamilyStore(settings.family_path).runs(root_id)


def events(result: RunResult, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_trajectory(result.trajectory_path) if e["event"] == kind]


def observations(result: RunResult) -> list[str]:
    return [e["observation"] for e in events(result, "step")]
