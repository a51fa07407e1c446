"""What every section of the settings is made of: ``Section``, the project's root folder, a comma-separated list.

Each room's section lives beside the room that reads it (``app/settings.py``, ``workers/settings.py``, ...) and
imports only this module, so that ``core/settings.py`` can gather them under the one ``Settings`` object without
an import cycle (``tests/test_architecture.py`` holds the section modules to that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, SecretStr
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def split_commas(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# A list of secrets in one variable: comma-separated, newest first.
SecretList = Annotated[list[SecretStr], NoDecode, BeforeValidator(split_commas)]
# A list of plain values in one variable, comma-separated.
CommaList = Annotated[list[str], NoDecode, BeforeValidator(split_commas)]


class Section(BaseSettings):
    """One room's settings: the variables ``env_prefix`` + FIELD, or a field's own ``validation_alias``."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable that sets ``field``, for error messages and the reference."""
        alias = cls.model_fields[field].validation_alias
        if isinstance(alias, str):
            return alias
        return (cls.model_config.get("env_prefix") or "") + field.upper()
