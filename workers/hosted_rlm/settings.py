"""The hosted rlm specialists' section of the settings (``settings.hosted``): specs, model routes, checkpoints.

Part of the one ``Settings`` object (core/settings.py); this module imports only core/settings_base.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from core.settings_base import PROJECT_ROOT, Section

CheckpointSync = Literal["with_journal", "each_record"]  # workers/hosted_rlm/store.py carries it out


class HostedSettings(Section):
    """The hosted specialists (workers/hosted_rlm, docs/SPECIALISTS.md): which specs, which model routes,
    checkpoints and resumes. A spec's own limits live in specs/*.yaml, bounded by core/specs.py."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_SPECIALIST_")

    specs_dir: Path = Field(
        default=PROJECT_ROOT / "specs",
        validation_alias="SPECIALISTS_SPECS_DIR",
        description="Folder of specialist specs (one YAML file each).",
    )
    model_routes_file: Path = Field(
        default=PROJECT_ROOT / "specs" / "demo" / "routes.toml",
        validation_alias="SPECIALISTS_MODEL_ROUTES_FILE",
        description="Model routes (TOML, JSON or YAML): named OpenAI-compatible endpoints with the NAME of the "
        "variable holding each key, or scripted routes. The default holds the scripted demo routes.",
    )
    model_routes_allow_scripted: bool = Field(
        default=False,
        validation_alias="SPECIALISTS_MODEL_ROUTES_ALLOW_SCRIPTED",
        description="Serve scripted (canned) model routes with an external database too; on one machine "
        "(embedded database) they are always allowed.",
    )
    checkpoint_key_min_chars: int = Field(
        default=32, ge=16, le=1024, description="Shortest checkpoint-signing key accepted at start-up."
    )
    checkpoint_key: SecretStr | None = Field(
        default=None,
        description="HMAC key that signs Monty checkpoints in PostgreSQL; a worker refuses to run rlm "
        "specialists without it. Changing it makes checkpoints of running jobs unusable: their resume fails, "
        "charged nothing.",
    )
    max_resumes: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Times one job may be resumed from its checkpoint after the worker running it died; "
        "past it (or without a checkpoint) the job is unknown.",
    )
    checkpoint_sync: CheckpointSync = Field(
        default="with_journal",
        description="When a Monty checkpoint's commit reaches disk (docs/WORKERS.md, Checkpoint durability). "
        "`with_journal`: it commits without waiting for its WAL flush (synchronous_commit off for that "
        "transaction) and is flushed by the journal's next commit, which always comes before anything relies "
        "on it; a killed worker loses nothing, a PostgreSQL crash only records no journal entry refers to yet. "
        "`each_record`: every checkpoint commit waits for its flush, as the database's synchronous_commit says.",
    )
    checkpoint_every_steps: int = Field(
        default=8,
        ge=1,
        le=1000,
        description="A running job's Monty session record is written at least every this many steps (docs/WORKERS.md, "
        "Checkpoint policy); besides, always before a paid model call, after a step that made one, and the run's "
        "first. A resume runs the steps since the newest record again from their code (cheap reads only), so this "
        "bounds that work; 1 writes a record after every step.",
    )
    checkpoint_every_s: float = Field(
        default=10.0,
        ge=0.0,
        le=3600.0,
        description="A running job's Monty session record is written at least every this many seconds of its run "
        "(with the steps' count above, whichever comes first): the time a resume may spend running steps again. "
        "0 writes a record after every step.",
    )
    resume_window_s: float = Field(
        default=300.0,
        ge=1.0,
        le=86_400.0,
        description="How long after a dead worker's lease expired a later delivery may still resume its job; "
        "until then the lease sweeper leaves it, after it the job is recorded unknown.",
    )
    checkpoint_retention_s: float = Field(
        default=86_400.0,
        ge=0.0,
        le=365 * 86_400.0,
        description="How long the Monty checkpoints of a job that can no longer resume (finished, or unknown) are "
        "kept, for an operator's look at a run; dispatchers then delete them. A running or released job keeps its "
        "own whatever their age.",
    )
    checkpoints_prune_batch: int = Field(
        default=500,
        ge=10,
        le=100_000,
        description="Checkpoints deleted at most per prune round (one short transaction, oldest first).",
    )

    @field_validator("checkpoint_key")
    @classmethod
    def _checkpoint_key_long_enough(cls, value: SecretStr | None, info) -> SecretStr | None:
        minimum = info.data.get("checkpoint_key_min_chars", 32)
        if value is not None and len(value.get_secret_value()) < minimum:
            raise ValueError(
                f"the checkpoint key has {len(value.get_secret_value())} characters; at least {minimum} are "
                "required (SPECIALISTS_SPECIALIST_CHECKPOINT_KEY)"
            )
        return value
