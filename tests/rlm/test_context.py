"""The corpus as data: what a repository, a document and an evidence bundle look like to a session."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmfamily.context import Context
from rlmfamily.errors import BundleInvalid, ContextError, FileNotInContext, ReadTooLarge

pytestmark = pytest.mark.timeout(30)


def test_only_git_tracked_files_are_in_the_corpus(fixture_repo: Path, make_settings) -> None:
    ctx = Context.from_repository(fixture_repo, make_settings(max_file_bytes=30_000))
    files = ctx.files()
    assert "README.md" in files and "src/limits.py" in files and "docs/log.md" in files
    assert "untracked.md" not in files


def test_binaries_and_oversized_files_are_skipped_and_reported(fixture_repo: Path, make_settings) -> None:
    ctx = Context.from_repository(fixture_repo, make_settings(max_file_bytes=30_000, max_total_bytes=100_000))
    stats = ctx.stats()
    assert "logo.png" not in ctx.files() and "big.txt" not in ctx.files()
    assert stats["skipped"] == {"binary": 1, "too_large": 1}
    reported = {(s["path"], s["reason"]) for s in stats["skipped_examples"]}
    assert ("logo.png", "binary") in reported and ("big.txt", "too_large") in reported


def test_caps_on_files_and_bytes_are_enforced_and_named(fixture_repo: Path, make_settings) -> None:
    few = Context.from_repository(fixture_repo, make_settings(max_files=2, max_file_bytes=30_000))
    assert len(few.files()) == 2
    assert few.stats()["skipped"]["max_files"] >= 1
    assert any("RLM_MAX_FILES" in note for note in few.stats()["notes"])
    small = Context.from_repository(fixture_repo, make_settings(max_total_bytes=150, max_file_bytes=150))
    assert small.size() <= 150
    assert small.stats()["skipped"].get("max_total_bytes", 0) >= 1


def test_size_and_stats_read_no_content(fixture_repo: Path, settings) -> None:
    ctx = Context.from_repository(fixture_repo, settings)
    assert ctx.size() == sum((fixture_repo / p).stat().st_size for p in ctx.files())
    stats = ctx.stats()
    assert stats["files"] == len(ctx.files())
    assert {f["folder"] for f in stats["top_folders"]} >= {"src/", "docs/"}
    assert all(doc._text is None for doc in ctx._docs.values()), "size()/stats() must not read files"


def test_read_returns_bounded_slices_and_names_the_setting_when_too_big(fixture_repo: Path, make_settings) -> None:
    ctx = Context.from_repository(fixture_repo, make_settings(max_read_chars=1000))
    full = (fixture_repo / "docs" / "log.md").read_text()
    assert ctx.read("docs/log.md", 100, 50) == full[100:150]
    with pytest.raises(ReadTooLarge) as info:
        ctx.read("docs/log.md")
    assert "RLM_MAX_READ_CHARS" in info.value.message and info.value.code == "read_too_large"
    with pytest.raises(FileNotInContext) as missing:
        ctx.read("untracked.md")
    assert missing.value.code == "file_not_in_context"


def test_search_reports_path_line_and_offsets(fixture_repo: Path, settings) -> None:
    ctx = Context.from_repository(fixture_repo, settings)
    hits = ctx.search(r"MAX_CRATES\s*=\s*(\d+)")
    assert len(hits) == 1
    hit = hits[0]
    assert hit["path"] == "src/limits.py" and hit["line"] == 3
    assert ctx.read(hit["path"], hit["start"], hit["end"] - hit["start"]) == "MAX_CRATES = 40"
    assert len(ctx.search("crates", limit=5)) == 5
    with pytest.raises(ContextError):
        ctx.search("(unclosed")


def test_a_hit_as_sub_call_text_is_its_lines_with_neighbours_within_the_named_bounds(tmp_path: Path,
                                                                                     make_settings) -> None:
    long_line = "x" * 3000 + " needle " + "y" * 3000
    doc = tmp_path / "notes.txt"
    doc.write_text("first needle here\nsecond\nthird\n" + long_line + "\nlast\n")
    ctx = Context.from_document(doc, make_settings(hit_context_lines=1, hit_context_chars=400))
    first, long_hit = ctx.search("needle")
    assert ctx.hit_text(first["path"], first["start"], first["end"]) == (
        f"=== notes.txt lines 1-2 (hit on line 1 at [{first['start']}:{first['end']}]) ===\nfirst needle here\nsecond")
    text = ctx.hit_text(long_hit["path"], long_hit["start"], long_hit["end"])
    header, body = text.split("\n", 1)
    assert header.startswith("=== notes.txt line 4 (hit on line 4 at [") and "cut at RLM_HIT_CONTEXT_CHARS" in header
    assert " needle " in body and len(body) <= 400
    with pytest.raises(ContextError):
        ctx.hit_text("notes.txt", 10**6, 10**6 + 3)


def test_select_narrows_the_view_and_views_nest(fixture_repo: Path, settings) -> None:
    ctx = Context.from_repository(fixture_repo, settings)
    py = ctx.select("*.py")
    assert sorted(py.files()) == ["src/ferry.py", "src/limits.py"]
    assert py.select("*limits*").files() == ["src/limits.py"]
    assert py.search("vault") == []
    with pytest.raises(FileNotInContext):
        py.read("README.md")


def test_chunks_remember_where_they_came_from(fixture_repo: Path, settings) -> None:
    ctx = Context.from_repository(fixture_repo, settings)
    log = ctx.select("docs/log.md")
    text = (fixture_repo / "docs" / "log.md").read_text()
    chunks = log.chunk(size=4000, overlap=500)
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    assert all(c.path == "docs/log.md" for c in chunks)
    assert chunks[1].start == chunks[0].end - 500
    assert "".join(c.text() for c in chunks[:1]) == text[:4000]
    assert chunks[2].labelled().startswith(f"=== docs/log.md [{chunks[2].start}:{chunks[2].end}] ===\n")


def test_chunking_past_the_cap_is_refused_with_the_setting(fixture_repo: Path, make_settings) -> None:
    ctx = Context.from_repository(fixture_repo, make_settings(max_chunks=10))
    with pytest.raises(ContextError) as info:
        ctx.chunk(size=100)
    assert "RLM_MAX_CHUNKS" in info.value.message


def test_text_form_is_labelled_and_bounded(fixture_repo: Path, settings) -> None:
    ctx = Context.from_repository(fixture_repo, settings)
    text = ctx.text(max_chars=600)
    assert len(text) <= 700
    assert text.startswith("=== README.md [0:")
    assert "more files not shown" in text


def test_a_single_document_is_a_corpus_of_one(tmp_path: Path, settings) -> None:
    doc = tmp_path / "notes.txt"
    doc.write_text("alpha\nbeta\ngamma\n")
    ctx = Context.from_document(doc, settings)
    assert ctx.files() == ["notes.txt"]
    assert ctx.search("beta")[0]["line"] == 2


def test_a_bundle_keeps_original_offsets(settings) -> None:
    items = [
        {"path": "src/app.py", "start": 1000, "end": 1011, "text": "hello world"},
        {"path": "README.md", "start": 0, "end": 5, "text": "intro"},
    ]
    ctx = Context.from_bundle(items, settings)
    assert ctx.files() == ["src/app.py", "README.md"]
    chunk = ctx.select("src/*").chunk(size=5)[1]
    assert (chunk.start, chunk.end) == (1005, 1010)
    assert chunk.text() == " worl"
    assert ctx.search("world")[0]["start"] == 1006
    assert ctx.read("src/app.py", 1006, 5) == "world"


def test_a_bundle_with_inconsistent_offsets_is_refused(settings) -> None:
    with pytest.raises(BundleInvalid) as info:
        Context.from_bundle([{"path": "a", "start": 0, "end": 3, "text": "four"}], settings)
    assert "character offsets" in info.value.message


def test_a_bundle_quoting_one_file_twice_names_each_range(settings) -> None:
    items = [
        {"path": "a.py", "start": 0, "end": 2, "text": "ab"},
        {"path": "a.py", "start": 10, "end": 12, "text": "cd"},
    ]
    ctx = Context.from_bundle(items, settings)
    assert ctx.files() == ["a.py:0-2", "a.py:10-12"]


def test_a_folder_outside_git_is_walked_and_says_so(tmp_path: Path, settings) -> None:
    folder = tmp_path / "plain"
    (folder / ".hidden").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    (folder / ".hidden" / "b.txt").write_text("b")
    ctx = Context.from_repository(folder, settings)
    assert ctx.files() == ["a.txt"]
    assert any("not a git work tree" in n for n in ctx.stats()["notes"])
