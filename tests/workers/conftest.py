"""Fixtures for the workers tests: the Cloud Tasks emulator, settings for dispatch and workers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.settings import Settings
from workers.dispatch.emulator import CloudTasksEmulator

QUEUE = "projects/test-project/locations/test-location/queues/jobs"
WORKER_SECRET = "worker-job-secret-" + "y" * 40
SERVICE_ACCOUNT = "dispatch@test-project.iam.gserviceaccount.com"


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudTasksEmulator]:
    emu = CloudTasksEmulator([QUEUE], max_retries=20, log_path=tmp_path_factory.mktemp("emulator") / "emulator.log")
    emu.start()
    yield emu
    emu.stop()


def cloud_tasks_settings(host: str, **sections: dict[str, object]) -> Settings:
    """Settings for Cloud Tasks at ``host``; ``sections`` override fields section by section."""
    options: dict[str, dict[str, object]] = {
        "dispatch": {
            "backend": "cloud_tasks",
            "cloud_tasks_project": "test-project",
            "cloud_tasks_location": "test-location",
            "cloud_tasks_queue": "jobs",
            "service_account": SERVICE_ACCOUNT,
            "cloud_tasks_emulator_host": host,
        },
        "worker": {"job_secrets": [WORKER_SECRET]},
    }
    for section, fields in sections.items():
        options.setdefault(section, {}).update(fields)
    return Settings(**options)
