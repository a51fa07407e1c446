"""What a completion gate is, and the verdicts a run can end with.

A gate is a named command (``python -m unittest``) run in the run's workspace
after the model answers, with its own deadline. Gates are configured by the
``gates`` setting (``RLM_GATES``, a JSON list) or ``rlm run --gate NAME=COMMAND``;
``RLMSettings`` checks them at start-up against its limits (``max_gates``,
``gate_max_deadline_s``, ``bash_max_command_chars``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

Verdict = Literal["accepted", "gates_failed", "not_verified"]
VERDICTS: tuple[Verdict, ...] = ("accepted", "gates_failed", "not_verified")
GATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # shown to the model and in records; no spaces


class GateSpec(BaseModel):
    """One gate: ``deadline_s`` None takes ``gate_default_deadline_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    command: str
    deadline_s: float | None = None


def check_gates(gates: list[GateSpec], *, max_gates: int, max_deadline_s: float, max_command_chars: int) -> None:
    """Refuse gates a run could not run as given (ValueError naming the gate and the limit)."""
    if len(gates) > max_gates:
        raise ValueError(f"{len(gates)} gates; at most {max_gates} (RLM_MAX_GATES)")
    seen: set[str] = set()
    for gate in gates:
        if not GATE_NAME.fullmatch(gate.name):
            raise ValueError(f"gate name {gate.name!r}: use 1-64 letters, digits, '.', '_' or '-'")
        if gate.name in seen:
            raise ValueError(f"gate name {gate.name!r} is given twice; each gate needs its own name")
        seen.add(gate.name)
        if not gate.command.strip():
            raise ValueError(f"gate {gate.name!r}: the command is empty")
        if len(gate.command) > max_command_chars:
            raise ValueError(f"gate {gate.name!r}: the command has {len(gate.command):,} characters; at most "
                             f"{max_command_chars:,} (RLM_BASH_MAX_COMMAND_CHARS): put it in a script")
        if gate.deadline_s is not None and not 0 < gate.deadline_s <= max_deadline_s:
            raise ValueError(f"gate {gate.name!r}: deadline_s={gate.deadline_s:g} must be over 0 and at most "
                             f"{max_deadline_s:g} s (RLM_GATE_MAX_DEADLINE_S)")
