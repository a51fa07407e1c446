"""Specialist specs: the pydantic schema of ``specs/*.yaml`` and the loader that validates them.

One YAML file per specialist; its file name (without ``.yaml``) is its id. The
schema is closed (unknown fields are errors, so a typo cannot silently drop a
limit) and grouped so later issues add sections (model routes, pricing, Monty
limits) without moving existing fields. An invalid spec stops start-up with a
``SpecInvalid`` error naming the file, the field and the reason.
"""

from __future__ import annotations

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
# "rlm" is run by workers (the dispatch issue) with the specialist's model route.
Executor = Literal["conformance", "rlm"]


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


class LimitsSpec(_Closed):
    """What one message to this specialist may carry. The HTTP body limit is a service setting."""

    max_input_bytes: int = Field(
        default=256 * 1024, ge=1, le=64 * 1024 * 1024, description="Sum of the message's part sizes."
    )
    max_parts: int = Field(default=16, ge=1, le=1000)
    max_metadata_bytes: int = Field(default=8 * 1024, ge=0, le=1024 * 1024)


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


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec and where it came from (the card's Last-Modified is the file's)."""

    spec: SpecialistSpec
    path: Path
    modified_at: datetime


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
