"""Which rlm specialists a worker serves, from settings: the specs, the routes, the key, the readiness report.

``specialist_runners`` is what the worker's runner registry adds for executor
``rlm``: one ``RlmRunner`` per spec that is ready (it has a route and a
prompt, its route is configured, its key variable is set, its script loads, a
scripted route is allowed here). A spec that is not ready is not served (a job
for it is answered ``specialist_not_served`` and its dispatcher retries later)
and is listed in the readiness report that the worker's ``/readyz`` and
``specialists serve`` show: a missing key is an operator's problem found at
start-up, never a customer's failed task. Without a checkpoint key
(``SPECIALISTS_SPECIALIST_CHECKPOINT_KEY``; ``specialists serve`` generates one on
one machine) no rlm spec is served: a run that could not be resumed safely is
not started.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from core.settings import Settings
from core.specs import LoadedSpec, SpecInvalid, load_specs, require_runnable
from workers.auth import VerifiedJob
from workers.hosted_rlm.routes import ModelRoutes, RouteProblem, readiness
from workers.hosted_rlm.runner import RlmRunner
from workers.hosted_rlm.store import CheckpointPolicy


@dataclass(frozen=True)
class SpecialistService:
    runners: dict[str, RlmRunner] = field(default_factory=dict)
    problems: tuple[RouteProblem, ...] = ()

    @property
    def ready(self) -> bool:
        return not self.problems


def _runnable(loaded: LoadedSpec) -> bool:
    try:
        require_runnable(loaded)
    except SpecInvalid:
        return False
    return True


def rlm_specs(settings: Settings, specs: Mapping[str, LoadedSpec] | None = None) -> dict[str, LoadedSpec]:
    """The rlm specs of ``specs``, or of the specs folder when none are given."""
    specs = load_specs(settings.hosted.specs_dir) if specs is None else specs
    return {sid: loaded for sid, loaded in specs.items() if loaded.spec.executor == "rlm"}


@dataclass(frozen=True)
class _Plan:
    ready: dict[str, LoadedSpec]
    problems: tuple[RouteProblem, ...]
    routes: ModelRoutes | None


def _plan(settings: Settings, environ: Mapping[str, str], loaded_specs: Mapping[str, LoadedSpec] | None = None) -> _Plan:
    specs = rlm_specs(settings, loaded_specs)
    runnable = {sid: loaded for sid, loaded in specs.items() if _runnable(loaded)}
    if not runnable:  # e.g. rlm specs served by other runners, or half-made ones: nothing needs a model here
        return _Plan({}, tuple(
            RouteProblem(sid, loaded.spec.model_route, "spec_not_runnable", "the spec names no model route or prompt")
            for sid, loaded in sorted(specs.items())
        ), None)
    if settings.hosted.checkpoint_key is None:
        return _Plan({}, tuple(
            RouteProblem(sid, loaded.spec.model_route, "checkpoint_key_missing",
                         "no key signs checkpoints on this worker; set SPECIALISTS_SPECIALIST_CHECKPOINT_KEY "
                         "(the same value on every worker)")
            for sid, loaded in sorted(runnable.items())
        ), None)
    routes = ModelRoutes.load(settings.hosted.model_routes_file)
    problems = readiness(specs, routes, environ=environ, allow_scripted=settings.scripted_routes_allowed)
    refused = {problem.specialist_id for problem in problems}
    return _Plan({sid: loaded for sid, loaded in specs.items() if sid not in refused}, tuple(problems), routes)


def check_readiness(settings: Settings, environ: Mapping[str, str] | None = None) -> list[RouteProblem]:
    """Every reason an rlm spec of this deployment could not run now (what ``specialists serve`` prints)."""
    return list(_plan(settings, os.environ if environ is None else environ).problems)


def specialist_runners(
    settings: Settings,
    engine: Engine,
    message_of: Callable[[VerifiedJob], Any],
    *,
    environ: Mapping[str, str] | None = None,
    specs: Mapping[str, LoadedSpec] | None = None,
) -> SpecialistService:
    """The ready rlm specialists as runners; the others as problems. ``specs``: as loaded already (a job's process
    gets the worker's, so it serves what the worker decided to serve, without parsing the files again)."""
    environ = os.environ if environ is None else environ
    plan = _plan(settings, environ, specs)
    if not plan.ready:
        return SpecialistService(problems=plan.problems)
    assert plan.routes is not None and settings.hosted.checkpoint_key is not None
    runner = RlmRunner(
        engine=engine,
        specs=plan.ready,
        routes=plan.routes,
        checkpoint_key=settings.hosted.checkpoint_key.get_secret_value().encode(),
        message_of=message_of,
        environ=environ,
        max_resumes=settings.hosted.max_resumes,
        checkpoint_sync=settings.hosted.checkpoint_sync,
        checkpoint_policy=CheckpointPolicy.of(settings.hosted),
    )
    return SpecialistService(runners={sid: runner for sid in plan.ready}, problems=plan.problems)
