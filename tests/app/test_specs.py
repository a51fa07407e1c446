"""Specs: an invalid spec stops start-up naming the file, the field and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.specs import SpecInvalid, load_spec, load_specs, media_type_matches
from core.settings import PROJECT_ROOT

VALID = """\
id: {id}
name: Reviewer
description: Reviews code.
executor: rlm
tariff_credits: 7
skill: {{id: review, name: Review, description: Reviews a diff.}}
input_modes: [text/plain]
output_modes: [text/plain]
"""


def write(folder: Path, name: str, content: str) -> Path:
    path = folder / name
    path.write_text(content)
    return path


def test_the_shipped_specs_are_valid():
    specs = load_specs(PROJECT_ROOT / "specs")
    assert specs["conformance"].spec.tariff_credits == 0
    assert specs["conformance"].spec.executor == "conformance"


def test_a_valid_spec_loads_with_default_limits(tmp_path):
    loaded = load_spec(write(tmp_path, "reviewer.yaml", VALID.format(id="reviewer")))
    assert loaded.spec.tariff_credits == 7
    assert loaded.spec.limits.max_parts == 16
    assert loaded.modified_at.tzinfo is not None


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        (("tariff_credits: 7", "tariff_credits: -3"), "tariff_credits", "greater than or equal to 0"),
        (("tariff_credits: 7", "tariff_credits: 7\ntarif: 1"), "tarif", "Extra inputs are not permitted"),
        (("input_modes: [text/plain]", "input_modes: [plain text]"), "input_modes", "is not a media type"),
        (("input_modes: [text/plain]", "input_modes: []"), "input_modes", "at least 1 item"),
        (("executor: rlm", "executor: magic"), "executor", "'conformance', 'rlm' or 'scripted'"),
        (("tariff_credits: 7", "tariff_credits: 7\nlimits: {max_parts: 0}"), "limits.max_parts", "greater than or equal to 1"),
    ],
)
def test_an_invalid_field_is_named_with_its_file_and_reason(tmp_path, change, field, reason):
    path = write(tmp_path, "reviewer.yaml", VALID.format(id="reviewer").replace(*change))
    with pytest.raises(SpecInvalid) as refused:
        load_spec(path)
    message = str(refused.value)
    assert str(path) in message and field in message and reason in message
    assert refused.value.code == "spec_invalid"


def test_the_id_must_match_the_file_name(tmp_path):
    with pytest.raises(SpecInvalid, match="must match"):
        load_spec(write(tmp_path, "other.yaml", VALID.format(id="reviewer")))


def test_an_in_process_executor_cannot_charge(tmp_path):
    content = VALID.format(id="tck").replace("executor: rlm", "executor: conformance")
    with pytest.raises(SpecInvalid, match="tariff_credits must be 0"):
        load_spec(write(tmp_path, "tck.yaml", content))


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path):
    with pytest.raises(SpecInvalid, match="mapping"):
        load_spec(write(tmp_path, "x.yaml", "- a\n- b\n"))
    with pytest.raises(SpecInvalid, match="not valid YAML"):
        load_spec(write(tmp_path, "y.yaml", "a: [b\n"))


def test_an_empty_or_missing_specs_folder_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(SpecInvalid, match="SPECIALISTS_SPECS_DIR"):
        load_specs(tmp_path)
    with pytest.raises(SpecInvalid, match="SPECIALISTS_SPECS_DIR"):
        load_specs(tmp_path / "missing")


@pytest.mark.parametrize(
    ("media_type", "ranges", "matches"),
    [
        ("text/plain", ["text/plain"], True),
        ("text/plain; charset=utf-8", ["text/plain"], True),
        ("text/markdown", ["text/*"], True),
        ("image/png", ["*/*"], True),
        ("application/json", ["text/plain", "text/*"], False),
    ],
)
def test_media_types_match_exact_types_and_wildcards(media_type, ranges, matches):
    assert media_type_matches(media_type, ranges) is matches
