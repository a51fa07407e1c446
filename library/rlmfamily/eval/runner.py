"""The runner: every (task, condition, repeat) once, in a fresh workspace, under one spend cap.

Attempts run in a fixed order, repeat by repeat, and within a repeat task by task with every
condition in turn, so matched repeats of two conditions are as close in time as they can be.
Before an attempt starts, the experiment's allowance (``rlmfamily.budget``, keyed ``experiment`` in
``DIR/budget.sqlite3``, the only limit ``--max-usd``) admits it: a spent or unknown allowance
refuses, and the experiment stops there. The attempt's own run gets what is left as its
``max_usd``, so the library admits each of its calls (root turns, sub-calls, children's calls)
against the cap before making it; like every run, its final-answer request may pass it by one call.
Afterwards the attempt's entry is settled with what the attempt used (or left unknown).

A killed run leaves its last attempt without a record: the next run redoes that attempt in a new
try folder, and first settles the killed try's entry from the try's own budget when every call of
it is known (otherwise it stays unknown, and under a cap blocks further attempts until reconciled).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlmfamily.budget import Budget, BudgetLedger, BudgetLimits
from rlmfamily.context import Context
from rlmfamily.errors import BudgetError, BudgetLimitsMismatch, MissingAPIKey, RLMError
from rlmfamily.eval.conditions import Condition
from rlmfamily.eval.errors import EvalError, SpendCapRequired
from rlmfamily.eval.generate import generate
from rlmfamily.eval.graders import Grade, grade
from rlmfamily.eval.hosted import check_hosted, run_hosted
from rlmfamily.eval.pack import Pack, Task, tree_digest
from rlmfamily.eval.scripts import check_scripts, script_for
from rlmfamily.eval.store import RECORD_SCHEMA, ResultsStore, attempt_key
from rlmfamily.eval.usage import attempt_usage
from rlmfamily.providers.base import PriceTable, Provider, Usage, usd_cost_known
from rlmfamily.providers.scripted import ScriptedProvider
from rlmfamily.session import RunResult, Session
from rlmfamily.settings import RLMSettings, load_settings

EXPERIMENT_ROOT = "experiment"  # the allowance's key in DIR/budget.sqlite3
MAX_REPEATS = 50
MAX_ANSWER_PREVIEW_CHARS = 2_000  # of an answer kept in its record (the trajectory has it whole)
ANSWER_FORMAT = {
    "coding": ("The corpus is the repository you work in, and your code's working directory is its root. Change "
               "the files in place (python: open() with relative paths; python-bash: bash.run or the bash tool), "
               "then call final_answer with a one-line summary."),
    "review": ("Answer with final_answer(a JSON list of findings), each {\"path\", \"line\", \"severity\" (info, "
               "low, medium, high or critical), \"class\", \"message\"}, line 1 being a file's first line; an "
               "empty list when there is nothing to report."),
    "analysis": "Answer with final_answer(text), citing path:line for what you rely on.",
    "investigation": "Answer with final_answer(text), citing path:line for what you rely on.",
}


def question_of(task: Task) -> str:
    return f"{task.spec.instruction.strip()}\n\n{ANSWER_FORMAT[task.spec.kind]}"


def refuse_unpriced_or_uncapped(conditions: list[Condition], max_usd: float | None) -> None:
    """Before anything runs: a paid condition needs a spend cap, and a model whose cost the cap can count."""
    paid = [c.name for c in conditions if c.paid]
    if paid and max_usd is None:
        raise SpendCapRequired(f"condition(s) {', '.join(paid)} call a paid model; give --max-usd X, the most the "
                               "whole experiment may spend (offline conditions need none)", setting="max_usd")
    for condition in conditions:
        if condition.provider == "hosted":
            if not condition.usage_command:
                raise SpendCapRequired(f"condition {condition.name} is hosted: give it usage_command (the operator's "
                                       "`specialists usage --json --job {task_id}`), so the spend cap can count what "
                                       "each task cost", setting="usage_command")
            if not os.environ.get(condition.api_key_env or ""):
                raise MissingAPIKey(f"condition {condition.name}: the customer key's variable {condition.api_key_env} "
                                    "is not set", setting="api_key_env")
        elif condition.paid:
            provider = _paid_provider(condition, _settings_for(condition, None, Path("."), Path("."), None))
            if not usd_cost_known(provider, condition.model or ""):
                raise SpendCapRequired(f"condition {condition.name}: model {condition.model!r} has no price, so the "
                                       "spend cap cannot count its calls; add prices_usd_per_mtok to the condition",
                                       setting="prices_usd_per_mtok")


class HostedFailed(EvalError):
    code = "eval_hosted_failed"


@dataclass
class Summary:
    planned: int
    ran: int = 0
    skipped: int = 0  # finished before (a resumed run)
    stopped: str | None = None  # why the experiment stopped before its last attempt
    records: list[dict[str, Any]] = field(default_factory=list)


class Experiment:
    def __init__(self, pack: Pack, conditions: list[Condition], *, repeats: int, results: Path,
                 max_usd: float | None, progress: Callable[[str], None] = lambda line: None) -> None:
        if not 1 <= repeats <= MAX_REPEATS:
            raise RLMError(f"--repeats {repeats}: between 1 and {MAX_REPEATS} (MAX_REPEATS)", setting="repeats")
        refuse_unpriced_or_uncapped(conditions, max_usd)
        for condition in conditions:
            check_scripts(pack.tasks, condition)
            if condition.provider == "hosted":
                check_hosted(pack.tasks, condition)
        self.pack, self.conditions, self.repeats, self.max_usd = pack, conditions, repeats, max_usd
        self.store = ResultsStore(results)
        self.progress = progress

    def manifest(self) -> dict[str, Any]:
        return {"pack": str(self.pack.folder), "pack_name": self.pack.name, "pack_digest": self.pack.digest,
                "tasks": [t.id for t in self.pack.tasks], "conditions": [c.to_dict() for c in self.conditions],
                "repeats": self.repeats, "max_usd": self.max_usd, "created_at": time.time(),
                "offline": all(not c.paid for c in self.conditions),
                "rlm_environment": sorted(k for k in os.environ if k.startswith("RLM_") and k != "RLM_DATA_DIR")}

    def plan(self) -> list[tuple[Task, Condition, int]]:
        return [(t, c, r) for r in range(1, self.repeats + 1) for t in self.pack.tasks for c in self.conditions]

    def run(self) -> Summary:
        resumed = self.store.open(self.manifest())
        # Names this experiment in what it sends (a hosted attempt's message id), the same after a restart.
        self.experiment_id = hashlib.sha256(json.dumps(self.store.manifest(), sort_keys=True).encode()).hexdigest()[:16]
        ledger = BudgetLedger(self.store.budget_path)
        if resumed:
            self._raise_cap(ledger)
        budget = Budget(ledger, EXPERIMENT_ROOT, BudgetLimits(max_usd=self.max_usd))
        if resumed:
            self._settle_interrupted(budget)
        plan = self.plan()
        summary = Summary(planned=len(plan))
        for index, (task, condition, repeat) in enumerate(plan, 1):
            key = attempt_key(task.id, condition.name, repeat)
            if self.store.has(key):
                summary.skipped += 1
                continue
            folder = self.store.next_try(key)
            try:
                entry = budget.admit(f"attempt:{key}:{folder.name}")
            except BudgetError as exc:
                folder.rmdir()
                summary.stopped = f"[{exc.code}] {exc.message}"
                self.progress(f"stopped before {key}: the experiment's spend cap refused it: {exc.message}")
                break
            record = self._attempt(task, condition, repeat, key, folder, budget)
            _settle(budget, entry, record)
            self.store.write(record)
            summary.ran += 1
            summary.records.append(record)
            self.progress(_progress_line(index, len(plan), record))
        return summary

    def _attempt(self, task: Task, condition: Condition, repeat: int, key: str, folder: Path,
                 budget: Budget) -> dict[str, Any]:
        record: dict[str, Any] = {"schema": RECORD_SCHEMA, "key": key, "task": task.id, "kind": task.spec.kind,
                                  "condition": condition.name, "repeat": repeat, "try": folder.name,
                                  "started_at": time.time(), "cost_basis": condition.cost_basis(),
                                  "tokens_basis": "scripted estimate (4 characters a token)" if not condition.paid
                                  else "reported by the provider"}
        workspace = folder / "workspace"
        started = time.monotonic()
        try:
            reference = self._prepare(task, workspace, record)
            if condition.provider == "hosted":
                answer, ran = self._hosted(task, condition, workspace, record)
            else:
                answer, ran = self._local(task, condition, folder, reference, budget, record)
        except RLMError as exc:
            record["error"] = exc.to_dict()
            answer, ran = None, False
        record["run_s"] = round(time.monotonic() - started, 4)
        graded_at = time.monotonic()
        container_settings = (_settings_for(condition, task, folder / "data", workspace, None)
                              if condition.kernel == "container" else None)  # graded in the attempt's image
        outcome = (grade(task, answer=answer, workspace=workspace, container_settings=container_settings) if ran
                   else Grade(False, 0.0, {"reason": "the run did not start"}))
        record["grade_s"] = round(time.monotonic() - graded_at, 4)
        record["wall_s"] = round(record["run_s"] + record["grade_s"], 4)
        record |= {"accepted": outcome.accepted, "score": outcome.score, "grade": outcome.detail,
                   "finished_at": time.time()}
        if "usage" not in record:
            record["usage"] = attempt_usage(folder / "data")
        return record

    def _local(self, task: Task, condition: Condition, folder: Path, reference: str | None, budget: Budget,
               record: dict[str, Any]) -> tuple[str | None, bool]:
        """The library's own session over the workspace: what the answer was, and whether the run happened."""
        workspace = folder / "workspace"
        remaining = None if self.max_usd is None else max(0.0, self.max_usd - budget.snapshot().usd)
        settings = _settings_for(condition, task, folder / "data", workspace, remaining)
        provider = _provider(task, condition, settings, reference)
        record |= _run_facts(None, provider)
        context = Context.from_repository(workspace, settings)
        session = Session(context=context, provider=provider, settings=settings,
                          kernel_factory=_kernel_factory(workspace), model=condition.model)
        result = session.run(question_of(task))
        record |= _run_facts(result, provider)
        record["cut_by_spend_cap"] = _cut_by_cap(result, remaining)
        return result.answer, True

    def _hosted(self, task: Task, condition: Condition, workspace: Path, record: dict[str, Any]) -> tuple[str | None, bool]:
        """The task through the running service, as a customer sends it (rlmfamily/eval/hosted.py)."""
        token = os.environ.get(condition.api_key_env or "", "")
        try:
            outcome = run_hosted(task, condition, workspace, token=token, question=task.spec.instruction.strip(),
                                 message_id=f"eval-{self.experiment_id}-{record['key']}")
        except Exception as exc:  # noqa: BLE001 - the service refused, the stream broke, the deadline passed
            raise HostedFailed(f"the hosted task failed: {type(exc).__name__}: {str(exc)[:500]}") from None
        record |= _run_facts(None, None) | {"hosted": outcome.hosted, "usage": outcome.usage,
                                            "stop_reason": outcome.hosted["stop_reason"],
                                            "turns": outcome.hosted["turns"] or 0,
                                            "semantic_queries": outcome.hosted["semantic_calls_used"] or 0,
                                            "answer_preview": None if outcome.answer is None
                                            else outcome.answer[:MAX_ANSWER_PREVIEW_CHARS],
                                            "cut_by_spend_cap": False}
        return outcome.answer, True

    def _prepare(self, task: Task, workspace: Path, record: dict[str, Any]) -> str | None:
        """The attempt's pinned input, fresh: a copy of the task's folder, or a generated repository."""
        spec = task.spec.input
        reference = task.spec.reference.answer
        if spec.workspace is not None:
            shutil.copytree(task.path(spec.workspace), workspace, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            assert spec.generator is not None
            made = generate(spec.generator.files, spec.generator.seed, workspace)
            record["generated"] = {"files": made.files, "seed": spec.generator.seed}
            reference = (f"The production upload retry limit is {made.answer_value}, set in "
                         f"{made.answer_path}:6 (it overrides settings/base.py).")
        record["input_digest"] = tree_digest(workspace)
        return reference

    def _raise_cap(self, ledger: BudgetLedger) -> None:
        """The same experiment continued with a higher ``--max-usd`` (as a spent cap's stop message advises):
        its allowance is raised and the raise recorded in experiment.json. A lower or removed cap is refused."""
        before = self.store.manifest().get("max_usd")
        if before == self.max_usd or before is None or EXPERIMENT_ROOT not in ledger.roots():
            return  # the same cap, or an offline experiment (no cap): Budget checks the rest
        if self.max_usd is None or self.max_usd < before:
            raise BudgetLimitsMismatch(
                f"{self.store.folder} was run under --max-usd {before:g}; continue it with that cap or a higher one "
                f"(given: {'none' if self.max_usd is None else f'{self.max_usd:g}'})", setting="max_usd")
        ledger.raise_usd_limit(EXPERIMENT_ROOT, self.max_usd)
        self.store.record_cap_raised(before, self.max_usd)
        self.progress(f"the spend cap is raised from ${before:g} to ${self.max_usd:g} for this experiment "
                      f"(recorded in {self.store.manifest_path.name})")

    def _settle_interrupted(self, budget: Budget) -> None:
        for entry in budget.ledger.entries(EXPERIMENT_ROOT):
            if entry.state != "unknown" or not entry.purpose.startswith("attempt:"):
                continue
            _, key, try_name = entry.purpose.split(":")
            data = self.store.work / key / try_name / "data"
            used = attempt_usage(data)
            if used["unknown_usage_calls"] == 0 and used["cost_usd"] is not None:
                budget.ledger.reconcile(entry.id, tokens=used["input_tokens"] + used["output_tokens"],
                                        usd=used["cost_usd"], reason=f"read from the interrupted try's own budget "
                                        f"({data}): every call of it is known")
                self.progress(f"interrupted {key} ({try_name}): its usage is known and counted; it runs again")
            else:
                self.progress(f"interrupted {key} ({try_name}): {used['unknown_usage_calls']} call(s) of unknown "
                              f"usage; the experiment's entry {entry.id} stays unknown (rlm --data-dir "
                              f"{self.store.folder} usage --reconcile {entry.id} ... once checked)")


def _settle(budget: Budget, entry: int, record: dict[str, Any]) -> None:
    used = record["usage"]
    if used["unknown_usage_calls"]:
        budget.mark_unknown(entry, f"{used['unknown_usage_calls']} call(s) of {record['key']} have unknown usage")
        return
    budget.settle(entry, Usage(used["input_tokens"], used["output_tokens"], used["cost_usd"]))


def _cut_by_cap(result: RunResult, remaining: float | None) -> bool:
    limits = result.budget.limits
    return (remaining is not None and result.stop_reason == "budget_exhausted" and limits.max_usd is not None
            and result.budget.usd >= limits.max_usd)


def _run_facts(result: RunResult | None, provider: Provider | None) -> dict[str, Any]:
    if result is None:
        return {"stop_reason": None, "answer_preview": None, "run_id": None, "turns": 0, "semantic_queries": 0,
                "subcalls_cached": 0, "child_runs": 0, "cancellations": 0, "retries": None,
                "peak_memory_bytes": None}
    children = result.extra.get("children") or []
    attempts = getattr(provider, "attempts", None)
    calls = getattr(provider, "calls", None)
    retries = (attempts - sum(calls.values()) if attempts is not None and calls is not None
               else 0 if isinstance(provider, ScriptedProvider) else None)
    return {"stop_reason": result.stop_reason, "run_id": result.run_id, "turns": result.turns,
            "answer_preview": None if result.answer is None else result.answer[:MAX_ANSWER_PREVIEW_CHARS],
            "run_error": result.error, "semantic_queries": result.subcalls, "subcalls_cached": result.subcalls_cached,
            "child_runs": len(children),
            "cancellations": sum(1 for c in children if isinstance(c, dict) and c.get("state") == "cancelled"),
            "retries": retries,  # the root process's provider; children's retries are not counted
            "peak_memory_bytes": None}  # not measured per attempt (one process runs them all)


def _settings_for(condition: Condition, task: Task | None, data: Path, workspace: Path,
                  max_usd: float | None) -> RLMSettings:
    limits = task.spec.limits if task is not None else None
    overrides: dict[str, Any] = {
        "data_dir": data, "kernel": condition.kernel, "profile": condition.profile, "protocol": condition.protocol,
        "memoise_subcalls": False, "max_usd": max_usd, "prices_usd_per_mtok": condition.prices_usd_per_mtok,
        "temperature": condition.temperature, "max_completion_tokens": condition.max_completion_tokens,
    }
    if condition.paid:
        overrides |= {"provider": condition.provider, "model": condition.model, "base_url": condition.base_url,
                      "api_key_env": condition.api_key_env}
    if limits is not None:
        overrides |= {"max_turns": limits.max_turns, "max_calls": limits.max_calls, "max_tokens": limits.max_tokens,
                      "max_run_s": limits.max_run_s, "final_reserve_tokens": min(50_000, limits.max_tokens // 4)}
    if condition.profile == "python-bash" or condition.kernel == "container":
        overrides["bash_workspace"] = workspace  # the container mounts it
    return load_settings(**overrides)


def _provider(task: Task, condition: Condition, settings: RLMSettings, reference: str | None) -> Provider:
    if condition.paid:
        return _paid_provider(condition, settings)
    script, folder = script_for(task, condition, reference_answer=reference)
    return ScriptedProvider(script, prices=PriceTable.load(settings.prices_usd_per_mtok, None),
                            source=f"{condition.name}:{task.id}", folder=folder)


def _paid_provider(condition: Condition, settings: RLMSettings) -> Provider:
    from rlmfamily.providers.select import build_provider

    return build_provider(settings, PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file))


def _kernel_factory(workspace: Path) -> Callable[..., Any]:
    """The default kernels, with the host kernel's working directory in the attempt's workspace."""
    from rlmfamily.composition import default_kernel_factory

    def factory(name: str, settings: RLMSettings, run_dir: Path, run_id: str, **kwargs: Any) -> Any:
        if name != "host":
            return default_kernel_factory(name, settings, run_dir, run_id, **kwargs)
        from rlmfamily.a2a.run import secret_env_names
        from rlmfamily.kernels.host import HostKernel

        hidden = {settings.key_env} | secret_env_names(settings)
        env = {k: v for k, v in os.environ.items() if k not in hidden}
        return HostKernel(limits=settings.kernel_limits(), cwd=workspace, env=env)

    return factory


def _progress_line(index: int, total: int, record: dict[str, Any]) -> str:
    verdict = "accepted" if record["accepted"] else "rejected"
    score = "-" if record["score"] is None else f"{record['score']:.2f}"
    cost = record["usage"]["cost_usd"]
    usd = "unknown" if cost is None else f"${cost:.4f}"
    error = f" error {record['error']['code']}" if "error" in record else ""
    return (f"[{index}/{total}] {record['task']} {record['condition']} r{record['repeat']}: {verdict} (score {score}, "
            f"{record['stop_reason'] or 'no run'}) {record['wall_s']:.1f} s {usd}{error}")
