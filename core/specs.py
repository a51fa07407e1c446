"""Specialist specs: the pydantic schema of ``specs/*.yaml`` and the loader that validates them.

One YAML file per specialist; its file name (without ``.yaml``) is its id. The
schema is closed (unknown fields are errors, so a typo cannot silently drop a
limit). An invalid spec stops start-up with a ``SpecInvalid`` error naming the
file, the field and the reason.

A hosted RLM specialist (executor ``rlm``) also names its model route, its
prompt, its pricing (``fixed``, or ``metered``: a base plus a price per semantic
call, never above the tariff that is reserved), every limit of a run (turns,
semantic calls, sub-call concurrency, prompt and response characters, output
bytes, deadline, Monty limits), and its sandbox. The sandbox is clamped: depth 0
(no children), no outbound A2A, no shell, no writes; a spec asking for more is
refused here, at load time, never discovered by a customer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.errors import ServiceError

SPEC_ID_RE = r"^[a-z0-9][a-z0-9-]{0,62}$"
# A media type, or a "type/*" or "*/*" wildcard.
_MEDIA_RANGE_RE = re.compile(r"^(\*/\*|[a-z0-9][a-z0-9.+-]*/(\*|[a-z0-9][a-z0-9.+-]*))$")
MAX_SPEC_FILE_BYTES = 256 * 1024
MAX_SPECS = 200

# Executors a spec may name. "conformance" runs in-process (no model, tariff 0);
# "rlm" is run by workers (the dispatch issue) with the specialist's model route;
# "scripted" is run by workers too, without a model: it runs the steps, delays and failures the
# message's data part scripts (the drill specialist, specs/drill.yaml).
Executor = Literal["conformance", "rlm", "scripted"]


# How a resend is recognised (docs/SPECIALISTS.md): ``message_id``, by the customer's messageId and content, or by
# an ``Idempotency-Key`` header; ``key_only``, by the header alone (a reused messageId is a new task).
IdempotencyPolicy = Literal["message_id", "key_only"]


class SpecInvalid(ServiceError):
    code = "spec_invalid"


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


MediaRange = Annotated[str, Field(min_length=3, max_length=127)]


class SkillSpec(_Closed):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    name: str = Field(min_length=1, max_length=120)
    description: str = Field(min_length=1, max_length=2000)
    tags: list[Annotated[str, Field(min_length=1, max_length=40)]] = Field(default_factory=list, max_length=20)
    examples: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(default_factory=list, max_length=20)


# Hard ceilings of every hosted specialist (issue 7). A spec may ask for less, never more.
MAX_SEMANTIC_CALLS = 16
MAX_SUBCALL_CONCURRENCY = 2
MAX_PROMPT_CHARS = 32_000
MAX_RESPONSE_CHARS = 4_000
# A job's deadline travels in the signed job body, which accepts at most an hour.
MAX_DEADLINE_S = 3600
ROUTE_NAME_RE = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class MontyLimitsSpec(_Closed):
    """The sandbox's own limits for one step of the model's code (pydantic-monty)."""

    step_timeout_s: float = Field(default=20.0, gt=0, le=300, description="Sandbox execution seconds per step.")
    max_memory_bytes: int = Field(default=128 * 1024 * 1024, ge=1024 * 1024, le=1024 * 1024 * 1024)
    max_recursion_depth: int = Field(default=200, ge=10, le=10_000)
    max_suspensions_per_step: int = Field(
        default=5_000, ge=10, le=100_000, description="Host calls, lookups and imports per step."
    )
    max_printed_bytes_per_step: int = Field(default=65_536, ge=1024, le=1024 * 1024)
    max_sleep_s_per_step: float = Field(default=1.0, gt=0, le=60)


class LimitsSpec(_Closed):
    """What one message may carry (admission) and what one run may use (the worker).

    The HTTP body limit is a service setting. Run limits have defaults so that
    specs of executors without a model (conformance) need not state them.
    """

    max_input_bytes: int = Field(
        default=256 * 1024, ge=1, le=64 * 1024 * 1024,
        description="The whole message as received, its metadata aside, in protobuf's encoding."
    )
    max_parts: int = Field(default=16, ge=1, le=1000)
    max_metadata_bytes: int = Field(default=8 * 1024, ge=0, le=1024 * 1024)
    max_output_bytes: int = Field(
        default=64 * 1024, ge=100, le=1024 * 1024, description="UTF-8 bytes of the answer (report and findings)."
    )
    deadline_s: float = Field(default=300.0, ge=5, le=MAX_DEADLINE_S, description="Wall-clock seconds of one run.")
    answer_reserve_s: float = Field(
        default=15.0, ge=1, le=600, description="Seconds kept back from the deadline to ask for the final answer."
    )
    max_turns: int = Field(default=12, ge=1, le=50, description="Root-model turns before the final request.")
    max_semantic_calls: int = Field(default=MAX_SEMANTIC_CALLS, ge=0, le=MAX_SEMANTIC_CALLS)
    max_subcall_concurrency: int = Field(default=MAX_SUBCALL_CONCURRENCY, ge=1, le=MAX_SUBCALL_CONCURRENCY)
    max_prompt_chars: int = Field(default=MAX_PROMPT_CHARS, ge=100, le=MAX_PROMPT_CHARS)
    max_response_chars: int = Field(default=MAX_RESPONSE_CHARS, ge=100, le=MAX_RESPONSE_CHARS)
    semantic_call_timeout_s: float = Field(default=60.0, gt=0, le=600)
    max_cpu_s: float | None = Field(
        default=None, gt=0, le=86_400.0,
        description="CPU seconds one run's processes may use together (workers/cpu_share.py); none: the "
        "worker's SPECIALISTS_WORKER_JOB_MAX_CPU_S. Past it the run fails with job_cpu_exceeded."
    )
    monty: MontyLimitsSpec = Field(default_factory=MontyLimitsSpec)

    @model_validator(mode="after")
    def _reserve_inside_deadline(self) -> LimitsSpec:
        if self.answer_reserve_s >= self.deadline_s:
            raise ValueError(
                f"answer_reserve_s ({self.answer_reserve_s:g}) must be below deadline_s ({self.deadline_s:g}), "
                "or the run would have no time to investigate"
            )
        return self


def metered_credits(base_credits: int, credits_per_semantic_call: int, semantic_calls: int,
                    credits_per_cpu_second: int = 0, cpu_seconds: float = 0.0) -> int:
    """The metered price of a run that answered ``semantic_calls`` calls and used ``cpu_seconds`` CPU seconds (its
    processes together, ``workers.cpu_share``; each second begun counts whole): the one place the formula is
    written. The CPU term is off (0) unless a spec prices it. The charge rule (``taskstate.charge.charged_credits``)
    caps the price by the reservation; a spec's check bounds its most by the tariff."""
    return (base_credits + credits_per_semantic_call * max(0, semantic_calls)
            + credits_per_cpu_second * math.ceil(max(0.0, cpu_seconds)))


