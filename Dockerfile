# syntax=docker/dockerfile:1
# One image for every role of the service; the first argument picks the role:
#   serve            the A2A edge (production: SPECIALISTS_SERVE_WORKER=false, the Cloud Tasks relay as its child)
#   worker           the private worker endpoint (POST /jobs)
#   console          the operator console (production: SPECIALISTS_CONSOLE_AUTH=iap, behind IAP)
#   dispatcher       the embedded dispatcher or the Cloud Tasks relay, on its own
#   db upgrade       the migration job
# PORT (set by Cloud Run) is the port of the role that listens: see infra/entrypoint.sh.
# tests/deploy/test_dockerfile.py checks this file against the code.

# The base, by tag and digest: every build starts from the same bytes, and the tag says what they are. To move it,
# look up the tag's current digest (`docker buildx imagetools inspect python:3.11-slim-bookworm`), change both
# FROM lines (tests/deploy/test_dockerfile.py checks they agree), and run the smoke (docs/OPERATIONS.md). Where no
# registry serves it, the build is given a local base under this same name, as a named build context:
# --build-context <the reference>=container-image://<local image> (infra/release/smoke.py makes one with debootstrap).

# --- builder: installs the runtime lock; nothing is compiled (wheels only) ---------------------------
FROM python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91 AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

SHELL ["/bin/sh", "-eu", "-c"]

# The runtime lock alone (requirements.lock: exact versions, nothing resolved here; the development set is
# requirements-dev.lock and never enters the image), as wheels only, so no compiler is needed or installed.
# `pip check` fails the build if the lock misses a dependency. A machine whose TLS to the package index goes
# through its own certificate authority passes that bundle as the build secret `build_ca`
# (--secret id=build_ca,src=/etc/ssl/certs/ca-certificates.crt); it is never written to a layer.
COPY requirements.lock requirements-build.lock /app/
RUN --mount=type=secret,id=build_ca \
    if [ -f /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca; fi; \
    python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --no-deps --only-binary=:all: -r /app/requirements.lock -r /app/requirements-build.lock \
    && /opt/venv/bin/pip check
ENV PATH=/opt/venv/bin:$PATH

# The project, editable at /app: code, specs and migrations stay where the settings expect them
# (PROJECT_ROOT), and the final stage copies /app and /opt/venv to the same paths.
WORKDIR /app
COPY pyproject.toml README.md ./
COPY core ./core
COPY ledger ./ledger
COPY taskstate ./taskstate
COPY app ./app
COPY workers ./workers
COPY library ./library
COPY ops ./ops
COPY migrations ./migrations
COPY specs ./specs
COPY infra/model_routes.toml infra/entrypoint.sh ./infra/
# Built with the locked setuptools (requirements-build.lock; no download); then setuptools and pip leave the
# venv: nothing at run time installs anything, and an editable install needs neither to import.
# Bytecode: all of the project's, and of the dependencies what the roles import at start (their modules, the job
# processes' forkserver preload, the model SDKs), written by importing them. The root is read-only at run time,
# so a module without it compiles in memory on each import (about 2.3 s more per process start if none were
# written); the dependencies' other modules (28 MB of bytecode) are rarely imported.
RUN pip install --no-compile --no-deps --no-build-isolation -e ./library -e . \
    && pip uninstall -y -q setuptools pip \
    && rm -rf /app/build /app/*.egg-info /app/library/build /app/library/*.egg-info \
    && find /opt/venv -name '*.pyi' -delete \
    && python -m compileall -q /app \
    && env -u PYTHONDONTWRITEBYTECODE python -c "import app.assembly, app.grpc_binding, ops.cli, ops.drill.cli, \
        ops.console.app, workers.job_signals, workers.assembly, workers.server, workers.dispatch.process, workers.dispatch.cloud_tasks, \
        workers.hosted_rlm.serving, workers.hosted_rlm.runner, rlmfamily.session, rlmfamily.kernels.monty, \
        rlmfamily.providers.openai_compat, rlmfamily.providers.anthropic_native, sqlalchemy.dialects.postgresql, \
        alembic.command, openai, anthropic"

# --- final: the runtime, no compilers -------------------------------------------------------------
FROM python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91 AS runtime

# A writable home of its own (libraries may cache under ~); /app stays read-only to it.
RUN groupadd --system --gid 10001 specialists \
    && useradd --system --uid 10001 --gid specialists --create-home --home-dir /home/specialists \
       --shell /usr/sbin/nologin specialists

# Owned by root and not writable by the service user: the code cannot be changed at run time.
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PORT=8080 \
    SPECIALISTS_EDGE_HOST=0.0.0.0 \
    SPECIALISTS_WORKER_HOST=0.0.0.0 \
    SPECIALISTS_CONSOLE_HOST=0.0.0.0 \
    SPECIALISTS_DATA_DIR=/tmp/specialists

WORKDIR /app
USER 10001:10001
EXPOSE 8080

# The listening roles (serve, worker, console) answer /healthz on PORT; the dispatcher and the migration job listen
# on nothing and report unhealthy under Docker (Cloud Run uses its own probes, set in infra/run.tf and console.tf).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8080'), timeout=4)"]

ENTRYPOINT ["/bin/sh", "/app/infra/entrypoint.sh"]
CMD ["serve"]
