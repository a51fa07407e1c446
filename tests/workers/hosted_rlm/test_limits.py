"""Limits of a hosted run, each ending as docs/SPECIALISTS.md says and telling the customer why:
the 17th semantic call, an over-long prompt, an answer over the output limit, the deadline."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from tests.workers.hosted_rlm import support

pytestmark = pytest.mark.timeout(60)

FILES = {"notes.txt": "alpha\nbeta\ngamma\n"}


def run(engine, tmp_path: Path, script: str, *, spec_id: str = "reviewer", **spec_overrides):
    spec = support.write_spec(tmp_path / "specs", spec_id, **spec_overrides)
    script_path = tmp_path / "script.toml"
    script_path.write_text(script)
    job_id = support.new_job_id()
    token = support.claim(engine, job_id)
    runner = support.runner(engine, spec, support.routes_for(script_path), support.message("Review it.", files=FILES))
    return job_id, runner.run(support.context(job_id, spec_id, token))


def subcalls_sent(engine, job_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM specialist_calls WHERE job_id = :j AND purpose = 'subcall'"), {"j": job_id}
        ).scalar_one()


def test_the_17th_semantic_call_is_refused_and_the_customer_is_told(engine, tmp_path):
    job_id, outcome = run(engine, tmp_path, '''
default_answer = "fine"
[[root]]
code = """
results = [llm_query("question %d" % i) for i in range(17)]
print([r.error_code for r in results][-2:])
"""
[[root]]
code = """final_answer({"summary": results[16].error_code + ": " + results[16].advice, "findings": []})"""
''')
    assert outcome.state == "completed"
    assert subcalls_sent(engine, job_id) == 16
    report = support.artifact(outcome, "report")["text"]
    assert report.startswith("subcall_limit: Combine the answers you have")
    assert "1 semantic call(s) were refused: this specialist makes at most 16 per task (limits.max_semantic_calls)" in report
    assert outcome.detail["semantic_calls_used"] == 16
    assert outcome.detail["charged_credits"] == 20  # 4 + 16 x 1: the metered maximum, exactly the tariff


def test_an_over_long_prompt_is_refused_without_calling_the_model(engine, tmp_path):
    job_id, outcome = run(engine, tmp_path, '''
[[root]]
code = """
r = llm_query("x" * 32001)
print(r.ok, r.error_code, r.error)
final_answer({"summary": r.error, "findings": []})
"""
''')
    assert outcome.state == "completed"
    assert subcalls_sent(engine, job_id) == 0
    report = support.artifact(outcome, "report")["text"]
    assert "32,001 characters; a sub-call takes at most 32,000" in report
    assert "1 semantic call(s) were refused: a prompt is at most 32,000 characters (limits.max_prompt_chars)" in report
    assert outcome.detail["charged_credits"] == 4  # the base: no semantic call was answered


def test_an_answer_over_the_output_limit_is_refused_in_the_sandbox_and_a_shorter_one_is_taken(engine, tmp_path):
    _, outcome = run(engine, tmp_path, '''
[[root]]
code = """
try:
    final_answer("x" * 500)
except ValueError as e:
    print("refused:", e)
"""
[[root]]
code = """final_answer({"summary": "short enough", "findings": []})"""
''', limits={"max_output_bytes": 200})
    assert outcome.state == "completed"
    assert support.artifact(outcome, "report")["text"].startswith("short enough")


def test_an_answer_that_never_fits_the_output_limit_fails_the_task_saying_so(engine, tmp_path):
    _, outcome = run(engine, tmp_path, '''
[[root]]
code = "print('thinking')"
[[root]]
text = "%s"
''' % ("y" * 500), limits={"max_output_bytes": 200, "max_turns": 1})
    assert outcome.state == "failed"
    assert outcome.detail["code"] == "output_too_large"
    assert "over 200 bytes (limits.max_output_bytes)" in outcome.message
    assert outcome.artifacts == ()


def test_the_deadline_stops_the_run_asks_for_the_answer_and_says_so(engine, tmp_path):
    _, outcome = run(engine, tmp_path, '''
[[root]]
code = "print('a slow first turn')"
delay_s = 1.3
[[root]]
code = """final_answer({"summary": "what I had", "findings": []})"""
''', limits={"deadline_s": 5, "answer_reserve_s": 4})
    assert outcome.state == "completed"
    assert outcome.detail["stop_reason"] == "deadline"
    report = support.artifact(outcome, "report")["text"]
    assert report.startswith("what I had")
    assert "reached its deadline (5 s, limits.deadline_s" in report


def test_a_run_that_reaches_its_deadline_without_an_answer_fails_saying_why(engine, tmp_path):
    _, outcome = run(engine, tmp_path, '''
[[root]]
code = "print('a slow first turn')"
delay_s = 1.3
[[root]]
code = "print('still no answer')"
''', limits={"deadline_s": 5, "answer_reserve_s": 4})
    assert outcome.state == "failed"
    assert outcome.detail["code"] == "no_answer_deadline"
    assert "reached its deadline" in outcome.message and "no answer" in outcome.message
