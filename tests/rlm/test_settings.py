"""Settings: every limit is named, validated at start-up, and errors name the variable to change."""

from __future__ import annotations

import pytest

from rlmfamily.cli import _settings as cli_settings
from rlmfamily.cli import build_parser
from rlmfamily.errors import SettingsInvalid
from rlmfamily.settings import load_settings

pytestmark = pytest.mark.timeout(30)


def test_an_invalid_limit_names_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_MAX_TURNS", "0")
    with pytest.raises(SettingsInvalid) as info:
        load_settings()
    assert "RLM_MAX_TURNS" in info.value.message and info.value.setting == "max_turns"


def test_incoherent_limits_are_refused_at_start_up() -> None:
    with pytest.raises(SettingsInvalid) as info:
        load_settings(subcall_timeout_s=600, host_call_timeout_s=60)
    assert "host_call_timeout_s" in info.value.message


def test_the_final_answer_reserve_scales_with_a_small_token_budget_and_a_flag_sets_it() -> None:
    # A local model is budgeted with --max-tokens (docs/RLM.md): 20,000 works as given, a tenth kept for the answer.
    assert load_settings(max_tokens=20_000).final_reserve_tokens == 2_000
    assert load_settings().final_reserve_tokens == 50_000  # the default 3,000,000: the cap
    assert load_settings(max_tokens=None).final_reserve_tokens == 50_000  # no token limit: nothing to keep it from
    given = build_parser().parse_args(["run", "--document", "notes.txt", "--max-tokens", "20000",
                                       "--final-reserve-tokens", "5000", "q"])
    assert cli_settings(given).final_reserve_tokens == 5_000
    too_much = build_parser().parse_args(["run", "--document", "notes.txt", "--max-tokens", "20000",
                                          "--final-reserve-tokens", "20000", "q"])
    with pytest.raises(SettingsInvalid) as info:
        cli_settings(too_much)
    assert "--final-reserve-tokens" in info.value.message and "--max-tokens" in info.value.message


def test_the_kernel_limits_are_built_from_the_settings_of_the_same_names() -> None:
    limits = load_settings(step_timeout_s=7, max_output_bytes=4096, max_memory_bytes=64 << 20).kernel_limits()
    assert (limits.step_timeout_s, limits.max_output_bytes, limits.max_memory_bytes) == (7, 4096, 64 << 20)


def test_the_data_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("RLM_DATA_DIR", str(tmp_path / "d"))
    settings = load_settings()
    assert settings.data_dir == tmp_path / "d" and settings.budget_path == tmp_path / "d" / "budget.sqlite3"
