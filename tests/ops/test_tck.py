"""The conformance kit's judge (ops/tck.py): the bar per transport, and the excused requirements docs/A2A_EDGE.md
lists. `./dev tck` itself runs the kit in CI (.ci/run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops.tck import (EDGE_DOC, Excuse, TckError, excused_requirements, find_kit, merge, score_transport,
                     service_errors, wrapper_fingerprint)


def compatibility(results: dict[str, tuple[str, dict[str, str]]]) -> dict:
    return {"per_requirement": {rid: {"level": level, "transports": per} for rid, (level, per) in results.items()}}


def musts(passed: int, failed: int, transport: str = "grpc") -> dict[str, tuple[str, dict[str, str]]]:
    return {f"M-{i:03}": ("MUST", {transport: "PASS" if i < passed else "FAIL"}) for i in range(passed + failed)}


def test_must_at_97_percent_meets_the_bar_and_below_it_does_not():
    assert score_transport("grpc", compatibility(musts(97, 3)), [], "conformance").met
    missed = score_transport("grpc", compatibility(musts(96, 4)), [], "conformance")
    assert not missed.met
    assert missed.problems == ["GRPC MUST 96.0% < 97% (failing: M-096, M-097, M-098, M-099)"]


def test_one_failing_should_or_may_misses_the_bar():
    for level in ("SHOULD", "MAY"):
        results = {**musts(10, 0), "X-1": (level, {"grpc": "PASS"}), "X-2": (level, {"grpc": "FAIL"})}
        score = score_transport("grpc", compatibility(results), [], "conformance")
        assert [p.split(" (")[0] for p in score.problems] == [f"GRPC {level} 50.0% < 100%"]


def test_a_transport_is_judged_on_its_own_results_and_untested_levels_pass():
    results = {**musts(10, 0, "jsonrpc"), "M-900": ("MUST", {"jsonrpc": "SKIPPED", "grpc": "FAIL"}),
               "S-1": ("SHOULD", {"jsonrpc": "SKIPPED"}), "Y-1": ("MAY", {})}
    score = score_transport("jsonrpc", compatibility(results), [], "conformance")
    assert score.met and score.levels["MUST"].percent == 100.0
    assert score.levels["SHOULD"].percent is None and score.levels["MAY"].percent is None


def test_a_requirement_with_one_failed_test_of_several_fails_on_its_transport():
    # The kit keeps the last test's status per transport (PASS here) and FAIL as the requirement's status.
    results = compatibility(musts(20, 0, "http_json"))
    results["per_requirement"]["SVC-1"] = {"level": "MUST", "status": "FAIL", "transports": {"http_json": "PASS"}}
    score = score_transport("http_json", results, [], "conformance")
    assert score.levels["MUST"].failed == ["SVC-1"] and not score.met


def test_a_transport_whose_tests_ran_in_two_kit_processes_is_judged_on_both_reports():
    waits = compatibility({"SUB-1": ("MUST", {"grpc": "FAIL"}), "GET-1": ("MUST", {})})
    rest = compatibility({"SUB-1": ("MUST", {"grpc": "PASS"}), "GET-1": ("MUST", {"grpc": "PASS"})})
    merged = merge("grpc", [rest, waits])
    score = score_transport("grpc", merged, [], "conformance")
    assert score.levels["MUST"].failed == ["SUB-1"] and score.levels["MUST"].passed == ["GET-1"]


def test_an_excused_requirement_is_left_out_only_for_the_specialists_it_names():
    results = {**musts(96, 2), "KIT-1": ("MUST", {"grpc": "FAIL"}), "POL-1": ("MUST", {"grpc": "FAIL"})}
    excuses = [Excuse("KIT-1", frozenset({"*"}), "kit fault", "the kit's"),
               Excuse("POL-1", frozenset({"reviewer"}), "policy", "message_id idempotency")]
    reviewer = score_transport("grpc", compatibility(results), excuses, "reviewer")
    assert reviewer.met and reviewer.levels["MUST"].excused == ["KIT-1", "POL-1"]
    conformance = score_transport("grpc", compatibility(results), excuses, "conformance")
    assert not conformance.met and "POL-1" in conformance.levels["MUST"].failed


def test_the_docs_table_is_the_judges_list_and_every_row_has_a_reason():
    excuses = excused_requirements(EDGE_DOC.read_text())
    assert excuses and all(e.reason and e.kind in ("kit fault", "policy") for e in excuses)
    assert "CORE-SEND-003" in {e.requirement for e in excuses}
    doc = "### Excused requirements\n\n| requirement | specialists | kind | reason |\n|---|---|---|---|\n"
    with pytest.raises(TckError, match="needs a requirement id"):
        excused_requirements(doc + "| `CORE-X-1` | * | kit fault |  |\n")
    with pytest.raises(TckError, match="has no section"):
        excused_requirements("# nothing here\n")


def test_the_fingerprint_is_the_one_run_tck_sh_keeps_so_each_run_reuses_the_kits_venv(tmp_path: Path):
    for name in ("tck/a.py", "tck/sub/b.py", "specification/a2a.proto", "codegen/x.txt", "pyproject.toml",
                 "sut/deep/pyproject.toml", "tests/not_counted.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    # run_tck.sh, step 2, as it computes it
    script = ("find . -type f \\( -path './tck/*' -o -path './specification/*' -o -path './codegen/*' "
              "-o -name pyproject.toml \\) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1")
    expected = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert wrapper_fingerprint(tmp_path) == expected.stdout.strip()


def test_the_services_error_lines_are_shown_from_its_json_log():
    log = ('{"level": "INFO", "logger": "uvicorn", "message": "started"}\n'
           '{"level": "ERROR", "logger": "asyncio", "message": "Task exception was never retrieved"}\n'
           'Traceback (most recent call last):\n  File "x.py", line 1\n')
    assert service_errors(log) == ["asyncio: Task exception was never retrieved", "Traceback (most recent call last):"]


def test_the_kit_is_found_with_its_commit_or_the_error_says_where_to_put_it(tmp_path: Path):
    with pytest.raises(TckError, match=r"no A2A conformance kit at .*\(\.\./shared/a2a-tck/ is the default\)"):
        find_kit(tmp_path / "nowhere")
    (tmp_path / "a2a-tck-1.0-dev-357c4a8.tar.gz").write_bytes(b"")
    with pytest.raises(TckError, match="run_tck.sh missing there"):
        find_kit(tmp_path)
    (tmp_path / "run_tck.sh").write_text("#!/bin/sh\n")
    kit = find_kit(tmp_path)
    assert kit.commit == "357c4a8" and kit.packed and kit.wrapper == tmp_path / "run_tck.sh"
