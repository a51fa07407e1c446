"""A specialist run in its own process, for crash tests: ``python -m tests.workers.hosted_rlm.run_process CONFIG``.

CONFIG is a JSON file: ``database_url``, ``job_id``, ``token``, ``spec`` (a spec file),
``script`` (the scripted route's script), ``text`` and ``files`` (the message),
``calls_log`` and ``outcome``, optionally ``checkpoint_sync``. Every call that reaches the scripted provider is
appended to ``calls_log`` (flushed at once, so a SIGKILL loses nothing written
before it): that is how a test counts what a process really asked the model.
The outcome is written to ``outcome`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from core import db
from core.settings import Settings
from core.specs import load_spec
from tests.workers.hosted_rlm import support
from workers.hosted_rlm.routes import ModelRoutes


class CountingProvider:
    def __init__(self, inner: Any, log_path: str) -> None:
        self.inner = inner
        self.log_path = log_path
        self.name = inner.name
        self.default_model = inner.default_model
        self.prices = inner.prices

    def complete(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        with open(self.log_path, "a") as log:
            log.write(f"{os.getpid()} {kwargs['purpose']}\n")
            log.flush()
        return self.inner.complete(messages, **kwargs)


class CountingRoutes(ModelRoutes):
    def __init__(self, base: ModelRoutes, log_path: str) -> None:
        super().__init__(base.routes)
        self.log_path = log_path

    def provider(self, name: str, **kwargs: Any) -> Any:
        provider, route = super().provider(name, **kwargs)
        return CountingProvider(provider, self.log_path), route


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    settings = Settings(database={"url": config["database_url"]})
    engine = db.make_engine(db.sqlalchemy_url(config["database_url"]), settings)
    spec = load_spec(Path(config["spec"]))
    routes = CountingRoutes(support.routes_for(Path(config["script"])), config["calls_log"])
    msg = support.message(config["text"], files=config["files"])
    runner = support.runner(engine, spec, routes, msg, checkpoint_sync=config.get("checkpoint_sync", "with_journal"))
    print("RUNNING", flush=True)
    outcome = runner.run(support.context(config["job_id"], spec.spec.id, config["token"]))
    Path(config["outcome"]).write_text(json.dumps({
        "state": outcome.state, "message": outcome.message, "artifacts": list(outcome.artifacts),
        "detail": outcome.detail,
    }, default=str))
    engine.dispose()


if __name__ == "__main__":
    main()
