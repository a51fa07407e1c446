"""Writes the bytecode of what the image's roles import at start; the Dockerfile runs it in both stages.

The image's root is read-only at run time, so a module with no bytecode on disk is compiled in memory on
every import: about 2.3 s more per process start if nothing were written. The builder runs this for the
venv's modules and the project's; the final stage runs it again with the base's own interpreter, which
writes what is still missing there, the standard library's (the distroless base ships no bytecode).
What is listed: each role's command (ops/cli.py's serve, worker, dispatcher, db upgrade, console; the
drill job), the job processes' forkserver preload (workers.isolation.PRELOAD), the model SDK of the
hosted routes, and OpenTelemetry's SDK and exporters (core.telemetry.SDK_MODULES: on in production).
tests/deploy/test_dockerfile.py keeps the list true.
"""

from __future__ import annotations

import importlib
import sys

MODULES = (
    "app.assembly", "app.grpc_binding", "ops.cli", "ops.entrypoint", "ops.drill.cli", "ops.console.app",
    "workers.job_signals", "workers.job_template", "workers.assembly", "workers.server", "workers.dispatch.process",
    "workers.dispatch.cloud_tasks", "workers.hosted_rlm.serving", "workers.hosted_rlm.runner",
    "rlmfamily.session", "rlmfamily.kernels.monty", "rlmfamily.providers.openai_compat",
    "sqlalchemy.dialects.postgresql", "alembic.command", "openai",
)


def main() -> int:
    from core.telemetry import SDK_MODULES  # what a role imports at start with telemetry on

    sys.dont_write_bytecode = False  # the image's ENV says otherwise for run time, not for this
    for name in MODULES + SDK_MODULES:
        importlib.import_module(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
