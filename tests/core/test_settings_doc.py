"""Every setting is documented: docs/SETTINGS.md is generated from the Settings class and kept current."""

from __future__ import annotations

from core import settings_doc
from core.settings import Settings


def test_every_setting_says_what_it_bounds():
    missing = [settings_doc.env_name(n, f) for n, f in Settings.model_fields.items() if not (f.description or "").strip()]
    assert missing == [], f"settings without a description: {missing}"


def test_the_settings_reference_is_current():
    assert settings_doc.DOC_PATH.read_text() == settings_doc.render(), (
        "docs/SETTINGS.md is stale: run `.venv/bin/python -m core.settings_doc`"
    )
