"""Every setting is documented: docs/SETTINGS.md is generated from the settings classes and kept current."""

from __future__ import annotations

from core import settings_doc
from core.settings import SECTIONS, Settings


def test_every_setting_says_what_it_bounds():
    missing = [env for _, _, field, env in settings_doc.settings_fields() if not (field.description or "").strip()]
    assert missing == [], f"settings without a description: {missing}"


def test_every_variable_names_one_setting():
    names = [env for _, _, _, env in settings_doc.settings_fields()]
    assert len(names) == len(set(names)), "two settings read the same environment variable"


def test_settings_has_exactly_its_sections_and_each_one_is_in_the_reference():
    assert list(Settings.model_fields) == list(SECTIONS)
    reference = settings_doc.render()
    for name in SECTIONS:
        assert f"## `settings.{name}`" in reference
    assert "SPECIALISTS_LEDGER_MAX_REASON_CHARS" in reference and "SCHEMA_MAX_CREDITS" in reference
    assert "limits.max_turns" in reference and "MAX_SPEC_FILE_BYTES" in reference


def test_the_settings_reference_is_current():
    assert settings_doc.DOC_PATH.read_text() == settings_doc.render(), (
        "docs/SETTINGS.md is stale: run `.venv/bin/python -m core.settings_doc`"
    )