class PricingSpec(_Closed):
    """What a task costs. ``fixed`` settles the tariff; ``metered`` settles base + per semantic call, never above
    the tariff. The rule itself is ``taskstate.charge.charged_credits``."""

    mode: Literal["fixed", "metered"] = "fixed"
    base_credits: int | None = Field(default=None, ge=0, le=1_000_000_000)
    credits_per_semantic_call: int | None = Field(default=None, ge=0, le=1_000_000_000)
    credits_per_cpu_second: int | None = Field(
        default=None, ge=0, le=1_000_000_000,
        description="Metered only, optional: credits per CPU second the run's processes used (each begun second "
        "counts); absent: CPU is not priced. A spec that prices CPU states limits.max_cpu_s."
    )

    @model_validator(mode="after")
    def _fields_of_the_mode(self) -> PricingSpec:
        if self.mode == "fixed":
            stated = [name for name in ("base_credits", "credits_per_semantic_call", "credits_per_cpu_second")
                      if getattr(self, name) is not None]
            if stated:
                raise ValueError(f"fixed pricing settles the tariff: remove {' and '.join(stated)}")
        metered_fields = (self.base_credits, self.credits_per_semantic_call)
        if self.mode == "metered" and any(value is None for value in metered_fields):
            raise ValueError("metered pricing needs base_credits and credits_per_semantic_call")
        return self


