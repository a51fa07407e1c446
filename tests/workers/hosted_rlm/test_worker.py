"""The worker's registry of rlm specialists and its readiness: a specialist whose route is not ready is not
served, and /readyz says why; a ready one is served by the specialist runner with the resumable claim."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from tests.workers.hosted_rlm import support
from tests.workers.conftest import WORKER_SECRET
from workers.server import create_worker_app
from workers.assembly import build_worker_service
from workers.hosted_rlm.runner import RlmRunner

pytestmark = pytest.mark.timeout(60)


def worker(settings, engine):
    return TestClient(create_worker_app(build_worker_service(settings, engine)))


def test_a_route_whose_key_is_missing_is_not_served_and_readyz_says_why(database_url, engine, tmp_path):
    specs = tmp_path / "specs"
    support.write_spec(specs, "reviewer")
    routes = tmp_path / "routes.toml"
    routes.write_text('[routes.test]\nkind = "openai"\nbase_url = "https://models.example/v1"\nmodel = "m"\n'
                      'api_key_env = "REVIEWER_MODEL_KEY"\n')
    configured = Settings(
        database={"url": database_url},
        hosted={"specs_dir": specs, "model_routes_file": routes, "checkpoint_key": support.CHECKPOINT_KEY.decode()},
        worker={"job_secrets": WORKER_SECRET, "oidc_verify": False},
    )
    with worker(configured, engine) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 503
    body = answer.json()
    assert "reviewer" not in body["specialists"] and "conformance" in body["specialists"]
    [problem] = body["problems"]
    assert (problem["specialist"], problem["code"]) == ("reviewer", "route_key_missing")
    assert "REVIEWER_MODEL_KEY is not set on this worker" in problem["message"]


def test_without_a_checkpoint_key_no_rlm_specialist_is_served(database_url, engine, tmp_path):
    specs = tmp_path / "specs"
    support.write_spec(specs, "reviewer")
    configured = Settings(
        database={"url": database_url},
        hosted={"specs_dir": specs, "model_routes_file": tmp_path / "unused.toml", "checkpoint_key": None},
        worker={"job_secrets": WORKER_SECRET, "oidc_verify": False},
    )
    with worker(configured, engine) as client:
        body = client.get("/readyz").json()
    assert [p["code"] for p in body["problems"]] == ["checkpoint_key_missing"]
    assert "SPECIALISTS_SPECIALIST_CHECKPOINT_KEY" in body["problems"][0]["message"]


def test_a_ready_specialist_is_served_by_the_specialist_runner(database_url, engine, tmp_path):
    specs = tmp_path / "specs"
    support.write_spec(specs, "reviewer")
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[routes.test]\nkind = "scripted"\nscript = "{support.SCRIPTS / "review_sql.toml"}"\n')
    configured = Settings(
        database={"url": database_url},
        hosted={
            "specs_dir": specs,
            "model_routes_file": routes,
            "model_routes_allow_scripted": True,
            "checkpoint_key": support.CHECKPOINT_KEY.decode(),
            "max_resumes": 3,
        },
        worker={"job_secrets": WORKER_SECRET, "oidc_verify": False},
    )
    service = build_worker_service(configured, engine)
    runner = service.runners["reviewer"]
    assert isinstance(runner, RlmRunner) and runner.max_resumes == 3
    with TestClient(create_worker_app(service)) as client:
        assert client.get("/readyz").json()["status"] == "ready"
