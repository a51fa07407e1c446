"""docs/RLM.md documents every named limit and the Python example it shows runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlmfamily import Context, ScriptedProvider, Session, load_settings
from rlmfamily.settings import RLMSettings

from .conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(60)

DOCS = (REPO_ROOT / "docs" / "RLM.md").read_text()


def test_every_setting_is_documented_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", DOCS, flags=re.MULTILINE))
    for name, field in RLMSettings.model_fields.items():
        assert name in rows, f"setting {name} is missing from docs/RLM.md"
        default = field.default
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            assert rows[name].strip() == f"{default:g}" if isinstance(default, float) else str(default), name


def test_the_python_example_runs(tmp_path: Path) -> None:
    settings = load_settings(kernel="monty", max_calls=50, data_dir=tmp_path / "data")
    context = Context.from_repository(REPO_ROOT / "library" / "rlmfamily" / "examples" / "harbor", settings)
    provider = ScriptedProvider.from_file(REPO_ROOT / "library" / "rlmfamily" / "examples" / "harbor_demo.toml")
    result = Session(context=context, provider=provider, settings=settings).run("question")
    assert result.stop_reason == "answered" and result.answer.startswith("Production uploads are tried 5 times")
    assert result.budget.calls == 14 and result.trajectory_path.is_file()