class SandboxSpec(_Closed):
    """What the model's code may reach. Hosted specialists are clamped; asking for more is refused."""

    kernel: str = "monty"
    max_child_depth: int = 0
    a2a: bool = False
    shell: bool = False
    writes: bool = False

    @field_validator("kernel")
    @classmethod
    def _monty_only(cls, value: str) -> str:
        if value != "monty":
            raise ValueError(
                f"kernel {value!r} is refused: hosted specialists run the model's code in the Monty sandbox only "
                "(the host kernel would give it a shell on the worker)"
            )
        return value

    @field_validator("max_child_depth")
    @classmethod
    def _no_children(cls, value: int) -> int:
        if value != 0:
            raise ValueError(
                f"max_child_depth {value} is refused: hosted specialists run at depth 0, children (rlm.run) "
                "are not available on workers"
            )
        return value

    @field_validator("a2a")
    @classmethod
    def _no_a2a(cls, value: bool) -> bool:
        if value:
            raise ValueError("a2a: true is refused: hosted specialists make no outbound A2A calls")
        return value

    @field_validator("shell")
    @classmethod
    def _no_shell(cls, value: bool) -> bool:
        if value:
            raise ValueError("shell: true is refused: hosted specialists have no shell")
        return value

    @field_validator("writes")
    @classmethod
    def _no_writes(cls, value: bool) -> bool:
        if value:
            raise ValueError("writes: true is refused: hosted specialists are read-only (the bundle is never written)")
        return value


