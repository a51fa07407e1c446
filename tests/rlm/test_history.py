"""History: durable, searchable, bounded reads by handle, scoped to one run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmfamily.errors import HistoryEntryNotFound, ReadTooLarge
from rlmfamily.history import History

pytestmark = pytest.mark.timeout(30)


def test_entries_are_found_by_every_word_and_read_in_slices(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite3", "run-1", max_read_chars=100)
    first = history.add("observation", "the ferry left dock 4 at noon", turn=1)
    answer = "PROMPT:\nwhich dock?\n\nANSWER:\ndock 9"
    history.add("subcall", answer, turn=2)
    hits = history.search("FERRY dock")
    assert [h["id"] for h in hits] == [first] and "ferry" in hits[0]["snippet"]
    assert len(history.search("dock")) == 2
    assert history.read(first, 4, 5) == "ferry"
    assert history.stats()["by_kind"] == {"observation": {"entries": 1, "chars": 29},
                                          "subcall": {"entries": 1, "chars": len(answer)}}


def test_a_read_over_the_cap_is_refused_with_the_setting(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite3", "run-1", max_read_chars=100)
    entry = history.add("observation", "x" * 500)
    with pytest.raises(ReadTooLarge) as info:
        history.read(entry, 0, 101)
    assert "RLM_MAX_HISTORY_READ_CHARS" in info.value.message


def test_history_survives_reopening_and_one_run_never_reads_another(tmp_path: Path) -> None:
    entry = History(tmp_path / "h.sqlite3", "run-1").add("observation", "kept across restarts")
    assert History(tmp_path / "h.sqlite3", "run-1").read(entry) == "kept across restarts"
    other = History(tmp_path / "h.sqlite3", "run-2")
    with pytest.raises(HistoryEntryNotFound):
        other.read(entry)
    assert other.search("kept") == []
