"""Model routes: the operator's routes file, and the readiness check that fails a missing key before any
customer does."""

from __future__ import annotations

import json

import pytest
import yaml

from core.settings import PROJECT_ROOT
from core.specs import load_specs
from tests.workers.hosted_rlm import support
from workers.hosted_rlm.routes import ModelRoutes, OpenAIRoute, RouteInvalid, ScriptedRoute, readiness

ROUTES = {
    "routes": {
        "reviewer": {
            "kind": "openai", "base_url": "https://openrouter.ai/api/v1", "model": "openai/gpt-4o-mini",
            "api_key_env": "OPENROUTER_API_KEY",
            "prices_usd_per_mtok": {"openai/gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}},
        },
        "analyst": {"kind": "scripted", "script": "scripts/analyst.toml"},
    }
}


@pytest.mark.parametrize("suffix", [".toml", ".json", ".yaml"])
def test_a_routes_file_loads_from_toml_json_or_yaml(tmp_path, suffix):
    path = tmp_path / f"routes{suffix}"
    if suffix == ".toml":
        path.write_text(
            '[routes.reviewer]\nkind = "openai"\nbase_url = "https://openrouter.ai/api/v1"\n'
            'model = "openai/gpt-4o-mini"\napi_key_env = "OPENROUTER_API_KEY"\n'
            '[routes.reviewer.prices_usd_per_mtok."openai/gpt-4o-mini"]\nprompt = 0.15\ncompletion = 0.6\n'
            '[routes.analyst]\nkind = "scripted"\nscript = "scripts/analyst.toml"\n'
        )
    else:
        path.write_text(json.dumps(ROUTES) if suffix == ".json" else yaml.safe_dump(ROUTES))
    routes = ModelRoutes.load(path)
    reviewer, analyst = routes.get("reviewer"), routes.get("analyst")
    assert isinstance(reviewer, OpenAIRoute) and reviewer.api_key_env == "OPENROUTER_API_KEY"
    assert reviewer.prices_usd_per_mtok["openai/gpt-4o-mini"] == {"prompt": 0.15, "completion": 0.6}
    assert isinstance(analyst, ScriptedRoute) and analyst.script == (tmp_path / "scripts" / "analyst.toml").resolve()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"api_key_env": "sk-live-abc123"}, "routes.reviewer.openai.api_key_env"),
        ({"kind": "magic"}, "routes.reviewer"),
        ({"base_url": "ftp://x"}, "routes.reviewer.openai.base_url"),
        ({"timeout": 3}, "Extra inputs are not permitted"),
    ],
)
def test_an_invalid_route_is_refused_naming_the_file_and_field(tmp_path, change, reason):
    document = json.loads(json.dumps(ROUTES))
    document["routes"]["reviewer"].update(change)
    path = tmp_path / "routes.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RouteInvalid) as caught:
        ModelRoutes.load(path)
    assert str(path) in str(caught.value) and reason in str(caught.value)


def test_a_route_whose_key_is_missing_fails_readiness_naming_the_variable_not_the_customer(tmp_path):
    path = tmp_path / "routes.json"
    path.write_text(json.dumps({"routes": {"reviewer": ROUTES["routes"]["reviewer"],
                                           "analyst": {"kind": "scripted", "script": str(support.SCRIPTS / "review_sql.toml")}}}))
    specs = load_specs(PROJECT_ROOT / "specs")
    routes = ModelRoutes.load(path)

    problems = readiness(specs, routes, environ={}, allow_scripted=True)
    assert [(p.specialist_id, p.code) for p in problems] == [("reviewer", "route_key_missing")]
    assert "OPENROUTER_API_KEY is not set" in problems[0].message

    key = "sk-or-" + "k" * 30
    assert readiness(specs, routes, environ={"OPENROUTER_API_KEY": key}, allow_scripted=True) == []


def test_readiness_reports_a_missing_route_and_refuses_scripted_routes_in_production(tmp_path):
    specs = load_specs(PROJECT_ROOT / "specs")
    only_reviewer = ModelRoutes({"reviewer": ScriptedRoute(kind="scripted", script=support.SCRIPTS / "review_sql.toml")})
    problems = readiness(specs, only_reviewer, environ={}, allow_scripted=False)
    assert [(p.specialist_id, p.code) for p in problems] == [
        ("analyst", "route_missing"), ("reviewer", "route_scripted_refused")
    ]
    assert "SPECIALISTS_MODEL_ROUTES_FILE" in problems[0].message
