"""The service's one settings object, read from the environment.

Nothing else in the service reads ``os.environ``. Every limit is a named field
with a default that works on one machine, validated when the settings load.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from typing import Annotated

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_", extra="ignore")

    # --- database -----------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        validation_alias="DATABASE_URL",
        description="PostgreSQL URL. Unset: start the embedded PostgreSQL in data_dir.",
    )
    data_dir: Path = Field(
        default=PROJECT_ROOT / ".data",
        description="Project-local folder for the embedded database and local secrets.",
    )
    db_pool_size: int = Field(default=10, ge=1, le=200)
    db_max_overflow: int = Field(default=20, ge=0, le=500)
    db_connect_timeout_s: int = Field(default=10, ge=1, le=120)

    # --- customer keys ------------------------------------------------------
    key_min_secret_chars: int = Field(default=32, ge=16, le=1024)
    key_signing_secrets: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated key-signing secrets, newest first. The newest signs, all verify.",
    )
    key_environment: str = Field(default="test", pattern="^(live|test)$")
    key_default_ttl_days: int = Field(default=365, ge=1, le=3650)
    revocation_cache_s: float = Field(
        default=5.0,
        ge=0.0,
        le=300.0,
        description="How long an instance may trust a key's revocation status: the revocation bound.",
    )

    @field_validator("key_signing_secrets", mode="before")
    @classmethod
    def _split_secrets(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("key_signing_secrets")
    @classmethod
    def _secrets_long_enough(cls, value: list[SecretStr], info) -> list[SecretStr]:
        minimum = info.data.get("key_min_secret_chars", 32)
        for index, secret in enumerate(value):
            if len(secret.get_secret_value()) < minimum:
                raise ValueError(
                    f"key-signing secret #{index + 1} has {len(secret.get_secret_value())} characters; "
                    f"at least {minimum} are required (SPECIALISTS_KEY_MIN_SECRET_CHARS)"
                )
        return value

    @property
    def embedded(self) -> bool:
        return self.database_url is None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
