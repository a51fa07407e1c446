"""Model routes: the named endpoints operators configure for specialists, and the readiness check.

A routes file (TOML, JSON or YAML, by extension; ``SPECIALISTS_MODEL_ROUTES_FILE``)
maps names to routes. A spec names its route (``model_route``). Two kinds:

``openai``: any OpenAI-compatible endpoint: base URL, model id (and optionally a
cheaper model for semantic calls), the NAME of the environment variable that
holds the key, a price table (USD per million tokens) and timeouts. The key is
read on the worker host when a run starts (``rlmfamily.providers.OpenAIProvider``); it
never enters the sandbox, a checkpoint, the journal or a log line.

``scripted``: ``rlmfamily.providers.ScriptedProvider`` replaying a script file (relative
paths are relative to the routes file): tests and the one-machine demo. With an
external database a scripted route is refused unless
``SPECIALISTS_MODEL_ROUTES_ALLOW_SCRIPTED`` is set, so a production deployment
never answers customers from a script by accident.

``readiness`` checks every rlm spec against the routes and the environment
(route exists, key variable set, script loads) and is what a worker's readiness
probe and ``specialists serve`` call: a missing key fails there, not on the first
customer.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.errors import ServiceError
from core.specs import ROUTE_NAME_RE, LoadedSpec
from rlmfamily.errors import RLMError
from rlmfamily.providers.base import PriceTable, Provider
from rlmfamily.providers.openai_compat import OpenAIProvider
from rlmfamily.providers.scripted import ScriptedProvider

MAX_ROUTES_FILE_BYTES = 256 * 1024
MAX_ROUTES = 100
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class RouteInvalid(ServiceError):
    code = "route_invalid"


class RouteNotReady(ServiceError):
    code = "route_not_ready"


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Prices = dict[str, dict[Literal["prompt", "completion"], Annotated[float, Field(ge=0)]]]


class OpenAIRoute(_Closed):
    kind: Literal["openai"]
    base_url: str = Field(pattern=r"^https?://[^\s]+$")
    model: str = Field(min_length=1, max_length=200)
    subcall_model: str | None = Field(default=None, min_length=1, max_length=200)
    api_key_env: str = Field(pattern=ENV_NAME_RE, description="The NAME of the variable holding the key.")
    prices_usd_per_mtok: Prices = Field(default_factory=dict)
    request_timeout_s: float = Field(default=120.0, gt=0, le=900, description="One root-model call, retries included.")
    max_retries: int = Field(default=3, ge=0, le=10)
    backoff_s: float = Field(default=0.5, ge=0, le=60)

    @field_validator("prices_usd_per_mtok")
    @classmethod
    def _both_prices(cls, value: Prices) -> Prices:
        for model, price in value.items():
            if set(price) != {"prompt", "completion"}:
                raise ValueError(f"price of {model!r} needs both prompt and completion (USD per million tokens)")
        return value


class ScriptedRoute(_Closed):
    kind: Literal["scripted"]
    script: Path
    request_timeout_s: float = Field(default=60.0, gt=0, le=900)


Route = Annotated[OpenAIRoute | ScriptedRoute, Field(discriminator="kind")]


class RoutesFile(_Closed):
    routes: dict[Annotated[str, Field(pattern=ROUTE_NAME_RE)], Route] = Field(max_length=MAX_ROUTES)


@dataclass(frozen=True)
class RouteProblem:
    """Why a specialist cannot be served: what readiness reports."""

    specialist_id: str
    route: str | None
    code: str  # route_missing | route_key_missing | route_script_invalid | route_scripted_refused | spec_not_runnable
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"specialist": self.specialist_id, "route": self.route, "code": self.code, "message": self.message}


class ModelRoutes:
    """The loaded routes file; builds a provider for a route name."""

    def __init__(self, routes: Mapping[str, OpenAIRoute | ScriptedRoute], *, source: Path | None = None) -> None:
        self.routes = dict(routes)
        self.source = source

    @classmethod
    def load(cls, path: Path) -> ModelRoutes:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise RouteInvalid(
                f"{path}: the model routes file cannot be read ({exc.strerror}); set SPECIALISTS_MODEL_ROUTES_FILE"
            ) from None
        if len(raw) > MAX_ROUTES_FILE_BYTES:
            raise RouteInvalid(f"{path}: is {len(raw)} bytes; a routes file has at most {MAX_ROUTES_FILE_BYTES}")
        try:
            if path.suffix == ".toml":
                document = tomllib.loads(raw.decode())
            elif path.suffix == ".json":
                document = json.loads(raw)
            elif path.suffix in (".yaml", ".yml"):
                document = yaml.safe_load(raw)
            else:
                raise RouteInvalid(f"{path}: a routes file is .toml, .json or .yaml")
        except (ValueError, yaml.YAMLError) as exc:
            raise RouteInvalid(f"{path}: cannot be parsed ({exc})") from None
        try:
            parsed = RoutesFile.model_validate(document)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_input=False, include_url=False)
            )
            raise RouteInvalid(f"{path}: {problems}") from None
        routes: dict[str, OpenAIRoute | ScriptedRoute] = {}
        for name, route in parsed.routes.items():
            if isinstance(route, ScriptedRoute) and not route.script.is_absolute():
                route = route.model_copy(update={"script": (path.parent / route.script).resolve()})
            routes[name] = route
        return cls(routes, source=path)

    def get(self, name: str) -> OpenAIRoute | ScriptedRoute:
        route = self.routes.get(name)
        if route is None:
            where = f" in {self.source}" if self.source else ""
            raise RouteNotReady(
                f"model route {name!r} is not configured{where}; add it to the routes file "
                "(SPECIALISTS_MODEL_ROUTES_FILE)",
                code="route_missing",
            )
        return route

    def provider(
        self, name: str, *, environ: Mapping[str, str], skip_root_turns: int = 0
    ) -> tuple[Provider, OpenAIRoute | ScriptedRoute]:
        """A provider for ``name``. ``skip_root_turns``: root turns a resumed run replays from its journal
        (a scripted route serves the next ones in order, as the first worker would have)."""
        route = self.get(name)
        try:
            if isinstance(route, ScriptedRoute):
                script = ScriptedProvider.from_file(route.script).script
                script = dict(script, root=list(script.get("root", []))[skip_root_turns:])
                return ScriptedProvider(script, source=str(route.script), folder=Path(route.script).resolve().parent), route
            return (
                OpenAIProvider(
                    base_url=route.base_url,
                    model=route.model,
                    api_key_env=route.api_key_env,
                    prices=PriceTable(dict(route.prices_usd_per_mtok)),
                    max_retries=route.max_retries,
                    backoff_s=route.backoff_s,
                    environ=environ,
                ),
                route,
            )
        except RLMError as exc:
            # Never the key itself: only the variable's name is ever shown.
            if exc.code == "missing_api_key" and isinstance(route, OpenAIRoute):
                message = (f"the environment variable {route.api_key_env} is not set on this worker; put the key for "
                           f"{route.base_url} in it, or name another variable (api_key_env) in the routes file")
            else:
                message = exc.message
            raise RouteNotReady(f"model route {name!r}: {message}", code=_problem_code(exc)) from None


def _problem_code(exc: RLMError) -> str:
    return {"missing_api_key": "route_key_missing", "script_invalid": "route_script_invalid"}.get(
        exc.code, "route_not_ready"
    )


def readiness(
    specs: Mapping[str, LoadedSpec],
    routes: ModelRoutes,
    *,
    environ: Mapping[str, str],
    allow_scripted: bool,
) -> list[RouteProblem]:
    """Every reason an rlm specialist in ``specs`` could not run now. Empty: ready."""
    from core.specs import SpecInvalid, require_runnable

    problems: list[RouteProblem] = []
    for spec_id, loaded in sorted(specs.items()):
        spec = loaded.spec
        if spec.executor != "rlm":
            continue
        try:
            require_runnable(loaded)
        except SpecInvalid as invalid:
            problems.append(RouteProblem(spec_id, spec.model_route, "spec_not_runnable", invalid.message))
            continue
        assert spec.model_route is not None
        try:
            route = routes.get(spec.model_route)
            if isinstance(route, ScriptedRoute) and not allow_scripted:
                problems.append(
                    RouteProblem(
                        spec_id,
                        spec.model_route,
                        "route_scripted_refused",
                        f"model route {spec.model_route!r} is scripted (canned answers); with an external database "
                        "configure a real route, or set SPECIALISTS_MODEL_ROUTES_ALLOW_SCRIPTED=true for a test deployment",
                    )
                )
                continue
            routes.provider(spec.model_route, environ=environ)
        except RouteNotReady as problem:
            problems.append(RouteProblem(spec_id, spec.model_route, problem.code, problem.message))
    return problems
