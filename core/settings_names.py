"""The names of the service's environment variables, and the ``SPECIALISTS_*`` variables that are none of them.

A misspelled variable (``SPECIALISTS_PUSH_MAX_ATEMPTS``) would be ignored by the settings, its default silently in
force; every command warns at start-up instead, naming the nearest real variable (``ops/cli.py``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from pydantic import AliasChoices

from core.settings import SECTIONS

PREFIX = "SPECIALISTS_"
# SPECIALISTS_* variables that are not settings, on purpose: keys a peers file names (the library's default and the
# journey's), and the test suite's own.
NOT_SETTINGS = frozenset({"SPECIALISTS_API_KEY", "SPECIALISTS_JOURNEY_KEY", "SPECIALISTS_REVIEW_KEY",
                          "SPECIALISTS_TEST_RUN", "SPECIALISTS_TEST_ARTIFACTS"})
MIN_SIMILARITY = 0.75  # difflib's ratio below which no variable is named as the one meant


def variable_names() -> frozenset[str]:
    """Every variable a setting reads (its own name, or each of its aliases)."""
    names: set[str] = set()
    for section in SECTIONS.values():
        for field, info in section.model_fields.items():
            alias = info.validation_alias
            if isinstance(alias, AliasChoices):
                names.update(choice for choice in alias.choices if isinstance(choice, str))
            else:
                names.add(section.env_name(field))
    return frozenset(names)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each ``SPECIALISTS_*`` variable in ``environ`` that no setting reads, with the nearest one that does (or None)."""
    names = variable_names()
    unknown = sorted(n for n in environ if n.startswith(PREFIX) and n not in names and n not in NOT_SETTINGS)
    return [(name, next(iter(difflib.get_close_matches(name, names, n=1, cutoff=MIN_SIMILARITY)), None))
            for name in unknown]


def warning_of(name: str, nearest: str | None) -> str:
    meant = f"; did you mean {nearest}?" if nearest else "; docs/SETTINGS.md lists the settings"
    return f"{name} is not a setting of this service and is ignored{meant}"