class SpecialistSpec(_Closed):
    id: str = Field(pattern=SPEC_ID_RE)
    name: str = Field(min_length=1, max_length=120)
    description: str = Field(min_length=1, max_length=4000)
    version: str = Field(default="1.0.0", pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")
    executor: Executor
    skill: SkillSpec
    tariff_credits: int = Field(ge=0, le=1_000_000_000, description="Credits reserved per task, in integers.")
    input_modes: list[MediaRange] = Field(min_length=1, max_length=50)
    output_modes: list[MediaRange] = Field(min_length=1, max_length=50)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    streaming: bool = True
    push_notifications: bool = Field(
        default=True,
        description="Whether this specialist sends A2A push notifications (when the service has "
        "SPECIALISTS_PUSH_SIGNING_SECRETS): its card's capability, the config methods and a send's configuration.",
    )
    idempotency: IdempotencyPolicy = Field(
        default="message_id",
        description="message_id: a resend with the same messageId (or Idempotency-Key) and content replays the "
        "first task; key_only: only the Idempotency-Key header makes a send idempotent.",
    )
    # --- hosted RLM specialists (executor "rlm") ---
    pricing: PricingSpec = Field(default_factory=PricingSpec)
    model_route: str | None = Field(
        default=None, pattern=ROUTE_NAME_RE, description="Name of an operator-configured model route."
    )
    prompt: str | None = Field(default=None, min_length=1, max_length=20_000)
    answer_kind: Literal["findings", "cited_answer"] = Field(
        default="cited_answer",
        description="findings: a data artifact of {path, line, severity, message}; cited_answer: text citing where.",
    )
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)

    @field_validator("input_modes", "output_modes")
    @classmethod
    def _media_ranges(cls, value: list[str]) -> list[str]:
        for mode in value:
            if not _MEDIA_RANGE_RE.match(mode):
                raise ValueError(f"{mode!r} is not a media type such as text/plain, image/* or */*")
        if len(set(value)) != len(value):
            raise ValueError("lists a media type twice")
        return value

    @model_validator(mode="after")
    def _in_process_executors_are_free(self) -> SpecialistSpec:
        # The in-process runner does not settle reservations, so it only runs free work.
        if self.executor == "conformance" and self.tariff_credits != 0:
            raise ValueError("executor 'conformance' runs in-process and settles nothing: tariff_credits must be 0")
        return self

    @model_validator(mode="after")
    def _paid_work_is_never_charged_twice(self) -> SpecialistSpec:
        # An agent that retries after a timeout resends the same messageId, rarely with a key: under key_only that
        # resend would be a second task and a second charge.
        if self.idempotency == "key_only" and self.tariff_credits > 0:
            raise ValueError(
                f"idempotency: key_only is refused for a paid specialist (tariff_credits {self.tariff_credits}): "
                "a client that resends after a timeout without an Idempotency-Key would be charged twice; "
                "use idempotency: message_id"
            )
        return self

    @model_validator(mode="after")
    def _only_rlm_runs_a_model(self) -> SpecialistSpec:
        # An rlm spec without a route or prompt still loads (the edge can list and admit it); the worker
        # refuses to start with it (``require_runnable``), so no customer ever reaches a half-made specialist.
        if self.executor != "rlm" and (self.model_route is not None or self.prompt is not None):
            raise ValueError(f"executor {self.executor!r} runs no model: remove model_route and prompt")
        return self

    @model_validator(mode="after")
    def _metered_price_fits_the_reservation(self) -> SpecialistSpec:
        pricing = self.pricing
        if pricing.mode == "metered":
            assert pricing.base_credits is not None and pricing.credits_per_semantic_call is not None
            per_cpu_second = pricing.credits_per_cpu_second or 0
            if per_cpu_second and self.limits.max_cpu_s is None:
                raise ValueError("pricing: credits_per_cpu_second needs limits.max_cpu_s, so that the reserved "
                                 "tariff can cover the most a task's CPU can cost")
            most = metered_credits(pricing.base_credits, pricing.credits_per_semantic_call,
                                   self.limits.max_semantic_calls, per_cpu_second, self.limits.max_cpu_s or 0.0)
            if most > self.tariff_credits:
                cpu_term = (f" + credits_per_cpu_second ({per_cpu_second}) x limits.max_cpu_s "
                            f"({self.limits.max_cpu_s:g})" if per_cpu_second else "")  # only where CPU is priced
                raise ValueError(
                    f"pricing: metered base_credits ({pricing.base_credits}) + credits_per_semantic_call "
                    f"({pricing.credits_per_semantic_call}) x limits.max_semantic_calls "
                    f"({self.limits.max_semantic_calls}){cpu_term} = {most} is above tariff_credits "
                    f"({self.tariff_credits}); the reserved tariff must cover the most a task can cost"
                )
        return self


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec and where it came from (the card's Last-Modified is the file's)."""

    spec: SpecialistSpec
    path: Path
    modified_at: datetime


def require_runnable(loaded: LoadedSpec) -> None:
    """Refuse an ``rlm`` spec a worker could not run (no model route or no prompt), naming file and field."""
    spec = loaded.spec
    if spec.executor != "rlm":
        return
    for name in ("model_route", "prompt"):
        if getattr(spec, name) is None:
            raise SpecInvalid(f"{loaded.path}: {name}: executor 'rlm' needs a {name.replace('_', ' ')} to run on a worker")


def media_type_matches(media_type: str, ranges: list[str]) -> bool:
    """Whether ``media_type`` (parameters ignored) falls in one of ``ranges``."""
    bare = media_type.split(";", 1)[0].strip().lower()
    kind = bare.split("/", 1)[0]
    for candidate in ranges:
        if candidate == "*/*" or candidate == bare or candidate == f"{kind}/*":
            return True
    return False


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "(file)"
        problems.append(f"{where}: {item['msg']}")
    return "; ".join(problems)


def load_spec(path: Path) -> LoadedSpec:
    """Read and validate one spec file; the id must equal the file name."""
    try:
        raw_bytes = path.read_bytes()
    except OSError as exc:
        raise SpecInvalid(f"{path}: cannot be read ({exc.strerror})") from None
    if len(raw_bytes) > MAX_SPEC_FILE_BYTES:
        raise SpecInvalid(f"{path}: is {len(raw_bytes)} bytes; a spec file has at most {MAX_SPEC_FILE_BYTES}")
    try:
        document = yaml.safe_load(raw_bytes)
    except yaml.YAMLError as exc:
        raise SpecInvalid(f"{path}: is not valid YAML ({exc})") from None
    if not isinstance(document, dict):
        raise SpecInvalid(f"{path}: must be a YAML mapping of spec fields")
    try:
        spec = SpecialistSpec.model_validate(document)
    except ValidationError as exc:
        raise SpecInvalid(f"{path}: {_describe(exc)}") from None
    if spec.id != path.stem:
        raise SpecInvalid(f"{path}: id: is {spec.id!r} but the file is named {path.name}; they must match")
    modified_at = datetime.fromtimestamp(int(path.stat().st_mtime), timezone.utc)
    return LoadedSpec(spec=spec, path=path, modified_at=modified_at)


def load_specs(folder: Path) -> dict[str, LoadedSpec]:
    """All specs in ``folder`` by id. Any invalid file, or none at all, is an error."""
    if not folder.is_dir():
        raise SpecInvalid(f"{folder}: the specs folder does not exist (SPECIALISTS_SPECS_DIR)")
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise SpecInvalid(f"{folder}: holds no *.yaml spec (SPECIALISTS_SPECS_DIR)")
    if len(files) > MAX_SPECS:
        raise SpecInvalid(f"{folder}: holds {len(files)} specs; at most {MAX_SPECS} are served")
    return {loaded.spec.id: loaded for loaded in map(load_spec, files)}


class SkillUnknown(ServiceError):
    """A skill name no loaded spec publishes (or one several publish)."""

    code = "skill_unknown"


@dataclass(frozen=True)
class SkillCatalogue:
    """The skills the specs publish on their Agent Cards, and the specialist behind each.

    Operators name an entitlement by the card's skill, the name a customer sees (``review``); the ledger keeps
    it under the specialist's id (``reviewer``), which is what the edge reserves for a task. This is the one
    translation between the two, so the operator's commands speak of skills only.
    """

    specialist_by_skill: dict[str, tuple[str, ...]]  # skill id -> the specialists publishing it (normally one)
    folder: Path | None = None

    @classmethod
    def of(cls, specs: dict[str, LoadedSpec], folder: Path | None = None) -> "SkillCatalogue":
        by_skill: dict[str, list[str]] = {}
        for specialist_id, loaded in sorted(specs.items()):
            by_skill.setdefault(loaded.spec.skill.id, []).append(specialist_id)
        return cls({skill: tuple(ids) for skill, ids in sorted(by_skill.items())}, folder)

    def listed(self) -> str:
        return ", ".join(self.specialist_by_skill) or "none"

    def specialist_of(self, skill: str) -> str:
        """The specialist whose card publishes ``skill``; SkillUnknown (listing the valid skills) otherwise."""
        where = f" (SPECIALISTS_SPECS_DIR: {self.folder})" if self.folder else ""
        found = self.specialist_by_skill.get(skill)
        if found is None:
            named = [s for s, ids in self.specialist_by_skill.items() if skill in ids]
            hint = f"; {skill!r} is a specialist's id, its card's skill is {named[0]!r}" if named else ""
            raise SkillUnknown(
                f"no specialist publishes the skill {skill!r}{hint}. The skills are: {self.listed()}{where}"
            )
        if len(found) > 1:
            raise SkillUnknown(
                f"the skill {skill!r} is published by several specialists ({', '.join(found)}), so an entitlement "
                f"to it would be ambiguous; give each its own skill.id in its spec{where}",
                code="skill_ambiguous",
            )
        return found[0]

    def skill_of(self, specialist_id: str) -> str | None:
        """The skill a specialist's card publishes; None for an id no loaded spec has."""
        for skill, ids in self.specialist_by_skill.items():
            if specialist_id in ids:
                return skill
        return None
