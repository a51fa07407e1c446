"""The end of a run as the customer sees it: the answer as artifacts, the reasons, the output limit.

- ``findings`` specialists (the reviewer) answer ``{"summary": ..., "findings": [{path,
  line, severity, message}, ...]}``. A finding must cite a path of the bundle and a
  line inside it; anything else is dropped and counted (``findings_dropped``), so a
  customer never receives a claim about a file they did not send.
- ``cited_answer`` specialists (the analyst) answer text, or ``{"answer": ...,
  "citations": [{path, line}]}``; citations outside the bundle are dropped and counted.

Artifacts: a text ``report`` (what was found, and every limit that shaped the
run: refused semantic calls, an early stop, dropped findings) and, for the
reviewer, a ``findings`` data artifact. An answer over ``limits.max_output_bytes``
fails the task with ``output_too_large``; a run that ended without an answer fails
with the reason it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from core.specs import SpecialistSpec
from rlmfamily.session import RunResult
from workers.hosted_rlm.bundle import SpecialistTask

SEVERITIES = ("info", "low", "medium", "high", "critical")
MAX_FINDINGS = 200
MAX_MESSAGE_CHARS = 2000


@dataclass
class Verdict:
    """What the runner returns, before it becomes a ``RunOutcome``."""

    state: str  # completed | failed
    message: str
    report: str = ""
    findings: list[dict[str, Any]] | None = None
    code: str | None = None  # why it failed, machine-readable
    free: bool = False  # the service's own failure (e.g. a resume refused): the customer is charged nothing
    dropped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _lines_of(task: SpecialistTask) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in task.items:
        counts[item["path"]] = max(counts.get(item["path"], 0), item["text"].count("\n") + 1)
    return counts


def _parse(answer: str) -> Any:
    try:
        return json.loads(answer)
    except ValueError:
        return answer


def check_citation(raw: Any, lines: dict[str, int]) -> tuple[dict[str, Any] | None, str | None]:
    """A cited ``{path, line}`` that the bundle holds, or the reason it is dropped."""
    if not isinstance(raw, dict):
        return None, "malformed"
    path, line = raw.get("path"), raw.get("line")
    if not isinstance(path, str) or path not in lines:
        return None, "path_not_in_bundle"
    if isinstance(line, bool) or not isinstance(line, int) or not 1 <= line <= lines[path]:
        return None, "line_outside_file"
    return {"path": path, "line": line}, None


def _findings(value: Any, lines: dict[str, int], verdict: Verdict) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(value, dict) and isinstance(value.get("findings"), list):
        summary, raw_findings = str(value.get("summary") or ""), value["findings"]
    elif isinstance(value, list):
        summary, raw_findings = "", value
    else:
        verdict.notes.append("The answer held no findings list; it is reported as text.")
        return (value if isinstance(value, str) else json.dumps(value)), []
    kept: list[dict[str, Any]] = []
    for raw in raw_findings[:MAX_FINDINGS]:
        cited, reason = check_citation(raw, lines)
        if cited is not None:
            severity = str(raw.get("severity", "")).lower()
            message = raw.get("message")
            if severity not in SEVERITIES or not isinstance(message, str) or not message.strip():
                cited, reason = None, "malformed"
            else:
                cited.update(severity=severity, message=message.strip()[:MAX_MESSAGE_CHARS])
        if cited is None:
            assert reason is not None
            verdict.dropped[reason] = verdict.dropped.get(reason, 0) + 1
        else:
            kept.append(cited)
    if len(raw_findings) > MAX_FINDINGS:
        verdict.dropped["over_max_findings"] = len(raw_findings) - MAX_FINDINGS
    return summary, kept


def _cited_answer(value: Any, lines: dict[str, int], verdict: Verdict) -> str:
    if not isinstance(value, dict) or "answer" not in value:
        return value if isinstance(value, str) else json.dumps(value, indent=2)
    text = str(value["answer"])
    kept = []
    for raw in value.get("citations") or []:
        cited, reason = check_citation(raw, lines)
        if cited is None:
            assert reason is not None
            verdict.dropped[reason] = verdict.dropped.get(reason, 0) + 1
        else:
            kept.append(f"{cited['path']}:{cited['line']}")
    if kept:
        text += "\n\nWhere: " + ", ".join(kept)
    return text


def stop_note(spec: SpecialistSpec, result: RunResult) -> str | None:
    limits = spec.limits
    if result.stop_reason == "max_turns":
        return f"The run used all {limits.max_turns} turns (limits.max_turns) and was asked for its answer."
    if result.stop_reason == "deadline":
        return (
            f"The run reached its deadline ({limits.deadline_s:g} s, limits.deadline_s, less "
            f"{limits.answer_reserve_s:g} s kept for the answer) and was asked for its answer."
        )
    if result.stop_reason == "budget_exhausted":
        return "The run's inference allowance was used up and it was asked for its answer."
    return None


def refusal_notes(spec: SpecialistSpec, refusals: dict[str, int]) -> list[str]:
    limits = spec.limits
    notes = []
    if refusals.get("subcall_limit"):
        notes.append(
            f"{refusals['subcall_limit']} semantic call(s) were refused: this specialist makes at most "
            f"{limits.max_semantic_calls} per task (limits.max_semantic_calls)."
        )
    if refusals.get("prompt_too_large"):
        notes.append(
            f"{refusals['prompt_too_large']} semantic call(s) were refused: a prompt is at most "
            f"{limits.max_prompt_chars:,} characters (limits.max_prompt_chars)."
        )
    if refusals.get("batch_too_large"):
        notes.append(f"{refusals['batch_too_large']} semantic call(s) were refused: the batch was too large.")
    return notes


def verdict_of(spec: SpecialistSpec, task: SpecialistTask, result: RunResult, refusals: dict[str, int]) -> Verdict:
    """The customer's view of a finished ``RunResult``."""
    limits = spec.limits
    notes = refusal_notes(spec, refusals)
    early = stop_note(spec, result)
    if early:
        notes.append(early)
    if result.answer is None:
        if result.stop_reason == "error":
            message = f"The specialist could not finish: {result.error}."
            code = "run_error"
        else:
            message = (early or f"The run stopped ({result.stop_reason}).") + " It produced no answer."
            code = f"no_answer_{result.stop_reason}"
        return Verdict("failed", " ".join([message, *refusal_notes(spec, refusals)]), code=code, notes=notes)
    answer_bytes = len(result.answer.encode("utf-8"))
    if answer_bytes > limits.max_output_bytes:
        return Verdict(
            "failed",
            f"The answer is over {limits.max_output_bytes:,} bytes (limits.max_output_bytes); this specialist "
            "returns nothing longer. Ask a narrower question or send a smaller bundle.",
            code="output_too_large",
            notes=notes,
        )
    verdict = Verdict("completed", "", notes=notes)
    lines = _lines_of(task)
    value = _parse(result.answer)
    if spec.answer_kind == "findings":
        summary, verdict.findings = _findings(value, lines, verdict)
        body = [summary.strip()] if summary.strip() else []
        body.append(f"{len(verdict.findings)} finding(s):" if verdict.findings else "No findings.")
        body += [f"- {f['path']}:{f['line']} [{f['severity']}] {f['message']}" for f in verdict.findings]
        text = "\n".join(body)
        verdict.message = f"Review complete: {len(verdict.findings)} finding(s)."
    else:
        text = _cited_answer(value, lines, verdict)
        verdict.message = "Answered."
    if verdict.dropped:
        counts = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(verdict.dropped.items()))
        verdict.notes.append(f"Dropped {sum(verdict.dropped.values())} citation(s) that the bundle does not hold ({counts}).")
    verdict.report = text + ("\n\nNotes:\n" + "\n".join(f"- {n}" for n in verdict.notes) if verdict.notes else "")
    if verdict.notes:
        verdict.message += " " + " ".join(verdict.notes)
    return verdict
