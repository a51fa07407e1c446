"""The pack: tasks as data. Each task is a folder with a ``task.toml`` (schema below), validated at load.

A pack folder holds ``pack.toml`` (its name and its conditions, rlmfamily/eval/conditions.py) and
``tasks/<id>/task.toml``. A task declares its kind, its instruction, its input (a workspace folder or
a generator), its evaluator (how acceptance is decided from the output alone) and its limits. A
task's ``reference`` is what the scripted oracle of offline mode answers with; no grader reads it.
Every problem of every file is reported at once, naming the file and the field.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlmfamily.eval.errors import PackInvalid

MAX_TASKS = 500  # tasks in one pack
MAX_INPUT_FILES = 2_000  # files of one task's input folder
MAX_INPUT_BYTES = 8_000_000  # bytes of one task's input folder
MAX_GENERATED_FILES = 20_000  # files a generator may write (the larger investigation size is far below it)
SEVERITIES = ("info", "low", "medium", "high", "critical")
TASK_KINDS = ("coding", "review", "analysis", "investigation")
EVALUATOR_OF_KIND = {"coding": "tests", "review": "findings", "analysis": "answer", "investigation": "answer"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Limits(_Strict):
    """The run's bounds for every condition: the same task gets the same limits whatever runs it."""

    max_turns: int = Field(8, ge=1, le=50)
    max_calls: int = Field(40, ge=1, le=1_000)
    max_tokens: int = Field(400_000, ge=1_000)
    max_run_s: float = Field(300, gt=0, le=3_600)


class TestsEvaluator(_Strict):
    """Runs the task's tests in a fresh copy of the output workspace, with the protected files restored."""

    kind: Literal["tests"]
    command: list[str] = Field(default_factory=lambda: ["python", "-m", "unittest", "-q"], min_length=1)
    protected: list[str] = Field(default_factory=lambda: ["test_*.py", "tests/*"])  # restored from the input
    timeout_s: float = Field(60, gt=0, le=600)


class Planted(_Strict):
    path: str = Field(min_length=1)
    lines: tuple[int, int]
    severity: Literal["info", "low", "medium", "high", "critical"]
    defect_class: str = Field(alias="class", min_length=1)

    @model_validator(mode="after")
    def _range(self) -> Planted:
        if not 1 <= self.lines[0] <= self.lines[1]:
            raise ValueError(f"lines {list(self.lines)} must be [first, last] with 1 <= first <= last")
        return self


class FindingsEvaluator(_Strict):
    """Precision and recall of the reported findings against the planted set.

    A finding counts only when it cites a planted defect's path and a line inside its range. A bundle
    with nothing planted (a clean one) is accepted when no finding has a severity in ``fail_severities``.
    """

    kind: Literal["findings"]
    planted: list[Planted] = Field(default_factory=list)
    min_recall: float = Field(1.0, ge=0, le=1)
    min_precision: float = Field(0.5, ge=0, le=1)
    fail_severities: list[Literal["info", "low", "medium", "high", "critical"]] = Field(
        default_factory=lambda: ["high", "critical"])


class AnswerEvaluator(_Strict):
    """A known answer: every ``must_contain`` (case-insensitive) and, if set, ``number`` among its numbers."""

    kind: Literal["answer"]
    must_contain: list[str] = Field(default_factory=list)
    number: float | None = None
    must_not_contain: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _something(self) -> AnswerEvaluator:
        if not self.must_contain and self.number is None:
            raise ValueError("an answer evaluator needs must_contain or number")
        return self


Evaluator = Annotated[TestsEvaluator | FindingsEvaluator | AnswerEvaluator, Field(discriminator="kind")]


class Generator(_Strict):
    """A repository generated at attempt time, the same for the same seed (rlmfamily/eval/generate.py)."""

    kind: Literal["haystack"]
    files: int = Field(ge=10, le=MAX_GENERATED_FILES)
    seed: int = 0


class TaskInput(_Strict):
    workspace: str | None = None  # a folder of the task, copied fresh for each attempt
    generator: Generator | None = None

    @model_validator(mode="after")
    def _one(self) -> TaskInput:
        if (self.workspace is None) == (self.generator is None):
            raise ValueError("input needs exactly one of workspace (a folder) or generator")
        return self


class Reference(_Strict):
    """What the scripted oracle answers with (offline mode). Graders never read it."""

    files: str | None = None  # a folder overlaid on the workspace: the known-good change
    answer: str | None = None


