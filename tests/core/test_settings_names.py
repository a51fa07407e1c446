"""Every SPECIALISTS_* variable the project itself sets or documents is a setting (core/settings_names.py), so the
start-up warning about unknown ones never fires on the project's own deployment, and a typo in Terraform fails here."""

from __future__ import annotations

import re

from core.settings import PROJECT_ROOT
from core.settings_names import NOT_SETTINGS, unknown_variables, variable_names

# A whole name (a prefix written as SPECIALISTS_DRILL_* is not one).
NAME = re.compile(r"SPECIALISTS_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")


def test_every_variable_infra_and_the_docs_name_is_a_setting():
    files = [*PROJECT_ROOT.glob("infra/**/*.tf"), *PROJECT_ROOT.glob("docs/*.md"), PROJECT_ROOT / "README.md",
             PROJECT_ROOT / "Dockerfile", PROJECT_ROOT / "cloudbuild.yaml", PROJECT_ROOT / "dev"]
    known = variable_names() | NOT_SETTINGS
    named = {(path.relative_to(PROJECT_ROOT).as_posix(), name) for path in files for name in NAME.findall(path.read_text())}
    assert len(named) > 100
    assert sorted((path, name) for path, name in named if name not in known) == []


def test_a_misspelled_variable_is_matched_to_the_nearest_setting_and_a_stranger_to_none():
    found = dict(unknown_variables({"SPECIALISTS_DISPATCH_DEADLNE_S": "2", "SPECIALISTS_EDGE_PORT": "1",
                                    "SPECIALISTS_ZZZ": "1", "SPECIALISTS_API_KEY": "k", "OTHER": "x"}))
    assert found == {"SPECIALISTS_DISPATCH_DEADLNE_S": "SPECIALISTS_DISPATCH_DEADLINE_S", "SPECIALISTS_ZZZ": None}
