# No `# syntax=` line: the engine's built-in Dockerfile frontend builds it (BuildKit's since Docker 23, Buildah's),
# so no frontend image is pulled by a mutable tag; `RUN --mount=type=secret` is part of both.
# One image for every role of the service; the first argument picks the role:
#   serve            the A2A edge (production: SPECIALISTS_SERVE_WORKER=false, the Cloud Tasks relay as its child)
#   worker           the private worker endpoint (POST /jobs)
#   console          the operator console (production: SPECIALISTS_CONSOLE_AUTH=iap, behind IAP)
#   dispatcher       the embedded dispatcher or the Cloud Tasks relay, on its own
#   db upgrade       the migration job
# PORT (set by Cloud Run) is the port of the role that listens: see ops/entrypoint.py.
# tests/deploy/test_dockerfile.py checks this file against the code.

# Two bases, each by tag and digest: every build starts from the same bytes, and the tag says what they are.
#   builder  Debian bookworm, where Debian's own Python 3.11 (apt) makes the venv: the interpreter the final base
#            carries, at the same path (/usr/bin/python3.11), so the venv's links hold there too.
#   final    Google's distroless Python (Debian 12's python3.11 and the libraries it links, nothing else: no shell,
#            no package manager), about 55 MB against 128 MB for python:3.11-slim.
# To move either, look up the tag's current digest (`docker buildx imagetools inspect <tag>`), change the FROM
# line, and run the smoke (docs/OPERATIONS.md). Where no registry serves them, the build is given local stand-ins
# under these same names as named build contexts: --build-context <the reference>=container-image://<local image>
# (infra/release/smoke.py makes both from Debian's packages: the builder with debootstrap, the final base from the
# package list distroless builds python3-debian12 from).

# --- builder: installs the runtime lock; nothing is compiled (wheels only) ---------------------------
# debian:bookworm-slim
FROM debian@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251 AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DEBIAN_FRONTEND=noninteractive

SHELL ["/bin/sh", "-eu", "-c"]

# Debian's Python with venv (the final base's interpreter), and binutils for `strip`. Neither reaches the final
# image: it copies /opt/venv and /app alone.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv=3.11.2-1+b1 binutils=2.40-2 \
    && rm -rf /var/lib/apt/lists/*

# The runtime lock alone (requirements.lock: exact versions, nothing resolved here; the development set is
# requirements-dev.lock and never enters the image), as wheels only, so no compiler is needed or installed.
# `pip check` fails the build if the lock misses a dependency; --require-hashes refuses any file whose sha256 is not
# the lock's. A machine whose TLS to the package index goes
# through its own certificate authority passes that bundle as the build secret `build_ca`
# (--secret id=build_ca,src=/etc/ssl/certs/ca-certificates.crt); it is never written to a layer.
COPY requirements.lock requirements-build.lock /app/
RUN --mount=type=secret,id=build_ca \
    if [ -f /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca; fi; \
    python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --no-deps --only-binary=:all: --require-hashes -r /app/requirements.lock -r /app/requirements-build.lock \
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
COPY infra/model_routes.toml ./infra/
# Built with the locked setuptools (requirements-build.lock; no download); then setuptools and pip leave the
# venv: nothing at run time installs anything, and an editable install needs neither to import.
# The packages' own test suites go (greenlet's, json-rpc's, certifi's: 0.4 MB of the image that nothing imports).
# The wheels' shared objects lose their symbol tables (`strip --strip-unneeded`: what the dynamic linker needs
# stays; SQLAlchemy's, PyYAML's and greenlet's shrink about eightfold, 16 MB in all). The Monty binary is
# shipped stripped and is left alone (its digest names the runtime in every run record).
# Bytecode: all of the project's, and of the dependencies what the roles import at start (their modules, the job
# processes' forkserver preload, the model SDK), written by importing them. The root is read-only at run time,
# so a module without it compiles in memory on each import (about 2.3 s more per process start if none were
# written); the dependencies' other modules (28 MB of bytecode) are rarely imported.
RUN pip install --no-compile --no-deps --no-build-isolation -e ./library -e . \
    && pip uninstall -y -q setuptools pip \
    && rm -rf /app/build /app/*.egg-info /app/library/build /app/library/*.egg-info \
    && find /opt/venv -name '*.pyi' -delete \
    && find /opt/venv/lib/python3.11/site-packages -mindepth 2 -maxdepth 2 -type d -name tests -exec rm -rf {} + \
    && find /opt/venv/lib -name '*.so*' -type f -exec strip --strip-unneeded {} + \
    && python -m compileall -q /app \
    && python -m ops.image_bytecode

# --- final: the runtime, no shell, no package manager, no compilers --------------------------------
# gcr.io/distroless/python3-debian12:latest
FROM gcr.io/distroless/python3-debian12@sha256:2fdb05402a2cf21cf78fdb3ba4c5db167241e9e498140f5bf689d7efb773731f AS runtime

# Owned by root and not writable by the service user: the code cannot be changed at run time.
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app
WORKDIR /app

# The standard library's bytecode, for what the roles import at start: the base ships none (its packages' own
# scripts compile it on a Debian system, and distroless runs no scripts), and the root is read-only at run time.
# Run here, with the base's own interpreter, so each file matches the source it was compiled from; the venv's and
# the project's are already written, so this layer holds the standard library's alone (exec form: no shell).
RUN ["/opt/venv/bin/python", "-m", "ops.image_bytecode"]

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PORT=8080 \
    SPECIALISTS_EDGE_HOST=0.0.0.0 \
    SPECIALISTS_WORKER_HOST=0.0.0.0 \
    SPECIALISTS_CONSOLE_HOST=0.0.0.0 \
    SPECIALISTS_DATA_DIR=/tmp/specialists \
    HOME=/home/nonroot \
    LANG=C.UTF-8

# The base's unprivileged user (nonroot, 65532, home /home/nonroot: libraries may cache under ~).
USER 65532:65532
EXPOSE 8080

# The listening roles (serve, worker, console) answer /healthz on PORT; the dispatcher and the migration job listen
# on nothing and report unhealthy under Docker (Cloud Run uses its own probes, set in infra/run.tf and console.tf).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8080'), timeout=4)"]

ENTRYPOINT ["/opt/venv/bin/python", "-m", "ops.entrypoint"]
CMD ["serve"]