class TaskSpec(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    kind: Literal["coding", "review", "analysis", "investigation"]
    instruction: str = Field(min_length=1, max_length=20_000)
    tags: list[str] = Field(default_factory=list)
    input: TaskInput
    evaluator: Evaluator
    limits: Limits = Field(default_factory=Limits)
    reference: Reference = Field(default_factory=Reference)

    @model_validator(mode="after")
    def _fits(self) -> TaskSpec:
        wanted = EVALUATOR_OF_KIND[self.kind]
        if self.evaluator.kind != wanted:
            raise ValueError(f"a {self.kind} task is graded by evaluator kind {wanted!r}, not {self.evaluator.kind!r}")
        if self.kind == "coding" and self.input.workspace is None:
            raise ValueError("a coding task needs input.workspace")
        return self


@dataclass(frozen=True)
class Task:
    spec: TaskSpec
    folder: Path

    @property
    def id(self) -> str:
        return self.spec.id

    def path(self, relative: str) -> Path:
        return self.folder / relative


@dataclass(frozen=True)
class Pack:
    folder: Path
    name: str
    description: str
    tasks: tuple[Task, ...]
    conditions: dict[str, dict[str, Any]]  # raw; rlmfamily/eval/conditions.py validates them
    digest: str  # sha256 over every file of the pack: the pinned inputs

    def task(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise PackInvalid(f"pack {self.name!r} has no task {task_id!r}; it has {', '.join(t.id for t in self.tasks)}")

    def select(self, task_ids: list[str] | None) -> Pack:
        if not task_ids:
            return self
        chosen = tuple(self.task(t) for t in task_ids)
        return Pack(self.folder, self.name, self.description, chosen, self.conditions, self.digest)


BUNDLED_PACKS = Path(__file__).resolve().parent / "packs"


def resolve_pack_folder(name_or_path: str) -> Path:
    """A folder, or the name of a pack bundled with the library (``pilot``)."""
    path = Path(name_or_path)
    if path.is_dir():
        return path.resolve()
    bundled = BUNDLED_PACKS / name_or_path
    if bundled.is_dir():
        return bundled
    names = sorted(p.name for p in BUNDLED_PACKS.iterdir() if p.is_dir()) if BUNDLED_PACKS.is_dir() else []
    raise PackInvalid(f"no pack folder {name_or_path!r}; give a folder with pack.toml, or a bundled pack: "
                      f"{', '.join(names) or 'none'}")


def load_pack(name_or_path: str | Path) -> Pack:
    folder = resolve_pack_folder(str(name_or_path))
    problems: list[str] = []
    meta = _toml(folder / "pack.toml", problems) or {}
    unknown = set(meta) - {"name", "description", "conditions"}
    if unknown:
        problems.append(f"{folder / 'pack.toml'}: unknown keys {sorted(unknown)} (allowed: name, description, conditions)")
    task_dirs = sorted(p for p in (folder / "tasks").glob("*") if p.is_dir()) if (folder / "tasks").is_dir() else []
    if not task_dirs:
        problems.append(f"{folder}: no tasks/<id>/task.toml")
    if len(task_dirs) > MAX_TASKS:
        problems.append(f"{folder}: {len(task_dirs)} tasks; a pack holds at most {MAX_TASKS} (MAX_TASKS)")
    tasks = [t for t in (_load_task(d, problems) for d in task_dirs[:MAX_TASKS]) if t is not None]
    if problems:
        raise PackInvalid(f"pack {folder} is invalid ({len(problems)} problem(s)):\n  " + "\n  ".join(problems),
                          problems=problems)
    return Pack(folder, str(meta.get("name", folder.name)), str(meta.get("description", "")), tuple(tasks),
                dict(meta.get("conditions", {})), _digest(folder))


def _load_task(folder: Path, problems: list[str]) -> Task | None:
    file = folder / "task.toml"
    raw = _toml(file, problems)
    if raw is None:
        return None
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "(top level)"
            problems.append(f"{file}: {where}: {error['msg']}")
        return None
    before = len(problems)
    if spec.id != folder.name:
        problems.append(f"{file}: id: {spec.id!r} must be the folder's name {folder.name!r}")
    for field, relative in (("input.workspace", spec.input.workspace), ("reference.files", spec.reference.files)):
        if relative is not None and not _inside_dir(folder, relative):
            problems.append(f"{file}: {field}: {relative!r} is not a folder inside the task")
    if spec.input.workspace is not None and _inside_dir(folder, spec.input.workspace):
        files = [p for p in (folder / spec.input.workspace).rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        if len(files) > MAX_INPUT_FILES or size > MAX_INPUT_BYTES:
            problems.append(f"{file}: input.workspace: {len(files)} files, {size:,} bytes; at most {MAX_INPUT_FILES} "
                            f"files and {MAX_INPUT_BYTES:,} bytes (MAX_INPUT_FILES, MAX_INPUT_BYTES)")
    if isinstance(spec.evaluator, FindingsEvaluator) and spec.input.workspace is not None:
        for i, planted in enumerate(spec.evaluator.planted):
            target = folder / spec.input.workspace / planted.path
            if not target.is_file():
                problems.append(f"{file}: evaluator.planted.{i}.path: {planted.path!r} is not a file of the input")
            elif planted.lines[1] > len(target.read_text().splitlines()):
                problems.append(f"{file}: evaluator.planted.{i}.lines: {list(planted.lines)} runs past the end of "
                                f"{planted.path}")
    generator, evaluator = spec.input.generator, spec.evaluator
    if generator is not None and isinstance(evaluator, AnswerEvaluator) and evaluator.number is not None:
        from rlmfamily.eval.generate import answer_value

        if answer_value(generator.seed) != evaluator.number:
            problems.append(f"{file}: evaluator.number: {evaluator.number:g} is not what the generator writes for "
                            f"seed {generator.seed} ({answer_value(generator.seed)})")
    return Task(spec, folder) if len(problems) == before else None


def _inside_dir(folder: Path, relative: str) -> bool:
    target = (folder / relative).resolve()
    return target.is_dir() and target.is_relative_to(folder.resolve())


def _toml(file: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        return tomllib.loads(file.read_text())
    except OSError as exc:
        problems.append(f"{file}: cannot be read: {exc.strerror}")
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"{file}: not valid TOML: {exc}")
    return None


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def tree_digest(folder: Path) -> str:
    """The digest of a workspace as an attempt received it (pinned input, generated or copied)."""
    return _digest(folder)
