"""``rlm container image`` builds or reuses the local image and says which; ``rlm container sweep`` removes orphans."""

from __future__ import annotations

import json

import pytest

from rlmfamily.cli import main

pytestmark = pytest.mark.timeout(120)


def test_rlm_container_image_reuses_the_build_of_unchanged_packages(
        container_image: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["container", "image", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["reused"] is True and said["build_tag"] == container_image
    assert said["name"] == "localhost/rlmfamily-python:local"  # RLM_CONTAINER_IMAGE's default, tagged onto it
    assert main(["container", "image"]) == 0
    assert f"localhost/rlmfamily-python:local ({said['engine']}, {container_image}): reused" in capsys.readouterr().out


def test_rlm_container_sweep_says_what_it_removed(container_image: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["container", "sweep"]) == 0
    assert "orphaned container(s)" in capsys.readouterr().out
