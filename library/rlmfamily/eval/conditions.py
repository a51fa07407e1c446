"""A condition: everything an attempt's run is fixed by, except the task (provider, model, sampling,
profile, kernel, protocol). Conditions are named in ``pack.toml`` (``[conditions.<name>]``) or in a
file given with ``--conditions-file``; ``rlm eval run --conditions A,B`` picks two or more.

``provider = "hosted"`` sends each task to a running service (rlmfamily/eval/hosted.py): ``url``,
``specialist``, ``api_key_env`` (the customer key's variable) and ``usage_command`` (the operator's
usage record of a task, which the spend cap counts).

``provider = "scripted"`` is offline: a scripted model (rlmfamily/eval/scripts.py) that makes a
known-good (``oracle``) or known-bad (``noop``) attempt, or plays a task's own script. Every other
provider is **paid**: the runner refuses it without a spend cap, and refuses a model without a price
(the cap could not be enforced on an unknown cost).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlmfamily.eval.errors import ConditionInvalid
from rlmfamily.providers.base import PriceTable

BUILTIN_SCRIPTS = ("oracle", "noop")


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    provider: Literal["scripted", "openai", "anthropic", "gemini", "hosted"]
    script: str | None = None  # scripted: oracle, noop, or NAME (each task's scripts/NAME.toml)
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = Field(None, pattern=r"^[A-Z_][A-Z0-9_]*$")
    temperature: float | None = Field(None, ge=0, le=2)
    max_completion_tokens: int | None = Field(None, ge=1)
    protocol: Literal["tools", "text", "auto"] = "tools"
    profile: Literal["python", "python-bash"] = "python"
    kernel: Literal["host", "monty", "container"] = "host"  # container: graded in the same image too
    prices_usd_per_mtok: dict[str, dict[str, float]] = Field(default_factory=dict)
    url: str | None = Field(None, pattern=r"^https?://[^/?#@]+(/[^?#@]*)?$")  # hosted: the service
    specialist: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")  # hosted: the specialist's id
    usage_command: list[str] = Field(default_factory=list)  # hosted: prints the task's usage as JSON; {task_id}
    deadline_s: float = Field(900, gt=0, le=7_200)  # hosted: one task, from send to its last event
    description: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Condition:
        if self.provider == "scripted" and not self.script:
            raise ValueError("a scripted condition names its script: oracle, noop, or a task script's name")
        if self.provider == "hosted":
            if not (self.url and self.specialist and self.api_key_env) or self.script or self.model:
                raise ValueError("a hosted condition names url, specialist and api_key_env (the customer key's "
                                 "variable), and no script or model (the service's route decides the model)")
            return self
        if self.provider != "scripted" and (self.script or not self.model):
            raise ValueError(f"a {self.provider} condition names a model and no script")
        return self

    @property
    def paid(self) -> bool:
        return self.provider != "scripted"

    def prices(self) -> PriceTable:
        return PriceTable.load(self.prices_usd_per_mtok, None)

    def cost_basis(self) -> str:
        """Where this condition's USD figures come from, said plainly in every record and the report."""
        if self.provider == "hosted":
            return ("the service's usage record (usage_command): its route's price table, an estimate, or the "
                    "endpoint's billing field; credits charged by the ledger beside it")
        if not self.paid:
            model = self.model or "scripted"
            return ("scripted: price table rates for its model (an estimate)" if self.prices().has(model)
                    else "scripted: no cost (0 USD)")
        if self.prices().has(self.model or ""):
            as_of = self.prices().as_of
            return f"estimate: list prices of the price table (as_of {as_of}) times reported tokens"
        return "provider billing field (usage.cost) where the endpoint reports it, else unknown"

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def parse_conditions(raw: dict[str, Any], *, source: str) -> dict[str, Condition]:
    conditions, problems = {}, []
    for name, body in raw.items():
        try:
            conditions[name] = Condition.model_validate({"name": name, **(body if isinstance(body, dict) else {})})
        except ValidationError as exc:
            for error in exc.errors():
                where = ".".join(str(p) for p in error["loc"]) or "(table)"
                problems.append(f"{source}: conditions.{name}.{where}: {error['msg']}")
    if problems:
        raise ConditionInvalid("conditions are invalid:\n  " + "\n  ".join(problems), problems=problems)
    return conditions


def load_conditions_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConditionInvalid(f"conditions file {path} cannot be read: {exc}") from None
    return dict(data.get("conditions", data))


def choose(available: dict[str, Condition], names: list[str]) -> list[Condition]:
    if len(names) < 1 or len(set(names)) != len(names):
        raise ConditionInvalid("--conditions names one or more distinct conditions, e.g. --conditions A,B")
    missing = [n for n in names if n not in available]
    if missing:
        raise ConditionInvalid(f"unknown condition(s) {', '.join(missing)}; the pack defines "
                               f"{', '.join(sorted(available)) or 'none'} (or give --conditions-file)")
    return [available[n] for n in names]
