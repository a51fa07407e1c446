"""Fixtures for the deployment tests: the parsed Terraform, and the roles started from the environment it gives.

``api_from_terraform``, ``worker_from_terraform`` and ``console_from_terraform`` are the real `specialists
serve`, `specialists worker` and `specialists console`, started through the image's entry point with exactly
the variables that infra/ sets on each Cloud Run service and those Cloud Run sets itself (secrets replaced by
test values, the database by this run's, IAP's key address by a stand-in's, the collector sidecar's address by
``collector``'s), listening on the PORT Cloud Run would give them. Shared by the tests of a session.

They run on a database of their own (``deploy_database``): the API's dispatcher is a Cloud Tasks
relay to an address where nothing answers, and on the session's shared database it took the jobs
other tests' edges admitted and held each for its lease (a task of tests/app/test_two_instances
waited 47 s for its worker that way).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from tests.deploy.iap import FakeIap, start_fake_iap
from tests.deploy.manifests import Terraform, container_env, dockerfile_stages
from tests.deploy.roles import Role, clean_environment, free_port, on_this_machine, start_role
from tests.otlp import Receiver, otlp_receiver
from tests.workers.system import drop_database, fresh_database

SERVICE = "google_cloud_run_v2_service"


@pytest.fixture(scope="session")
def tf() -> Terraform:
    return Terraform()


def secret_test_value(secret_name: str) -> str:
    """A stand-in for a secret's value: distinct per secret and long enough for every minimum."""
    return f"{secret_name}-test-value-" + "s" * 48


def image_environment() -> dict[str, str]:
    """The ENV of the image's final stage, as this machine can use it: the project's own PATH, and loopback
    instead of every interface (test_dockerfile checks that the image itself listens on all of them)."""
    env = dockerfile_stages()[-1].env()
    env.pop("PATH")
    return {key: "127.0.0.1" if value == "0.0.0.0" else value for key, value in env.items()}


def cloud_run_environment(tf: Terraform, type_name: str, name: str) -> dict[str, str]:
    """What Cloud Run itself sets in a service's containers (PORT aside): its name, revision and configuration."""
    if type_name != SERVICE:
        return {}
    service = str(tf.resolve(tf.resource(type_name, name)["name"]))
    return {"K_SERVICE": service, "K_REVISION": f"{service}-00001-tst", "K_CONFIGURATION": service}


def terraform_environment(tf: Terraform, type_name: str, name: str, database_url: str, *,
                          collector_url: str | None = None, **overrides: str) -> dict[str, str]:
    """The environment of a Cloud Run container: the image's ENV, then what infra/ and Cloud Run set on the
    service, made runnable on this machine. ``collector_url`` (a stand-in's) replaces the address of the collector
    sidecar, which runs only on Cloud Run."""
    given = container_env(tf, type_name, name)
    env = clean_environment(**image_environment(), **cloud_run_environment(tf, type_name, name))
    env.update({variable: on_this_machine(value) for variable, value in given.plain.items()})
    for variable, (secret_name, _) in given.secrets.items():
        env[variable] = database_url if variable == "DATABASE_URL" else secret_test_value(secret_name)
    if collector_url and "SPECIALISTS_OTEL_ENDPOINT" in env:
        env["SPECIALISTS_OTEL_ENDPOINT"] = collector_url
    env.update(overrides)
    return env


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process would load from ``env`` (and nothing else of this machine's environment)."""
    for key in list(os.environ):
        if key.startswith("SPECIALISTS_") or key in ("DATABASE_URL", "PORT"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()


@pytest.fixture(scope="session")
def deploy_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deploy-logs")


@pytest.fixture(scope="session")
def deploy_database(server_url: str) -> Iterator[str]:
    """The deployed roles' own database, migrated to head (see the module's docstring)."""
    url = fresh_database(server_url)
    yield url
    drop_database(server_url, url)


@pytest.fixture(scope="session")
def collector() -> Iterator[Receiver]:
    """A stand-in for the OpenTelemetry Collector sidecar (infra/observability.tf): an OTLP/HTTP receiver on
    127.0.0.1 (tests/otlp.py) that the roles started from Terraform's environment export to."""
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def worker_from_terraform(tf: Terraform, deploy_database: str, deploy_logs: Path,
                          collector: Receiver) -> Iterator[Role]:
    port = free_port()
    env = terraform_environment(tf, SERVICE, "worker", deploy_database, collector_url=collector.url, PORT=str(port))
    role = start_role(["worker"], env, deploy_logs / "worker.log", port=port, ready_path="/healthz")
    yield role
    role.stop()


@pytest.fixture(scope="session")
def api_from_terraform(tf: Terraform, deploy_database: str, deploy_logs: Path, collector: Receiver) -> Iterator[Role]:
    port = free_port()
    env = terraform_environment(
        tf,
        SERVICE,
        "api",
        deploy_database,
        collector_url=collector.url,
        PORT=str(port),
        # The relay runs as in production, but talks to a local address instead of Google's API (nothing
        # leaves this machine). Nothing is admitted on its database, so it never has a job to send.
        SPECIALISTS_CLOUD_TASKS_EMULATOR_HOST=f"127.0.0.1:{free_port()}",
        SPECIALISTS_OTEL_SAMPLING_RATIO="1",  # every trace: the check follows one request's span
    )
    role = start_role(["serve"], env, deploy_logs / "api.log", port=port, ready_path="/healthz")
    yield role
    role.stop()


@pytest.fixture(scope="session")
def fake_iap() -> Iterator[FakeIap]:
    iap = start_fake_iap()
    yield iap
    iap.stop()


@pytest.fixture(scope="session")
def console_from_terraform(tf: Terraform, deploy_database: str, deploy_logs: Path, fake_iap: FakeIap) -> Iterator[Role]:
    """`specialists console` as infra/console.tf runs it (auth=iap, its audience and operators), IAP's keys
    fetched from the stand-in on 127.0.0.1 instead of Google's address."""
    port = free_port()
    env = terraform_environment(
        tf, "google_cloud_run_v2_service", "console", deploy_database, PORT=str(port),
        SPECIALISTS_CONSOLE_IAP_CERTS_URL=fake_iap.certs_url,
    )
    role = start_role(["console"], env, deploy_logs / "console.log", port=port, ready_path="/healthz")
    yield role
    role.stop()
