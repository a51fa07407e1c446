"""The specialist runner end to end, in this process: an A2A message in, Monty investigating with the
scripted route, artifacts and usage out, everything journaled in PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from core.settings import PROJECT_ROOT, Settings
from core.specs import load_specs
from tests.workers.hosted_rlm import support
from workers.hosted_rlm import journal
from workers.hosted_rlm.routes import ModelRoutes, readiness

pytestmark = pytest.mark.timeout(60)

FILES = {
    "app/db.py": (
        "import sqlite3\n\n"
        "def find(conn, name):\n"
        "    return conn.execute(f\"SELECT * FROM users WHERE name = '{name}'\")\n\n"
        "def count(conn):\n"
        "    return conn.execute(\"SELECT count(*) FROM users\")\n"
    ),
    "app/orders.py": (
        "def order(conn, oid):\n"
        "    cur = conn.cursor()\n"
        "    cur.execute(f\"SELECT * FROM orders WHERE id = {oid}\")\n"
        "    return cur.fetchone()\n"
    ),
    "README.md": "# shop\n\nA small shop.\n",
}
RULE = "Find every SQL statement built from caller input."


def test_a_review_finds_the_defects_with_their_path_and_line_and_drops_foreign_paths(engine, tmp_path):
    spec = support.write_spec(tmp_path / "specs")
    job_id = support.new_job_id()
    token = support.claim(engine, job_id)
    events = support.Events()
    runner = support.runner(engine, spec, support.routes_for("review_sql.toml"), support.message(RULE, files=FILES))

    outcome = runner.run(support.context(job_id, "reviewer", token, events=events))

    assert outcome.state == "completed", outcome
    findings = support.artifact(outcome, "findings")["data"]
    assert [(f["path"], f["line"], f["severity"]) for f in findings] == [
        ("app/db.py", 4, "high"),
        ("app/orders.py", 3, "high"),
    ]
    assert outcome.detail["findings_dropped"] == {"path_not_in_bundle": 2}
    report = support.artifact(outcome, "report")["text"]
    assert "app/db.py:4 [high]" in report and "Dropped 2 citation(s)" in report
    # Metered: 4 base + 1 per answered semantic call, within the tariff of 20.
    assert outcome.detail["semantic_calls_used"] == 2
    assert outcome.detail["charged_credits"] == 4 + 2
    assert any("turn 2 of 10" in t for t in events.texts())
    with engine.connect() as conn:
        calls = conn.execute(
            text("SELECT purpose, state, prompt_tokens, completion_tokens, cost_usd FROM specialist_calls "
                 "WHERE job_id = :j ORDER BY call_id"), {"j": job_id}
        ).all()
        run = conn.execute(text("SELECT * FROM specialist_runs WHERE job_id = :j"), {"j": job_id}).mappings().one()
    assert [c.purpose for c in calls] == ["root", "root", "subcall", "subcall", "root"]
    assert all(c.state == "completed" and c.prompt_tokens > 0 and c.cost_usd == 0 for c in calls)
    assert (run["state"], run["outcome"], run["stop_reason"], run["credits_to_settle"]) == (
        "ended", "completed", "answered", 6)
    with engine.connect() as conn:
        [row] = journal.usage_by_job(conn, job_id=job_id)
        listed = journal.usage_calls(conn, job_id)
    assert (row["specialist_id"], row["model_calls"], row["semantic_calls_charged"], row["charged_credits"]) == (
        "reviewer", 5, 2, 6)
    assert row["prompt_tokens"] == sum(c.prompt_tokens for c in calls) and row["calls_with_unknown_tokens"] == 0
    assert [c["purpose"] for c in listed] == [c.purpose for c in calls]
def test_the_runners_figure_comes_from_the_tasks_reservation_in_its_run_context_not_from_the_spec(engine, tmp_path):
    """The spec's tariff is 20 and the run's metered price 4 + 2, but the task reserved 5 at admission (a spec
    changed since, say): the runner states no more than 5 and journals the reservation it was given."""
    spec = support.write_spec(tmp_path / "specs")
    assert spec.spec.tariff_credits == 20
    job_id = support.new_job_id()
    runner = support.runner(engine, spec, support.routes_for("review_sql.toml"), support.message(RULE, files=FILES))

    outcome = runner.run(support.context(job_id, "reviewer", support.claim(engine, job_id), reserved_credits=5))

    assert outcome.state == "completed" and outcome.detail["charged_credits"] == 5
    with engine.connect() as conn:
        journaled = conn.execute(text("SELECT tariff_credits FROM specialist_runs WHERE job_id = :j"),
                                 {"j": job_id}).scalar_one()
    assert journaled == 5


def test_a_refused_message_ends_the_job_rejected_and_charges_nothing(engine, tmp_path):
    spec = support.write_spec(tmp_path / "specs")
    job_id = support.new_job_id()
    pasted = support.message("Review these.\n```python path=/etc/passwd\nroot:x:0:0\n```\n")
    runner = support.runner(engine, spec, support.routes_for("review_sql.toml"), pasted)
    outcome = runner.run(support.context(job_id, "reviewer", support.claim(engine, job_id)))
    assert outcome.state == "rejected"
    assert outcome.detail == {"code": "evidence_path_invalid", "charged_credits": 0}
    assert "'/etc/passwd' is absolute" in outcome.message and "relative path" in outcome.message


def pasted_files(rule: str, files: dict[str, str]) -> str:
    """``files`` pasted in one text the way a foreign agent writes them: a rule, then one named fence each."""
    blocks = [f"```python path={path}\n{content}```" for path, content in files.items()]
    return rule + "\n\n" + "\n\n".join(blocks) + "\n"


def test_code_pasted_in_text_is_reviewed_with_findings_at_its_path_and_line(engine, tmp_path):
    spec = support.write_spec(tmp_path / "specs")
    job_id = support.new_job_id()
    message = support.message(pasted_files(RULE, FILES))
    assert [p.WhichOneof("content") for p in message.parts] == ["text"]  # nothing but pasted text
    runner = support.runner(engine, spec, support.routes_for("review_sql.toml"), message)

    outcome = runner.run(support.context(job_id, "reviewer", support.claim(engine, job_id)))

    assert outcome.state == "completed", outcome
    findings = support.artifact(outcome, "findings")["data"]
    assert [(f["path"], f["line"]) for f in findings] == [("app/db.py", 4), ("app/orders.py", 3)]


def test_the_default_routes_serve_the_demo_on_one_machine_only():
    embedded = Settings(database={"url": None})
    external = Settings(database={"url": "postgresql://db.example/specialists"})
    assert embedded.scripted_routes_allowed and not external.scripted_routes_allowed
    assert Settings(
        database={"url": "postgresql://x/y"},
        hosted={"model_routes_allow_scripted": True},
    ).scripted_routes_allowed
    routes = ModelRoutes.load(embedded.hosted.model_routes_file)
    specs = load_specs(PROJECT_ROOT / "specs")
    assert readiness(specs, routes, environ={}, allow_scripted=embedded.scripted_routes_allowed) == []
