# syntax=docker/dockerfile:1
# One image for every role of the service; the first argument picks the role:
#   serve            the A2A edge (production: SPECIALISTS_SERVE_WORKER=false, the Cloud Tasks relay as its child)
#   worker           the private worker endpoint (POST /jobs)
#   dispatcher       the embedded dispatcher or the Cloud Tasks relay, on its own
#   db upgrade       the migration job
# PORT (set by Cloud Run) is the port of the role that listens: see infra/entrypoint.sh.
# tests/deploy/test_dockerfile.py checks this file against the code.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: compilers allowed here only ---------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

# For any locked dependency that has no wheel for this platform; none of it reaches the final stage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# Dependencies first, from the lock alone (exact versions, nothing resolved here), so that a code change
# does not reinstall them; `pip check` fails the build if the lock is missing a dependency.
COPY requirements.lock /app/requirements.lock
RUN pip install --no-deps -r /app/requirements.lock && pip check

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
RUN pip install --no-deps -e ./library -e . && python -m compileall -q /app /opt/venv

# --- final: the runtime, no compilers -------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

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
    SPECIALISTS_DATA_DIR=/tmp/specialists

WORKDIR /app
USER 10001:10001
EXPOSE 8080

# Both listening roles (serve, worker) answer /healthz on PORT; the dispatcher and the migration job listen on
# nothing and report unhealthy under Docker (Cloud Run uses its own probes, set in infra/run.tf).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8080'), timeout=4)"]

ENTRYPOINT ["/bin/sh", "/app/infra/entrypoint.sh"]
CMD ["serve"]
