"""The `rlm` command, run as a user runs it: a subprocess of the installed console script.

The demo command here is the one docs/RLM.md shows, character for character.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlmfamily.budget import Budget, BudgetLimits

from .conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

RLM = str(Path(sys.executable).parent / "rlm")
DEMO_QUESTION = "How many times does harbor try an upload in production before giving up, and what decides it?"
DEMO = ["run", "--repo", "library/rlmfamily/examples/harbor", "--script", "library/rlmfamily/examples/harbor_demo.toml", DEMO_QUESTION]


def rlm(*args: str, data_dir: Path, env: dict[str, str] | None = None,
        cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    full_env.update({"RLM_DATA_DIR": str(data_dir), "COLUMNS": "200", **(env or {})})
    return subprocess.run([RLM, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=100)


def test_the_documented_demo_command_matches_the_docs() -> None:
    docs = (REPO_ROOT / "docs" / "RLM.md").read_text()
    assert "rlm run --repo library/rlmfamily/examples/harbor --script library/rlmfamily/examples/harbor_demo.toml \\\n" in docs
    assert f'"{DEMO_QUESTION}"' in docs


@pytest.mark.parametrize("kernel", ["monty", "host"])
def test_the_offline_demo_answers_and_show_replays_it(kernel: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    run = rlm(*DEMO, "--kernel", kernel, data_dir=data)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("Production uploads are tried 5 times")
    assert "deploy/production.toml sets upload.max_attempts = 6" in run.stdout
    assert "INC-412" in run.stdout
    assert "answered after 4 turns" in run.stderr
    show = rlm("show", "last", data_dir=data)
    assert show.returncode == 0, show.stderr
    for expected in ("turn 1", "turn 4", "context.search", "sub-call", "llm_query_batched", "answered after 4 turns",
                     "Production uploads are tried 5 times"):
        assert expected in show.stdout
    events = json.loads(rlm("show", "last", "--json", data_dir=data).stdout)
    assert events[-1]["event"] == "run_finished" and events[-1]["stop_reason"] == "answered"


def test_run_json_and_usage_report_the_same_budget(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run = rlm(*DEMO, "--json", data_dir=data)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    usage = json.loads(rlm("usage", "--json", data_dir=data).stdout)
    (root,) = usage["roots"]
    assert root["root_id"] == result["run_id"] and root["calls"] == result["budget"]["calls"] == 14
    assert usage["unresolved"] == []
    table = rlm("usage", data_dir=data)
    assert result["run_id"] in table.stdout


def test_a_document_run_with_budget_flags(tmp_path: Path) -> None:
    doc = tmp_path / "notes.txt"
    doc.write_text("the answer is 42\n")
    script = tmp_path / "s.toml"
    script.write_text("[[root]]\ncode = '''print(context.files())'''\n[[root]]\ncode = '''x = 1'''\n"
                      "[[root]]\ncode = '''final_answer(context.search(\"answer is (\\\\d+)\")[0][\"match\"])'''\n")
    run = rlm("run", "--document", str(doc), "--script", str(script), "--max-calls", "3", "--max-tokens", "none",
              "--kernel", "host", "what is the answer?", data_dir=tmp_path / "data")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "answer is 42"
    assert "budget_exhausted" in run.stderr


def test_a_bundle_run_answers_with_the_original_offsets(tmp_path: Path) -> None:
    bundle = tmp_path / "evidence.json"
    bundle.write_text(json.dumps({"items": [
        {"path": "src/app.py", "start": 120, "end": 138, "text": "RETRY_LIMIT = 7 # "},
        {"path": "README.md", "start": 0, "end": 6, "text": "# app\n"},
    ]}))
    script = tmp_path / "s.json"
    code = "h = context.search(r'RETRY_LIMIT = (\\d+)')[0]\nfinal_answer(h['path'] + ':' + str(h['start']))"
    script.write_text(json.dumps({"root": [{"code": code}]}))
    run = rlm("run", "--bundle", str(bundle), "--script", str(script), "where is the retry limit?",
              data_dir=tmp_path / "data")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "src/app.py:120"


def test_a_missing_key_variable_is_named_and_nothing_runs(tmp_path: Path) -> None:
    run = rlm("run", "--repo", "library/rlmfamily/examples/harbor", "--model", "gpt-x", "--api-key-env", "NO_SUCH_RLM_KEY", "q",
              data_dir=tmp_path / "data")
    assert run.returncode == 2
    assert "NO_SUCH_RLM_KEY" in run.stderr and "missing_api_key" in run.stderr
    assert not (tmp_path / "data" / "runs").exists()


def test_a_run_against_an_openai_compatible_endpoint(tmp_path: Path, fake_openai) -> None:
    fake_openai.push(code='final_answer("files: " + str(len(context.files())))', prompt_tokens=300,
                     completion_tokens=30)
    run = rlm("run", "--repo", "library/rlmfamily/examples/harbor", "--base-url", fake_openai.base_url, "--model", "m-1",
              "--api-key-env", "TEST_RLM_KEY", "how many files?", data_dir=tmp_path / "data",
              env={"TEST_RLM_KEY": "sk-local"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "files: 10"
    request = fake_openai.requests[0]
    assert request["tools"][0]["function"]["name"] == "python"
    assert "330 tokens" in run.stderr
    stored = [p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert stored and not any(b"sk-local" in blob for blob in stored), "the key must never be stored"


def test_unknown_usage_is_listed_and_reconciled_from_the_command_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    budget = Budget(data / "budget.sqlite3", "run-x", BudgetLimits(max_calls=10, max_tokens=1000))
    budget.mark_unknown(budget.admit("subcall"), "no answer within 120 s")
    listed = json.loads(rlm("usage", "--json", data_dir=data).stdout)
    (entry,) = listed["unresolved"]
    assert entry["root_id"] == "run-x" and entry["state"] == "unknown"
    refused = rlm("usage", "--reconcile", str(entry["id"]), "--tokens", "250", data_dir=data)
    assert refused.returncode == 2 and "--reason" in refused.stderr
    done = rlm("usage", "--reconcile", str(entry["id"]), "--tokens", "250", "--reason", "provider console, req 7",
               data_dir=data)
    assert done.returncode == 0, done.stderr
    after = json.loads(rlm("usage", "--json", "--run", "run-x", data_dir=data).stdout)
    assert after["unresolved"] == [] and after["roots"][0]["tokens"] == 250
    assert after["entries"][0]["reason"] == "provider console, req 7"


def test_showing_an_unknown_run_says_where_it_looked(tmp_path: Path) -> None:
    show = rlm("show", "nope", data_dir=tmp_path / "data")
    assert show.returncode == 2 and "run_not_found" in show.stderr and "RLM_DATA_DIR" in show.stderr


def test_a_run_against_the_anthropic_messages_api_retries_caches_and_records_usage(tmp_path: Path,
                                                                                  fake_anthropic) -> None:
    fake_anthropic.push(status=529, message="Overloaded")
    fake_anthropic.push(code="n = len(context.files())\nprint(n)", input_tokens=900, output_tokens=40,
                        cache_creation_input_tokens=2000)
    fake_anthropic.push(code='final_answer("files: " + str(n))', input_tokens=50, output_tokens=20,
                        cache_read_input_tokens=2000, cache_creation_input_tokens=950)
    run = rlm("run", "--repo", "library/rlmfamily/examples/harbor", "--provider", "anthropic", "--base-url",
              fake_anthropic.base_url, "--model", "claude-haiku-4-5", "--api-key-env", "TEST_ANTHROPIC_KEY",
              "--json", "how many files?", data_dir=tmp_path / "data", env={"TEST_ANTHROPIC_KEY": "sk-ant-local"})
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["answer"] == "files: 10"
    assert len(fake_anthropic.requests) == 3, "the 529 was retried once, then two turns"
    assert fake_anthropic.requests[0] == fake_anthropic.requests[1], "the retry resends the same request"
    second_turn = fake_anthropic.requests[2]
    assert second_turn["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert second_turn["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert second_turn["messages"][-1]["content"][0]["type"] == "tool_result"
    # Tokens: every prompt token (uncached + cache read + cache write) plus the output tokens.
    assert result["budget"]["tokens"] == (900 + 2000 + 40) + (50 + 2000 + 950 + 20)
    # claude-haiku-4-5 in the bundled table: 1.00 prompt, 0.10 cached, 1.25 cache write, 5.00 completion.
    expected_usd = (900 * 1.0 + 2000 * 1.25 + 40 * 5.0 + 50 * 1.0 + 2000 * 0.10 + 950 * 1.25 + 20 * 5.0) / 1e6
    assert result["budget"]["usd"] == pytest.approx(expected_usd)
    turns = [json.loads(line) for line in Path(result["trajectory_path"]).read_text().splitlines()]
    usages = [e["usage"] for e in turns if e.get("event") == "turn"]
    assert [(u["cache_read_tokens"], u["cache_creation_tokens"]) for u in usages] == [(0, 2000), (2000, 950)]
    stored = [p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert not any(b"sk-ant-local" in blob for blob in stored), "the key must never be stored"


def _priced_run(tmp_path: Path, fake_openai, *flags: str, env: dict[str, str] | None = None) -> dict:
    run = rlm("run", "--repo", "library/rlmfamily/examples/harbor", "--base-url", fake_openai.base_url, "--model",
              "gpt-4o-mini", "--api-key-env", "TEST_RLM_KEY", "--json", *flags, "how many files?",
              data_dir=tmp_path / "data", env={"TEST_RLM_KEY": "sk-local", **(env or {})})
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)


def test_a_known_model_is_priced_from_the_bundled_table(tmp_path: Path, fake_openai) -> None:
    fake_openai.push(code="final_answer(len(context.files()))", prompt_tokens=10_000, completion_tokens=1_000,
                     cached_tokens=4_000)
    result = _priced_run(tmp_path, fake_openai)
    # gpt-4o-mini in the bundled table: 0.15 prompt, 0.075 cached, 0.60 completion.
    assert result["budget"]["usd"] == pytest.approx((6_000 * 0.15 + 4_000 * 0.075 + 1_000 * 0.60) / 1e6)


def test_prompt_tokens_written_to_the_cache_are_priced_as_cache_writes(tmp_path: Path, fake_openai) -> None:
    fake_openai.push(code="final_answer(len(context.files()))", prompt_tokens=10_000, completion_tokens=1_000,
                     cached_tokens=2_000, cache_write_tokens=5_000)
    result = _priced_run(tmp_path, fake_openai, "--model", "gpt-6-sol")
    # gpt-6-sol in the bundled table: 2.00 prompt, 0.20 cached, 2.50 cache write, 10.00 completion.
    assert result["budget"]["usd"] == pytest.approx((3_000 * 2.00 + 2_000 * 0.20 + 5_000 * 2.50
                                                      + 1_000 * 10.00) / 1e6)


def test_max_usd_stops_a_run_priced_from_the_bundled_table(tmp_path: Path, fake_openai) -> None:
    for _ in range(6):  # each turn costs 1M prompt tokens at 0.15: $0.15
        fake_openai.push(code="print(1)", prompt_tokens=1_000_000, completion_tokens=10)
    result = _priced_run(tmp_path, fake_openai, "--max-usd", "0.4")
    assert result["stop_reason"] == "budget_exhausted" and result["answer"] is None
    assert len(fake_openai.requests) < 6
    # Past the limit: at most the call in flight, and the final-answer request, which is always made.
    assert result["budget"]["usd"] <= 0.4 + 2 * 0.15 + 1e-9, result["budget"]


def test_a_price_file_overrides_the_bundled_table(tmp_path: Path, fake_openai) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('"gpt-4o-mini" = { prompt = 10.0, completion = 20.0 }\n')
    fake_openai.push(code="final_answer(1)", prompt_tokens=1_000, completion_tokens=100)
    result = _priced_run(tmp_path, fake_openai, env={"RLM_PRICE_TABLE_FILE": str(prices)})
    assert result["budget"]["usd"] == pytest.approx((1_000 * 10.0 + 100 * 20.0) / 1e6)
