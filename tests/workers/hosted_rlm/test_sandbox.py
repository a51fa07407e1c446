"""What the model's code cannot reach on a hosted worker: the model key, the environment, the network,
files outside the bundle, children or A2A. The route is an OpenAI-compatible endpoint on 127.0.0.1 (a
stand-in for a paid model, speaking the real wire format) whose key is in the worker's environment."""

from __future__ import annotations

import ast

import pytest
from sqlalchemy import text

from core.specs import load_spec
from tests.workers.hosted_rlm import support
from tests.workers.hosted_rlm.fake_openai import FakeOpenAI
from workers.hosted_rlm.hosted import hosted_settings
from workers.hosted_rlm.routes import ModelRoutes, OpenAIRoute

pytestmark = pytest.mark.timeout(60)

KEY = "sk-test-" + "Q7" * 20
PROBE = '''
import os
probes = {}
def attempt(name, fn):
    try:
        probes[name] = "reached: " + str(fn())[:200]
    except Exception as e:
        probes[name] = "refused: " + type(e).__name__
attempt("environ", lambda: os.environ)
attempt("getenv", lambda: os.getenv("FAKE_MODEL_KEY"))
attempt("secret_file", lambda: open(SECRET).read())
attempt("etc_passwd", lambda: open("/etc/passwd").read())
attempt("listdir_root", lambda: os.listdir("/"))
attempt("outside_bundle", lambda: context.read("../secret.txt"))
attempt("socket", lambda: __import__("socket"))
attempt("import_socket", lambda: exec("import socket"))
attempt("import_subprocess", lambda: exec("import subprocess"))
attempt("children", lambda: rlm.run("do more"))
attempt("a2a", lambda: a2a.peers())
attempt("write", lambda: open("notes.txt", "w").write("x"))
print(probes)
'''


def test_the_sandbox_cannot_see_the_key_the_environment_the_network_or_files_outside_the_bundle(
    engine, tmp_path, monkeypatch
):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-" + KEY)
    monkeypatch.setenv("FAKE_MODEL_KEY", KEY)  # in the worker process's own environment too
    spec = support.write_spec(tmp_path / "specs")
    with FakeOpenAI([PROBE.replace("SECRET", repr(str(secret))),
                     'final_answer({"summary": repr(probes), "findings": []})']) as model:
        routes = ModelRoutes({"test": OpenAIRoute(kind="openai", base_url=model.url, model="fake-model",
                                                  api_key_env="FAKE_MODEL_KEY", max_retries=0)})
        job_id = support.new_job_id()
        token = support.claim(engine, job_id)
        runner = support.runner(engine, spec, routes, support.message("Review.", files={"notes.txt": "hello\n"}),
                                environ={"FAKE_MODEL_KEY": KEY})
        outcome = runner.run(support.context(job_id, "reviewer", token))

    assert outcome.state == "completed", outcome
    probes = ast.literal_eval(support.artifact(outcome, "report")["text"].split("\n")[0])
    assert len(probes) == 12 and all(value.startswith("refused: ") for value in probes.values()), probes
    assert probes["secret_file"] == probes["etc_passwd"] == probes["write"] == "refused: PermissionError"
    assert probes["environ"] == probes["getenv"] == "refused: RuntimeError"
    assert probes["import_socket"] == probes["import_subprocess"] == "refused: ModuleNotFoundError"
    assert probes["children"] == probes["a2a"] == "refused: NameError"  # not in the hosted namespace at all
    # The key went to the model only as the Authorization header, never in what the sandbox produced.
    assert model.requests and all(headers.get("authorization") == f"Bearer {KEY}" for headers, _ in model.requests)
    assert not any(KEY.encode() in body for _, body in model.requests)
    assert KEY not in repr(outcome)
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT coalesce(string_agg(data::text, ''), '') FROM specialist_checkpoints WHERE job_id = :j"),
            {"j": job_id},
        ).scalar_one()
        calls = conn.execute(
            text("SELECT coalesce(string_agg(coalesce(request_text, '') || coalesce(response::text, ''), ''), '') "
                 "FROM specialist_calls WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()
    assert KEY not in stored and KEY.encode().hex() not in stored and KEY not in calls
    with engine.connect() as conn:
        usage = conn.execute(
            text("SELECT prompt_tokens, completion_tokens, cost_usd FROM specialist_calls WHERE job_id = :j"),
            {"j": job_id},
        ).all()
    assert usage and all(row.prompt_tokens == 100 and row.completion_tokens == 20 for row in usage)
    assert all(row.cost_usd is None for row in usage)  # no price for fake-model: unknown, not zero


def test_the_hosted_profile_ignores_the_workers_rlm_environment(tmp_path, monkeypatch):
    for name, value in {"RLM_A2A_ENABLED": "true", "RLM_MAX_CHILD_DEPTH": "3", "RLM_KERNEL": "host",
                        "RLM_MAX_SUBCALLS": "999", "RLM_MAX_PROMPT_CHARS": "500000",
                        "RLM_MEMOISE_SUBCALLS": "true"}.items():
        monkeypatch.setenv(name, value)
    spec = load_spec(support.write_spec(tmp_path / "specs").path).spec
    route = support.routes_for("review_sql.toml").get("test")
    settings = hosted_settings(spec, route, data_dir=tmp_path, max_run_s=60, max_subcalls=16)
    assert (settings.a2a_enabled, settings.max_child_depth, settings.max_children, settings.kernel,
            settings.memoise_subcalls) == (False, 0, 0, "monty", False)
    assert (settings.max_subcalls, settings.max_prompt_chars, settings.max_response_chars,
            settings.max_concurrency) == (16, 32_000, 4_000, 2)
