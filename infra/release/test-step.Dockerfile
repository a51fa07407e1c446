# The environment of the release's `test` step (cloudbuild.yaml): the python image the suite ran in, plus what the
# suite needs that it lacks: git (the library's tests make repositories: tests/rlm/conftest.py) and Terraform
# (tests/deploy's plan of infra/variables.tf, and `terraform fmt`). Built by the `test-image` step, on the build's
# Docker, from the step images' own digests (given as build arguments: cloudbuild.yaml's _STEP_* substitutions).
# Locally, infra/release/test_step.py builds it on stand-ins for both and runs the step's command in it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG TERRAFORM_IMAGE=hashicorp/terraform:1.11.4
# hadolint ignore=DL3006
FROM ${TERRAFORM_IMAGE} AS terraform

# hadolint ignore=DL3006
FROM ${PYTHON_IMAGE}
SHELL ["/bin/sh", "-eu", "-c"]
# Debian bookworm's git, and libatomic1, which Playwright's driver (node) links and the slim image lacks (the page
# tests drive Debian's chromium through it); ./dev test installs chromium and podman itself when they are missing.
# tini: the step's PID 1 (cloudbuild.yaml's entrypoint). A step container's PID 1 is otherwise its command, bash,
# which never reaps what is orphaned to it: an embedded PostgreSQL a test stops or kills is a daemon, and stayed a
# zombie that still looked alive (`specialists db stop` waited its 60 s; a crash test's restart saw a live server).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git libatomic1 tini ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=terraform /bin/terraform /usr/local/bin/terraform
RUN git --version && terraform version && tini --version
